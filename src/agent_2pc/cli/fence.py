"""``agent-2pc fence ...``: the effect fence's commands (thin: parse, call agent_2pc.fence, render).

Declarative at import time: the fence library, sqlite3, psycopg and rfc8785 are imported inside
the run functions only, so that the CLI starts fast. docs/fence.md is the reference.
"""

from __future__ import annotations

from ..errors import UsageError
from .args import FLAG, MULTI, VALUE, Command, Opt, int_arg

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _float_arg(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"not a number: {value!r}") from None


# -- shared helpers (run time only) ---------------------------------------------------------------


def _value(args: dict[str, Any], name: str, what: str, default: Any = None) -> Any:
    """A JSON value given as --NAME JSON or --NAME-file F (or the default)."""
    from .inputs import load_json

    if args.get(name) is not None and args.get(name + "_file") is not None:
        raise UsageError(f"give --{name.replace('_', '-')} or --{name.replace('_', '-')}-file, "
                         "not both")
    if args.get(name) is not None:
        return load_json(args[name], what=what)
    if args.get(name + "_file") is not None:
        return load_json(path=args[name + "_file"], what=what)
    return default


def _ticket(args: dict[str, Any]) -> Any:
    """The ticket: its JSON, or a file holding it or holding the whole prepare result. A
    ticket that is not JSON (or too deep, or not UTF-8) is malformed: stale_lease."""
    from ..errors import FenceRefusal
    from .inputs import load_json

    def stale(msg: str) -> FenceRefusal:
        return FenceRefusal(msg, code="stale_lease")

    obj = load_json(args.get("ticket"), args.get("ticket_file"), "the ticket", stale)
    if isinstance(obj, dict) and "ticket" in obj and "lease_id" not in obj:
        obj = obj["ticket"]  # the whole output of `fence prepare --json`
    return obj


def _store_url(ctx: Any, args: dict[str, Any]) -> str:
    import os

    url = args.get("store") or os.environ.get("AGENT2PC_FENCE_STORE")
    if url:
        return str(url)
    root = ctx.root()
    return "sqlite:///" + os.path.join(root, ".agent-tx", "fence.db").lstrip("/")


def _open(ctx: Any, args: dict[str, Any]) -> Any:
    from ..fence import open_fence

    kw: dict[str, Any] = {}
    if args.get("lease_ttl") is not None:
        kw["lease_ttl"] = args["lease_ttl"]
    if args.get("result_ttl") is not None:
        kw["result_ttl"] = args["result_ttl"]
    return open_fence(_store_url(ctx, args), **kw)


def _read_specs(specs: list[str]) -> list[dict[str, Any]]:
    out = []
    for spec in specs:
        domain, at, seq = spec.rpartition("@")
        if not at or not domain:
            raise UsageError(f"--read takes DOMAIN@SEQ, not {spec!r}")
        try:
            n = int(seq)
        except ValueError:
            raise UsageError(f"--read takes DOMAIN@SEQ, not {spec!r}") from None
        out.append({"domain": domain, "seq": n})
    return out


# -- commands -------------------------------------------------------------------------------------


