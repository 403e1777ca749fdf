"""The CLI of global transactions (docs/distributed.md): ``node``, ``nodes``, ``begin
--global``, and ``--workspace``/``--store`` on the transaction verbs.

A tid that starts with ``g-`` names a global transaction: the verbs that take ``--tid`` send
its steps to the ``--workspace`` named (each served by an ``agent-2pc node``) through the store
(``--store URL`` or $AGENT2PC_STORE). psycopg is imported only when such a step runs.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from .args import FLAG, Command, Opt, int_arg

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..distributed.coordinator import GlobalTransaction

STORE = Opt("--store", metavar="URL", help="global transactions: the store, "
            "postgresql://user@host/db (default $AGENT2PC_STORE)")
WORKSPACE = Opt("--workspace", metavar="NAME", help="global transactions: the workspace "
                "(its node's name) this step goes to")
GLOBAL = Opt("--global", FLAG, help="a transaction across workspaces, decided in the store "
             "(needs --store or $AGENT2PC_STORE)")
# The verbs that accept a global tid (and those that also need the workspace).
TAKES_STORE = ("stage-write", "stage-delete", "stage-replace", "stage-patch", "stage-cmd",
               "stage-sql", "record-read", "diff", "commit", "abort", "status")
TAKES_WORKSPACE = ("stage-write", "stage-delete", "stage-replace", "stage-patch", "stage-cmd",
                   "stage-sql", "record-read", "diff")


def is_global(tid: object) -> bool:
    return isinstance(tid, str) and tid.startswith("g-")


def extend(commands: tuple[Command, ...]) -> None:
    """Add --store/--workspace (and begin's --global) to the verbs that take a global tid."""
    for cmd in commands:
        extra: tuple[Opt, ...] = ()
        if cmd.name == "begin":
            extra = (GLOBAL, STORE)
        elif cmd.name in TAKES_WORKSPACE:
            extra = (WORKSPACE, STORE)
        elif cmd.name in TAKES_STORE:
            extra = (STORE,)
        cmd.opts = cmd.opts + extra


def _client(args: dict[str, Any]) -> Any:
    from ..distributed.coordinator import GlobalClient

    return GlobalClient(args.get("store"))


def begin(args: dict[str, Any]) -> dict[str, Any]:
    if args.get("git_branch") is not None:
        raise UsageError("--git-branch binds a local transaction; a global one has none")
    return {"tid": _client(args).begin(label=args["label"], timeout_ms=args["timeout_ms"]).tid}


def status(args: dict[str, Any]) -> dict[str, Any]:
    return _client(args).status(args["tid"])  # type: ignore[no-any-return]


def step(args: dict[str, Any]) -> WorkspaceStep:
    """The --tid of a step: the global transaction and the --workspace it goes to."""
    return WorkspaceStep(_client(args).get(args["tid"]), args.get("workspace"))


def refuse_local(args: dict[str, Any]) -> None:
    if args.get("workspace") is not None:
        raise UsageError("--workspace is for a global transaction (a tid that starts with "
                         "g-); this one is local")


class WorkspaceStep:
    """A local transaction's face for one workspace of a global transaction: the CLI's
    runners call it as they call a Transaction."""

    def __init__(self, gtx: GlobalTransaction, workspace: str | None) -> None:
        self.gtx = gtx
        self.tid = gtx.tid
        self._workspace = workspace

    @property
    def ws(self) -> str:
        if self._workspace is None:
            raise UsageError(f"{self.tid} is a global transaction: this step needs "
                             "--workspace NAME (the node that serves it)")
        return self._workspace

    def __getattr__(self, name: str) -> Any:
        raise UsageError(f"{name.replace('_', '-')} is not available in a global transaction "
                         "(docs/distributed.md lists the verbs)")

    def stage_write(self, path: str, content: bytes, mode: int | None = None) -> dict[str, Any]:
        return self.gtx.stage_write(self.ws, path, content, mode)

    def stage_write_file(self, path: str, fd: int, mode: int | None = None) -> dict[str, Any]:
        from ..distributed.coordinator import CONTENT_BYTES_MAX

        ws = self.ws
        chunks, size = [], 0
        while size <= CONTENT_BYTES_MAX:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > CONTENT_BYTES_MAX:
            raise UsageError(f"a file staged in a global transaction is at most "
                             f"{CONTENT_BYTES_MAX} bytes")
        return self.gtx.stage_write(ws, path, b"".join(chunks), mode)

    def stage_delete(self, path: str) -> dict[str, Any]:
        return self.gtx.stage_delete(self.ws, path)

    def stage_replace(self, path: str, old: str, new: str, all: bool = False) -> dict[str, Any]:
        return self.gtx.stage_replace(self.ws, path, old, new, all)

    def stage_patch(self, patch: str | bytes) -> dict[str, Any]:
        return self.gtx.stage_patch(self.ws, patch)

    def stage_cmd(self, command: str, timeout_ms: int | None = None,
                  promote: list[str] | None = None, sandbox: bool = False,
                  network: bool = False, limits: dict[str, int] | None = None,
                  working_dir: str | None = None, env: dict[str, str] | None = None
                  ) -> dict[str, Any]:
        return self.gtx.stage_cmd(self.ws, command, timeout_ms, promote, sandbox, network,
                                  limits, working_dir, env)

    def stage_sql(self, dsn: str, sql: str) -> dict[str, Any]:
        return self.gtx.stage_sql(self.ws, dsn, sql)

    def record_read_result(self, path: str) -> dict[str, Any]:
        return self.gtx.record_read(self.ws, path)

    def diff(self, stat: bool = False) -> dict[str, Any]:
        return self.gtx.diff(self.ws, stat)

    def commit(self, merge: bool = True) -> dict[str, Any]:
        if self._workspace is not None:
            raise UsageError("commit decides the whole global transaction: no --workspace")
        return self.gtx.commit()

    def abort(self, reason: str | None = None) -> dict[str, Any]:
        if self._workspace is not None:
            raise UsageError("abort ends the whole global transaction: no --workspace")
        return self.gtx.abort(reason)


def run_node(ctx: Any, args: dict[str, Any]) -> None:
    import sys

    from ..distributed.node import Node

    node = Node(ctx.root(), args["store"], args["name"], args["poll_ms"], args["resolve_ms"])

    def ready(info: dict[str, Any]) -> None:
        if ctx.json:
            from .output import emit_json

            emit_json({"ok": True, **info})
        else:
            sys.stdout.write(f"node {info['node']} serves {info['root']} (pid {info['pid']}) "
                             f"through {info['store']}, schema {info['schema']}\n")
            sys.stdout.flush()

    out = node.serve(ready)
    if not ctx.json:
        sys.stderr.write(f"node {node.name} stopped after {out['requests']} request(s)\n")
    return None


def run_nodes(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return {"nodes": _client(args).nodes()}


def text_nodes(r: dict[str, Any]) -> str:
    return "\n".join(f"{n['name']:<20} {'alive' if n['alive'] else 'down ':<6} pid {n['pid']} "
                     f"on {n['host']}: {n['root']}" for n in r["nodes"]) or "(no nodes)"


NODE = Command("node", "serve this workspace to global transactions through the store "
               "(foreground; SIGTERM/SIGINT stop it)", run_node, (
                   Opt("--store", metavar="URL", help="postgresql://user@host/db (default "
                       "$AGENT2PC_STORE)"),
                   Opt("--name", metavar="NAME", help="the workspace's name in global "
                       "transactions (default: the root's directory name)"),
                   Opt("--poll-ms", type=int_arg, metavar="N", help="look for requests at "
                       "least every N ms besides LISTEN (default 500)"),
                   Opt("--resolve-ms", type=int_arg, metavar="N", help="finish decided "
                       "transactions every N ms (default 2000)")))
NODES = Command("nodes", "the nodes registered in the store, alive or not", run_nodes,
                (Opt("--store", metavar="URL", help="postgresql://user@host/db (default "
                     "$AGENT2PC_STORE)"),), extra={"text": text_nodes})
