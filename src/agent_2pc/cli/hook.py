"""``agent-2pc hook install|uninstall|check``: the pre-commit gate (thin: parse, call
agent_2pc.git.hooks, render). docs/git.md is the guide.

Declarative at import time: agent_2pc.git.hooks (and subprocess, for git) is imported inside the
run functions only, so that no other command pays for it.
"""

from __future__ import annotations

from .args import FLAG, Command, Opt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def _start(ctx: Any) -> str:
    """Where to look for the git repository: --root, else $AGENT2PC_ROOT, else here."""
    import os

    return os.path.abspath(ctx.root_arg or os.environ.get("AGENT2PC_ROOT") or os.getcwd())


def run_install(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..git.hooks import install

    return install(_start(ctx), force=bool(args["force"]))


def run_uninstall(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..git.hooks import uninstall

    return uninstall(_start(ctx))


def run_check(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..git.hooks import check

    return check(ctx.root_arg, missing_ok=bool(args["missing_ok"]))


def text_install(r: dict[str, Any]) -> str:
    lines = [f"installed the agent-2pc pre-commit gate: {r['hook']}"]
    if r.get("saved"):
        lines.append(f"moved the hook that stood there aside (not run): {r['saved']}")
    if r["chained"]:
        lines.append("it runs the existing hook after the gate: pre-commit.agent-2pc-chained")
    return "\n".join(lines)


def text_uninstall(r: dict[str, Any]) -> str:
    if not r["removed"]:
        return f"the agent-2pc gate is not installed at {r['hook']}; nothing changed"
    if r["chained"]:
        return f"removed the agent-2pc gate; the hook it chained is back at {r['hook']}"
    return f"removed the agent-2pc gate: {r['hook']}"


def text_check(r: dict[str, Any]) -> str:
    if r.get("workspace") is None:
        return "no agent-2pc workspace here: nothing in flight"
    return f"no agent-2pc transaction in flight in {r['workspace']}"


INSTALL = Command(
    "install", "install the gate as the repository's pre-commit hook (an existing hook is "
    "chained, never lost); idempotent", run_install,
    (Opt("--force", FLAG, help="when both a foreign pre-commit hook and a chained one are "
         "there: move the first aside (pre-commit.agent-2pc-saved) and chain the second"),),
    extra={"text": text_install},
    epilog="The hooks directory is the one git uses (core.hooksPath, worktrees, submodules). "
           "See docs/git.md.")
UNINSTALL = Command(
    "uninstall", "remove the gate and put back the hook it chained, exactly as it was",
    run_uninstall, extra={"text": text_uninstall})
CHECK = Command(
    "check", "exit 1 while transactions are in flight in the workspace (what the hook and CI "
    "run)", run_check,
    (Opt("--missing-ok", FLAG, help="pass when there is no workspace (instead of "
         "not_initialized); the installed hook uses it"),),
    extra={"text": text_check})

HOOK = Command("hook", "the git pre-commit gate: install|uninstall|check",
               subcommands=(INSTALL, UNINSTALL, CHECK))
