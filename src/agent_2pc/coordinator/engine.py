"""The transaction engine of one workspace: a facade over its parts.

Every public method is one step of the contract (begin, stage, commit, ...), carried out by the
parts it is built from (docs/design.md, "The engine's parts"):

  journal      the log, the transaction table folded from it, the locks, liveness
  twophase     begin, prepare (the participants' votes), the decision, apply, abort
  recovery     finishing what dead processes left, the report of recover
  gate         the way into a transaction (its lock; a dead worker's step finished first)
  compaction   the log into history.jsonl, garbage collection, the scratch sweep
  staging      the staging steps, the staged view, diff and status
  runs         checks, exec and look-arounds in the staged view
  rebase       commit's merge of what other writers changed under the staged files

The engine tails the log before each step, so it sees what other processes appended.
"""

from __future__ import annotations

from ..core.paging import LIST_LIMIT, LIST_LIMIT_MAX
from ..core.records import now_ms as now_ms
from ..core.states import ABORTED, ACTIVE, COMMITTED, IN_FLIGHT, PREPARED
from ..errors import NotInitialized, TransactionAborted, UsageError
from ..participants.registry import participants_for
from ..storage.blobs import BlobStore
from ..storage.workspace import Layout, check_intact, is_workspace
from .answers import answer_again, check_summary, result, with_merged
from .answers import summary as summary
from .compaction import Compaction
from .gate import TID_RE as TID_RE
from .gate import Gate, Held, HeldActive
from .gate import check_tid as check_tid
from .journal import Journal
from .journal import boot_id as boot_id
from .outside import check_coordinator, check_outcome, in_doubt, refuse_prepared
from .rebase import Rebase
from .recovery import Recovery
from .runs import Runs
from .staging import Staging
from .twophase import DEFAULT_TIMEOUT_MS as DEFAULT_TIMEOUT_MS
from .twophase import TIMEOUT_MS_MAX as TIMEOUT_MS_MAX
from .twophase import TwoPhase

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..core.states import Tx
    from ..storage.log import Log


