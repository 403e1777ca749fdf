"""Commands run in the staged view: checks (stage-cmd), captured runs (exec), look-arounds.

A *check* is a command the commit depends on: ``stage-cmd`` runs it in the staged view now and
records the outcome with a fingerprint of the staged content it saw; at commit, a check whose
fingerprint no longer matches runs again, and a check whose latest run failed is a no vote
(``verification_failed``). A check is identified by its command and options; its latest run
counts. What a check writes is thrown away, except paths matching ``--promote`` globs, which
become staged writes.

``exec`` runs a command (an agent, a shell, a build) in the staged view and stages what it
created, modified and deleted; a command that fails stages nothing (unless asked to keep what
it changed: ``keep_on_failure``). A session on a terminal that fails after changing files has
its capture *kept* aside (kept.py) for ``stage-kept``: an interactive session never loses its
work silently.

No transaction lock is held while a command runs: commands may call agent-2pc themselves (a
nested ``stage-write --tid T`` from inside the view lands in the real workspace). The staged
content is read under the lock, the view is built from that snapshot, and what is staged
afterwards is appended under the lock again.
"""

from __future__ import annotations

import json
import os

from ..core import records as log_records
from ..core.states import Tx
from ..errors import (
    Agent2PCError,
    CheckFailed,
    PathForbidden,
    PathOutsideRoot,
    TransactionAborted,
    UsageError,
)
from ..storage.blobs import BlobCorrupt, BlobStore, Pending
from ..storage.hashing import sha256_bytes
from .paths import FORBIDDEN_ANY, FORBIDDEN_TOP, resolve, resolve_dir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from ..core.records import StageRecord
    from ..isolation import Change, RunResult, StagedView
    from .gate import Gate
    from .journal import Journal
    from .staging import Staging

TIMEOUT_MS_DEFAULT = 10 * 60 * 1000
TIMEOUT_MS_MAX = 24 * 3600 * 1000
PROMOTE_GLOBS_MAX = 64
COMMAND_CHARS_MAX = 64 * 1024
ENV_VARS_MAX = 256
ENV_VALUE_CHARS_MAX = 32 * 1024
SESSION_FILE = "session.json"  # in a view's dir: what recover needs to salvage a session


def fingerprint(tx: Tx) -> str:
    """What a check saw: the transaction's net staged change (path, op, blob, mode; a link's
    target too)."""
    rows = [[op.path, op.op, op.blob, op.mode] if op.target is None else
            [op.path, op.op, op.blob, op.mode, op.target] for op in tx.changes()]
    return sha256_bytes(json.dumps(rows, separators=(",", ":")).encode("utf-8"))


def check_key(command: str | list[str], options: dict[str, Any]) -> str:
    """A check's identity: its command and options (the latest run of a key counts)."""
    return sha256_bytes(json.dumps([command, options], sort_keys=True,
                                   separators=(",", ":")).encode("utf-8"))[:16]


def _timeout_s(timeout_ms: int | None) -> float:
    if timeout_ms is None:
        timeout_ms = TIMEOUT_MS_DEFAULT
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not (
            0 < timeout_ms <= TIMEOUT_MS_MAX):
        raise UsageError(f"`timeout_ms` must be between 1 and {TIMEOUT_MS_MAX}",
                         params=("timeout_ms",))
    return timeout_ms / 1000.0


def _command(command: Any) -> str | list[str]:
    if isinstance(command, str):
        if not command.strip() or len(command) > COMMAND_CHARS_MAX:
            raise UsageError(f"the command must be 1 to {COMMAND_CHARS_MAX} characters")
        if "\0" in command:
            raise UsageError("the command may not contain a NUL byte")
        return command
    if (isinstance(command, (list, tuple)) and command
            and all(isinstance(a, str) for a in command)):
        if any("\0" in a for a in command):
            raise UsageError("an argument may not contain a NUL byte")
        return list(command)
    raise UsageError("the command is a string (run by /bin/sh -c) or a list of arguments")


