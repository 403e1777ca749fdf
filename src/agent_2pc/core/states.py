"""Transactions as the log describes them: records, states, legal transitions. Pure: no I/O.

Records (the payloads of log frames; docs/format.md lists every field)::

    begin     {tid, ts, label, timeout_ms, boot, pid[, undoes]}    -> active
    read      {tid, ts, path, sha256}                               active
    stage     {tid, ts, path, op, via, blob, size, mode, pre[, target]}  active
    effect    {tid, ts, n, kind, request, key, compensate}          active
    check     {tid, ts, key, command, options, fingerprint, ...}    active
    savepoint {tid, ts, name}                                       active
    rollback  {tid, ts, name}                                       active
    prepare   {tid, ts, pid}                                        active    -> preparing
    vote      {tid, ts, pid, coordinator, decided}                  preparing -> prepared
    decision  {tid, ts, outcome: commit, ...}                       preparing | prepared
                                                                              -> committing
    decision  {tid, ts, outcome: abort, code, reason}               active | preparing |
                                                                    prepared -> aborting
    result    {tid, ts, phase, n, outcome, ...}                     preparing, aborting
    end       {tid, ts, state: committed | aborted, files, ...}     committing -> committed,
                                                                    aborting -> aborted

``effect`` stages a remote call (participants/api.py); ``result`` records what one attempt at an
effect (phase ``effect``) or its compensation (phase ``compensate``) came to.

``ts`` is milliseconds since the epoch. A record that the table does not allow is an
IllegalTransition: the log is corrupt or there is a bug, and nobody may guess. A record whose
fields are not of its kind's shape (core/records.py, which also builds them) is a BadRecord.
"""

from __future__ import annotations

import time

from .records import BadRecord, shape_problem

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ACTIVE, PREPARING, PREPARED, COMMITTING, COMMITTED, ABORTING, ABORTED = (
    "active", "preparing", "prepared", "committing", "committed", "aborting", "aborted")
# The contract's states. PREPARED is recorded only for a transaction an outside coordinator
# decides (``vote``): a plain commit decides right after the last vote, under the same lock.
# A prepared transaction is in doubt, not in flight: no process works on it, and nothing but
# its coordinator's decision (``decide``) ends it (docs/design.md, "Prepared, in doubt").
STATES = (ACTIVE, PREPARING, PREPARED, COMMITTING, COMMITTED, ABORTING, ABORTED)
FINISHED = frozenset({COMMITTED, ABORTED})
# Past the commit point, or deciding: a process works on these under the commit lock, and one
# that finds such a transaction with no live holder finishes it.
IN_FLIGHT = frozenset({PREPARING, COMMITTING, ABORTING})

# (record kind, state before) -> state after; None stands for "no such transaction yet".
TRANSITIONS: dict[tuple[str, str | None], str] = {
    ("begin", None): ACTIVE,
    ("read", ACTIVE): ACTIVE,
    ("stage", ACTIVE): ACTIVE,
    ("effect", ACTIVE): ACTIVE,
    ("check", ACTIVE): ACTIVE,
    ("result", PREPARING): PREPARING,
    ("result", ABORTING): ABORTING,
    ("savepoint", ACTIVE): ACTIVE,
    ("rollback", ACTIVE): ACTIVE,
    ("prepare", ACTIVE): PREPARING,
    ("vote", PREPARING): PREPARED,
    ("decision:commit", PREPARING): COMMITTING,
    ("decision:commit", PREPARED): COMMITTING,
    ("decision:abort", ACTIVE): ABORTING,
    ("decision:abort", PREPARING): ABORTING,
    ("decision:abort", PREPARED): ABORTING,
    ("end:committed", COMMITTING): COMMITTED,
    ("end:aborted", ABORTING): ABORTED,
}


class IllegalTransition(Exception):
    def __init__(self, tid: str, kind: str, state: str | None) -> None:
        super().__init__(f"record {kind!r} is not allowed for {tid} in state {state}")
        self.tid = tid


def record_kind(rec: dict[str, Any]) -> str:
    t = rec["type"]
    if t == "decision":
        return f"decision:{rec['outcome']}"
    if t == "end":
        return f"end:{rec['state']}"
    return str(t)


