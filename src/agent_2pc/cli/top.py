"""``agent-2pc top [--watch] [--interval-ms N]``: the monitor, live, full-screen (rich).

Keys: q quit (or leave the diff), s change the sort, up/down (j/k) select a transaction,
enter (or d) open its staged diff (up/down, space/b page, q back), r refresh now. Not on a
terminal, it prints the monitor's text instead, once or every interval with --watch.
"""

from __future__ import annotations

import os
import select
import sys
import time

from ..errors import WorkspaceError
from .monitor import age, checks_cell, counts_line, size, text_snapshot

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SORTS = (("age_s", "age", True), ("state", "state", False), ("label", "label", False),
         ("files_total", "files", True), ("tid", "tid", False))
STATE_STYLE = {"active": "bold bright_blue", "preparing": "bold magenta",
               "prepared": "bold magenta", "committing": "bold cyan",
               "committed": "bold green", "aborting": "bold dark_orange",
               "aborted": "bold red"}
SELECTED = "bold on grey30"
HEALTH_STYLE = {"healthy": "bold green", "degraded": "bold yellow", "unhealthy": "bold red"}
KEYS = {b"\x1b[A": "up", b"\x1bOA": "up", b"\x1b[B": "down", b"\x1bOB": "down",
        b"\x1b[5~": "pgup", b"\x1b[6~": "pgdn", b"\r": "enter", b"\n": "enter",
        b"\x1b": "esc", b"k": "up", b"j": "down", b" ": "pgdn", b"b": "pgup", b"q": "q",
        b"s": "s", b"d": "enter", b"r": "r", b"g": "home", b"G": "end"}


def top(root: str, watch: bool, interval_s: float) -> None:
    from ..coordinator.monitor import Monitor

    mon = Monitor(root)
    try:
        if not sys.stdout.isatty():
            _plain(mon, watch, interval_s)
            return
        try:
            from rich.console import Console
        except ImportError:
            raise WorkspaceError("'agent-2pc top' needs rich: pip install 'agent-2pc[monitor]'",
                                 code="dependency_missing") from None
        console = Console()
        ui = _Ui(mon)
        if not watch:
            console.print(ui.render(console.size.height, console.size.width, full=False))
            return
        _live(console, ui, interval_s)
    finally:
        mon.close()


def _plain(mon: Any, watch: bool, interval_s: float) -> None:
    while True:
        sys.stdout.write(text_snapshot(mon.snapshot()))
        sys.stdout.flush()
        if not watch:
            return
        time.sleep(interval_s)
        sys.stdout.write("\n")