def _recordable(value: Any, what: str) -> None:
    """``value`` goes into the log, which is UTF-8 JSON: refuse a lone surrogate."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not UTF-8 text; a check's command and options are "
                         "recorded as UTF-8") from None


def check_env(env: Any) -> dict[str, str]:
    """Variables to add to a check's environment: {NAME: value}, names without '=' or NUL."""
    if env is None:
        return {}
    if not isinstance(env, dict) or len(env) > ENV_VARS_MAX:
        raise UsageError(f"env is at most {ENV_VARS_MAX} NAME: value pairs")
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise UsageError(f"{name!r} is not an environment variable name")
        if not isinstance(value, str) or "\0" in value or len(value) > ENV_VALUE_CHARS_MAX:
            raise UsageError(f"the value of {name} must be a string without NUL, at most "
                             f"{ENV_VALUE_CHARS_MAX} characters")
    return dict(env)


def _glob_matcher(globs: list[str]) -> Callable[[str], bool]:
    from fnmatch import fnmatchcase

    if len(globs) > PROMOTE_GLOBS_MAX:
        raise UsageError(f"at most {PROMOTE_GLOBS_MAX} `promote` globs", params=("promote",))
    for g in globs:
        if not isinstance(g, str) or not g:
            raise UsageError("a `promote` glob is a non-empty string", params=("promote",))
    return lambda path: any(fnmatchcase(path, g) for g in globs)


