"""What every participant is: the protocol the engine drives, and its small value types.

A participant owns some kinds of staged operation (the file participant: write, delete,
symlink, mkdir; the API participant: http effects). The engine holds a list of participants
(``registry.participants_for``) and drives each transaction through every one of them, in the
list's order, without knowing their kinds:

  prepare(tx, ctx)        -> Vote       before the decision; the first no aborts
  decision_fields(tid)    -> fields     what the commit decision record carries for a redo
  apply(tx, ctx, redo)    -> Applied    after a commit decision (redo: in recovery)
  undo(tx, ctx)           -> fields     after an abort of a prepared transaction; what the end
                                        record adds
  forget(tid)                           an abort: drop what prepare kept in memory
  close()                               the engine closes
  describe(tx)            -> fields     what ``status`` shows of the transaction

``Participant`` and ``Context`` are ``typing.Protocol`` classes for the type checker only: the
typing module costs milliseconds to import, and nothing checks them at run time. mypy checks
each participant against ``Participant`` where the registry lists it. docs/design.md, "Adding a
participant", says what each method must guarantee.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterable, Protocol, TypedDict

    from ..core.states import Tx

    class Context(Protocol):
        """What a participant may do to the log while it works on one transaction."""

        @property
        def tid(self) -> str: ...

        def record(self, fields: dict[str, Any], sync: bool) -> None:
            """Log one ``result`` record of the transaction (synced when asked) before going
            on: what recovery must know, e.g. that a request may have left."""

        def sync(self) -> None:
            """Make everything logged so far durable."""

        def others(self) -> Iterable[Tx]:
            """The other unfinished transactions, as the log says now (the caller of apply
            holds the log lock, so the answer stays true until apply returns)."""

    class Participant(Protocol):
        """One kind of resource a transaction changes (docs/design.md, "Adding a
        participant")."""

        @property
        def name(self) -> str: ...

        @property
        def kinds(self) -> frozenset[str]:
            """The kinds of staged operation this participant owns (no two share one)."""

        def prepare(self, tx: Tx, ctx: Context) -> Vote:
            """Vote: YES when the apply cannot fail for a reason known now, else no with an
            error code and a reason. Raises nothing a caller can foresee (a refusal of the
            system is a no vote)."""

        def decision_fields(self, tid: str) -> dict[str, Any]:
            """What the commit decision must carry for this participant's redo (JSON)."""

        def apply(self, tx: Tx, ctx: Context, redo: bool) -> Applied:
            """Carry out a decided commit. Idempotent: a redo (after a crash at any point of
            an earlier run) finishes what that run began. ApplyFailed when it stops."""

        def undo(self, tx: Tx, ctx: Context) -> dict[str, Any]:
            """Undo what prepare (or the calls it made) left, after an abort; the fields the
            end record adds. Idempotent, as apply."""

        def forget(self, tid: str) -> None:
            """Drop what prepare kept in memory for ``tid`` (an abort)."""

        def close(self) -> None:
            """Release connections and handles; the participant may be used again after."""

        def describe(self, tx: Tx) -> dict[str, Any]:
            """The fields ``status`` shows of ``tx`` for this participant (empty: nothing)."""

    class EffectStager(Participant, Protocol):
        """A participant whose staged operations are remote effects: ``effect`` records of its
        kinds, staged by the engine's one step for them (``Staging.stage_effect``), folded
        into ``Tx.effects`` in staging order, their attempts' outcomes into ``Tx.results``."""

        def check_effect(self, kind: str, args: dict[str, Any]) -> Any:
            """Check one call's arguments completely (UsageError names what is wrong) before
            anything is logged; what it returns goes to ``effect_fields``."""

        def effect_fields(self, tid: str, n: int, checked: Any) -> EffectFields:
            """The ``effect`` record's fields for the ``n``-th effect of ``tid``."""

        def staged_answer(self, effect: dict[str, Any]) -> dict[str, Any]:
            """What staging the effect answers (the record as logged)."""

    class EffectFields(TypedDict):
        request: dict[str, Any]  # what to do (the API participant: method, url, headers, body)
        key: str  # the idempotency key: the fence's and the remote side's
        compensate: dict[str, Any] | None  # what undoes it after an abort, if anything


class Vote:
    """A participant's answer at prepare: yes, or no with an error code and a reason."""

    __slots__ = ("yes", "code", "reason")

    def __init__(self, yes: bool, code: str | None = None, reason: str | None = None) -> None:
        self.yes = yes
        self.code = code
        self.reason = reason

    @staticmethod
    def no(code: str, reason: str) -> Vote:
        return Vote(False, code, reason)


YES = Vote(True)


class Applied:
    """What an apply did: the names it changed (``files``) and those it left as someone
    outside any transaction changed them after the decision (``diverged``)."""

    __slots__ = ("files", "diverged")

    def __init__(self) -> None:
        self.files: list[str] = []
        self.diverged: list[str] = []


class ApplyFailed(Exception):
    """The apply of a decided commit stopped on an error (``cause``: a file system refusal, a
    lost blob); ``done``: the paths it applied or found diverged before that. A redo resumes
    it: every step is idempotent."""

    def __init__(self, cause: BaseException, done: list[str]) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.done = done
