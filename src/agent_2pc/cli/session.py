"""``agent-2pc session -- PROGRAM ARGS``: begin, run PROGRAM (any CLI agent, a shell) in the
staged view on the caller's terminal, show what it changed, run the checks, then ask: commit,
abort, show the diff, or keep the transaction open for later.

The work is never lost: it is staged as soon as the program exits, whatever its exit status (a
crash of agent-2pc during the program leaves it to ``recover`` and ``stage-kept``, as ``exec``'s
terminal sessions do); Ctrl-C (during the program or at the question) and end of input leave
the transaction active and say how to resume (docs/cli.md, "session").
"""

from __future__ import annotations

import sys

from ..errors import Agent2PCError, CheckFailed, Refusal, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..coordinator.client import Transaction

# A program that ends by one of these (128 + SIGHUP, SIGINT, SIGQUIT) was interrupted by the
# person at the terminal: the session stops there, its work kept in the active transaction.
INTERRUPTED_EXITS = (129, 130, 131)
QUESTION = "[c]ommit, [a]bort, [d]iff, [k]eep for later? "


class SessionInterrupted(Refusal):
    """The program or the question was interrupted (Ctrl-C): the transaction stays active."""

    code = "interrupted"
    exit_status = 130


def resume_hint(tid: str) -> str:
    return (f"transaction {tid} stays active: `agent-2pc diff --tid {tid}` shows it, "
            f"`agent-2pc commit --tid {tid}` commits it, `agent-2pc abort --tid {tid}` drops it")


def _say(text: str) -> None:
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


def _run_program(tx: Transaction, argv: list[str], as_json: bool) -> dict[str, Any]:
    """Run the program on this terminal; stage what it changed whatever its exit status."""
    try:
        return tx.exec(argv, interactive=True, keep_on_failure=True,
                       stdout_fd=2 if as_json else None)
    except CheckFailed as err:  # it failed: its changes are staged all the same
        result = err.details.get("result")
        if not isinstance(result, dict) or "exit_code" not in result:
            raise
        return result


def _summary(tx: Transaction, run: dict[str, Any]) -> dict[str, Any]:
    files = tx.diff(stat=True)["files"]
    return {"exit_code": run.get("exit_code"), "timed_out": bool(run.get("timed_out")),
            "files": files}


def text_files(files: list[dict[str, Any]]) -> str:
    if not files:
        return "no changes"
    mark = {"added": "A", "modified": "M", "deleted": "D"}
    lines = [f"{len(files)} file{'s' if len(files) != 1 else ''} changed:"]
    lines += [f"  {mark.get(f['status'], '?')} {f['path']}  +{f.get('additions', 0)} "
              f"-{f.get('deletions', 0)}" for f in files]
    return "\n".join(lines)


def _run_checks(tx: Transaction, checks: list[str], quiet: bool) -> list[dict[str, Any]]:
    """Run each check in the staged view (recorded with the transaction: commit runs it again
    if the content changes). The answer lists ``{command, passed, exit_code, log}``."""
    out = []
    for command in checks:
        r: dict[str, Any]
        try:
            r = tx.stage_cmd(command)
        except CheckFailed as err:
            got = err.details.get("result")
            r = {**(got if isinstance(got, dict) else {}), "passed": False}
        row = {"command": command, "passed": bool(r.get("passed")),
               "exit_code": r.get("exit_code"), "log": r.get("log")}
        out.append(row)
        if not quiet:
            _say(f"check {'passed' if row['passed'] else 'FAILED'}: {command}"
                 + ("" if row["passed"] else f" (exit {row['exit_code']}; log: {row['log']})"))
    return out


def _ask(prompt: str) -> str | None:
    """One answer from the person (None at end of input)."""
    sys.stderr.write(prompt)
    sys.stderr.flush()
    line = sys.stdin.readline()
    return line.strip().lower() if line else None


def _kept(tid: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"tid": tid, "state": "active", **extra}