# What ``Op.op`` may be. A write puts a regular file (blob, mode); a symlink puts a symbolic
# link (target); a mkdir an empty directory (mode); a delete removes a file, a link, or an
# empty directory.
OP_KINDS = ("write", "delete", "symlink", "mkdir")
# ``pre`` (and the fingerprints prepare compares it with) names what stood at a path: None for
# nothing, the sha256 of a regular file's content, DIR_FINGERPRINT for a directory, or
# "symlink:" + the sha256 of a link's target (storage/hashing.py: node_fingerprint).
DIR_FINGERPRINT = "dir"


class Op:
    """One staged change of one path. ``blob`` is None for all but a write; ``pre`` is the
    fingerprint of what stood at the path when it was first staged in this transaction
    (None: nothing); ``target`` is a symlink's target."""

    __slots__ = ("path", "op", "via", "blob", "size", "mode", "pre", "target")

    def __init__(self, path: str, op: str, via: str, blob: str | None, size: int,
                 mode: int | None, pre: str | None, target: str | None = None) -> None:
        self.path = path
        self.op = op  # one of OP_KINDS
        self.via = via  # what staged it: write | replace | patch | delete | exec | ...
        self.blob = blob
        self.size = size
        self.mode = mode
        self.pre = pre
        self.target = target

    def __repr__(self) -> str:
        return f"Op({self.op} {self.path} via {self.via}, blob={self.blob}, pre={self.pre})"


def named_blobs(op: Op) -> tuple[str | None, str | None]:
    """The blobs a live transaction's op keeps: its content, and for a write over a file its
    base (the content it was staged from, which staging keeps when it can, for a merge at
    commit: coordinator/rebase.py). A symlink's or a directory's ``pre`` names no blob."""
    if op.op != "write" or op.pre is None or len(op.pre) != 64:
        return op.blob, None
    return op.blob, op.pre


class Tx:
    """A transaction as folded from its records (plain class: dataclasses import slowly)."""

    __slots__ = ("tid", "state", "label", "created_ms", "timeout_ms", "boot", "ops", "reads",
                 "effects", "results", "checks", "savepoints", "outcome", "code", "reason",
                 "decision_fields", "prepared", "files",
                 "diverged", "uncompensated", "ended_ms", "frames", "origin",
                 "undoes", "coordinator", "voted_ms", "voted", "_latest", "_below",
                 "_indexed")

    def __init__(self, tid: str, state: str, label: str | None, created_ms: int,
                 timeout_ms: int | None, boot: str | None) -> None:
        self.tid = tid
        self.state = state
        self.label = label
        self.created_ms = created_ms
        self.timeout_ms = timeout_ms
        self.boot = boot
        self.ops: list[Op] = []
        self.reads: list[tuple[str, str | None]] = []
        self.effects: list[dict[str, Any]] = []  # the effect records, in staging order
        self.results: dict[tuple[str, int], dict[str, Any]] = {}  # (phase, n) -> last result
        self.checks: dict[str, dict[str, Any]] = {}  # check key -> its latest run
        # name, #ops, #reads, #effects at that point
        self.savepoints: list[tuple[str, int, int, int]] = []
        self.outcome: str | None = None
        self.code: str | None = None
        self.reason: str | None = None
        self.decision_fields: dict[str, Any] = {}  # the decision record (modes for a redo)
        self.prepared = False  # a prepare record was written (remote calls may have run)
        self.files: list[str] = []
        self.diverged: list[str] = []
        self.uncompensated: list[int] = []  # calls that may have happened and were not undone
        self.ended_ms: int | None = None
        self.frames: list[bytes | memoryview] = []  # its records' frames (for compaction)
        self.origin: dict[str, Any] | None = None  # where an imported transaction came from
        self.undoes: str | None = None  # the transaction this one takes back (undo)
        # The vote record, for a transaction an outside coordinator decides: who decides,
        # when it voted yes, what its commit decision will carry.
        self.coordinator: dict[str, Any] | None = None
        self.voted_ms: int | None = None
        self.voted: dict[str, Any] = {}
        # An index of ``ops``, brought up to date on use (ops are only ever appended, or cut
        # by a rollback, which drops the index): the latest op per path, and per directory
        # how many paths below it hold a live (not deleted) op. Without it a lookup is a scan
        # of every op, and a step staging n files costs n^2.
        self._latest: dict[str, Op] = {}
        self._below: dict[str, int] = {}
        self._indexed = 0

    @property
    def deadline_ms(self) -> int | None:
        return None if not self.timeout_ms else self.created_ms + self.timeout_ms

    def expired(self, now_ms: int) -> bool:
        d = self.deadline_ms
        return d is not None and now_ms >= d

    def staged(self, path: str) -> Op | None:
        """The latest op on ``path`` still in effect, if any."""
        return self.latest_ops().get(path)

    def holds_below(self, rel_dir: str) -> bool:
        """Does a path below the directory ``rel_dir`` hold a live op (not a delete)?"""
        self.latest_ops()
        return self._below.get(rel_dir, 0) > 0

    def latest_ops(self) -> dict[str, Op]:
        """The latest op per path (the index itself: do not change it)."""
        ops = self.ops
        if self._indexed > len(ops):  # cut behind our back: start again
            self.drop_index()
        latest, below = self._latest, self._below
        for op in ops[self._indexed:]:
            old = latest.get(op.path)
            if old is not None and old.op != "delete":
                _count_dirs(below, op.path, -1)
            latest[op.path] = op
            if op.op != "delete":
                _count_dirs(below, op.path, 1)
        self._indexed = len(ops)
        return latest

    def drop_index(self) -> None:
        self._latest, self._below, self._indexed = {}, {}, 0

    def changes(self) -> list[Op]:
        """The net change per path, sorted by path; the first op's pre-image is the base."""
        last: dict[str, Op] = {}
        for op in self.ops:
            last[op.path] = op
        return [last[p] for p in sorted(last)]

    def summary(self) -> dict[str, Any]:
        return {
            "tid": self.tid,
            "state": self.state,
            "label": self.label,
            "created_at": iso_ms(self.created_ms),
            "ops": len(self.ops) + len(self.effects),
        }


