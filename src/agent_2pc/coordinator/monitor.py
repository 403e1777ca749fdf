"""The monitor: a read-only picture of a workspace, for ``monitor``, ``top`` and ``web``.

A monitor never changes the workspace. The engine is not opened: opening it finishes what dead
processes left (recovery), and its log reader cuts a torn tail and creates the log file. Here
the log is opened read-only and decoded as it is, a torn tail is reported and left for the next
writer to cut, a corrupt log is reported (with its offset) while what was read before the damage
is still shown, and locks are probed (F_OFD_GETLK), never taken.

``Monitor(root).snapshot()`` is the ``monitor --json`` object::

    {ok, health: healthy|degraded|unhealthy, reasons: [{code, severity, message, tid?}],
     wal: {bytes, records, verified, damage}, counts: {active, ..., committed, aborted},
     in_flight: [{tid, label, state, age_s, files, ...}], stuck: [...], recent: [...], ...}

Polling it again reads only what was appended since (``top`` and ``web`` poll it).

Reaches into the engine's internals (issue 11 re-points them; each is used in this file only,
at the place named):

  R1 the log       storage.wal_format.decode of .agent-tx/wal.bin, opened O_RDONLY  (_WalTail)
  R2 the fold      core.states.apply_record and Tx: the engine's transaction table  (_WalTail)
  R3 liveness      the byte of .agent-tx/txlocks that Journal.tx_lock takes          (_holder)
  R4 staleness     core.recovery.stale_active and engine.boot_id                    (_row)
  R5 history       .agent-tx/history.jsonl lines, as engine.summary writes them     (_History)
  R6 the diff      Staging.diff_of, on a read-only subclass (its _blob reads only)   (diff)
  R7 the fence     fence SqliteStore, read-only, on .agent-tx/fence.db              (_fence)
  R8 scratch       .agent-tx/tx/<tid>/: view-* directories while a run is going     (_runs)
  R9 checks        coordinator.runs.fingerprint: a check's staged content is stale  (_checks)
  R10 tids         engine.check_tid: what a transaction id looks like                (_find)
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import time
import zlib

from ..core.records import BadRecord
from ..core.states import (
    ABORTED,
    COMMITTED,
    COMMITTING,
    FINISHED,
    IN_FLIGHT,
    STATES,
    IllegalTransition,
    Tx,
    apply_record,
    effects_summary,
    iso_ms,
)
from ..errors import NotInitialized, UnknownTid, UsageError
from ..storage import wal_format
from ..storage.log import HEADER_READ_BYTES as LOG_HEADER_READ_BYTES
from ..storage.workspace import Layout, is_workspace

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

HEALTHY, DEGRADED, UNHEALTHY = "healthy", "degraded", "unhealthy"
_RANK = {HEALTHY: 0, DEGRADED: 1, UNHEALTHY: 2}
# Disk: degraded below 5 % free (or 1 GiB), unhealthy below 1 % (or 64 MiB).
DISK_LOW_RATIO, DISK_LOW_BYTES = 0.05, 1 << 30
DISK_CRITICAL_RATIO, DISK_CRITICAL_BYTES = 0.01, 64 << 20
TORN_RECENT_S = 24 * 3600.0       # a torn tail cut this recently still degrades the health
TORN_SETTLE_S = 0.05              # a tail that looks torn is looked at again after this long
RECENT_MAX = 10                   # finished transactions in a snapshot
FILES_LISTED_MAX = 50             # paths per in-flight transaction in a snapshot
PAGE_MAX = 500                    # rows of a history or ledger page
SCRATCH_ENTRIES_MAX = 100_000     # entries walked to size the scratch (then: at least)
LOG_TAIL_BYTES_MAX = 256 << 10    # bytes of a check's log that are shown
_FLOCK = struct.Struct("hh4xqqi4x")  # struct flock, as storage/locks.py packs it
# A history line as engine.summary writes it starts with these two fields.
# (Only a line's own object can hold '{"tid":"' unescaped: the literal prefix is searched
# for, which is far quicker than anchoring at each line start.)
_HISTORY_HEAD = re.compile(rb'\{"tid":"([^"\\\n]+)","state":"([a-z]+)"')


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _WalTail:
    """R1, R2: the log read-only, folded as the engine folds it; re-reads only what is new."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.offset = 0            # end of the last good frame folded
        self.records = 0
        self.txs: dict[str, Tx] = {}
        self.recs: dict[str, list[dict[str, Any]]] = {}  # each live tid's records, in order
        self.damage: dict[str, Any] | None = None
        self.version = 0           # bumped whenever something new was folded
        self._size_seen = -1       # the file's size when it was last decoded
        self._crc = 0              # CRC-32 of the bytes folded so far

    def _reset(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd, self.offset, self.records, self.damage = None, 0, 0, None
        self.txs, self.recs, self._size_seen, self._crc = {}, {}, -1, 0
        self.version += 1

    def poll(self, settle: int = 3) -> None:
        if self.fd is not None:
            st = os.fstat(self.fd)
            if st.st_nlink == 0 or st.st_size < self.offset:  # compaction replaced it
                self._reset()
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return  # no step was ever taken: an empty log
            self._skip_header()
        size = os.fstat(self.fd).st_size
        if size == self._size_seen:
            return  # nothing new (a damaged tail is not decoded again and again)
        if size == self.offset:
            self._size_seen = size
            if self.damage is not None:
                self.damage = None  # the torn tail was cut
                self.version += 1
            return
        buf = os.pread(self.fd, size - self.offset, self.offset)
        decoded = wal_format.decode(buf)
        if decoded.damage is not None and decoded.damage.torn:
            # An append in flight looks torn for an instant: look again before saying so.
            time.sleep(TORN_SETTLE_S)
            if os.fstat(self.fd).st_size != size:
                if settle > 0:
                    return self.poll(settle - 1)
                decoded.damage = None  # still growing: the good frames now, the rest later
                size = self.offset + decoded.end
        self._size_seen = size
        start = self.offset
        try:
            self._fold(decoded)
        finally:
            self._crc = zlib.crc32(memoryview(buf)[:self.offset - start], self._crc)
        damage = None
        if decoded.damage is not None:
            d = decoded.damage
            damage = {"offset": self.offset, "reason": d.reason, "torn": d.torn,
                      "bytes": size - self.offset}
        if damage != self.damage:
            self.damage = damage
            self.version += 1

    def _skip_header(self) -> None:
        """The log's first frame names its workspace (docs/format.md): not a transaction's
        record, so it is passed over (and counted in what ``verify`` re-reads)."""
        assert self.fd is not None and self.offset == 0
        head = os.pread(self.fd, LOG_HEADER_READ_BYTES, 0)
        _, end = wal_format.read_log_header(head)
        if end:
            self.offset = end
            self._crc = zlib.crc32(head[:end])

    def verify(self) -> None:
        """Check that what was folded is still on disk as it was read (a tail reader sees
        only appends; damage done in place, bit rot, shows here): read again on a change."""
        if self.fd is None or self.offset == 0:
            return
        if zlib.crc32(os.pread(self.fd, self.offset, 0)) != self._crc:
            self._reset()
            self.poll()

    def _fold(self, decoded: Any) -> None:
        start = self.offset
        for i, rec in enumerate(decoded.records):
            try:
                tx = apply_record(self.txs, rec)
            except (IllegalTransition, BadRecord) as exc:  # corruption; the rest, bugs
                at = start + sum(len(f) for f in decoded.frames[:i])
                self.offset = at
                self.damage = {"offset": at, "reason": f"record not allowed here ({exc})",
                               "torn": False, "bytes": 0}
                self.version += 1
                raise _Stop() from None
            tx.frames.clear()  # the monitor keeps records, not frames
            self.recs.setdefault(tx.tid, []).append(rec)
            self.records += 1
        self.offset = start + decoded.end
        if decoded.records:
            self.version += 1

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.close()


class _Stop(Exception):
    """A record the fold refuses: the log is corrupt from there on."""


class _History:
    """R5: the history: its sealed segments (history/, read whole, again after each seal) and
    history.jsonl, tailed. Keeps their bytes (bounded by the history's retention), and per tid
    its state, in the order of its latest line; a line is parsed only when it is shown (found
    again by its tid). Lines as engine.summary writes them (tid and state first) are indexed
    by one regular expression over all that is read (C speed: 10k lines in a few ms); any
    other line is parsed as JSON."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ino: int | None = None
        self.offset = 0
        self.data = bytearray()
        self.states: dict[str, str] = {}    # tid -> state, in the order of their latest line
        self.interrupted: int | None = None  # where the latest "interrupted" abort is
        self.version = 0
        self._order: tuple[int, list[str]] | None = None

    def poll(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        ino = st.st_ino if st is not None else -1
        if ino != self.ino or (st is not None and st.st_size < self.offset):
            # A new history.jsonl (compaction sealed the last one into history/): read the
            # sealed segments again, then this file from its start.
            self.__init__(self.path)  # type: ignore[misc]
            self.ino = ino
            self._read_sealed()
        if st is None or st.st_size == self.offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            new = f.read(st.st_size - self.offset)
        self.offset += self._feed(new)

    def _read_sealed(self) -> None:
        from ..storage.history_store import Store

        store = Store(self.path)
        for seg in store.index()["segments"]:
            try:
                with open(store.segment_path(seg["seq"]), "rb") as f:
                    self._feed(f.read())
            except FileNotFoundError:
                continue  # cut by retention meanwhile, or a seal not finished

    def _feed(self, new: bytes) -> int:
        """Take in the complete lines of ``new``; returns how many bytes they are."""
        end = new.rfind(b"\n") + 1  # a line cut short by a crash is written again later
        if end == 0:
            return 0
        base = len(self.data)
        self.data += memoryview(new)[:end]
        pairs = _HISTORY_HEAD.findall(new, 0, end)
        states = self.states
        if len(pairs) == new.count(b"\n", 0, end):  # every line as summary() writes it
            tids = b"\n".join(t for t, _ in pairs).decode().split("\n")
            if not states.keys().isdisjoint(tids) or len(set(tids)) != len(tids):
                for tid in tids:  # a tid again (a crash repeats lines): its latest counts
                    states.pop(tid, None)
            states.update(zip(tids, b"\n".join(s for _, s in pairs).decode().split("\n"),
                              strict=True))
        else:
            for line in new[:end - 1].split(b"\n"):
                obj = _json_line(line) or {}
                key, value = obj.get("tid"), obj.get("state")
                if isinstance(key, str) and isinstance(value, str):
                    states.pop(key, None)
                    states[key] = value
        hit = new.rfind(b'"code":"interrupted"', 0, end)
        if hit != -1:
            self.interrupted = base + hit
        self.version += 1
        return end

    def _line_at(self, pos: int) -> dict[str, Any] | None:
        start = self.data.rfind(b"\n", 0, pos) + 1
        stop = self.data.find(b"\n", pos)
        return _json_line(bytes(self.data[start:stop if stop != -1 else None]))

    def entry(self, tid: str) -> dict[str, Any] | None:
        """The latest line of ``tid`` (the last one in the file), parsed."""
        if tid not in self.states:
            return None
        pos = self.data.rfind(b'"tid":"' + tid.encode() + b'"')
        return None if pos == -1 else self._line_at(pos)

    def latest_interrupted(self) -> dict[str, Any] | None:
        return None if self.interrupted is None else self._line_at(self.interrupted)

    def newest_first(self) -> list[str]:
        if self._order is None or self._order[0] != self.version:
            self._order = (self.version, list(reversed(self.states)))
        return self._order[1]

    def page(self, offset: int, limit: int, state: str | None) -> tuple[int, list[dict[str, Any]]]:
        """Newest first: (total matching, the entries of the page). Their latest lines are in
        the file in the same order, so each is searched for before the previous one only: a
        page costs one pass over the file at most, however old it is."""
        tids = self.newest_first()
        if state is not None:
            tids = [t for t in tids if self.states[t] == state]
        rows = []
        before = len(self.data)
        for tid in tids[offset:offset + limit]:
            pos = self.data.rfind(b'"tid":"' + tid.encode() + b'"', 0, before)
            if pos == -1:
                continue
            row = self._line_at(pos)
            if row is not None:
                rows.append(row)
            before = pos
        return len(tids), rows


def _json_line(line: bytes) -> dict[str, Any] | None:
    import json

    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


class Monitor:
    """A read-only view of the workspace at ``root``; ``snapshot()`` after ``poll()``."""

    def __init__(self, root: str) -> None:
        if not is_workspace(root):
            raise NotInitialized(f"no agent-2pc workspace at {root}", root=root)
        self.root = root
        self.layout = Layout(root)
        self.wal = _WalTail(self.layout.wal)
        self.history = _History(self.layout.history)
        self._locks_fd: int | None = None
        from .engine import boot_id  # R4

        self.boot = boot_id()

    def close(self) -> None:
        self.wal.close()
        if self._locks_fd is not None:
            os.close(self._locks_fd)
            self._locks_fd = None

    def __del__(self) -> None:  # a monitor dropped unclosed leaks no descriptor
        if getattr(self, "_locks_fd", None) is not None:
            self.close()

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------------

    def poll(self) -> int:
        """Read what is new; return a number that changes whenever something did."""
        try:
            self.wal.poll()
        except _Stop:
            pass
        self.history.poll()
        return self.wal.version * 1_000_003 + self.history.version

    def _holder(self, tid: str) -> bool:
        """R3: is a live process holding ``tid``'s lock? Probed, never taken."""
        from ..storage.locks import byte_for

        if self._locks_fd is None:
            try:
                self._locks_fd = os.open(self.layout.txlocks, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
        probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, byte_for(tid), 1, 0)
        got = fcntl.fcntl(self._locks_fd, fcntl.F_OFD_GETLK, probe)
        return bool(_FLOCK.unpack(got)[0] != fcntl.F_UNLCK)

    # -- the snapshot ------------------------------------------------------------------------

    def snapshot(self, recent: int = RECENT_MAX) -> dict[str, Any]:
        self.poll()
        try:
            self.wal.verify()
        except _Stop:
            pass
        now = _now_ms()
        live = [tx for tx in self.wal.txs.values() if tx.state not in FINISHED]
        held = {tx.tid: self._holder(tx.tid) for tx in live}
        if any(tx.state in IN_FLIGHT and not held[tx.tid] for tx in live):
            # Free lock on a deciding transaction: dead holder, unless it just finished (its
            # holder writes the end record before it lets go): read the log again to know.
            seen = {tx.tid: (tx.state, len(self.wal.recs.get(tx.tid, ()))) for tx in live}
            self.poll()
            live = [tx for tx in self.wal.txs.values() if tx.state not in FINISHED]
            for tx in live:
                if seen.get(tx.tid) != (tx.state, len(self.wal.recs.get(tx.tid, ()))):
                    held[tx.tid] = self._holder(tx.tid)
                held.setdefault(tx.tid, self._holder(tx.tid))
        rows = [self._row(tx, now, held[tx.tid]) for tx in live]
        rows.sort(key=lambda r: (r["created_at"], r["tid"]))
        counts = self._counts()
        reasons = self._reasons(rows)
        health = max((r["severity"] for r in reasons), key=_RANK.__getitem__, default=HEALTHY)
        out: dict[str, Any] = {
            "root": self.root, "workspace": self.layout.dir, "at": iso_ms(now),
            "health": health, "reasons": reasons,
            "wal": {"bytes": self.wal.offset + (self.wal.damage or {}).get("bytes", 0),
                    "records": self.wal.records, "verified": self.wal.damage is None,
                    "damage": self.wal.damage},
            "counts": counts, "in_flight": rows,
            "stuck": [{"tid": r["tid"], "label": r["label"], "state": r["state"],
                       "why": r["stuck"]} for r in rows if r["stuck"]],
            "recent": self._recent(recent),
            "scratch": self._scratch(), "blobs": self._blobs(live),
            "disk": self._disk(), "last_recovery": self._last_recovery(),
            "fence": self._fence_summary(),
        }
        for r in out["fence"].get("reasons", []):
            reasons.append(r)
        out["health"] = max((r["severity"] for r in reasons), key=_RANK.__getitem__,
                            default=health)
        return out

    def health(self) -> dict[str, Any]:
        """The health alone (what ``agent_2pc_status`` adds): the log and the live
        transactions, the disk and the fence; the history is not read."""
        try:
            self.wal.poll()
        except _Stop:
            pass
        now = _now_ms()
        rows = [self._row(tx, now, self._holder(tx.tid)) for tx in self.wal.txs.values()
                if tx.state not in FINISHED]
        reasons = self._reasons(rows) + self._fence_summary().get("reasons", [])
        return {"health": max((r["severity"] for r in reasons), key=_RANK.__getitem__,
                              default=HEALTHY),
                "reasons": reasons, "in_flight": len(rows),
                "stuck": sum(1 for r in rows if r["stuck"])}

    def _row(self, tx: Tx, now: int, held: bool) -> dict[str, Any]:
        from ..core import recovery  # R4

        changes = tx.changes()
        stuck = None
        if tx.state in IN_FLIGHT and not held:
            stuck = ("its process died after the commit decision: the tree may be half "
                     "applied until the next command or 'agent-2pc recover' finishes it"
                     if tx.state == COMMITTING else
                     f"its process died while {tx.state}: the next command or 'agent-2pc "
                     "recover' finishes it")
        else:
            act = recovery.stale_active(tx, now, self.boot)
            if act is not None:
                stuck = f"{act.reason}: the next command that touches it aborts it ({act.code})"
        deadline = tx.deadline_ms
        row: dict[str, Any] = {
            "tid": tx.tid, "label": tx.label, "state": tx.state,
            "created_at": iso_ms(tx.created_ms), "age_s": round((now - tx.created_ms) / 1000, 1),
            "files": [op.path for op in changes[:FILES_LISTED_MAX]],
            "files_total": len(changes), "ops": len(tx.ops) + len(tx.effects),
            "reads": len(tx.reads), "savepoints": [s[0] for s in tx.savepoints],
            "checks": self._checks(tx), "effects": len(tx.effects),
            "deadline": iso_ms(deadline) if deadline else None,
            "expires_in_s": round((deadline - now) / 1000, 1) if deadline else None,
            "holder": "working" if held else ("dead" if tx.state in IN_FLIGHT else "idle"),
            "runs": self._runs(tx.tid), "stuck": stuck,
        }
        if tx.effects:
            outcomes: dict[str, int] = {}
            for e in effects_summary(tx):
                outcomes[e["outcome"]] = outcomes.get(e["outcome"], 0) + 1
            row["effect_outcomes"] = outcomes
        return row

    def _checks(self, tx: Tx) -> dict[str, Any]:
        passed = sum(1 for c in tx.checks.values() if c.get("passed"))
        failed = [{"command": c.get("command"), "exit_code": c.get("exit_code"),
                   "timed_out": bool(c.get("timed_out")), "log": c.get("log")}
                  for c in tx.checks.values() if not c.get("passed")]
        stale = 0
        if tx.checks:
            from .runs import fingerprint  # R9

            fp = fingerprint(tx)
            stale = sum(1 for c in tx.checks.values() if c.get("fingerprint") != fp)
        return {"passed": passed, "failed": len(failed), "stale": stale, "failing": failed}

    def _runs(self, tid: str) -> list[dict[str, Any]]:
        """R8: staged views open on ``tid``: a check, exec or look is running (or its process
        died and the next recover sweeps the directory)."""
        out = []
        try:
            with os.scandir(self.layout.tx_dir(tid)) as it:
                for e in it:
                    if e.name.startswith("view-") and e.is_dir(follow_symlinks=False):
                        out.append({"view": e.name, "since": iso_ms(
                            int(e.stat(follow_symlinks=False).st_mtime * 1000))})
        except (FileNotFoundError, NotADirectoryError):
            pass
        return out

    def _counts(self) -> dict[str, int]:
        counts = {s: 0 for s in STATES}
        for tx in self.wal.txs.values():
            counts[tx.state] += 1
        from collections import Counter

        for state, n in Counter(self.history.states.values()).items():
            if state in counts:
                counts[state] += n
        for tid in self.wal.txs:  # finished, still in the log, and already in the history
            was = self.history.states.get(tid)
            if was is not None and was in counts:
                counts[was] -= 1
        counts["total"] = sum(counts.values())
        return counts

    def _recent(self, n: int) -> list[dict[str, Any]]:
        done = _newest_first([tx for tx in self.wal.txs.values() if tx.state in FINISHED])
        out = [_finished_row(tx) for tx in done[:n]]
        if len(out) < n:
            _, older = self.history.page(0, n - len(out) + len(done), None)
            seen = {r["tid"] for r in out}
            out += [_entry_row(e) for e in older if e["tid"] not in seen][:n - len(out)]
        return out

    def _reasons(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        d = self.wal.damage
        if d is not None and not d["torn"]:
            out.append(_reason("corrupt_wal", UNHEALTHY,
                               f"the log is damaged at offset {d['offset']} ({d['reason']}) "
                               "with valid records after it: commands refuse to guess until it "
                               "is restored; what is shown was read before the damage"))
        elif d is not None:
            out.append(_reason("torn_tail", DEGRADED,
                               f"the log ends with {d['bytes']} bytes of a torn record at "
                               f"offset {d['offset']} (a writer died mid-append); the next "
                               "command or 'agent-2pc recover' cuts it"))
        for cut in self._torn_cuts():
            if time.time() - cut["at_s"] < TORN_RECENT_S:
                out.append(_reason("torn_tail_cut", DEGRADED,
                                   f"a torn tail of {cut['bytes']} bytes was cut at offset "
                                   f"{cut['offset']} at {cut['at']} (kept in {cut['file']})"))
        for r in rows:
            if not r["stuck"]:
                continue
            if r["state"] == COMMITTING:
                out.append(_reason("interrupted_commit", UNHEALTHY,
                                   f"{r['tid']}: {r['stuck']}", tid=r["tid"]))
            elif r["state"] in IN_FLIGHT:
                out.append(_reason("interrupted", DEGRADED, f"{r['tid']}: {r['stuck']}",
                                   tid=r["tid"]))
            else:
                out.append(_reason("stuck", DEGRADED, f"{r['tid']}: {r['stuck']}",
                                   tid=r["tid"]))
        disk = self._disk()
        if disk is not None:
            free, ratio = disk["free_bytes"], disk["free_ratio"]
            if ratio < DISK_CRITICAL_RATIO or free < DISK_CRITICAL_BYTES:
                sev = UNHEALTHY
            elif ratio < DISK_LOW_RATIO or free < DISK_LOW_BYTES:
                sev = DEGRADED
            else:
                sev = None
            if sev is not None:
                out.append(_reason("disk_nearly_full", sev,
                                   f"{human_size(free)} free ({ratio:.1%}) on the "
                                   "workspace's disk: staging and commits need room for blobs "
                                   "and the log"))
        return out

    # -- the smaller parts -------------------------------------------------------------------

    def _torn_cuts(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        prefix = os.path.basename(self.layout.wal) + ".torn-"
        try:
            names = [n for n in os.listdir(self.layout.dir) if n.startswith(prefix)]
        except FileNotFoundError:
            return []
        for name in names:
            try:
                st = os.stat(os.path.join(self.layout.dir, name))
            except FileNotFoundError:
                continue
            out.append({"file": name, "offset": int(name[len(prefix):] or 0)
                        if name[len(prefix):].isdigit() else None, "bytes": st.st_size,
                        "at": iso_ms(int(st.st_mtime * 1000)), "at_s": st.st_mtime})
        out.sort(key=lambda c: c["at_s"])
        return out

    def _last_recovery(self) -> dict[str, Any] | None:
        """The latest thing recovery did that left a trace: a torn tail cut, or a transaction
        aborted because its process died (``interrupted``). A roll-forward writes an ordinary
        end record, so it is not told apart here."""
        best: dict[str, Any] | None = None
        cuts = self._torn_cuts()
        if cuts:
            c = cuts[-1]
            best = {"at": c["at"], "kind": "torn_tail_cut", "bytes": c["bytes"],
                    "offset": c["offset"], "_ms": int(c["at_s"] * 1000)}
        for tx in self.wal.txs.values():
            if tx.code == "interrupted" and tx.ended_ms and (
                    best is None or tx.ended_ms > best["_ms"]):
                best = {"at": iso_ms(tx.ended_ms), "kind": "rolled_back", "tid": tx.tid,
                        "reason": tx.reason, "_ms": tx.ended_ms}
        if (best is None or "tid" not in best) and self.history.interrupted is not None:
            e = self.history.latest_interrupted() or {}
            ms = _parse_iso_ms(e.get("ended_at"))
            if best is None or (ms or 0) > best["_ms"]:
                best = {"at": e.get("ended_at"), "kind": "rolled_back", "tid": e.get("tid"),
                        "reason": e.get("reason"), "_ms": ms or 0}
        if best is not None:
            best.pop("_ms")
        return best

    def _scratch(self) -> dict[str, Any]:
        """Bytes under .agent-tx/tx/ (scratch of live transactions: logs, views)."""
        total, entries, dirs = 0, 0, 0
        stack = [self.layout.tx]
        while stack and entries < SCRATCH_ENTRIES_MAX:
            try:
                with os.scandir(stack.pop()) as it:
                    for e in it:
                        entries += 1
                        try:
                            if e.is_dir(follow_symlinks=False):
                                stack.append(e.path)
                                dirs += 1
                            else:
                                total += e.stat(follow_symlinks=False).st_size
                        except FileNotFoundError:
                            pass
            except (FileNotFoundError, NotADirectoryError, PermissionError):
                pass
        return {"bytes": total, "entries": entries, "complete": not stack}

    def _blobs(self, live: list[Tx]) -> dict[str, Any]:
        """Staged content that live transactions name, and blobs being written."""
        seen: dict[str, int] = {}
        for tx in live:
            for op in tx.ops:
                if op.blob:
                    seen[op.blob] = op.size
        writing = 0
        try:
            with os.scandir(self.layout.objects_tmp) as it:
                for e in it:
                    try:
                        writing += e.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        pass
        except FileNotFoundError:
            pass
        return {"bytes": sum(seen.values()), "count": len(seen), "writing_bytes": writing}

    def _disk(self) -> dict[str, Any] | None:
        try:
            st = os.statvfs(self.layout.dir)
        except OSError:
            return None
        total = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize
        return {"free_bytes": free, "total_bytes": total,
                "free_ratio": round(free / total, 4) if total else 1.0}

    # -- the fence (R7) ----------------------------------------------------------------------

    def _fence(self) -> Any:
        """The workspace's fence store (SQLite in .agent-tx/), read-only; None when absent."""
        path = os.path.join(self.layout.dir, "fence.db")
        if not os.path.exists(path):
            return None
        from ..fence._fence import Fence
        from ..fence._sqlite import SqliteStore

        return Fence(SqliteStore(f"sqlite:///{path}", path, read_only=True))

    def _fence_summary(self) -> dict[str, Any]:
        try:
            fence = self._fence()
        except Exception as exc:  # noqa: BLE001 -- a monitor reports, never stops
            return {"present": True, "error": str(exc), "reasons": [
                _reason("fence_unreadable", DEGRADED, f"the fence store cannot be read: {exc}")]}
        if fence is None:
            return {"present": False}
        try:
            st = fence.status(limit=20)
        except Exception as exc:  # noqa: BLE001
            return {"present": True, "error": str(exc), "reasons": [
                _reason("fence_unreadable", DEGRADED, f"the fence store cannot be read: {exc}")]}
        finally:
            fence.close()
        out = {"present": True, "states": st["states"], "domains": st["domains"],
               "counters": st["counters"], "fenced": st.get("fenced", []),
               "running": st.get("running", [])}
        if st["states"].get("fenced"):
            out["reasons"] = [_reason(
                "fenced_intents", DEGRADED,
                f"{st['states']['fenced']} effect(s) ended with an unknown outcome and stay "
                "fenced until reconciled ('agent-2pc fence reconcile')")]
        return out

    def ledger(self, offset: int = 0, limit: int = 100) -> dict[str, Any]:
        """The fence's entries, newest first, each certificate verified."""
        _page_args(offset, limit)
        fence = self._fence()
        if fence is None:
            return {"present": False, "total": 0, "entries": []}
        try:
            total, entries = fence.store.entries(offset, limit)
            rows = [_ledger_row(e) for e in entries]
            summary = fence.status(limit=0)
        finally:
            fence.close()
        return {"present": True, "total": total, "offset": offset, "entries": rows,
                "states": summary["states"], "counters": summary["counters"]}

    # -- one transaction ---------------------------------------------------------------------

    def _find(self, tid: str) -> Tx | dict[str, Any]:
        from .engine import check_tid

        check_tid(tid)
        self.poll()
        tx = self.wal.txs.get(tid)
        if tx is not None:
            return tx
        entry = self.history.entry(tid)
        if entry is None:
            raise UnknownTid(f"no transaction {tid} in this workspace", tid=tid)
        return entry

    def transaction(self, tid: str) -> dict[str, Any]:
        """Everything about one transaction: its steps, savepoints, checks, API steps with
        their fence certificates (verified), and, while it is live, its holder."""
        found = self._find(tid)
        if isinstance(found, dict):
            return {"tid": tid, "live": False, "in_log": False, **found, "steps": [],
                    "savepoints": [], "checks": [], "effects": found.get("effects") or []}
        tx = found
        now = _now_ms()
        held = self._holder(tid) if tx.state not in FINISHED else False
        out = self._row(tx, now, held) if tx.state not in FINISHED else _finished_row(tx)
        out.update({"live": tx.state not in FINISHED, "in_log": True, "code": tx.code,
                    "reason": tx.reason, "timeout_ms": tx.timeout_ms})
        out["changes"] = [{"path": op.path, "op": op.op, "via": op.via, "size": op.size,
                           **({"target": op.target} if op.target else {})}
                          for op in tx.changes()]
        out["steps"] = _steps(self.wal.recs.get(tid, []))
        out["savepoints"] = [{"name": s[0], "ops": s[1]} for s in tx.savepoints]
        out["checks"] = _check_rows(tx)
        out["effects"] = self._effects(tx)
        return out

    def _effects(self, tx: Tx) -> list[dict[str, Any]]:
        rows = effects_summary(tx) if tx.effects else []
        if not rows:
            return rows
        try:
            fence = self._fence()
        except Exception as exc:  # noqa: BLE001
            for r in rows:
                r["fence"] = {"error": str(exc)}
            return rows
        try:
            for r in rows:
                for key, name in ((r["idempotency_key"], "fence"),
                                  (r["idempotency_key"] + ":compensate", "compensation_fence")):
                    entry = fence.store.get(key) if fence is not None else None
                    if entry is not None or name == "fence":
                        r[name] = _ledger_row(entry) if entry is not None else {
                            "intent": key, "state": "absent"}
        finally:
            if fence is not None:
                fence.close()
        return rows

    def check_log(self, tid: str, n: int) -> dict[str, Any]:
        """The tail of the log of ``tid``'s n-th check (as listed by ``transaction``). Only a
        file inside the transaction's scratch directory is ever read."""
        found = self._find(tid)
        if isinstance(found, dict):
            raise UsageError(f"{tid} is finished: its check logs went with its scratch")
        rows = _check_rows(found)
        if not 0 <= n < len(rows):
            raise UsageError(f"{tid} has no check #{n}")
        path = rows[n].get("log")
        base = os.path.realpath(self.layout.tx_dir(tid)) + os.sep
        real = os.path.realpath(path) if isinstance(path, str) else ""
        if not real.startswith(base):
            raise UsageError("that log is not in the transaction's scratch directory")
        try:
            fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            return {"tid": tid, "n": n, "log": path, "text": "", "bytes": 0,
                    "missing": exc.strerror}
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - LOG_TAIL_BYTES_MAX)
            data = os.pread(fd, size - start, start)
        finally:
            os.close(fd)
        return {"tid": tid, "n": n, "log": path, "bytes": size, "truncated": start > 0,
                "text": data.decode("utf-8", "replace")}

    def diff(self, tid: str) -> dict[str, Any]:
        """R6: the staged diff, as ``agent-2pc diff`` shows it, without taking the
        transaction's lock and without finishing it (a monitor changes nothing)."""
        found = self._find(tid)
        if isinstance(found, dict) or found.state in FINISHED:
            return {"tid": tid, "files": [], "diff": "", "finished": True}
        from ..core.textdiff import diff_file
        from ..errors import Agent2PCError
        from ..storage.blobs import BlobCorrupt, BlobStore
        from .staging import Staging

        class _Look(Staging):
            def __init__(self, root: str, blobs: BlobStore) -> None:
                self.root, self.blobs = root, blobs

            def _blob(self, op: Any) -> bytes:
                return self.blobs.read(op.blob)  # no discard of a damaged blob: read-only

        look = _Look(self.root, BlobStore(self.layout.objects, self.layout.preimages))
        files: list[dict[str, Any]] = []
        texts: list[str] = []
        for op in found.changes():
            try:
                for row, text in look.diff_of(found, op, diff_file):
                    files.append(row)
                    texts.append(text)
            except (BlobCorrupt, Agent2PCError, OSError) as exc:
                files.append({"path": op.path, "status": "unreadable", "additions": 0,
                              "deletions": 0, "error": str(exc)})
                texts.append(f"# {op.path}: cannot be shown ({exc})\n")
        return {"tid": tid, "files": files, "diff": "".join(texts), "finished": False}

    def page(self, offset: int = 0, limit: int = 50, state: str | None = None
             ) -> dict[str, Any]:
        """Finished transactions, newest first, a page at a time."""
        _page_args(offset, limit)
        if state is not None and state not in (COMMITTED, ABORTED):
            raise UsageError("state is committed or aborted")
        self.poll()
        in_log = [tx for tx in self.wal.txs.values() if tx.state in FINISHED
                  and (state is None or tx.state == state)]
        in_log = _newest_first(in_log)
        log_rows = [_finished_row(tx) for tx in in_log]
        skip = {r["tid"] for r in log_rows}
        rows = log_rows[offset:offset + limit]
        hist_offset = max(0, offset - len(log_rows))
        total_hist, hist = self.history.page(hist_offset, limit - len(rows) + len(skip), state)
        rows += [_entry_row(e) for e in hist if e["tid"] not in skip][:limit - len(rows)]
        return {"total": len(log_rows) + total_hist - sum(
            1 for t in skip if t in self.history.states), "offset": offset, "limit": limit,
            "transactions": rows}


def health(root: str) -> dict[str, Any]:
    """``Monitor(root).health()``, opened and closed."""
    mon = Monitor(root)
    try:
        return mon.health()
    finally:
        mon.close()


def _newest_first(txs: list[Tx]) -> list[Tx]:
    """By end time, newest first; in the log's order (the order they ended) within a ms."""
    order = sorted(range(len(txs)), key=lambda i: (txs[i].ended_ms or 0, i), reverse=True)
    return [txs[i] for i in order]


def _page_args(offset: Any, limit: Any) -> None:
    if type(offset) is not int or offset < 0 or type(limit) is not int or not (
            0 <= limit <= PAGE_MAX):
        raise UsageError(f"offset >= 0 and 0 <= limit <= {PAGE_MAX}")


def _reason(code: str, severity: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"code": code, "severity": severity, "message": message, **extra}


def human_size(n: float) -> str:
    """Bytes as the monitor, top and web show them: 512 B, 1.5 KiB, 3.2 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _parse_iso_ms(text: Any) -> int | None:
    if not isinstance(text, str) or len(text) < 20:
        return None
    import calendar

    try:
        secs = calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
        return secs * 1000 + int(text[20:23] or 0)
    except ValueError:
        return None


def _finished_row(tx: Tx) -> dict[str, Any]:
    out: dict[str, Any] = {"tid": tx.tid, "label": tx.label, "state": tx.state,
           "created_at": iso_ms(tx.created_ms),
           "ended_at": iso_ms(tx.ended_ms) if tx.ended_ms else None,
           "files": list(tx.files), "code": tx.code, "reason": tx.reason,
           "ops": len(tx.ops) + len(tx.effects)}
    if tx.uncompensated:
        out["uncompensated"] = list(tx.uncompensated)
    return out


def _entry_row(e: dict[str, Any]) -> dict[str, Any]:
    out = {k: e.get(k) for k in ("tid", "label", "state", "created_at", "ended_at", "code",
                                 "reason", "ops")}
    out["files"] = e.get("files") or []
    if e.get("uncompensated"):
        out["uncompensated"] = e["uncompensated"]
    return out


def _check_rows(tx: Tx) -> list[dict[str, Any]]:
    fp = None
    if tx.checks:
        from .runs import fingerprint  # R9

        fp = fingerprint(tx)
    return [{"command": c.get("command"), "passed": bool(c.get("passed")),
             "exit_code": c.get("exit_code"), "timed_out": bool(c.get("timed_out")),
             "duration_ms": c.get("duration_ms"), "isolation": c.get("isolation"),
             "at": iso_ms(c["ts"]) if isinstance(c.get("ts"), int) else None,
             "stale": c.get("fingerprint") != fp, "log": c.get("log"),
             "tail": c.get("tail")} for c in tx.checks.values()]


_STEP_FIELDS = {
    "begin": ("label", "timeout_ms", "pid"), "read": ("path", "sha256"),
    "stage": ("path", "op", "via", "size", "target"), "effect": ("n", "kind", "key"),
    "check": ("command", "passed", "exit_code", "duration_ms"), "savepoint": ("name",),
    "rollback": ("name",), "prepare": ("pid",), "decision": ("outcome", "code", "reason"),
    "result": ("phase", "n", "outcome", "status"), "end": ("state", "files"),
}


def _steps(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of a transaction as steps (what the graph draws): a rollback names the
    savepoint it returns to, and every step it undid is marked ``undone``."""
    steps: list[dict[str, Any]] = []
    marks: dict[str, int] = {}
    for rec in recs:
        t = rec.get("type")
        step: dict[str, Any] = {"n": len(steps), "type": t, "at": iso_ms(rec["ts"]) if isinstance(
            rec.get("ts"), int) else None}
        for k in _STEP_FIELDS.get(str(t), ()):
            if rec.get(k) is not None:
                step[k] = rec[k]
        if t == "effect":
            req = rec.get("request") or {}
            step["method"], step["url"] = req.get("method"), req.get("url")
        if t == "savepoint":
            marks[rec["name"]] = step["n"]
        elif t == "rollback" and rec.get("name") in marks:
            back = marks[rec["name"]]
            step["to"] = back
            for s in steps[back + 1:]:
                if s["type"] in ("stage", "read", "effect", "check", "savepoint") and \
                        "undone_by" not in s:
                    s["undone_by"] = step["n"]
            marks = {k: v for k, v in marks.items() if v <= back}
        steps.append(step)
    return steps


def _ledger_row(entry: Any) -> dict[str, Any]:
    """A fence entry as shown, its certificate verified here (the page shows the verdict)."""
    from ..fence._cert import env_key

    row: dict[str, Any] = {"intent": entry.intent, "state": entry.state,
                           "generation": entry.generation, "token": entry.token,
                           "tool": (entry.request or {}).get("tool"),
                           "domain": (entry.request or {}).get("domain"),
                           "agent": (entry.request or {}).get("agent"),
                           "reason": entry.reason or None,
                           "updated_at": iso_ms(int(entry.updated_at * 1000))}
    cert = entry.cert
    if cert is not None:
        problems = cert.problems(env_key())
        row["cert"] = cert.to_json()
        row["verified"] = not problems
        row["problems"] = problems
    return row