def run_session(ctx: Any, args: dict[str, Any]) -> dict[str, Any] | None:
    argv = args["argv"]
    if not argv:
        raise UsageError("session needs a program after '--': agent-2pc session -- PROGRAM ARGS")
    as_json = ctx.json
    client = ctx.client()
    tx = client.begin(label=args["label"] or "session: " + " ".join(argv)[:80])
    tid = tx.tid
    if not as_json:
        _say(f"agent-2pc session {tid}: {argv[0]} runs in the staged view; nothing reaches the "
             "tree until you commit")
    try:
        run = _run_program(tx, argv, as_json)
    except KeyboardInterrupt:
        raise SessionInterrupted("interrupted; " + resume_hint(tid),
                                 result=_kept(tid, {})) from None
    except Agent2PCError as err:  # it could not run (no isolation, bad name...)
        if not tx.status().get("files"):
            tx.abort(f"session: {err.code}")
        else:
            err.message += "; " + resume_hint(tid)
        raise
    summary = _summary(tx, run)
    code = summary["exit_code"]
    if code in INTERRUPTED_EXITS:
        if not as_json:
            _say(text_files(summary["files"]))
        raise SessionInterrupted(f"{argv[0]} was interrupted (exit {code}); its work is "
                                 "staged; " + resume_hint(tid), result=_kept(tid, summary))
    if not as_json:
        _say(f"{argv[0]} exited {code}" + (" (timed out)" if summary["timed_out"] else "")
             + "; " + text_files(summary["files"]))
    try:
        checks = _run_checks(tx, args["check"], quiet=as_json)
    except KeyboardInterrupt:
        raise SessionInterrupted("interrupted; " + resume_hint(tid),
                                 result=_kept(tid, summary)) from None
    summary["checks"] = checks
    failed = [c["command"] for c in checks if not c["passed"]]
    if args["yes"] or as_json:
        return _unattended(ctx, tx, summary, failed, commit=args["yes"])
    try:
        return _prompt(tx, summary, failed)
    except KeyboardInterrupt:
        _say("")
        raise SessionInterrupted("interrupted; " + resume_hint(tid),
                                 result=_kept(tid, summary)) from None


def _unattended(ctx: Any, tx: Transaction, summary: dict[str, Any], failed: list[str],
                commit: bool) -> dict[str, Any]:
    """``--yes``: commit when the program succeeded and the checks passed; else keep the
    transaction (exit 1). ``--json`` without ``--yes``: keep it, and say what it holds."""
    tid = tx.tid
    if not commit:
        return _kept(tid, summary)
    if summary["exit_code"] != 0:
        raise CheckFailed(f"the program failed (exit {summary['exit_code']}): not committed; "
                          + resume_hint(tid), code="command_failed", tid=tid,
                          result=_kept(tid, summary))
    if failed:
        raise CheckFailed("check failed: " + ", ".join(failed) + "; not committed; "
                          + resume_hint(tid), tid=tid, result=_kept(tid, summary))
    return {**tx.commit(), "checks": summary["checks"]}


def _prompt(tx: Transaction, summary: dict[str, Any], failed: list[str]) -> dict[str, Any]:
    tid = tx.tid
    while True:
        answer = _ask(QUESTION)
        if answer is None or answer in ("k", "keep"):
            _say(resume_hint(tid))
            return _kept(tid, summary)
        if answer in ("c", "commit"):
            if failed:
                _say("not committed: check failed (" + ", ".join(failed) + "), so commit would "
                     "abort the transaction. Fix it with `agent-2pc exec --tid " + tid
                     + " -- ...`, or answer a (abort) or k (keep)")
                continue
            return tx.commit()
        if answer in ("a", "abort"):
            return tx.abort("session: aborted at the question")
        if answer in ("d", "diff"):
            text = tx.diff()["diff"] or "(no changes)"
            show(text if text.endswith("\n") else text + "\n")
            continue
        _say("answer c, a, d or k")


def show(text: str) -> None:
    """Print ``text``; on a terminal through the pager as git does ($AGENT2PC_PAGER, else
    $PAGER, else ``less -FRX``: it quits at once when the text fits the screen)."""
    import os

    pager = os.environ.get("AGENT2PC_PAGER", os.environ.get("PAGER", "less -FRX"))
    if pager and pager != "cat" and sys.stdout.isatty():
        import subprocess

        try:
            proc = subprocess.Popen(pager, shell=True, stdin=subprocess.PIPE)
            assert proc.stdin is not None
            try:
                proc.stdin.write(text.encode("utf-8", "surrogateescape"))
                proc.stdin.close()
            except BrokenPipeError:  # the person quit before the end
                pass
            if proc.wait() != 127:  # 127: the shell found no such pager
                return
        except OSError:
            pass
    sys.stdout.write(text)
    sys.stdout.flush()


def text_session(r: dict[str, Any]) -> str:
    if r["state"] == "active":
        return f"kept {r['tid']} (active)"
    from .commands import text_outcome

    return text_outcome(r)