def _count_dirs(below: dict[str, int], path: str, by: int) -> None:
    """Add ``by`` to the count of every directory above ``path``."""
    end = path.rfind("/")
    while end > 0:
        d = path[:end]
        below[d] = below.get(d, 0) + by
        end = path.rfind("/", 0, end)


def apply_record(txs: dict[str, Tx], rec: dict[str, Any], frame: bytes | memoryview = b"") -> Tx:
    """Fold one record into ``txs``; return the transaction it touched. ``frame`` is the
    record's bytes on disk, kept with the transaction so compaction can copy them.

    BadRecord when the record fails its kind's shape (core/records.py), IllegalTransition when
    the table (or a savepoint, or the order of effects) does not allow it: both are
    corruption. Anything else raised here is a bug in the fold."""
    try:  # a frame without them is damage (storage/wal_format.py), but nobody may guess
        t = rec["type"]
        tid = rec["tid"]
    except KeyError:
        raise BadRecord(rec, shape_problem(rec) or "no type or tid") from None
    if t == "stage" and type(tid) is str:
        tx = txs.get(tid)
        get = rec.get
        if tx is not None and tx.state == ACTIVE and type(get("ts")) is int:
            # Most of any log: TRANSITIONS[("stage", ACTIVE)] without a lookup, and the
            # stage shape checked inline (tests/test_record_shapes.py holds it to SHAPES).
            path, op, via, blob = get("path"), get("op"), get("via"), get("blob")
            size, mode, pre, target = get("size", 0), get("mode"), get("pre"), get("target")
            if (type(path) is str and type(op) is str and type(size) is int
                    and (via is None or type(via) is str)
                    and (blob is None or type(blob) is str)
                    and (mode is None or type(mode) is int)
                    and (pre is None or type(pre) is str)
                    and (target is None or type(target) is str)):
                tx.ops.append(Op(path, op, via or op, blob, size, mode, pre, target))
                tx.frames.append(frame)
                return tx
    why = shape_problem(rec)
    if why is not None:
        raise BadRecord(rec, why)
    tx = txs.get(tid)
    state = tx.state if tx is not None else None
    kind = t if t != "decision" and t != "end" else record_kind(rec)
    after = TRANSITIONS.get((kind, state))
    if after is None:
        raise IllegalTransition(tid, kind, state)
    if t == "begin":
        tx = Tx(tid=tid, state=after, label=rec.get("label"), created_ms=rec["ts"],
                timeout_ms=rec.get("timeout_ms"), boot=rec.get("boot"))
        tx.origin = rec.get("origin")
        tx.undoes = rec.get("undoes")
        txs[tid] = tx
    else:
        assert tx is not None
        tx.state = after
        _fold_fields(tx, t, rec)
    tx.frames.append(frame)
    return tx


