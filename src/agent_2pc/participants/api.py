"""The API participant: remote HTTP calls inside a transaction, each exactly once, with
compensation on abort. Built on the effect fence (agent_2pc.fence).

A staged call is sent during prepare, after the file participant voted yes (so a file conflict
aborts before anything remote happens), and its success is this participant's yes vote:

  prepare   for each call in order: fence.prepare(intent = its idempotency key, takeover=True:
            the key makes a repeat safe); Replay -> it was done before, use the recorded result;
            Fresh -> send with ``Idempotency-Key: <key>``:
              2xx                                  -> fence.commit: done (vote yes so far)
              4xx but 408/409/425/429              -> fence.abort(failed): it did not happen; no
              a timeout, a dropped connection, 5xx,
              408/409/425/429                      -> send again with the same key, a bounded
                                                      number of times; still no answer ->
                                                      fence.abort(unknown); no
  abort     for each call, newest first, that may have happened (done, or unknown): resolve an
            unknown outcome by sending the same request with the same key again (never a fresh
            request); then send the compensation, fenced with the key ``<key>:compensate``.
            A call that definitely did not happen is not compensated.

Before a request leaves, a ``result`` record ``sending`` with the fence's ticket is logged and
synced; after it, the outcome. A crash in between is resumed from the logged ticket: the same
request with the same key, under the same lease. No ``sending`` record means it never left.
A crash after the decision needs nothing from this participant: every call was settled before
the decision.

Staging a call (``Staging.stage_effect`` with kind ``http``) asks ``check_effect`` (``http_call``:
the request and its compensation checked completely before anything is logged), then
``effect_fields`` (``staged_effect``: the record's fields, a key made up when none is given).
"""

from __future__ import annotations

import os
import time

from .. import crashpoints
from ..core.states import effects_summary
from ..errors import Agent2PCError, FenceRefusal, UsageError
from .base import YES, Applied, Vote

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..core.states import Tx
    from ..fence import Fence
    from .base import Context, EffectFields

    Recorder = Callable[[dict[str, Any], bool], None]  # (result fields, sync)

TIMEOUT_S = float(os.environ.get("AGENT2PC_API_TIMEOUT_S", "30"))
ATTEMPTS = int(os.environ.get("AGENT2PC_API_ATTEMPTS", "3"))
BACKOFF_S = (0.2, 0.5, 1.0, 2.0)
RESPONSE_BODY_CHARS_MAX = 64 * 1024
RETRY_STATUSES = frozenset({408, 409, 425, 429})  # "not now": the same key may be sent again
KEPT_HEADERS = ("content-type", "location", "idempotent-replayed", "request-id")

DONE, FAILED, UNKNOWN, SKIPPED, UNCOMPENSATED, SENDING = (
    "done", "failed", "unknown", "skipped", "uncompensated", "sending")

def lease_ttl_s() -> float:
    """A lease long enough for every attempt at one call (the fence's lease is per call)."""
    return ATTEMPTS * TIMEOUT_S + sum(BACKOFF_S[:ATTEMPTS]) + 30.0


