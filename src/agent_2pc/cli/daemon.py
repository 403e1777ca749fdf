"""``agent-2pc daemon start|stop|status|reap``: the workspace's daemon (thin: parse, call
agent_2pc.daemon.control, render). docs/daemon.md is the guide.

Declarative at import time: the daemon's modules are imported inside the run functions only.
"""

from __future__ import annotations

from .args import FLAG, Command, Opt, int_arg

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def run_start(ctx: Any, args: dict[str, Any]) -> dict[str, Any] | None:
    from ..daemon import control

    interval = args.get("reap_interval_ms")
    if interval is not None and interval < 0:
        from ..errors import UsageError

        raise UsageError("--reap-interval-ms must be 0 (no reaper) or more")
    if args["foreground"]:
        control.foreground(ctx.root(), ctx.json, interval)
        return None
    return control.start(ctx.root(), interval)


def run_stop(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..daemon import control

    return control.stop(ctx.root())


def run_status(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..daemon import control

    return control.status(ctx.root())


def run_reap(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..daemon import control

    return control.reap(ctx.root())


def text_status(r: dict[str, Any]) -> str:
    if not r["running"]:
        return "no daemon serves this workspace"
    return (f"daemon pid {r['pid']} on {r['socket']}, up {r['uptime_s']:.0f} s: "
            f"{r['clients']} client(s), {r['requests']} request(s), {r['commits']} commit(s) "
            f"in {r['fsyncs']} fsync(s) ({r.get('fsyncs_saved', 0)} saved by batching), "
            f"{r.get('reaper', {}).get('reaped', 0)} reaped")


START = Command(
    "start", "start the workspace's daemon (one per workspace, on .agent-tx/daemon.sock)",
    run_start, (
        Opt("--foreground", FLAG, help="serve in this process until stopped (for a "
            "supervisor such as systemd)"),
        Opt("--reap-interval-ms", type=int_arg, metavar="N",
            help="how often the reaper aborts expired transactions (default 1000; 0: never)")),
    extra={"text": lambda r: f"daemon started: pid {r['pid']} on {r['socket']}"})
STOP = Command("stop", "stop the daemon (requests in progress finish first)", run_stop,
               extra={"text": lambda r: f"daemon {r['pid']} stopped" if r["stopped"]
                      else "no daemon was running"})
STATUS = Command("status", "is a daemon serving this workspace; its counters", run_status,
                 extra={"text": text_status})
REAP = Command("reap", "abort the transactions past their timeout now (through the daemon, "
               "else in this process)", run_reap,
               extra={"text": lambda r: f"reaped {len(r['reaped'])} transaction(s)"})

DAEMON = Command("daemon", "the workspace's daemon: start|stop|status|reap",
                 subcommands=(START, STOP, STATUS, REAP),
                 epilog="See docs/daemon.md.")