def _fold_fields(tx: Tx, t: str, rec: dict[str, Any]) -> None:
    """What a record (its shape checked, its transition allowed) changes in ``tx`` besides
    its state."""
    if t == "stage":
        get = rec.get
        tx.ops.append(Op(rec["path"], rec["op"], get("via") or rec["op"], get("blob"),
                         get("size", 0), get("mode"), get("pre"), get("target")))
    elif t == "read":
        tx.reads.append((rec["path"], rec.get("sha256")))
    elif t == "effect":
        if rec["n"] != len(tx.effects):
            raise IllegalTransition(tx.tid, f"effect {rec['n']} out of order", tx.state)
        tx.effects.append(rec)
    elif t == "result":
        tx.results[(rec["phase"], rec["n"])] = rec
    elif t == "check":
        tx.checks.pop(rec["key"], None)
        tx.checks[rec["key"]] = rec
    elif t == "savepoint":
        tx.savepoints = [s for s in tx.savepoints if s[0] != rec["name"]]
        tx.savepoints.append((rec["name"], len(tx.ops), len(tx.reads), len(tx.effects)))
    elif t == "rollback":
        idx = next((i for i, s in enumerate(tx.savepoints) if s[0] == rec["name"]), None)
        if idx is None:
            raise IllegalTransition(tx.tid, f"rollback to unknown savepoint {rec['name']!r}",
                                    tx.state)
        _, n_ops, n_reads, n_effects = tx.savepoints[idx]
        del tx.ops[n_ops:]
        tx.drop_index()
        del tx.reads[n_reads:]
        del tx.effects[n_effects:]
        del tx.savepoints[idx + 1:]
    elif t == "prepare":
        tx.prepared = True
    elif t == "vote":
        tx.coordinator = rec["coordinator"]
        tx.voted_ms = rec["ts"]
        tx.voted = rec.get("decided") or {}
    elif t == "decision":
        tx.outcome = rec["outcome"]
        tx.code = rec.get("code")
        tx.reason = rec.get("reason")
        tx.decision_fields = rec
    elif t == "end":
        tx.files = list(rec.get("files", ()))
        tx.diverged = list(rec.get("diverged", ()))
        tx.uncompensated = list(rec.get("uncompensated", ()))
        tx.ended_ms = rec["ts"]


def effects_summary(tx: Tx, kinds: frozenset[str] = frozenset({"http"})
                    ) -> list[dict[str, Any]]:
    """One line per remote call of ``kinds``: what it was and what came of it (and of its
    compensation)."""
    rows = []
    for eff in tx.effects:
        if eff.get("kind", "http") not in kinds:
            continue
        n, req = eff["n"], eff["request"]
        row: dict[str, Any] = {"n": n, "method": req["method"], "url": req["url"],
                               "idempotency_key": eff["key"], "outcome": "not sent"}
        res = tx.results.get(("effect", n))
        if res is not None:
            row["outcome"] = res["outcome"]
            row["status"] = res.get("status")
            if res.get("response") is not None:
                row["response"] = res["response"]
        comp = tx.results.get(("compensate", n))
        if comp is not None:
            row["compensation"] = {"outcome": comp["outcome"], "status": comp.get("status")}
        rows.append(row)
    return rows


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as ISO-8601 UTC with millisecond precision."""
    secs, rem = divmod(ms, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{rem:03d}Z"