class ApiParticipant:
    """Remote HTTP calls (participants/base.py: the protocol)."""

    name = "api"
    kinds = frozenset({"http"})

    def __init__(self, fence_factory: Callable[[], Fence]) -> None:
        self._fence_factory = fence_factory
        self._fence: Fence | None = None
        self._http: Any = None

    @classmethod
    def in_workspace(cls, state_dir: str) -> ApiParticipant:
        """The participant of a workspace: its fence is SQLite in ``state_dir`` (.agent-tx/),
        opened on first use."""
        def open_workspace_fence() -> Fence:
            from ..fence import open_fence

            return open_fence(f"sqlite:///{os.path.join(state_dir, 'fence.db')}",
                              lease_ttl=lease_ttl_s())

        return cls(open_workspace_fence)

    # -- the participant protocol (base.py) --------------------------------------------------

    def prepare(self, tx: Tx, ctx: Context) -> Vote:
        """Make every staged call (this participant votes after the files)."""
        if not self.calls(tx):
            return YES
        try:
            return self.make_calls(tx, ctx.record)
        except (OSError, Agent2PCError) as exc:  # a participant that raises has voted no
            return Vote.no(getattr(exc, "code", "prepare_failed"),
                           f"the remote calls could not be made: {exc}")

    def decision_fields(self, tid: str) -> dict[str, Any]:
        return {}  # every call was settled before the decision

    def apply(self, tx: Tx, ctx: Context, redo: bool) -> Applied:
        return Applied()  # nothing is left to do after the decision

    def undo(self, tx: Tx, ctx: Context) -> dict[str, Any]:
        if not self.calls(tx):
            return {}
        left = self.compensate(tx, ctx.record)
        return {"uncompensated": left} if left else {}

    def forget(self, tid: str) -> None:
        pass  # prepare keeps nothing in memory: the log has every outcome

    def describe(self, tx: Tx) -> dict[str, Any]:
        return {"effects": effects_summary(tx, self.kinds)} if self.calls(tx) else {}

    def calls(self, tx: Tx) -> list[dict[str, Any]]:
        """The effects of ``tx`` that are this participant's (another may stage effects)."""
        return [eff for eff in tx.effects if eff.get("kind", "http") in self.kinds]

    # -- staging (base.py: EffectStager) -----------------------------------------------------

    def check_effect(self, kind: str, args: dict[str, Any]) -> Any:
        try:
            request, compensation = http_call(**args)
        except TypeError as exc:  # an argument http_call does not take
            raise UsageError(f"an HTTP call takes method, url, body, headers, "
                             f"idempotency_key and compensate: {exc}") from None
        return request, compensation, args.get("idempotency_key")

    def effect_fields(self, tid: str, n: int, checked: Any) -> EffectFields:
        request, compensation, idempotency_key = checked
        return staged_effect(tid, n, request, compensation, idempotency_key)

    def staged_answer(self, effect: dict[str, Any]) -> dict[str, Any]:
        request = effect["request"]
        return {"n": effect["n"], "method": request["method"], "url": request["url"],
                "idempotency_key": effect["key"], "compensate": effect["compensate"] is not None}

    # -- plumbing ----------------------------------------------------------------------------

    def fence(self) -> Fence:
        if self._fence is None:
            self._fence = self._fence_factory()
        return self._fence

    def _client(self) -> Any:
        if self._http is None:
            try:
                import httpx
            except ImportError:  # pragma: no cover - the api extra is missing
                from ..errors import IsolationUnavailable

                raise IsolationUnavailable(
                    "API calls need httpx: pip install 'agent-2pc[api]'") from None
            self._http = httpx.Client(timeout=TIMEOUT_S, follow_redirects=False)
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._fence is not None:
            self._fence.close()
            self._fence = None

    # -- prepare -----------------------------------------------------------------------------

    def make_calls(self, tx: Tx, record: Recorder) -> Vote:
        """Send each call not done yet, in order; a no at the first that does not succeed."""
        try:
            return self._prepare(tx, record)
        finally:
            self.close()  # no connection or store handle outlives the step

    def _prepare(self, tx: Tx, record: Recorder) -> Vote:
        for eff in self.calls(tx):
            n = eff["n"]
            last = tx.results.get(("effect", n))
            if last is not None and last["outcome"] == DONE:
                continue
            res = self._call_logged(tx, "effect", n, eff["request"], eff["key"], record)
            if res["outcome"] != DONE:
                req = eff["request"]
                why = res.get("error") or f"HTTP {res.get('status')}"
                code = res.get("code") or ("effect_failed" if res["outcome"] == FAILED
                                           else "effect_unknown")
                return Vote.no(code, f"{req['method']} {req['url']}: {why}")
        return YES

    def _call_logged(self, tx: Tx, phase: str, n: int, request: dict[str, Any], key: str,
                     record: Recorder) -> dict[str, Any]:
        """``call``, resuming the lease a crashed attempt logged, and logging the outcome."""
        last = tx.results.get((phase, n))
        resume = last["ticket"] if last is not None and last["outcome"] == SENDING else None

        def sending(ticket: dict[str, Any]) -> None:
            # Synced before the request leaves: recovery must know it may have been sent.
            record({"phase": phase, "n": n, "outcome": SENDING, "ticket": ticket}, True)

        res = self.call(request, key, tx.tid, sending, resume)
        record({"phase": phase, "n": n, **res}, False)
        return res

    def call(self, request: dict[str, Any], key: str, agent: str,
             sending: Callable[[dict[str, Any]], None],
             ticket_json: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send ``request`` exactly once under the fence's intent ``key``; return its outcome:
        {outcome, status, response, error, code} (status/response when there was an answer).

        ``sending(ticket)`` is called once the lease is held and before the first byte leaves.
        ``ticket_json`` resumes a lease that an earlier (crashed) attempt logged.
        """
        from ..fence import EffectRequest, Replay, Ticket

        fence = self.fence()
        ticket = None
        if ticket_json is not None:
            try:
                ticket = Ticket.parse(ticket_json)
                fence.heartbeat(ticket)  # still ours: send again under it, with the same key
            except FenceRefusal:
                ticket = None  # it ended or was taken over: the fence says what happened
        if ticket is None:
            req = EffectRequest(intent=key, domain=_domain(request["url"]),
                                tool=f"http.{request['method'].lower()}",
                                args={"method": request["method"], "url": request["url"],
                                      "body": request.get("body")},
                                agent=agent)
            try:
                adm = fence.prepare(req, takeover=True)
            except FenceRefusal as exc:
                return {"outcome": FAILED, "code": exc.code, "error": f"fence: {exc.message}"}
            if isinstance(adm, Replay):
                return {"outcome": DONE, **adm.cert.result, "replayed": True}
            ticket = adm.ticket
            sending(ticket.to_json())
        last: dict[str, Any] = {}
        for attempt in range(ATTEMPTS):
            if attempt:
                time.sleep(BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)])
                fence.heartbeat(ticket)
            crashpoints.hit("api.before_send")
            last = self._send(request, key)
            crashpoints.hit("api.after_send")
            status = last.get("status")
            if status is not None and 200 <= status < 300:
                fence.commit(ticket, {"status": status, "response": last["response"]})
                return {"outcome": DONE, **last}
            if status is not None and status < 500 and status not in RETRY_STATUSES:
                fence.abort(ticket, f"HTTP {status}", "failed")
                return {"outcome": FAILED, **last}
        fence.abort(ticket, last.get("error") or f"HTTP {last.get('status')}", "unknown")
        return {"outcome": UNKNOWN, **last}

    def _send(self, request: dict[str, Any], key: str) -> dict[str, Any]:
        import httpx

        headers = dict(request.get("headers") or {})
        headers["Idempotency-Key"] = key
        body = request.get("body")
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["json"] = body
        try:
            resp = self._client().request(request["method"], request["url"], **kwargs)
        except httpx.TimeoutException as exc:
            return {"status": None, "error": f"timed out: {exc}"}
        except httpx.TransportError as exc:
            return {"status": None, "error": f"connection failed: {exc!r}"}
        text = resp.text
        return {"status": resp.status_code, "response": {
            "status": resp.status_code,
            "headers": {k: v for k, v in resp.headers.items() if k.lower() in KEPT_HEADERS},
            "body": text[:RESPONSE_BODY_CHARS_MAX],
            "truncated": len(text) > RESPONSE_BODY_CHARS_MAX}}

    # -- abort -------------------------------------------------------------------------------

    def compensate(self, tx: Tx, record: Recorder) -> list[int]:
        """Undo what may have happened, newest first; return the calls left uncompensated."""
        try:
            return self._compensate(tx, record)
        finally:
            self.close()

    def _compensate(self, tx: Tx, record: Recorder) -> list[int]:
        left: list[int] = []
        for eff in reversed(self.calls(tx)):
            n = eff["n"]
            prior = tx.results.get(("compensate", n))
            if prior is not None and prior["outcome"] in (DONE, SKIPPED):
                continue
            happened = self._happened(tx, eff, record)
            if happened is False:
                record({"phase": "compensate", "n": n, "outcome": SKIPPED,
                        "error": "the call did not happen"}, False)
                continue
            comp = eff.get("compensate")
            if comp is None:
                record({"phase": "compensate", "n": n, "outcome": UNCOMPENSATED,
                        "error": "the call may have happened and has no compensation"}, False)
                left.append(n)
                continue
            res = self._call_logged(tx, "compensate", n, comp, f"{eff['key']}:compensate",
                                    record)
            if res["outcome"] != DONE:
                left.append(n)
        return left

    def _happened(self, tx: Tx, eff: dict[str, Any], record: Recorder) -> bool | None:
        """Did the call happen? True, False, or None (unknown even after asking again)."""
        last = tx.results.get(("effect", eff["n"]))
        if last is None:
            return False  # never sent: "sending" is logged (synced) before a request leaves
        if last["outcome"] in (DONE, FAILED):
            return bool(last["outcome"] == DONE)
        # Unknown, or cut off mid-call: send the same request with the same key again; the
        # service answers what it did (never a fresh request).
        again = self._call_logged(tx, "effect", eff["n"], eff["request"], eff["key"], record)
        return {DONE: True, FAILED: False}.get(again["outcome"])


# -- staging a call ------------------------------------------------------------------------

HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
URL_CHARS_MAX = 8192
BODY_BYTES_MAX = 1 << 20
HEADERS_MAX = 64


def http_call(method: Any, url: Any, body: Any = None, headers: Any = None,
              idempotency_key: Any = None, compensate: Any = None
              ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Check a staged HTTP call and its compensation completely (a bad one is refused before
    anything is logged): (request, compensation or None)."""
    if idempotency_key is not None:
        _check_key(idempotency_key)
    if headers is not None and not isinstance(headers, dict):
        raise UsageError("the headers are a JSON object of name: value")
    request = _http_request(method, url, body, headers)
    if compensate is None:
        return request, None
    if not isinstance(compensate, dict) or set(compensate) - {"method", "url", "body"}:
        raise UsageError("a compensation is {method, url, body}")
    if not compensate.get("method") or not compensate.get("url"):
        raise UsageError("a compensation needs both a method and a URL")
    return request, _http_request(compensate["method"], compensate["url"],
                                  compensate.get("body"), headers)


def _http_request(method: Any, url: Any, body: Any, headers: Any) -> dict[str, Any]:
    import json

    from ..core.jsonin import check

    if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
        raise UsageError(f"the method must be one of {', '.join(sorted(HTTP_METHODS))}, "
                         f"not {method!r}")
    if not isinstance(url, str) or len(url) > URL_CHARS_MAX or not (
            url.startswith("http://") or url.startswith("https://")):
        raise UsageError(f"the URL must be http:// or https:// (at most {URL_CHARS_MAX} "
                         f"characters), not {url!r}")
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname
    except ValueError:
        host = None
    if not host:
        raise UsageError(f"the URL has no host: {url!r}")
    check(body, "the body", strings=False)  # nesting: the log's encoder recurses
    try:
        encoded = json.dumps(body, ensure_ascii=False, allow_nan=False)
        size = len(encoded.encode("utf-8"))
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError: a lone surrogate
        raise UsageError(f"the body must be JSON text: {exc}") from None
    if size > BODY_BYTES_MAX:
        raise UsageError(f"the body is larger than {BODY_BYTES_MAX} bytes")
    clean: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not name or not name.isascii() or not all(
                c.isalnum() or c in "-_" for c in name) or not isinstance(value, str) or any(
                c in value for c in "\r\n\0"):
            raise UsageError(f"bad header {name!r}: a name of letters, digits, '-', '_' and a "
                             "single-line value")
        if name.lower() == "idempotency-key":
            raise UsageError("set the key with `idempotency_key`, not as a header",
                             params=("idempotency_key",))
        clean[name] = value
    if len(clean) > HEADERS_MAX:
        raise UsageError(f"at most {HEADERS_MAX} headers")
    try:
        json.dumps([url, clean], ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("the URL and the headers must be Unicode text") from None
    return {"method": method.upper(), "url": url, "headers": clean, "body": body}


def _check_key(key: Any) -> None:
    if not isinstance(key, str) or not 0 < len(key) <= 255 or not key.isascii() or not \
            key.isprintable():
        raise UsageError("an idempotency key is 1 to 255 printable ASCII characters")


def staged_effect(tid: str, n: int, request: dict[str, Any], compensation: dict[str, Any] | None,
                  idempotency_key: str | None) -> EffectFields:
    """The fields of the ``effect`` record that stages the ``n``-th call of ``tid`` (checked
    by ``http_call``); a key is made up when none is given."""
    key = idempotency_key if idempotency_key is not None else (
        f"a2pc-{tid}-{n}-{os.urandom(4).hex()}")
    return {"request": request, "key": key, "compensate": compensation}


def _domain(url: str) -> str:
    from urllib.parse import urlsplit

    return "http:" + (urlsplit(url).netloc or "unknown")
