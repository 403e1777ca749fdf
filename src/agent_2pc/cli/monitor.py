"""``agent-2pc monitor`` (one snapshot), ``top`` (live, in the terminal) and ``web`` (live, in
the browser). docs/monitoring.md is the guide.

Declarative at import time: rich (top) and Starlette/uvicorn (web) are imported inside the run
functions only, so that no other command pays for them.
"""

from __future__ import annotations

from ..errors import UsageError
from .args import FLAG, Command, Opt, int_arg

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

INTERVAL_MS_MIN, INTERVAL_MS_MAX = 50, 3_600_000


def run_monitor(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ..coordinator.monitor import Monitor

    mon = Monitor(ctx.root())
    try:
        return mon.snapshot()
    finally:
        mon.close()


def interval_ms(args: dict[str, Any], default: int) -> int:
    value = args.get("interval_ms")
    if value is None:
        return default
    if not INTERVAL_MS_MIN <= value <= INTERVAL_MS_MAX:
        raise UsageError(f"--interval-ms must be between {INTERVAL_MS_MIN} and "
                         f"{INTERVAL_MS_MAX}, not {value}")
    return int(value)


def run_top(ctx: Any, args: dict[str, Any]) -> None:
    if ctx.json:
        raise UsageError("'top' is a dashboard for people; use 'monitor --json' for JSON")
    from .top import top

    top(ctx.root(), watch=bool(args["watch"]), interval_s=interval_ms(args, 1000) / 1000)
    return None


def run_web(ctx: Any, args: dict[str, Any]) -> None:
    if ctx.json:
        raise UsageError("'web' prints its URL as text; there is no JSON form")
    port = args.get("port")
    if port is None:
        port = 8642
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, not {port}")
    from ..web import serve

    serve(ctx.root(), host=args.get("host") or "127.0.0.1", port=port,
          allow_actions=bool(args["allow_actions"]))
    return None


# -- text ------------------------------------------------------------------------------------


def size(n: float) -> str:
    """coordinator/monitor.py's human_size (that module loads only when a snapshot is taken,
    which is before any text is made, not when the CLI starts)."""
    from ..coordinator.monitor import human_size

    return human_size(n)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def checks_cell(row: dict[str, Any]) -> str:
    c = row.get("checks") or {}
    parts = []
    if row.get("runs"):
        parts.append(f"{len(row['runs'])} running")
    if c.get("failed"):
        parts.append(f"{c['failed']} failed")
    if c.get("passed"):
        parts.append(f"{c['passed']} passed")
    if c.get("stale"):
        parts.append(f"{c['stale']} stale")
    return ", ".join(parts) or "-"


def counts_line(counts: dict[str, int]) -> str:
    shown = [(k, counts.get(k, 0)) for k in ("active", "preparing", "committing", "aborting")
             if counts.get(k) or k == "active"]
    shown += [("committed", counts.get("committed", 0)), ("aborted", counts.get("aborted", 0))]
    return " | ".join(f"{n} {k.capitalize()}" for k, n in shown)


def text_snapshot(s: dict[str, Any]) -> str:
    wal = s["wal"]
    verified = "CRC32 verified" if wal["verified"] else (
        f"damaged at offset {wal['damage']['offset']}")
    fence = s.get("fence") or {}
    lines = [
        f"agent-2pc monitor  {s['root']}  {s['at']}",
        f"  Workspace      {s['workspace']}",
        f"  WAL log        {size(wal['bytes'])} ({wal['records']} records, {verified})",
        f"  Scratch        {size(s['scratch']['bytes'])} in flight; staged blobs "
        f"{size(s['blobs']['bytes'])} ({s['blobs']['count']})",
    ]
    if s.get("disk"):
        lines.append(f"  Disk           {size(s['disk']['free_bytes'])} free "
                     f"({s['disk']['free_ratio']:.1%})")
    if fence.get("present"):
        st = fence.get("states") or {}
        lines.append("  Fence          " + (f"error: {fence['error']}" if fence.get("error") else
                     ", ".join(f"{n} {k}" for k, n in st.items()) or "empty"))
    rec = s.get("last_recovery")
    lines.append("  Last recovery  " + ("none recorded" if not rec else
                 f"{rec['at']} {rec['kind']}" + (f" {rec['tid']}" if rec.get("tid") else "")))
    lines.append(f"  Health         {s['health'].upper()}")
    for r in s["reasons"]:
        lines.append(f"    - [{r['severity']}] {r['code']}: {r['message']}")
    lines.append(f"  Transactions   {counts_line(s['counts'])}")
    rows = s["in_flight"]
    lines += ["", f"In flight ({len(rows)})"]
    if rows:
        lines.append(f"  {'TID':<26} {'STATE':<10} {'AGE':>8} {'FILES':>5}  "
                     f"{'CHECKS':<18} LABEL")
        for r in rows:
            flag = " STUCK" if r["stuck"] else ""
            lines.append(f"  {r['tid']:<26} {r['state']:<10} {age(r['age_s']):>8} "
                         f"{r['files_total']:>5}  {checks_cell(r):<18} "
                         f"{r['label'] or ''}{flag}")
    if s["stuck"]:
        lines += ["", f"Stuck ({len(s['stuck'])})"]
        lines += [f"  {x['tid']} ({x['state']}): {x['why']}" for x in s["stuck"]]
    if s["recent"]:
        lines += ["", "Recently finished"]
        for r in s["recent"]:
            why = f"  {r['code']}: {r['reason']}" if r["state"] == "aborted" and r.get(
                "reason") else ""
            lines.append(f"  {r['tid']:<26} {r['state']:<10} {r.get('ended_at') or '':<25} "
                         f"{len(r.get('files') or []):>3} files  {r.get('label') or ''}{why}")
    return "\n".join(lines) + "\n"


MONITOR = Command(
    "monitor", "a snapshot of the workspace: health, log, transactions in flight and stuck",
    run_monitor, extra={"text": text_snapshot})
TOP = Command(
    "top", "a live dashboard of the workspace in the terminal (needs agent-2pc[monitor])",
    run_top, (
        Opt("--watch", FLAG, help="keep refreshing (keys: q quit, s sort, arrows/j/k select, "
            "enter/d diff)"),
        Opt("--interval-ms", type=int_arg, metavar="N",
            help="refresh every N ms (default 1000)")))
WEB = Command(
    "web", "a live dashboard in the browser on localhost (needs agent-2pc[monitor])", run_web, (
        Opt("--host", metavar="HOST", help="the address to listen on (default 127.0.0.1)"),
        Opt("--port", type=int_arg, metavar="N", help="the port (default 8642; 0: any free)"),
        Opt("--allow-actions", FLAG, help="offer commit and abort buttons (token and CSRF "
            "checked)")))
MONITORING = (MONITOR, TOP, WEB)