class _Ui:
    """What the screen shows: the snapshot, the sort, the selection, or a diff."""

    def __init__(self, mon: Any) -> None:
        self.mon = mon
        self.snap: dict[str, Any] = mon.snapshot()
        self.sort = 0
        self.selected = 0
        self.diff: list[str] | None = None
        self.diff_tid = ""
        self.scroll = 0
        self.message = ""

    def refresh(self) -> None:
        self.snap = self.mon.snapshot()

    def rows(self) -> list[dict[str, Any]]:
        key, _, desc = SORTS[self.sort]
        rows = list(self.snap["in_flight"])
        rows.sort(key=lambda r: (r.get(key) is None, r.get(key) or 0 if key in (
            "age_s", "files_total") else str(r.get(key) or "")), reverse=desc)
        return rows

    # -- keys --------------------------------------------------------------------------------

    def key(self, k: str, height: int) -> bool:
        """Handle a key; False means quit."""
        if self.diff is not None:
            page = max(height - 4, 1)
            if k in ("q", "esc"):
                self.diff = None
                return True
            if k == "down":
                self.scroll += 1
            elif k == "up":
                self.scroll -= 1
            elif k == "pgdn":
                self.scroll += page
            elif k == "pgup":
                self.scroll -= page
            elif k == "home":
                self.scroll = 0
            elif k == "end":
                self.scroll = len(self.diff)
            self.scroll = max(0, min(self.scroll, max(len(self.diff) - page, 0)))
            return True
        rows = self.rows()
        if k == "q":
            return False
        if k == "s":
            self.sort = (self.sort + 1) % len(SORTS)
        elif k == "down":
            self.selected = min(self.selected + 1, max(len(rows) - 1, 0))
        elif k == "up":
            self.selected = max(self.selected - 1, 0)
        elif k == "r":
            self.refresh()
        elif k == "enter" and rows:
            tid = rows[min(self.selected, len(rows) - 1)]["tid"]
            try:
                out = self.mon.diff(tid)
                text = out["diff"] or "(nothing staged)\n"
            except Exception as exc:  # noqa: BLE001 -- shown, the dashboard goes on
                text = f"cannot show the diff: {exc}\n"
            self.diff, self.diff_tid, self.scroll = text.splitlines(), tid, 0
        return True

    # -- drawing -----------------------------------------------------------------------------

    def render(self, height: int, width: int, full: bool = True) -> Any:
        from rich.console import Group
        from rich.text import Text

        if self.diff is not None:
            return self._render_diff(height)
        s = self.snap
        parts: list[Any] = [self._header()]
        rows = self.rows()
        self.selected = min(self.selected, max(len(rows) - 1, 0))
        used = 12 + len(s["reasons"])
        room = max(height - used - 6, 3) if full else len(rows) + 1
        parts.append(self._in_flight(rows, room))
        used += min(len(rows), room) + 4
        if s["stuck"]:
            parts.append(self._stuck())
            used += len(s["stuck"]) + 4
        left = height - used - 5 if full else len(s["recent"])
        if left >= 2 and s["recent"]:
            parts.append(self._recent(min(left, len(s["recent"]))))
        _, name, desc = SORTS[self.sort]
        keys = Text.assemble(("q", "bold"), " quit  ", ("s", "bold"),
                             f" sort: {name} {'▼' if desc else '▲'}  ", ("↑↓", "bold"),
                             " select  ", ("enter", "bold"), " diff  ", ("r", "bold"),
                             " refresh", style="dim")
        if full:
            parts.append(keys)
        return Group(*parts)

    def _header(self) -> Any:
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        s = self.snap
        wal = s["wal"]
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column()
        verified = ("CRC32 verified" if wal["verified"] else
                    f"{'torn tail' if wal['damage']['torn'] else 'DAMAGED'} at offset "
                    f"{wal['damage']['offset']}")
        grid.add_row("Workspace", s["workspace"])
        grid.add_row("WAL log", f"{size(wal['bytes'])} ({wal['records']} records, {verified})")
        grid.add_row("Scratch", f"{size(s['scratch']['bytes'])} in flight · staged blobs "
                                f"{size(s['blobs']['bytes'])} ({s['blobs']['count']})")
        if s.get("disk"):
            grid.add_row("Disk", f"{size(s['disk']['free_bytes'])} free "
                                 f"({s['disk']['free_ratio']:.1%})")
        fence = s.get("fence") or {}
        if fence.get("present"):
            c = fence.get("counters") or {}
            fenced = (fence.get("states") or {}).get("fenced", 0)
            grid.add_row("Fence", f"error: {fence['error']}" if fence.get("error") else
                         f"{c.get('attempts', 0)} attempts, {c.get('committed', 0)} done, "
                         f"{fenced} fenced")
        rec = s.get("last_recovery")
        grid.add_row("Last recovery", "none recorded" if not rec else
                     f"{rec['kind'].replace('_', ' ')} at {rec['at']}"
                     + (f" ({rec['tid']})" if rec.get("tid") else ""))
        state = Text(s["health"].upper(), style=HEALTH_STYLE.get(s["health"], "bold"))
        grid.add_row("System state", state)
        for r in s["reasons"]:
            style = "red" if r["severity"] == "unhealthy" else "yellow"
            grid.add_row("", Text(f"{r['code']}: {r['message']}", style=style))
        grid.add_row("Transactions", counts_line(s["counts"]))
        return Panel(grid, title=f"[bold]⚡ agent-2pc[/] live monitor · {s['root']}",
                     subtitle=s["at"], border_style=HEALTH_STYLE.get(s["health"], "blue")
                     .replace("bold ", ""))

    def _in_flight(self, rows: list[dict[str, Any]], room: int) -> Any:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        key = SORTS[self.sort][0]
        t = Table(title=f"In flight ({len(rows)})", box=box.SIMPLE_HEAD, title_justify="left",
                  expand=True, header_style="bold dim", title_style="bold")
        for col, name, just in (("tid", "TID", "left"), ("label", "LABEL", "left"),
                                ("state", "STATE", "left"), ("age_s", "AGE", "right"),
                                ("files_total", "FILES", "right"), ("checks", "CHECKS", "left"),
                                ("effects", "API", "right"), ("deadline", "DEADLINE", "left"),
                                ("holder", "HOLDER", "left")):
            mark = " ▼" if col == key and SORTS[self.sort][2] else " ▲" if col == key else ""
            t.add_column(name + mark, justify=just, no_wrap=True,  # type: ignore[arg-type]
                         overflow="ellipsis", max_width=40 if col == "label" else None)
        start = max(0, self.selected - room + 1)
        for i, r in enumerate(rows[start:start + room], start):
            style = SELECTED if i == self.selected else ("red" if r["stuck"] else "")
            exp = r.get("expires_in_s")
            t.add_row(r["tid"], r["label"] or "", Text(r["state"], STATE_STYLE.get(r["state"], "")),
                      age(r["age_s"]), str(r["files_total"]), checks_cell(r),
                      str(r["effects"] or "-"),
                      "none" if exp is None else ("passed" if exp < 0 else "in " + age(exp)),
                      Text(r["holder"] + (" STUCK" if r["stuck"] else ""),
                           "bold red" if r["stuck"] else ""), style=style)
        if not rows:
            t.add_row("[dim]no transaction in flight[/]", "", "", "", "", "", "", "", "")
        return t

    def _stuck(self) -> Any:
        from rich import box
        from rich.table import Table

        t = Table(title=f"Stuck ({len(self.snap['stuck'])})", box=box.SIMPLE_HEAD,
                  title_justify="left", expand=True, header_style="bold dim",
                  title_style="bold red")
        t.add_column("TID", no_wrap=True)
        t.add_column("STATE", no_wrap=True)
        t.add_column("WHY")
        for x in self.snap["stuck"]:
            t.add_row(x["tid"], x["state"], x["why"], style="red")
        return t

    def _recent(self, n: int) -> Any:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        t = Table(title="Recently finished", box=box.SIMPLE_HEAD, title_justify="left",
                  expand=True, header_style="bold dim", title_style="bold")
        for name in ("TID", "LABEL", "STATE", "ENDED", "FILES", "WHY"):
            t.add_column(name, no_wrap=True, overflow="ellipsis",
                         justify="right" if name == "FILES" else "left")
        for r in self.snap["recent"][:n]:
            why = f"{r['code']}: {r['reason']}" if r["state"] == "aborted" and r.get(
                "reason") else ""
            t.add_row(r["tid"], r.get("label") or "", Text(r["state"], STATE_STYLE.get(
                r["state"], "")), r.get("ended_at") or "", str(len(r.get("files") or [])), why)
        return t

    def _render_diff(self, height: int) -> Any:
        from rich.panel import Panel
        from rich.text import Text

        assert self.diff is not None
        page = max(height - 4, 1)
        body = Text(no_wrap=True, overflow="ellipsis")
        for line in self.diff[self.scroll:self.scroll + page]:
            style = ("bold" if line.startswith("diff --git") else "dim" if line.startswith(
                ("---", "+++", "index ", "new file", "deleted file", "old mode", "new mode"))
                else "green" if line.startswith("+") else "red" if line.startswith("-")
                else "magenta" if line.startswith("@@") else "")
            body.append(line + "\n", style=style)
        end = min(self.scroll + page, len(self.diff))
        return Panel(body, title=f"[bold]diff[/] {self.diff_tid}",
                     subtitle=f"lines {self.scroll + 1}-{end} of {len(self.diff)} · "
                              "↑↓ space b scroll · q back", height=height)


def _live(console: Any, ui: _Ui, interval_s: float) -> None:
    from rich.live import Live

    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = None
    if fd is not None:
        import termios
        import tty

        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
    try:
        with Live(console=console, screen=True, auto_refresh=False) as live:
            due = time.monotonic() + interval_s
            while True:
                h, w = console.size.height, console.size.width
                live.update(ui.render(h, w), refresh=True)
                wait = max(due - time.monotonic(), 0)
                if fd is not None:
                    ready, _, _ = select.select([fd], [], [], wait)
                    if ready:
                        data = os.read(fd, 64)
                        for k in _keys(data):
                            if not ui.key(k, h):
                                return
                        continue
                else:
                    time.sleep(wait)
                if time.monotonic() >= due:
                    ui.refresh()
                    due = time.monotonic() + interval_s
    finally:
        if saved is not None and fd is not None:
            import termios

            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _keys(data: bytes) -> list[str]:
    """The keys in what one read gave (escape sequences whole)."""
    out = []
    i = 0
    while i < len(data):
        for seq in (data[i:i + 4], data[i:i + 3], data[i:i + 1]):
            name = KEYS.get(seq)
            if name is not None:
                out.append(name)
                i += len(seq)
                break
        else:
            i += 1
    return out