class Engine:
    def __init__(self, root: str, *, recover_dead: bool = True) -> None:
        if not is_workspace(root):
            raise NotInitialized(f"no agent-2pc workspace at {root}", root=root)
        self.root = root
        self.layout = Layout(root)
        check_intact(self.layout, log=False)  # FORMAT; the log's open checks wal.bin
        self.journal = Journal(self.layout)
        self.blobs = BlobStore(self.layout.objects, self.layout.preimages)
        self.participants = participants_for(self.layout, self.blobs)
        self.twophase = TwoPhase(self.journal, self.participants)
        self.compaction = Compaction(self.journal)
        self.recovery = Recovery(self.journal, self.twophase, self.compaction)
        self.gate = Gate(self.journal, self.twophase, self.recovery)
        self.staging = Staging(root, self.blobs, self.journal, self.gate, self.participants)
        self.runs = Runs(root, self.blobs, self.journal, self.gate, self.staging)
        self.rebase = Rebase(root, self.blobs, self.journal, self.staging, self.twophase)
        self.journal.refresh()
        if recover_dead and any(tx.state in IN_FLIGHT for tx in self.journal.txs.values()):
            self.recovery.recover_dead()

    def close(self) -> None:
        self.twophase.close()
        self.journal.close()

    @property
    def txs(self) -> dict[str, Tx]:
        """The live transactions, as the log said at the last step."""
        return self.journal.txs

    @property
    def log(self) -> Log:
        return self.journal.log

    # -- the protocol ------------------------------------------------------------------------

    def begin(self, timeout_ms: int | None = None, label: str | None = None,
              git_branch: str | None = None) -> dict[str, Any]:
        """A new transaction; with ``git_branch``, bound to that branch (participants/git.py:
        prepare checks that it did not move under the transaction's paths, and git-commit
        commits onto it). The branch is checked before anything is logged."""
        if git_branch is None:
            return self.twophase.begin(timeout_ms, label)
        checked = self.staging.check_effect("git-branch", {"branch": git_branch})
        out = self.twophase.begin(timeout_ms, label)
        bound = self.staging.log_effect(out["tid"], "git-branch", checked)
        return {**out, "git_branch": bound["branch"], "base": bound["base"]}

    def commit(self, tid: str, merge: bool = True) -> dict[str, Any]:
        """Commit ``tid``. ``merge``: a file that another writer changed since it was staged
        is merged with it when the edits do not overlap (rebase.py), else it is a conflict."""
        if type(merge) is not bool:
            raise UsageError(f"`merge` is true or false, not {merge!r}", params=("merge",))
        with self.gate.locked(tid) as tx:
            if not isinstance(tx, dict) and tx.state == PREPARED:
                refuse_prepared(tx, "committed by 'commit'")
            if isinstance(tx, dict) or tx.state != ACTIVE:
                return with_merged(answer_again(tx, COMMITTED))
            self.gate.abort_if_stale(tx)
            if merge and self.txs[tid].checks:  # so that the checks run again outside the
                self.rebase.rebase(tid)            # commit lock, in the usual case
            # Checks run before the commit lock is taken (they may take minutes); the
            # transaction's own lock, held meanwhile, keeps its staged content as they saw it.
            self._run_stale_checks(tid)
            with self.journal.commit_lock:
                self.recovery.finish_dead_locked()
                if merge and self.rebase.rebase(tid):  # a commit got in meanwhile
                    self._run_stale_checks(tid)
                self.twophase.prepare_and_commit(tid)
        self.compaction.maybe_compact()
        return with_merged(result(self.txs.get(tid) or self.journal.lookup(tid)))

    def _run_stale_checks(self, tid: str) -> None:
        """Run the checks whose staged content changed; a failing one aborts ``tid``."""
        ok, reason, failed = self.runs.run_stale_checks(tid)
        if not ok:
            self.twophase.abort(self.txs[tid], "verification_failed", reason or "")
            raise TransactionAborted(reason or "a check failed", code="verification_failed",
                                     tid=tid, check=check_summary(failed))

    def abort(self, tid: str, reason: str | None = None) -> dict[str, Any]:
        with self.gate.locked(tid) as tx:
            if not isinstance(tx, dict) and tx.state == PREPARED:
                refuse_prepared(tx, "aborted by 'abort'")
            if isinstance(tx, dict) or tx.state != ACTIVE:
                out = answer_again(tx, ABORTED)
            else:
                self.twophase.abort(tx, "aborted", reason or "aborted by request")
                out = result(self.txs[tid])
        self.compaction.maybe_compact()
        out.pop("files", None)
        return out

    # -- decided by an outside coordinator (outside.py) --------------------------------------

    def vote(self, tid: str, coordinator: dict[str, Any] | str) -> dict[str, Any]:
        """Prepare ``tid`` for an outside coordinator (a JSON object naming it, no password)
        and vote: yes -> ``{tid, state: prepared, vote: yes}``, the vote durable and every
        lock released (the transaction waits, in doubt, for ``decide``); no ->
        TransactionAborted, the transaction aborted, as commit. Voting again for the same
        coordinator answers the same; for another, or on a transaction decided otherwise,
        bad_state."""
        coordinator = check_coordinator(coordinator)
        with self.gate.locked(tid) as tx:
            if isinstance(tx, dict) or tx.state != ACTIVE:
                return self._vote_again(tx, coordinator)
            self.gate.abort_if_stale(tx)
            self._run_stale_checks(tid)
            with self.journal.commit_lock:
                self.recovery.finish_dead_locked()
                self.twophase.prepare_and_vote(tid, coordinator)
        return {"tid": tid, "state": PREPARED, "vote": "yes"}

    def _vote_again(self, tx: Tx | dict[str, Any], coordinator: dict[str, Any]
                    ) -> dict[str, Any]:
        """vote on a transaction that is no longer active: the same answer as the first
        vote when it was for this coordinator."""
        get = tx.get if isinstance(tx, dict) else lambda k: getattr(tx, k, None)
        tid, state, voted_for = get("tid"), get("state"), get("coordinator")
        if state == ABORTED and voted_for in (None, coordinator):
            raise TransactionAborted(get("reason") or f"{tid} is aborted",
                                     code=get("code") or "aborted", tid=tid)
        if voted_for == coordinator and state in (PREPARED, COMMITTED, "committing"):
            return {"tid": tid, "state": state, "vote": "yes"}
        why = (f"it voted for another coordinator ({voted_for})" if voted_for
               else "it was not prepared for a coordinator")
        from ..errors import BadState

        raise BadState(f"{tid} is {state}; {why}: it cannot vote for {coordinator}",
                       tid=tid, state=state)

    def decide(self, tid: str, outcome: str, reason: str | None = None) -> dict[str, Any]:
        """The coordinator's decision for ``tid`` ("commit" or "abort"), from any process.
        A prepared transaction commits (decision, apply: commit's answer) or aborts (undo:
        abort's answer); an active one may only be aborted. Deciding a finished transaction
        the way it went answers the same; the other way is bad_state."""
        outcome = check_outcome(outcome)
        if reason is not None and (not isinstance(reason, str) or len(reason) > 1000):
            raise UsageError("`reason` is a string of at most 1000 characters",
                             params=("reason",))
        wanted = COMMITTED if outcome == "commit" else ABORTED
        with self.gate.locked(tid) as tx:
            if isinstance(tx, dict) or tx.state not in (ACTIVE, PREPARED):
                out = answer_again(tx, wanted)
            elif tx.state == ACTIVE and outcome == "commit":
                from ..errors import BadState

                raise BadState(f"{tid} is active: it never voted, so it cannot be decided "
                               "committed ('vote' first, or 'commit' it)",
                               tid=tid, state=tx.state)
            else:
                with self.journal.commit_lock:
                    if outcome == "commit":
                        self.twophase.decide_commit(tid)
                    else:
                        self.twophase.abort(tx, "aborted", reason or (
                            "its coordinator decided abort" if tx.state == PREPARED
                            else "aborted by request"))
                out = result(self.txs.get(tid) or self.journal.lookup(tid))
        self.compaction.maybe_compact()
        if outcome == "abort":
            out.pop("files", None)
            return out
        return with_merged(out)

    def in_doubt(self) -> list[dict[str, Any]]:
        """The prepared transactions, waiting for their coordinators' decisions:
        ``[{tid, coordinator, prepared_ms, files}]``, oldest vote first."""
        self.journal.refresh()
        return in_doubt(self.journal.txs.values())

    def recover(self) -> dict[str, Any]:
        """Finish or undo what crashes left; abort expired transactions; repair a torn tail.

        ``truncated_bytes`` counts what this engine cut off since it opened the log (or since
        its previous recover).
        """
        self.recovery.finish_all()
        views_removed = self.runs.sweep_views()  # staged views of dead callers
        self.compaction.maybe_compact()
        return self.recovery.report(views_removed)

    def undo(self, tid: str) -> dict[str, Any]:
        """Take back a committed transaction as a new one (undo.py)."""
        from .undo import undo

        return undo(self, tid)

    def log_entries(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Finished transactions, newest first, with their chain hashes (history_log.py)."""
        from .history_log import entries

        return entries(self.journal, limit)

    def verify_log(self) -> dict[str, Any]:
        from .history_log import verify

        return verify(self.journal)

    def compact(self, gc: bool = True) -> dict[str, Any]:
        return self.compaction.compact(gc)

    def collect_garbage(self) -> dict[str, int]:
        return self.compaction.collect_garbage()

    def transactions(self, state: str | None = None, *, finished: bool = True,
                     limit: int | None = LIST_LIMIT, before: str | None = None
                     ) -> list[dict[str, Any]]:
        """The ``limit`` newest transactions (before ``before``), oldest first (journal.py)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or not 0 < limit <= LIST_LIMIT_MAX):
            raise UsageError(f"`limit` must be a whole number from 1 to {LIST_LIMIT_MAX}",
                             params=("limit",))
        if before is not None and not isinstance(before, str):
            raise UsageError("`before` is a transaction id", params=("before",))
        return self.journal.transactions(state, finished=finished, limit=limit, before=before)

    def locked(self, tid: str) -> Held:
        return self.gate.locked(tid)

    def active(self, tid: str) -> HeldActive:
        return self.gate.active(tid)

    # -- staging (staging.py) ----------------------------------------------------------------

    def record_read(self, tid: str, path: str) -> dict[str, Any]:
        return self.staging.record_read(tid, path)

    def read(self, tid: str, path: str) -> bytes | None:
        return self.staging.read(tid, path)

    def stage_write(self, tid: str, path: str, content: bytes | None = None, *,
                    src_fd: int | None = None, mode: int | None = None,
                    via: str = "write", create_dirs: bool = True) -> dict[str, Any]:
        return self.staging.stage_write(tid, path, content, src_fd=src_fd, mode=mode, via=via,
                                        create_dirs=create_dirs)

    def stage_delete(self, tid: str, path: str) -> dict[str, Any]:
        return self.staging.stage_delete(tid, path)

    def stage_replace(self, tid: str, path: str, old: str | bytes, new: str | bytes,
                      all: bool = False) -> dict[str, Any]:
        return self.staging.stage_replace(tid, path, old, new, all)

    def stage_patch(self, tid: str, patch: str | bytes) -> dict[str, Any]:
        return self.staging.stage_patch(tid, patch)

    def stage_api(self, tid: str, method: str, url: str, body: Any = None,
                  headers: dict[str, str] | None = None, idempotency_key: str | None = None,
                  compensate: dict[str, Any] | None = None) -> dict[str, Any]:
        """Stage a remote HTTP call, sent exactly once at commit (participants/api.py)."""
        return self.staging.stage_effect(tid, "http", {
            "method": method, "url": url, "body": body, "headers": headers,
            "idempotency_key": idempotency_key, "compensate": compensate})

    def stage_sql(self, tid: str, dsn: str, sql: str) -> dict[str, Any]:
        """Stage SQL statements, run at once in a transaction that is rolled back (errors
        surface now) and committed with the files through PREPARE TRANSACTION
        (participants/postgres.py). They are checked after the statements staged before for
        the same DSN, which commit with them in one database transaction."""
        from ..participants.postgres import KIND, statements_before

        with self.gate.active(tid) as tx:
            before = statements_before(tx, dsn) if isinstance(dsn, str) else []
        return self.staging.stage_effect(tid, KIND, {"dsn": dsn, "sql": sql, "before": before})

    def stage_effect(self, tid: str, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        """Stage an effect of ``kind`` for the participant that owns it (the faces of a new
        participant call this; docs/design.md, "Adding a participant")."""
        return self.staging.stage_effect(tid, kind, args)

    def savepoint(self, tid: str, name: str) -> dict[str, Any]:
        return self.staging.savepoint(tid, name)

    def rollback_to(self, tid: str, name: str) -> dict[str, Any]:
        return self.staging.rollback_to(tid, name)

    def diff(self, tid: str, stat_only: bool = False) -> dict[str, Any]:
        return self.staging.diff(tid, stat_only)

    def status(self, tid: str | None = None) -> dict[str, Any]:
        return self.staging.status(tid)

    # -- bundles (bundles.py) ------------------------------------------------------------------

    def export_bundle(self, tid: str, path: str) -> dict[str, Any]:
        from .bundles import export

        return export(self, tid, path)

    def import_bundle(self, path: str, label: str | None = None) -> dict[str, Any]:
        from .bundles import import_bundle

        return import_bundle(self, path, label)

    # -- runs (runs.py) ----------------------------------------------------------------------

    def stage_cmd(self, tid: str, command: str | list[str], timeout_ms: int | None = None,
                  promote: list[str] | None = None, sandbox: bool = False,
                  network: bool = False, limits: dict[str, int] | None = None,
                  working_dir: str | None = None, env: dict[str, str] | None = None
                  ) -> dict[str, Any]:
        return self.runs.stage_cmd(tid, command, timeout_ms, promote, sandbox, network, limits,
                                   working_dir, env)

    def exec_cmd(self, tid: str, argv: list[str], timeout_ms: int | None = None,
                 interactive: bool = True, stdout_fd: int | None = None,
                 tier: str | None = None, keep_on_failure: bool = False,
                 sandbox: bool = False, network: bool = False) -> dict[str, Any]:
        return self.runs.exec_cmd(tid, argv, timeout_ms, interactive, stdout_fd, tier,
                                  keep_on_failure, sandbox, network)

    def stage_kept(self, tid: str) -> dict[str, Any]:
        return self.runs.stage_kept(tid)

    def stage_wasm(self, tid: str, module: str, args: list[str] | None = None,
                   fuel: int | None = None, max_memory_mb: int | None = None,
                   timeout_ms: int | None = None, interactive: bool = False,
                   stdout_fd: int | None = None) -> dict[str, Any]:
        return self.runs.stage_wasm(tid, module, args, fuel, max_memory_mb, timeout_ms,
                                    interactive, stdout_fd)

    def view_run(self, tid: str, command: str | list[str], timeout_ms: int | None = None,
                 sandbox: bool = False, network: bool = False) -> dict[str, Any]:
        return self.runs.view_run(tid, command, timeout_ms, sandbox, network)

    def git_commit(self, tid: str, message: str, author: str | None = None,
                   branch: str | None = None, verify: bool = True, sign: bool | None = None
                   ) -> dict[str, Any]:
        """git's hooks before (in the staged view), the git effect staged, the commit, then
        post-commit (participants/git_hooks.py, participants/git.py)."""
        from ..participants.git import bound_branch

        binding = bound_branch(self.runs.snapshot(tid))
        if binding is not None:
            if branch not in (None, binding["branch"]):
                raise UsageError(f"{tid} was begun on the branch {binding['branch']} "
                                 f"(`git_branch`): git-commit commits onto it, not onto "
                                 f"{branch}", params=("branch", "git_branch"))
            branch = binding["branch"]
        message, hooks, hooks_dir = self.runs.git_hooks(tid, message, branch, verify)
        self.staging.stage_effect(tid, "git", {"message": message, "author": author,
                                               "branch": branch, "sign": sign})
        out = self.commit(tid, merge=False)  # exactly its changes: never a merge
        if out.get("commit"):
            from ..participants.git_hooks import after_commit

            after = after_commit(self.root, tid, hooks_dir)
            hooks += [after] if after else []
        if hooks:
            out["hooks"] = hooks
        return out

    def checks_to_run(self, tx: Tx) -> list[dict[str, Any]]:
        return self.runs.checks_to_run(tx)

    def run_stale_checks(self, tid: str) -> tuple[bool, str | None, dict[str, Any] | None]:
        return self.runs.run_stale_checks(tid)

    def sweep_views(self) -> dict[str, int]:
        return self.runs.sweep_views()