class Runs:
    """stage-cmd, exec and looking around in the staged view."""

    def __init__(self, root: str, blobs: BlobStore, journal: Journal, gate: Gate,
                 staging: Staging) -> None:
        self.root = root
        self.blobs = blobs
        self.journal = journal
        self.layout = journal.layout
        self.gate = gate
        self.staging = staging

    # -- the view ----------------------------------------------------------------------------

    def snapshot(self, tid: str) -> Tx:
        """The transaction's state, checked active, read under its lock (then released)."""
        with self.gate.active(tid) as tx:
            return tx

    def _ignore(self) -> list[str]:
        """What runs may write without it being captured: the defaults (caches), the globs in
        ``.agent-tx/ignore`` (one per line, # comments), and $AGENT2PC_IGNORE (':'-separated)."""
        from ..isolation import DEFAULT_IGNORE

        patterns = list(DEFAULT_IGNORE)
        try:
            with open(os.path.join(self.layout.dir, "ignore"), encoding="utf-8") as f:
                patterns += [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
        except FileNotFoundError:
            pass
        patterns += [p for p in os.environ.get("AGENT2PC_IGNORE", "").split(":") if p]
        return patterns

    def _view(self, tx: Tx, tier: str | None = None) -> StagedView:
        from ..isolation import StagedView

        self.journal.check_confined(tx)  # the view is built from the log's paths and blob names
        try:
            return StagedView(self.root, tx.changes(), self.blobs, tier=tier,
                              ignore=self._ignore(), scratch_dir=self.layout.tx_dir(tx.tid),
                              trash_dir=self.layout.trash)
        except BlobCorrupt as exc:
            self.blobs.discard(exc.digest)
            raise TransactionAborted(f"staged content is damaged: {exc}; stage it again",
                                     code="corrupt_blob", tid=tx.tid) from None

    def _log_path(self, tid: str, kind: str) -> str:
        logs = os.path.join(self.layout.tx_dir(tid), "logs")
        os.makedirs(logs, exist_ok=True)
        return os.path.join(logs, f"{kind}-{os.urandom(4).hex()}.log")

    # -- checks ------------------------------------------------------------------------------

    def stage_cmd(self, tid: str, command: str | list[str], timeout_ms: int | None = None,
                  promote: list[str] | None = None, sandbox: bool = False,
                  network: bool = False, limits: dict[str, int] | None = None,
                  working_dir: str | None = None, env: dict[str, str] | None = None
                  ) -> dict[str, Any]:
        """Run a check in the staged view now and record it; at commit it runs again if the
        staged content changed since. A failing check raises TransactionAborted with code
        ``verification_failed`` (or ``timeout``) and the result — the transaction stays active.
        ``working_dir``: a directory of the view to run it in (default the root); ``env``:
        variables added to its environment (recorded with the check, as its command is)."""
        command = _command(command)
        cwd = "" if working_dir is None else resolve_dir(self.root, working_dir)
        extra_env = check_env(env)
        timeout_s = _timeout_s(timeout_ms)
        promote = list(promote or [])
        select = _glob_matcher(promote) if promote else None
        if network and not sandbox:
            raise UsageError("`network` only makes sense with `sandbox`",
                             params=("network", "sandbox"))
        if limits:
            from ..isolation import Limits

            Limits(**limits)  # a bad limit is refused before anything runs
        options: dict[str, Any] = {"timeout_ms": timeout_ms, "promote": promote,
                                   "sandbox": sandbox, "network": network,
                                   "limits": limits or {}}
        if cwd:  # only when given: a check's key (its identity) stays as it was without them
            options["working_dir"] = cwd
        if extra_env:
            options["env"] = extra_env
        _recordable([command, options], "the command (or a glob, or env)")
        tx = self.snapshot(tid)
        result, staged = self._run_check(tx, command, options, timeout_s, select)
        out = {**result, "promoted": staged}
        if not result["passed"]:
            code = _failure_code(result, "verification_failed")
            raise CheckFailed(
                f"the check {command!r} failed (exit {result['exit_code']}){_last_lines(out)}; "
                "the transaction stays active: fix and run it again, or abort", code=code,
                tid=tid, result={"tid": tid, **out})
        return out

    def _run_check(self, tx: Tx, command: str | list[str], options: dict[str, Any],
                   timeout_s: float, select: Callable[[str], bool] | None
                   ) -> tuple[dict[str, Any], list[str]]:
        """Run one check against ``tx``'s staged content, record it, promote if asked."""
        fp = fingerprint(tx)
        view = self._view(tx)
        staged: list[str] = []
        try:
            res = self._run(view, command, options, timeout_s, self._log_path(tx.tid, "check"))
            if res.passed and select is not None:
                staged = [c["path"] for c in
                          self._stage_changes(tx.tid, view, select, "promote")[0]]
        finally:
            view.close()
        result = _result_json(res)
        rec = {"key": check_key(command, options), "command": command, "options": options,
               "fingerprint": fp, **result}
        self.journal.append([log_records.check(tx.tid, **rec)])
        return result, staged

    def _run(self, view: StagedView, command: str | list[str], options: dict[str, Any],
             timeout_s: float, log_path: str | None, **kw: Any) -> RunResult:
        extra: dict[str, Any] = {}
        if options.get("sandbox"):
            extra["sandbox"] = True
            extra["network"] = bool(options.get("network"))
        if options.get("limits"):
            from ..isolation import Limits

            extra["limits"] = Limits(**options["limits"])
        if options.get("working_dir"):
            extra["cwd"] = options["working_dir"]
        if options.get("env"):
            extra["env"] = {**os.environ, **options["env"]}
        return view.run(command, timeout_s=timeout_s, log_path=log_path, **extra, **kw)

    def checks_to_run(self, tx: Tx) -> list[dict[str, Any]]:
        """The checks whose latest run saw other staged content than the transaction has now."""
        if not tx.checks:
            return []  # every commit asks: no fingerprint to compute without checks
        fp = fingerprint(tx)
        return [rec for rec in tx.checks.values() if rec["fingerprint"] != fp]

    def run_stale_checks(self, tid: str) -> tuple[bool, str | None, dict[str, Any] | None]:
        """At commit: run again the checks whose staged content changed; then every check's
        latest run must have passed. Returns (ok, reason, failing check's result)."""
        tx = self.journal.txs[tid]
        for rec in self.checks_to_run(tx):
            opts = rec["options"]
            select = _glob_matcher(opts["promote"]) if opts.get("promote") else None
            self._run_check(self.journal.txs[tid], rec["command"], opts,
                            _timeout_s(opts.get("timeout_ms")), select)
        for rec in self.journal.txs[tid].checks.values():
            if not rec["passed"]:
                what = "timed out" if rec.get("timed_out") else f"exited {rec['exit_code']}"
                return False, f"the check {rec['command']!r} {what} (log: {rec['log']})", rec
        return True, None, None

    # -- exec --------------------------------------------------------------------------------

    def exec_cmd(self, tid: str, argv: list[str], timeout_ms: int | None = None,
                 interactive: bool = True, stdout_fd: int | None = None,
                 tier: str | None = None, keep_on_failure: bool = False,
                 sandbox: bool = False, network: bool = False) -> dict[str, Any]:
        """Run ``argv`` in the staged view and stage everything it changed. A command that
        fails (or times out) stages nothing and raises CheckFailed with code
        ``command_failed`` (``timeout``); the transaction stays active. With
        ``keep_on_failure`` it stages what the command changed all the same (and still raises,
        with ``captured``). A session on a terminal of its own (``tty`` in the result) that
        fails after changing files keeps its capture aside (``kept`` in the error's result):
        ``stage_kept`` stages it. ``sandbox`` (and ``network``): confined as ``stage_cmd``'s."""
        command = _command(argv)
        timeout_s = None if timeout_ms is None else _timeout_s(timeout_ms)
        _check_network(sandbox, network)
        tx = self.snapshot(tid)
        view = self._view(tx, tier)
        try:
            if interactive:  # for recover, should we die during a terminal session
                with open(os.path.join(view.dir, SESSION_FILE), "w", encoding="utf-8") as f:
                    json.dump({"fingerprint": fingerprint(tx), "command": command}, f)
            log = None if interactive else self._log_path(tid, "exec")
            res = view.run(command, timeout_s=timeout_s, interactive=interactive,
                           stdout_fd=stdout_fd if interactive else None, log_path=log,
                           sandbox=sandbox, network=network)
            result = _result_json(res)
            if not res.passed:
                raise self._exec_failed(tx, command, res, result, view, keep_on_failure)
            captured, skipped = self._stage_changes(tid, view, None, "exec")
        finally:
            view.close()
        return {**result, "captured": captured, "skipped": skipped}

    def _exec_failed(self, tx: Tx, command: str | list[str], res: RunResult,
                     result: dict[str, Any], view: StagedView, keep: bool) -> CheckFailed:
        """The answer to an exec whose command did not pass: stage its changes (``keep``),
        keep them aside (a terminal session), or drop them."""
        tid = tx.tid
        code = _failure_code(result, "command_failed")
        what = "timed out" if res.timed_out else f"failed (exit {res.exit_code})"
        out: dict[str, Any] = {"tid": tid, **result, "captured": []}
        if keep:
            out["captured"], out["skipped"] = self._stage_changes(tid, view, None, "exec")
            n = len(out["captured"])
            return CheckFailed(f"{command!r} {what}; its {n} change{'s' if n != 1 else ''} "
                               "were staged all the same (keep on failure); the transaction "
                               "stays active", code=code, tid=tid, result=out)
        msg = f"{command!r} {what}; nothing was staged and the transaction stays active"
        if res.tty:
            from . import kept

            cap = view.capture()
            held = kept.keep(self.layout.tx_dir(tid), self.layout.trash, tx, fingerprint(tx),
                             cap, {"command": command, **result})
            if held is not None:
                out["kept"] = held
                n = held["changes"]
                msg += (f". Its {n} change{'s' if n != 1 else ''} are kept: "
                        f"`agent-2pc stage-kept --tid {tid}` stages them")
        return CheckFailed(msg, code=code, tid=tid, result=out)

    def sweep_views(self) -> dict[str, int]:
        """For recover: remove what staged views of dead callers left (isolation/_owner.py),
        keeping aside what a terminal session of exec had changed in an overlay view when its
        caller was killed (as a failed session's capture is kept: ``stage_kept``)."""
        from ..isolation._owner import sweep

        salvaged: list[str] = []

        def salvage(tid: str, view_dir: str) -> None:
            if self._salvage_session(tid, view_dir):
                salvaged.append(tid)

        out = sweep(self.layout.tx, self.layout.trash, salvage)
        out["kept"] = len(salvaged)
        return out

    def _salvage_session(self, tid: str, view_dir: str) -> bool:
        from ..isolation import FUSE, OVERLAY, Ignore
        from ..isolation._capture import capture_upper
        from ..isolation._layer import Layer
        from ..isolation._view import SESSION_MARK
        from . import kept

        tx = self.journal.txs.get(tid)
        upper = os.path.join(view_dir, "upper")
        tier = next((t for t in (OVERLAY, FUSE)
                     if os.path.exists(os.path.join(view_dir, SESSION_MARK + t))), None)
        if tx is None or tx.state != "active" or tier is None or not os.path.isdir(upper):
            return False
        try:
            with open(os.path.join(view_dir, SESSION_FILE), encoding="utf-8") as f:
                session = json.load(f)
        except (OSError, ValueError):
            return False
        fp = fingerprint(tx)
        if session.get("fingerprint") != fp:
            return False  # staged since: what the session saw is not known any more
        cap = capture_upper(upper, Layer(self.root, tx.changes(), self.blobs),
                            Ignore(self._ignore()), fuse=tier == FUSE)
        return kept.keep(self.layout.tx_dir(tid), self.layout.trash, tx, fp, cap,
                         {"command": session.get("command"), "exit_code": None,
                          "timed_out": False}) is not None

    def stage_kept(self, tid: str) -> dict[str, Any]:
        """Stage the capture that the last failed terminal session of ``exec`` kept aside
        (kept.py); then it is gone. NotFound when there is none; BadState when a path of it
        was staged differently since that session began."""
        from . import kept

        tx_dir = self.layout.tx_dir(tid)
        tx = self.snapshot(tid)
        manifest, changes = kept.load(tx_dir, tid)
        kept.check_fits(manifest, tx, fingerprint(tx))
        captured, skipped = self._stage_captured(tid, changes, manifest["skipped"], "exec")
        kept.drop(tx_dir, self.layout.trash)
        return {"captured": captured, "skipped": skipped, "command": manifest["command"],
                "exit_code": manifest["exit_code"]}

    def stage_wasm(self, tid: str, module: str, args: list[str] | None = None,
                   fuel: int | None = None, max_memory_mb: int | None = None,
                   timeout_ms: int | None = None, interactive: bool = False,
                   stdout_fd: int | None = None) -> dict[str, Any]:
        """Run a WASI module in the staged view (wasmtime; the view's root preopened at /) and
        stage what it wrote, as exec does. A budget that runs out (``tripped``: fuel,
        max_memory_mb, timeout_ms) or a failing module stages nothing and raises CheckFailed
        (``limit_exceeded``, ``timeout``, ``command_failed``)."""
        from ..isolation.wasi import run_wasm

        timeout_s = None if timeout_ms is None else _timeout_s(timeout_ms)
        tx = self.snapshot(tid)
        view = self._view(tx)
        try:
            res = run_wasm(view, module, list(args or []), fuel=fuel,
                           max_memory_mb=max_memory_mb, timeout_s=timeout_s,
                           interactive=interactive, stdout_fd=stdout_fd if interactive else None,
                           log_path=None if interactive else self._log_path(tid, "wasm"))
            result = res.to_json()
            if not res.passed:
                code = ("limit_exceeded" if res.tripped in ("fuel", "max_memory_mb") else
                        "timeout" if res.timed_out else "command_failed")
                raise CheckFailed(f"the module {module!r} did not finish cleanly "
                                  f"({res.outcome}: {res.message or res.exit_code}); nothing "
                                  "was staged and the transaction stays active", code=code,
                                  tid=tid, result={"tid": tid, **result, "captured": []})
            captured, skipped = self._stage_changes(tid, view, None, "exec")
        finally:
            view.close()
        return {**result, "captured": captured, "skipped": skipped}

    def view_run(self, tid: str, command: str | list[str], timeout_ms: int | None = None,
                 sandbox: bool = False, network: bool = False,
                 env: dict[str, str] | None = None) -> dict[str, Any]:
        """Run a command in the staged view to look around: output returned, nothing
        captured, no check recorded. ``sandbox`` (and ``network``) as for ``stage_cmd``;
        ``env``: the command's whole environment (default: ours)."""
        command = _command(command)
        _check_network(sandbox, network)
        tx = self.snapshot(tid)
        view = self._view(tx)
        try:
            res = view.run(command, timeout_s=_timeout_s(timeout_ms),
                           log_path=self._log_path(tid, "look"), tail_bytes=64 * 1024,
                           sandbox=sandbox, network=network, env=env)
        finally:
            view.close()
        return _result_json(res)

    def git_hooks(self, tid: str, message: str, branch: str | None, verify: bool
                  ) -> tuple[str, list[dict[str, Any]], str]:
        """git's hooks due before a git-commit of ``tid``, in its staged view
        (participants/git_hooks.py): the message as they left it, what ran, and git's hooks
        directory."""
        from ..participants import git_hooks

        return git_hooks.before_commit(
            self.root, self.snapshot(tid), message, branch, self.blobs.path, verify,
            lambda argv, env, timeout_ms: self.view_run(tid, argv, timeout_ms, env=env))

    # -- staging what a run changed ------------------------------------------------------------

    def _stage_changes(self, tid: str, view: StagedView, select: Callable[[str], bool] | None,
                       via: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Stage what a run changed (files written and deleted, links, empty directories made
        and removed) in one append: all of it or, if the append fails, nothing. A path that
        may not be staged is listed under ``skipped`` with the reason and the rest is staged; a
        change that does not fit the staged view (a file where a directory is) stages nothing
        and raises NotAFile.

        A captured path is literal: a link at its last component is the path itself (``rm
        link`` stages the deletion of the link, never of its target), and a path below a link
        of the tree is skipped (staging it would change the link's target instead) unless the
        link itself is replaced by a directory."""
        cap = view.capture(select)
        # Every caller closes the view right after: its files are moved into the blob store.
        return self._stage_captured(tid, cap.changes, cap.skipped, via, move=True)

    def _stage_captured(self, tid: str, changes: list[Change], skipped_in: list[Any],
                        via: str, move: bool = False
                        ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        _names_are_text(changes)
        skipped = [dict(s) for s in skipped_in]
        staged: list[dict[str, Any]] = []
        pending: list[Pending] = []
        with self.gate.active(tid) as tx:
            records: list[StageRecord] = []
            puts: dict[str, str] = {}  # path -> op, staged by this capture so far
            # What was learnt of the tree, asked once per directory rather than per file:
            # the parents that resolve to themselves, what the tree has at each parent.
            real_parents: set[str] = set()
            memo: dict[str, int] = {}
            try:
                for c in changes:
                    try:
                        rel, below_link = self._literal(tx, c.path, puts, real_parents)
                    except Agent2PCError as exc:  # forbidden, or through a link
                        skipped.append({"path": c.path, "kind": c.op, "reason": str(exc)})
                        continue
                    pre = self._pre_literal(tx, rel, below_link, memo)
                    if c.op != "delete":
                        self.staging.check_placeable(tx, rel, puts, kind=c.op, memo=memo)
                    if c.op == "delete":
                        rec = self.staging.stage_record(tid, rel, "delete", via, None, 0, None, pre)
                    elif c.op == "symlink":
                        assert c.target is not None
                        rec = log_records.stage(tid, path=rel, op="symlink", via=via,
                                         blob=None, size=0, mode=None, pre=pre,
                                         target=c.target)
                    elif c.op == "mkdir":
                        rec = self.staging.stage_record(tid, rel, "mkdir", via, None, 0,
                                                        c.mode, pre)
                    else:
                        assert c.op == "write" and c.source is not None, c
                        blob = self._put_captured(c.source, move, tid)
                        pending.append(blob)
                        if not below_link:
                            self.staging.keep_base(tx, rel, pre, pending)
                        rec = self.staging.stage_record(tid, rel, "write", via, blob.digest,
                                                        blob.size, c.mode, pre)
                    records.append(rec)
                    puts[rel] = c.op
                    row = c.to_json()
                    if row.get("mode") is not None:
                        row["mode"] = rec["mode"]  # as staged: permission bits only
                    staged.append(row)
            except BaseException:
                for p in pending:
                    p.discard()
                raise
            if records:
                self.staging.append_staged(records, pending)
        return staged, skipped

    def _put_captured(self, source: str, move: bool, tid: str) -> Pending:
        if move:
            return self.blobs.put_moved(source, spare=f"spare-{tid}-")
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return self.blobs.put_fd(fd)
        finally:
            os.close(fd)

    def _literal(self, tx: Tx, path: str, puts: dict[str, str],
                 real_parents: set[str]) -> tuple[str, bool]:
        """``path`` as a command wrote it (relative to the root), checked: inside the root,
        outside .git/ and .agent-tx/, its last component not followed. Its directory must
        resolve to itself, unless the first link on the way is replaced by this step or the
        transaction (deleted, or made a directory): then nothing of the tree is below it.
        Returns (path, whether it lies below such a replaced link)."""
        parent, _, name = path.rpartition("/")
        parts = path.split("/")
        if not name or any(p in ("", ".", "..", FORBIDDEN_ANY) for p in parts) or \
                parts[0] == FORBIDDEN_TOP:
            raise PathForbidden(f"{path!r} may not be staged", path=path)
        if not parent or parent in real_parents:
            return path, False
        try:
            if resolve(self.root, parent) == parent:
                real_parents.add(parent)
                return path, False
        except (PathForbidden, PathOutsideRoot):
            pass  # a link on the way leads outside the root or into .git/
        link = _first_link(self.root, parent)
        if link is not None:
            op = puts.get(link)
            if op is None:
                staged = tx.staged(link)
                op = staged.op if staged is not None else None
            if op in ("delete", "mkdir"):
                return path, True
        raise PathForbidden(f"{link or parent} is a symbolic link in the tree: a path through "
                            "it is not staged", path=path)

    def _pre_literal(self, tx: Tx, rel: str, below_link: bool,
                     memo: dict[str, int]) -> str | None:
        op = tx.staged(rel)
        if op is not None:
            return op.pre
        if below_link or self.staging.tree_lacks_parent(rel, memo):
            return None
        return self.staging.tree_fingerprint(rel)


def _names_are_text(changes: list[Any]) -> None:
    """The log holds paths and link targets as UTF-8: a command that made a name of other
    bytes stages nothing (all or nothing), and the error says which name."""

    def shown(name: str) -> str:
        return os.fsencode(name).decode("utf-8", "backslashreplace")

    for c in changes:
        for name in (c.path, c.target):
            try:
                name is None or name.encode("utf-8")
            except UnicodeEncodeError:
                what = (f"the link '{shown(c.path)}' points to '{shown(name)}'" if name is
                        c.target else f"the command made '{shown(name)}' ({c.op})")
                raise UsageError(f"{what}, which is not UTF-8; agent-2pc records names as "
                                 "UTF-8, so nothing was staged: use a UTF-8 name and run it "
                                 "again", path=shown(c.path)) from None


def _check_network(sandbox: bool, network: bool) -> None:
    if network and not sandbox:
        raise UsageError("`network` only makes sense with `sandbox`",
                         params=("network", "sandbox"))


def _last_lines(result: dict[str, Any], n: int = 3) -> str:
    lines = [ln.strip() for ln in (result.get("tail") or "").splitlines() if ln.strip()][-n:]
    return (": " + " | ".join(lines)) if lines else ""


def _first_link(root: str, rel: str) -> str | None:
    """The first component of ``rel`` (a literal path below ``root``) that is a symbolic
    link in the tree, if any."""
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if os.path.islink(os.path.join(root, prefix)):
            return prefix
    return None


def _result_json(res: RunResult) -> dict[str, Any]:
    out = res.to_json()
    out.setdefault("tripped", None)  # the contract's field: the limit that stopped it, or null
    return out


def _failure_code(result: dict[str, Any], otherwise: str) -> str:
    """The error code of a run that did not pass: a plain timeout, a governor limit, or the
    command's own failure."""
    tripped = result.get("tripped")
    if tripped == "timeout_ms" or (tripped is None and result.get("timed_out")):
        return "timeout"
    if tripped:
        return "limit_exceeded"
    return otherwise


def stage_vm_unavailable() -> Agent2PCError:
    """What ``stage-vm`` answers: microVMs need KVM and a VM monitor; say what is missing."""
    from shutil import which

    from ..errors import IsolationUnavailable

    missing = []
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        missing.append("/dev/kvm (KVM) is not available to this user")
    monitors = [m for m in ("firecracker", "cloud-hypervisor", "qemu-system-x86_64",
                            "qemu-system-aarch64") if which(m)]
    if not monitors:
        missing.append("no VM monitor is installed (firecracker, cloud-hypervisor or qemu)")
    if missing:
        why = "; ".join(missing)
    else:
        why = (f"KVM and {monitors[0]} are here, but agent-2pc does not run steps in microVMs "
               "yet")
    return IsolationUnavailable(f"stage-vm cannot run on this host: {why}. Use stage-cmd "
                                "with `sandbox` for confinement.", missing=missing,
                                params=("sandbox",))
