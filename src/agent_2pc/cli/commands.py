"""The CLI's command table: each command parses, calls the library, and names its renderer.

Results are the library's dicts; cli/output.py adds ``ok`` and prints JSON or text.
"""

from __future__ import annotations

import json
import os

from ..core.paging import LIST_LIMIT, LIST_LIMIT_MAX
from ..errors import UsageError
from . import distributed
from .args import FLAG, MULTI, Command, Opt, int_arg
from .bundle import EXPORT, IMPORT
from .daemon import DAEMON
from .fence import FENCE
from .hook import HOOK
from .mcp import MCP
from .session import run_session, text_session

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

TID = Opt("--tid", required=True, metavar="TID", help="the transaction id")
LIMIT_NAMES = ("max_runtime_ms", "max_cpu_ms", "max_procs", "max_memory_mb",
               "max_files_written", "max_forks_per_s", "max_deletes_per_s", "max_disk_mb")
LIMIT_HELP = {"max_runtime_ms": "wall time (ms)", "max_cpu_ms": "CPU time (ms)",
              "max_procs": "number of processes", "max_memory_mb": "memory (MiB)",
              "max_files_written": "number of files written",
              "max_forks_per_s": "rate of process creation (per s)",
              "max_deletes_per_s": "rate of deletions (per s)",
              "max_disk_mb": "disk space written (MiB, files and log)"}
CMD_OPTS = (
    TID,
    Opt("--command", required=True, metavar="C", help="the command line (run by /bin/sh -c)"),
    Opt("--timeout-ms", type=int_arg, metavar="N", help="kill it after N ms (default 10 min)"),
    Opt("--promote", MULTI, metavar="GLOB", help="stage the files it writes that match GLOB"),
    Opt("--working-dir", metavar="DIR", help="run it in DIR of the staged view (default: the "
        "root)"),
    Opt("--env", MULTI, metavar="NAME=VALUE", help="add a variable to its environment "
        "(repeatable; recorded with the check)"),
)
PATH = Opt("--path", required=True, metavar="PATH", help="a path relative to the root")


def octal_mode(value: str) -> int:
    try:
        return int(value, 8)
    except ValueError:
        raise UsageError(f"--mode takes an octal permission like 0644 or 0755, not {value!r}"
                         ) from None


# -- runners ---------------------------------------------------------------------------------