def run_prepare(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    import os

    from ..fence import EffectRequest

    fields = _value(args, "request", "the request")
    if fields is not None:
        for flag in ("intent", "domain", "tool", "args", "args_file", "agent", "read_set",
                     "parent", "known_clock"):
            if args.get(flag) is not None:
                raise UsageError("--request carries the whole request: drop --"
                                 + flag.replace("_", "-"))
        if args["read"]:
            raise UsageError("--request carries the whole request: drop --read")
        if isinstance(fields, dict) and "agent" not in fields:
            fields = {**fields, "agent": os.environ.get("AGENT2PC_AGENT", "")}
        req = EffectRequest.from_json(fields)
    else:
        if args.get("intent") is None:
            raise UsageError("'prepare' needs --intent (or --request)")
        read_set = _value(args, "read_set", "the read-set", default=[])
        if not isinstance(read_set, list):
            raise UsageError("--read-set is a JSON list of {domain, seq}")
        read_set = read_set + _read_specs(args["read"])
        req = EffectRequest(
            intent=args["intent"], domain=args.get("domain") or "default",
            tool=args.get("tool") or "", args=_value(args, "args", "--args", default={}),
            agent=str(args["agent"]) if args.get("agent") is not None
            else os.environ.get("AGENT2PC_AGENT", ""),
            read_set=read_set, parent=args.get("parent"),
            known_clock=_value(args, "known_clock", "--known-clock"))
    with _open(ctx, args) as fence:
        adm = fence.prepare(req, takeover=args["takeover"])
    return adm.to_json()  # type: ignore[no-any-return]


def _text_prepare(res: dict[str, Any]) -> str:
    import json

    if res["status"] == "fresh":
        head = "fresh: run the effect, then commit (or abort) with this ticket"
        if res.get("takeover"):
            head += f" (a takeover after {res.get('previous')}: the effect may have run once)"
        return head + ":\n" + json.dumps(res["ticket"])
    return "already done: do not run it again; result: " + json.dumps(res["cert"]["result"],
                                                                      ensure_ascii=False)


def run_commit(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    ticket = _ticket(args)
    result = _value(args, "result", "the result")
    with _open(ctx, args) as fence:
        cert = fence.commit(ticket, result)
    return {"cert": cert.to_json()}


def run_abort(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    ticket = _ticket(args)
    with _open(ctx, args) as fence:
        res = fence.abort(ticket, args.get("reason") or "", args.get("outcome") or "failed")
    return res.to_json()  # type: ignore[no-any-return]


def run_heartbeat(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    ticket = _ticket(args)
    with _open(ctx, args) as fence:
        expires = fence.heartbeat(ticket)
    return {"intent": ticket.get("intent") if isinstance(ticket, dict) else None,
            "lease_expires_at": expires}


def run_reconcile(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    result = _value(args, "result", "the result")
    if args["action"] not in ("clear", "done"):
        raise UsageError("--action is clear or done")
    with _open(ctx, args) as fence:
        cert = fence.reconcile(args["intent"], args["action"], result, args.get("reason") or "")
    out: dict[str, Any] = {"intent": args["intent"],
                           "state": "done" if args["action"] == "done" else "failed"}
    if cert is not None:
        out["cert"] = cert.to_json()
    return out


def run_status(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    with _open(ctx, args) as fence:
        if args.get("intent") is not None:
            return fence.status(args["intent"])  # type: ignore[no-any-return]
        return fence.status(limit=args.get("limit") or 100)  # type: ignore[no-any-return]


def run_verify(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..errors import Refusal
    from ..fence import Certificate, chain_problems

    given = [n for n in ("cert", "cert_file", "intent") if args.get(n) is not None]
    if len(given) != 1:
        raise UsageError("'verify' needs exactly one of --cert | --cert-file | --intent")
    if args["chain"] and args.get("intent") is None:
        raise UsageError("--chain reads the chain from the store: give --intent")
    if args.get("intent") is not None:
        with _open(ctx, args) as fence:
            certs = fence.chain(args["intent"]) if args["chain"] else \
                [c for c in [fence.certificate(args["intent"])] if c is not None]
        if not certs or certs[-1].intent != args["intent"]:
            raise UsageError(f"intent {args['intent']!r} has no certificate in the store",
                             code="unknown_intent")
    else:
        obj = _value(args, "cert", "the certificate")
        if isinstance(obj, dict) and "cert" in obj and "hash" not in obj:
            obj = obj["cert"]  # the whole output of commit / prepare
        certs = [Certificate.from_json(obj)]
    problems = chain_problems(certs, complete=False) if args["chain"] else certs[0].problems()
    res = {"valid": not problems, "hash": certs[-1].hash, "intent": certs[-1].intent,
           "signed": certs[-1].signature is not None, "length": len(certs),
           "problems": problems}
    if problems:
        raise Refusal("the certificate does not verify: " + "; ".join(problems),
                      code="invalid_certificate", result=res)
    return res


def run_storm(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..errors import Refusal
    from ..fence._storm import storm

    hold_ms = args.get("hold_ms") or 0
    res = storm(_store_url(ctx, args), attempts=args["attempts"], workers=args["workers"],
                processes=args.get("processes") or 1, effect_path=args.get("effect_file"),
                intent=args.get("intent"), hold_s=hold_ms / 1000.0,
                lease_ttl=args.get("lease_ttl") or 60.0)
    if res["executions"] != 1:
        raise Refusal(f"the effect ran {res['executions']} times, not once",
                      code="exactly_once_violated", result=res)
    return res


def run_sweep(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    with _open(ctx, args) as fence:
        return {"deleted": fence.sweep(args.get("limit") or 1000)}


# -- the table ------------------------------------------------------------------------------------

_STORE = (
    Opt("--store", VALUE, metavar="URL", help="memory://, sqlite:///path or postgresql://... "
        "(default: $AGENT2PC_FENCE_STORE, else sqlite in .agent-tx/fence.db)"),
    Opt("--lease-ttl", VALUE, metavar="S", type=_float_arg, help="lease length in seconds "
        "(default 60)"),
    Opt("--result-ttl", VALUE, metavar="S", type=_float_arg, help="how long finished outcomes "
        "are kept, in seconds (default 86400)"),
)
_TICKET = (
    Opt("--ticket", VALUE, metavar="JSON", help="the ticket that prepare printed"),
    Opt("--ticket-file", VALUE, metavar="F", help="a file (or -) holding the ticket, or the "
        "whole output of 'fence prepare --json'"),
)

PREPARE = Command(
    "prepare", "ask to run an effect: fresh (a ticket), already_done (a certificate) or refused",
    run=run_prepare,
    opts=(Opt("--intent", VALUE, help="the logical action's name (the idempotency key)"),
          Opt("--domain", VALUE, help="the domain the effect advances (default: default)"),
          Opt("--tool", VALUE, help="the tool's name"),
          Opt("--args", VALUE, metavar="JSON", help="the effect's arguments (default {})"),
          Opt("--args-file", VALUE, metavar="F", help="the arguments, from a file or -"),
          Opt("--agent", VALUE, help="who asks (default: $AGENT2PC_AGENT)"),
          Opt("--read", MULTI, metavar="DOMAIN@SEQ", help="a domain position the decision "
              "relied on (repeatable)"),
          Opt("--read-set", VALUE, metavar="JSON", help="[{\"domain\": D, \"seq\": N}, ...]"),
          Opt("--parent", VALUE, metavar="INTENT", help="a done intent this effect follows"),
          Opt("--known-clock", VALUE, metavar="JSON", help="a vector clock seen before"),
          Opt("--request", VALUE, metavar="JSON", help="the whole EffectRequest as JSON"),
          Opt("--request-file", VALUE, metavar="F", help="the request, from a file or -"),
          Opt("--takeover", FLAG, help="take over an expired lease or an unknown outcome "
              "(only for an effect that is safe to repeat)"))
    + _STORE,
    extra={"text": _text_prepare},
)

COMMIT = Command(
    "commit", "record the effect's result; prints its certificate", run=run_commit,
    opts=_TICKET + (Opt("--result", VALUE, metavar="JSON", help="the result (default null)"),
                    Opt("--result-file", VALUE, metavar="F", help="the result, from a file or -"))
    + _STORE,
    one_of=(("ticket", "ticket_file"),),
)

ABORT = Command(
    "abort", "end the lease without a result: failed frees the intent, unknown fences it",
    run=run_abort,
    opts=_TICKET + (Opt("--reason", VALUE, help="why"),
                    Opt("--outcome", VALUE, metavar="failed|unknown",
                        help="failed (definitely did not happen) or unknown (default failed)"))
    + _STORE,
    one_of=(("ticket", "ticket_file"),),
)

HEARTBEAT = Command(
    "heartbeat", "extend the lease by the lease TTL", run=run_heartbeat,
    opts=_TICKET + _STORE, one_of=(("ticket", "ticket_file"),),
)

RECONCILE = Command(
    "reconcile", "settle an unknown outcome: clear (it did not happen) or done (it did)",
    run=run_reconcile,
    opts=(Opt("--intent", VALUE, required=True),
          Opt("--action", VALUE, required=True, metavar="clear|done"),
          Opt("--result", VALUE, metavar="JSON", help="with done: the result that happened"),
          Opt("--result-file", VALUE, metavar="F", help="the result, from a file or -"),
          Opt("--reason", VALUE, help="why (kept in the ledger)")) + _STORE,
)

STATUS = Command(
    "status", "the ledger (counts, counters, fenced intents) or one intent", run=run_status,
    opts=(Opt("--intent", VALUE, help="show this intent only"),
          Opt("--limit", VALUE, metavar="N", type=int_arg, help="names listed per state "
              "(default 100)")) + _STORE,
)

VERIFY = Command(
    "verify", "check a certificate's hash and signature (and with --chain, its chain)",
    run=run_verify,
    opts=(Opt("--cert", VALUE, metavar="JSON", help="the certificate"),
          Opt("--cert-file", VALUE, metavar="F", help="the certificate, from a file or -"),
          Opt("--intent", VALUE, help="take the certificate from the store"),
          Opt("--chain", FLAG, help="verify the chain of parents up to --intent")) + _STORE,
    epilog="A signed certificate needs its key in $AGENT2PC_FENCE_HMAC_KEY. "
           "Exit 1 (invalid_certificate) when it does not verify.",
)

STORM = Command(
    "storm", "race many attempts at one intent; count how often the real effect ran",
    run=run_storm,
    opts=(Opt("--attempts", VALUE, required=True, metavar="N", type=int_arg),
          Opt("--workers", VALUE, required=True, metavar="W", type=int_arg,
              help="concurrent racers (threads, spread over the processes)"),
          Opt("--processes", VALUE, metavar="P", type=int_arg, help="worker processes "
              "(default 1)"),
          Opt("--effect-file", VALUE, metavar="F", help="append the effect's lines here "
              "(default: a temporary file)"),
          Opt("--intent", VALUE, help="the intent (default: a new one)"),
          Opt("--hold-ms", VALUE, metavar="N", type=int_arg, help="the winner holds the lease "
              "this long before committing")) + _STORE,
    epilog="Prints {ok, executions, replayed, refused, elapsed_ms, ...}; executions is the "
           "number of lines in the effect file. Exit 1 when it is not 1.",
)

SWEEP = Command(
    "sweep", "forget finished outcomes older than the result TTL, and idle domains",
    run=run_sweep,
    opts=(Opt("--limit", VALUE, metavar="N", type=int_arg, help="rows at most (default 1000)"),)
    + _STORE,
)

FENCE = Command(
    "fence", "exactly-once effects: prepare|commit|abort|heartbeat|reconcile|status|verify|storm",
    subcommands=(PREPARE, COMMIT, ABORT, HEARTBEAT, RECONCILE, STATUS, VERIFY, STORM, SWEEP),
)