def run_init(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..storage.workspace import init

    return {"root": init(args["root"] or os.environ.get("AGENT2PC_ROOT") or os.getcwd())}


def run_trust(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..coordinator.client import Agent2PC

    return Agent2PC.trust(ctx.root_arg)


def text_trust(r: dict[str, Any]) -> str:
    live = r["transactions"]
    lines = [f"trusted {r['root']}" + (f"; {len(live)} live transaction(s), which the next "
                                       "command finishes or keeps:" if live else "")]
    lines += [f"  {t['tid']} {t['state']} {t['label'] or ''}" for t in live]
    return "\n".join(lines)


def run_begin(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    if args["global"]:
        return distributed.begin(args)
    tx = ctx.client().begin(timeout_ms=args["timeout_ms"], label=args["label"],
                            git_branch=args["git_branch"])
    return {"tid": tx.tid} if args["git_branch"] is None else \
        {"tid": tx.tid, "git_branch": args["git_branch"]}


def run_record_read(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).record_read_result(args["path"])


def run_stage_write(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    tx = ctx.tx(args)
    if args["content"] is not None:
        return tx.stage_write(args["path"], args["content"].encode("utf-8", "surrogateescape"),
                              mode=args["mode"])
    from ..sources import open_source

    fd = 0 if args["stdin"] else open_source(args["from_file"])
    try:
        return tx.stage_write_file(args["path"], fd, mode=args["mode"])
    finally:
        if fd:
            os.close(fd)


def run_stage_delete(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).stage_delete(args["path"])


def run_stage_replace(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).stage_replace(args["path"], args["old"], args["new"], all=args["all"])


def run_stage_patch(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from .inputs import read_input

    patch = read_input("-" if args["stdin"] else args["patch_file"])
    return ctx.tx(args).stage_patch(patch)


def _json_arg(flag: str, value: str | None) -> Any:
    from .inputs import load_json

    return None if value is None else load_json(value, what=flag)


def run_stage_api(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    headers: dict[str, str] = {}
    for item in args["header"]:
        name, sep, value = item.partition(":")
        if not sep:
            raise UsageError(f"--header takes NAME:VALUE, not {item!r}")
        headers[name.strip()] = value.strip()
    compensate = None
    if args["compensate_method"] or args["compensate_url"] or args["compensate_body"]:
        compensate = {"method": args["compensate_method"], "url": args["compensate_url"],
                      "body": _json_arg("--compensate-body", args["compensate_body"])}
    return ctx.tx(args).stage_api(args["method"], args["url"], _json_arg("--body", args["body"]),
                                  headers, args["idempotency_key"], compensate)


def run_stage_sql(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    if args["sql"] is not None:
        sql = args["sql"]
    else:
        from .inputs import read_input

        data = read_input(args["file"], limit=1 << 20)
        try:
            sql = data.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{args['file']} is not UTF-8 text") from None
    return ctx.tx(args).stage_sql(args["dsn"], sql)


def text_sql(r: dict[str, Any]) -> str:
    return (f"staged SQL step {r['n']}: {r['rows_affected']} rows affected (rolled back until "
            "commit)")


def _limits(args: dict[str, Any]) -> dict[str, int]:
    return {name: args[name] for name in LIMIT_NAMES if args.get(name) is not None}


def _env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env takes NAME=VALUE, not {item!r}")
        env[name] = value
    return env


def run_stage_cmd(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).stage_cmd(
        args["command"], timeout_ms=args["timeout_ms"], promote=args["promote"],
        sandbox=args.get("sandbox", False), network=args.get("network", False),
        limits=_limits(args) or None, working_dir=args["working_dir"], env=_env(args["env"]))


def run_exec(ctx: Any, args: dict[str, Any]) -> dict[str, Any] | None:
    if not args["argv"]:
        raise UsageError("exec needs a command after '--': agent-2pc exec --tid T -- CMD ARGS")
    out = ctx.tx(args).exec(args["argv"], timeout_ms=args["timeout_ms"], interactive=True,
                            stdout_fd=2 if ctx.json else None,
                            keep_on_failure=args["keep_on_failure"], sandbox=args["sandbox"],
                            network=args["network"])
    if ctx.json:
        return out
    import sys

    sys.stderr.write(text_exec(out) + "\n")  # stdout belonged to the command
    return None


def run_stage_kept(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).stage_kept()


def run_stage_wasm(ctx: Any, args: dict[str, Any]) -> dict[str, Any] | None:
    out = ctx.tx(args).stage_wasm(
        args["module"], args["argv"], fuel=args["fuel"],
        max_memory_mb=args["max_memory_mb"], timeout_ms=args["timeout_ms"], interactive=True,
        stdout_fd=2 if ctx.json else None)
    if ctx.json:
        return out
    import sys

    sys.stderr.write(text_exec(out) + "\n")
    return None


def run_stage_vm(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).stage_vm()


def run_diff(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).diff(stat=args["stat"])


def run_status(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    if distributed.is_global(args["tid"]):
        return distributed.status(args)
    return ctx.client().status(args["tid"])


def run_list(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..core.states import STATES

    if args["state"] is not None and args["state"] not in STATES:
        raise UsageError(f"--state is one of {', '.join(STATES)}")
    limit = LIST_LIMIT if args["limit"] is None else args["limit"]
    if not 0 < limit <= LIST_LIMIT_MAX:
        raise UsageError(f"--limit is a whole number from 1 to {LIST_LIMIT_MAX}",
                         params=("limit",))
    rows = ctx.client().transactions(args["state"], limit=limit + 1, before=args["before"])
    # One more than the page: is there an older one? (--before the first row's tid)
    return {"transactions": rows[-limit:], "more": len(rows) > limit}


def run_savepoint(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).savepoint(args["name"])


def run_rollback_to(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).rollback_to(args["name"])


def run_commit(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).commit(merge=not args["no_merge"])


def run_merge(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..coordinator.client import Agent2PC

    return Agent2PC.merge_files(args["base"], args["ours"], args["theirs"], args["output"])


def run_git_commit(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    message = args["message"]
    if args["file"] is not None:
        message = _message_file(args["file"])
    return ctx.tx(args).git_commit(message, author=args["author"], branch=args["branch"],
                                   verify=not args["no_verify"], sign=args["sign"] or None)


def _message_file(path: str) -> str:
    """git commit -F: the message from a file, or stdin for "-"; UTF-8 text."""
    from ..participants.git import MESSAGE_BYTES_MAX
    from .inputs import read_input

    data = read_input(path, "the message file", MESSAGE_BYTES_MAX)
    if len(data) > MESSAGE_BYTES_MAX:
        raise UsageError(f"the message file {path} is over {MESSAGE_BYTES_MAX} bytes",
                         params=("file",))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"the message file {path} is not UTF-8 text",
                         params=("file",)) from None


def text_git_commit(r: dict[str, Any]) -> str:
    out = text_outcome(r)
    if r.get("commit"):
        out += f"\n[{r['branch']} {r['commit'][:12]}]"
    return out


def run_abort(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).abort(args["reason"])


def run_recover(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.client().recover()


def run_vote(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.tx(args).vote(_json_arg("--coordinator", args["coordinator"]))


def run_decide(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.client().decide(args["tid"], args["outcome"], args["reason"])


def run_in_doubt(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return {"in_doubt": ctx.client().in_doubt()}


def text_in_doubt(r: dict[str, Any]) -> str:
    rows = r["in_doubt"]
    if not rows:
        return "(no prepared transaction waits for a decision)"
    return "\n".join(f"{row['tid']}  prepared, in doubt: {len(row['files'])} "
                     f"file{'s' if len(row['files']) != 1 else ''}; coordinator "
                     f"{json.dumps(row['coordinator'], sort_keys=True)}" for row in rows)


def run_compact(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.client().compact()


def run_undo(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.client().undo(args["tid"])


def text_undo(r: dict[str, Any]) -> str:
    return text_outcome(r) + f" (undoes {r['undoes']})"


def run_log(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return ctx.client().log(limit=args["limit"], verify=args["verify"])


def text_log(r: dict[str, Any]) -> str:
    if "verified" in r:
        return (f"verified: {r['verified']} chained line(s)"
                + (f", {r['unchained']} older line(s) without hashes covered by the first"
                   if r["unchained"] else ""))
    lines = []
    for e in r["entries"]:
        head = f"{e['tid']} {e['state']} {e['at'] or ''} {e.get('label') or ''}".rstrip()
        lines.append(head)
        if e.get("files"):
            lines.append("  files: " + ", ".join(e["files"]))
        if e.get("checks"):
            lines.append("  checks passed: " + ", ".join(
                c if isinstance(c, str) else " ".join(map(str, c)) for c in e["checks"]))
        if e.get("reason"):
            lines.append(f"  {e.get('code')}: {e['reason']}")
        if e.get("undoes"):
            lines.append(f"  undoes {e['undoes']}")
        if e.get("undone_by"):
            lines.append(f"  undone by {e['undone_by']}")
        lines.append(f"  hash {(e['hash'] or '')[:16]}")
    return "\n".join(lines) or "no finished transactions"


def run_batch(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..core.jsonin import JSON_BYTES_MAX
    from .inputs import read_input

    data = read_input(args["file"], "the manifest", JSON_BYTES_MAX)
    return ctx.client().run_batch(data)


def run_demo(ctx: Any, args: dict[str, Any]) -> None:
    from ..demo import main as demo

    demo(keep=args["keep"])
    return None


# -- text renderers --------------------------------------------------------------------------


def text_begin(r: dict[str, Any]) -> str:
    return str(r["tid"])


def text_staged(r: dict[str, Any]) -> str:
    extra = (f" ({r['bytes']} bytes)" if "bytes" in r else
             f" ({r['replacements']} replacement{'s' if r['replacements'] != 1 else ''})"
             if "replacements" in r else "")
    return f"staged {r['op']} {r['path']}{extra}"


def text_api(r: dict[str, Any]) -> str:
    comp = " (with a compensation)" if r["compensate"] else ""
    return (f"staged call {r['n']}: {r['method']} {r['url']}{comp}, "
            f"Idempotency-Key {r['idempotency_key']}")


def text_check(r: dict[str, Any]) -> str:
    lines = [f"check passed in {r['duration_ms']:.0f} ms ({r['isolation']}); log: {r['log']}"]
    if r.get("promoted"):
        lines.append("promoted: " + ", ".join(r["promoted"]))
    return "\n".join(lines)


def text_exec(r: dict[str, Any]) -> str:
    staged = r.get("captured") or []
    head = (f"agent-2pc: exit {r['exit_code']} in {r['duration_ms']:.0f} ms ({r['isolation']}); "
            f"staged {len(staged)} change{'s' if len(staged) != 1 else ''}"
            if "isolation" in r else
            f"staged {len(staged)} kept change{'s' if len(staged) != 1 else ''}")
    lines = [head] + [f"  {c['op']:<7} {c['path']}" + (
        f" -> {c['target']}" if c.get("target") is not None else
        "/" if c["op"] == "mkdir" else "") for c in staged]
    lines += [f"  skipped {s['path']} ({s.get('reason') or s['kind']})"
              for s in r.get("skipped") or []]
    return "\n".join(lines)


def text_patch(r: dict[str, Any]) -> str:
    return "staged patch: " + ", ".join(r["files"])


def text_diff(r: dict[str, Any]) -> str:
    return str(r["diff"]) if r["files"] else "(no changes)"


def text_transactions(r: dict[str, Any]) -> str:
    rows = r["transactions"]
    if not rows:
        return "(no transactions)"
    lines = []
    for t in rows:
        label = f"  {t['label']}" if t.get("label") else ""
        if "workspaces" in t:  # a global transaction (docs/distributed.md)
            size = f"{len(t['workspaces']):>4} workspace{'s' if len(t['workspaces']) != 1 else ''}"
        else:
            size = f"{t.get('ops', 0):>4} ops"
        lines.append(f"{t['tid']}  {t['state']:<10} {size}  {t.get('created_at') or ''}{label}")
        for w in t.get("workspaces", []) if len(rows) == 1 else []:
            done = " (done)" if w.get("done") else ""
            lines.append(f"    {w['workspace']:<16} {w.get('local_tid') or '-'}  vote "
                         f"{w.get('vote') or '-'}  {w.get('outcome') or ''}{done}")
        for f in t.get("files", []) if len(rows) == 1 else []:
            lines.append(f"    {f['op']:<6} {f['path']}" if isinstance(f, dict) else f"    {f}")
        if len(rows) == 1 and t.get("reason"):
            lines.append(f"    reason: {t['reason']}")
        if len(rows) == 1 and t.get("coordinator"):
            lines.append(f"    decided by: {json.dumps(t['coordinator'], sort_keys=True)}")
    if r.get("in_doubt"):  # prepared: their coordinators decide (agent-2pc decide)
        lines.append(text_in_doubt(r))
    return "\n".join(lines)


def text_outcome(r: dict[str, Any]) -> str:
    files = r.get("files")
    tail = f": {len(files)} file{'s' if len(files) != 1 else ''}" if files is not None else ""
    out = f"{r['state']} {r['tid']}{tail}"
    if r.get("diverged"):
        out += "\nleft as another writer put them (diverged): " + ", ".join(r["diverged"])
    if r.get("merged"):
        out += "\nmerged with another writer's edits: " + ", ".join(r["merged"])
    return out


def text_recover(r: dict[str, Any]) -> str:
    def names(key: str) -> str:
        return ", ".join(r[key]) or "none"

    out = (f"rolled forward: {names('rolled_forward')}\nrolled back: {names('rolled_back')}\n"
           f"torn log tail cut: {r['truncated_bytes']} bytes")
    if r.get("in_doubt"):  # left alone: their coordinators decide (agent-2pc decide)
        out += "\n" + text_in_doubt(r)
    return out


def text_batch(r: dict[str, Any]) -> str:
    lines = [f"{r['state']} {r['tid']}"]
    for s in r["steps"]:
        pid = f" ({s['participant_id']})" if s.get("participant_id") else ""
        lines.append(f"  step {s['index']}{pid}: {s['type']} {'ok' if s['ok'] else 'FAILED'}")
    return "\n".join(lines)


# -- the table -------------------------------------------------------------------------------

COMMANDS: tuple[Command, ...] = (
    Command("init", "create the workspace (.agent-tx/) at the root; idempotent", run_init,
            extra={"text": lambda r: f"workspace ready at {r['root']}"}),
    Command("trust", "use a workspace this user did not make here (copied, restored)",
            run_trust, extra={"text": text_trust}),
    Command("begin", "start a transaction and print its id", run_begin, (
        Opt("--timeout-ms", type=int_arg, metavar="N",
            help="abort it if not committed within N ms (default 24 h; 0: never)"),
        Opt("--label", metavar="S", help="a note shown by status and list"),
        Opt("--git-branch", metavar="B", help="bind it to git branch B: commit refuses if B "
            "moved under its files; git-commit commits onto B")),
        extra={"text": text_begin}),
    Command("record-read", "remember a file's content hash; commit aborts if it changes",
            run_record_read, (TID, PATH), extra={"text": lambda r: f"{r['path']} "
                                                 f"{r['sha256'] or '(absent)'}"}),
    Command("stage-write", "stage a file's new content (text or binary)", run_stage_write, (
        TID, PATH,
        Opt("--content", metavar="S", help="the content, as text"),
        Opt("--from-file", metavar="F", help="read the content from file F (streamed)"),
        Opt("--stdin", FLAG, help="read the content from standard input (streamed)"),
        Opt("--mode", type=octal_mode, metavar="0755",
            help="permissions (default: keep the file's, 0644 for a new one)")),
        one_of=(("content", "from_file", "stdin"),), extra={"text": text_staged}),
    Command("stage-delete", "stage the deletion of a file", run_stage_delete, (TID, PATH),
            extra={"text": text_staged}),
    Command("stage-replace", "stage a text replacement in a file (unique match unless --all)",
            run_stage_replace, (
                TID, PATH,
                Opt("--old", required=True, metavar="S", help="the text to find"),
                Opt("--new", required=True, metavar="S", help="the text to put instead"),
                Opt("--all", FLAG, help="replace every occurrence")),
            extra={"text": text_staged}),
    Command("stage-patch", "stage a unified diff (git or plain; multi-file)", run_stage_patch, (
        TID,
        Opt("--patch-file", metavar="F", help="read the diff from file F"),
        Opt("--stdin", FLAG, help="read the diff from standard input")),
        one_of=(("patch_file", "stdin"),), extra={"text": text_patch}),
    Command("stage-api", "stage an HTTP call, sent exactly once at commit (compensated on abort)",
            run_stage_api, (
                TID,
                Opt("--method", required=True, metavar="M", help="GET, POST, PUT, DELETE, ..."),
                Opt("--url", required=True, metavar="U", help="an http:// or https:// URL"),
                Opt("--body", metavar="JSON", help="the request body, as JSON"),
                Opt("--header", MULTI, metavar="K:V", help="a request header (repeatable)"),
                Opt("--idempotency-key", metavar="K",
                    help="the Idempotency-Key (default: one made for this call)"),
                Opt("--compensate-method", metavar="M", help="the call that undoes it, if the "
                    "transaction aborts after it may have happened"),
                Opt("--compensate-url", metavar="U", help="the compensation's URL"),
                Opt("--compensate-body", metavar="JSON", help="the compensation's body")),
            extra={"text": text_api}),
    Command("stage-sql", "stage SQL statements for a Postgres database, committed with the "
            "files (PREPARE TRANSACTION)", run_stage_sql, (
                TID,
                Opt("--dsn", required=True, metavar="URL",
                    help="postgresql://user@host/db (no password: PGPASSWORD, ~/.pgpass), or "
                    "env:NAME"),
                Opt("--sql", metavar="S", help="the statements"),
                Opt("--file", metavar="F", help="read the statements from file F ('-': stdin)")),
            one_of=(("sql", "file"),), extra={"text": text_sql}),
    Command("stage-cmd", "run a check in the staged view; commit re-runs it if content changes",
            run_stage_cmd, CMD_OPTS + (
                Opt("--sandbox", FLAG, help="confine it: host read-only, private /tmp, no "
                    "network"),
                Opt("--network", FLAG, help="with --sandbox: allow the network")),
            extra={"text": text_check}),
    Command("stage-governed", "run a check under limits (time, CPU, processes, memory, ...)",
            run_stage_cmd, CMD_OPTS + tuple(
                Opt("--" + name.replace("_", "-"), type=int_arg, metavar="N",
                    help=f"trip and kill the command past this {LIMIT_HELP[name]}")
                for name in LIMIT_NAMES), extra={"text": text_check}),
    Command("exec", "run a command (a shell, an agent) in the staged view and stage what it "
            "changes", run_exec, (
                TID, Opt("--timeout-ms", type=int_arg, metavar="N",
                         help="kill it after N ms (default: none)"),
                Opt("--keep-on-failure", FLAG, help="stage what it changed even when it "
                    "fails (still exit 1)"),
                Opt("--sandbox", FLAG, help="confine it: host read-only, private /tmp, no "
                    "network"),
                Opt("--network", FLAG, help="with --sandbox: allow the network")),
            takes_rest=True),
    Command("session", "run a program (an agent, a shell) in a new transaction's staged view, "
            "then commit, abort, show the diff or keep it", run_session, (
                Opt("--label", metavar="S", help="a note shown by status and list"),
                Opt("--check", MULTI, metavar="CMD", help="a check to run on the result before "
                    "committing (repeatable; run by /bin/sh -c)"),
                Opt("--yes", FLAG, help="commit without asking when the program succeeded and "
                    "the checks passed")),
            takes_rest=True, extra={"text": text_session}),
    Command("stage-kept", "stage what a failed terminal session of exec kept aside",
            run_stage_kept, (TID,), extra={"text": text_exec}),
    Command("stage-wasm", "run a WASI module in the staged view and stage what it writes",
            run_stage_wasm, (
                TID, Opt("--module", required=True, metavar="M.wasm",
                         help="the module (a path in the staged view, or outside the repo)"),
                Opt("--fuel", type=int_arg, metavar="N", help="an instruction budget"),
                Opt("--max-memory-mb", type=int_arg, metavar="N",
                    help="the most linear memory the module may grow to"),
                Opt("--timeout-ms", type=int_arg, metavar="N", help="a wall-time budget")),
            takes_rest=True),
    Command("stage-vm", "run a step in a microVM (needs KVM and a VM monitor)", run_stage_vm,
            (TID,), takes_rest=True),
    Command("diff", "show what the transaction would change", run_diff, (
        TID, Opt("--stat", FLAG, help="a summary per file instead of the diff")),
        extra={"text": text_diff}),
    Command("status", "show live transactions, or one in detail", run_status, (
        Opt("--tid", metavar="TID", help="show this transaction in detail"),),
        extra={"text": text_transactions}),
    Command("list", "list transactions, finished ones included", run_list, (
        Opt("--state", metavar="S", help="only those in state S (active, committed, ...)"),
        Opt("--limit", type=int_arg, metavar="N",
            help=f"the N newest (default {LIST_LIMIT})"),
        Opt("--before", metavar="TID", help="those listed before TID (the next page: the "
            "first tid of this one)")),
        extra={"text": text_transactions}),
    Command("savepoint", "mark a point to roll back to", run_savepoint, (
        TID, Opt("--name", required=True, metavar="N", help="the savepoint's name")),
        extra={"text": lambda r: f"savepoint {r['name']}"}),
    Command("rollback-to", "undo what was staged after a savepoint", run_rollback_to, (
        TID, Opt("--name", required=True, metavar="N", help="the savepoint's name")),
        extra={"text": lambda r: f"rolled back to {r['name']}"}),
    Command("commit", "prepare and commit atomically (exit 1 if it aborts)", run_commit, (
        TID, Opt("--no-merge", FLAG, help="a file another writer changed since it was staged "
                 "is a conflict (default: merged when the edits do not overlap)")),
        extra={"text": text_outcome}),
    Command("git-commit", "commit, and a git commit of exactly the transaction's changes, as "
            "one atomic unit", run_git_commit, (
                TID, Opt("--message", metavar="MSG", short="-m",
                         help="the commit message (-m MSG)"),
                Opt("--file", metavar="FILE", short="-F", help="take the commit message from "
                    "FILE (- for stdin)"),
                Opt("--author", metavar="\"N <E>\"", help="the commit's author "
                    "(default: git's user.name and user.email)"),
                Opt("--branch", metavar="B", help="the branch to commit onto (default: the "
                    "one HEAD is on)"),
                Opt("--no-verify", FLAG, help="skip the pre-commit and commit-msg hooks"),
                Opt("--sign", FLAG, help="GPG-sign the commit (default: commit.gpgSign)")),
            one_of=(("message", "file"),), extra={"text": text_git_commit}),
    Command("merge", "three-way merge of files: the change BASE -> THEIRS into OURS (no "
            "workspace needed)", run_merge, (
                Opt("--base", required=True, metavar="B", help="the common ancestor"),
                Opt("--ours", required=True, metavar="O", help="one side (first in markers)"),
                Opt("--theirs", required=True, metavar="T", help="the other side"),
                Opt("--output", required=True, metavar="F", help="where the merge goes "
                    "(replaced atomically; may be one of the inputs)")),
            extra={"text": lambda r: f"merged cleanly into {r['output']}"}),
    EXPORT,
    IMPORT,
    Command("abort", "abort: nothing staged reaches the tree", run_abort, (
        TID, Opt("--reason", metavar="S", help="why (kept in the history)")),
        extra={"text": text_outcome}),
    Command("recover", "finish or undo what crashes left; abort expired transactions",
            run_recover, extra={"text": text_recover}),
    Command("vote", "prepare for an outside coordinator and vote; a yes waits, durable, for "
            "decide (exit 1 if it aborts)", run_vote, (
                TID, Opt("--coordinator", required=True, metavar="JSON",
                         help="who decides: a JSON object, no password (e.g. "
                         "'{\"gtid\": \"g-1\", \"store\": \"postgresql://host/db\"}')")),
            extra={"text": lambda r: f"{r['state']} {r['tid']}: voted {r['vote']}"}),
    Command("decide", "carry out the decision for a prepared transaction: commit or abort "
            "(by hand only when its coordinator is lost for good)", run_decide, (
                TID, Opt("--reason", metavar="S", help="why (kept in the history of an "
                         "abort)")),
            positionals=(("outcome", "commit or abort"),),
            extra={"text": text_outcome}),
    Command("in-doubt", "the prepared transactions waiting for their coordinators' decisions",
            run_in_doubt, extra={"text": text_in_doubt}),
    Command("compact", "move finished transactions out of the log; collect garbage",
            run_compact, extra={"text": lambda r: f"log: {r['before_bytes']} -> "
                                f"{r['after_bytes']} bytes"}),
    Command("undo", "take back a committed transaction as a new one (exit 1 if a file "
            "changed since)", run_undo, (TID,), extra={"text": text_undo}),
    Command("log", "finished transactions, newest first, chained by SHA-256", run_log, (
        Opt("--limit", type=int_arg, metavar="N", help="the N newest only"),
        Opt("--verify", FLAG, help="check the whole chain (exit 1, tampered, naming the first "
            "line that fails)")), extra={"text": text_log}),
    Command("run-batch", "run a JSON manifest of steps as one transaction", run_batch, (
        Opt("--file", required=True, metavar="F", help="the manifest (- for stdin)"),),
        extra={"text": text_batch}),
    Command("demo", "a one-minute tour in a throwaway git repository", run_demo, (
        Opt("--keep", FLAG, help="keep the demo repository and print where it is"),)),
    FENCE,
    HOOK,
    MCP,
    DAEMON,
    distributed.NODE,
    distributed.NODES,
)
distributed.extend(COMMANDS)
