"""The apply and the redo as a pure plan (core/applyplan.py): what to do with one staged change,
from what stands at its path now, what stood there when it was staged (``pre``) and whether the
apply looked again (a redo) or trusts what its own prepare saw.

Checked exhaustively: every op kind x every kind of thing at the path (nothing, a file, a link,
a directory, something no op puts) x its relation to ``pre`` and to the new content x redo or
not x placed or not, against a naive model written here from the rules in the module's
docstring and docs/design.md ("The apply as a plan"). Then the rules that matter, by name.
"""

from __future__ import annotations

import itertools
import json

import pytest
from crashkit import cli, make_repo, snapshot, stage_everything

from agent_2pc.core.applyplan import (
    Action,
    Standing,
    Step,
    plan_step,
    replaces_dir,
    standing,
)
from agent_2pc.core.states import DIR_FINGERPRINT, OP_KINDS

FILE_A = "a" * 64  # what a write puts
FILE_B = "b" * 64
LINK_A = "symlink:" + "c" * 64  # what a symlink puts
LINK_B = "symlink:" + "d" * 64
OTHER = ""  # a fifo, a device, a parent that is no longer a plain directory
NOW = [None, FILE_A, FILE_B, LINK_A, LINK_B, DIR_FINGERPRINT, OTHER]
PRE = [None, FILE_A, FILE_B, LINK_A, LINK_B, DIR_FINGERPRINT]  # staging never records OTHER
NEW = {"write": FILE_A, "symlink": LINK_A, "mkdir": DIR_FINGERPRINT, "delete": None}


def naive(kind: str, new: str | None, pre: str | None, now: str | None, redo: bool,
          placed: bool) -> tuple[str, bool, bool, bool]:
    """(action, displace, fix_mode, drop_placed), one rule at a time, as documented."""
    absent = now is None
    is_dir = now == "dir"
    if kind == "delete":
        if absent and pre is None:
            return ("nothing", False, False, False)
        if absent:
            return ("gone", False, False, False)
        if now != pre:
            return ("diverged", False, False, False)
        if is_dir:
            return ("remove_dir", False, False, False)
        return ("remove", False, False, False)
    # A write or link where a directory was staged: the deletes removed it; expect nothing.
    if pre == "dir" and kind in ("write", "symlink"):
        expect = None
    else:
        expect = pre
    if kind == "write" and redo and now == new:
        return ("in_place", False, True, placed)
    if kind == "symlink" and now == new:
        return ("in_place", False, False, placed and redo)
    if kind == "mkdir" and is_dir:
        return ("in_place", False, redo, False)
    if now != expect:
        return ("diverged", False, False, False)
    action = "make_dir" if kind == "mkdir" else "put"
    return (action, not absent, False, False)


def cases():
    for kind in OP_KINDS:
        placements = (False, True) if kind in ("write", "symlink") else (False,)
        for pre, now, redo, placed in itertools.product(PRE, NOW, (False, True), placements):
            yield kind, NEW[kind], pre, now, redo, placed


def as_tuple(step: Step) -> tuple[str, bool, bool, bool]:
    return (step.action, step.displace, step.fix_mode, step.drop_placed)


def test_the_plan_agrees_with_the_naive_model_on_every_combination():
    checked = 0
    for kind, new, pre, now, redo, placed in cases():
        got = plan_step(kind, new, pre, now, redo=redo, placed=placed)
        assert as_tuple(got) == naive(kind, new, pre, now, redo, placed), (
            kind, pre, now, redo, placed, got)
        checked += 1
    assert checked == (2 * 2 + 2) * len(PRE) * len(NOW) * 2  # write/link placed or not


def possible_relations(kind: str, st: str) -> set[tuple[bool, bool]]:
    """(now == pre, now == new) that can hold when ``st`` stands at the path: nothing and a
    directory are one value each; files and links are many; OTHER is never staged or put."""
    new_st = standing(NEW[kind])
    if st == Standing.OTHER:
        return {(False, False)}
    if st in (Standing.ABSENT, Standing.DIR):
        return {(True, new_st == st), (False, new_st == st)}
    if new_st == st:
        return set(itertools.product((False, True), repeat=2))
    return {(True, False), (False, False)}


def test_the_combinations_cover_every_state_and_relation():
    """Every kind of thing at the path, in every relation to pre and to the new content that
    can hold, for every op and both runs: the enumeration leaves no class of input out."""
    seen: dict[tuple[str, str, bool], set[tuple[bool, bool]]] = {}
    for kind, new, pre, now, redo, _ in cases():
        seen.setdefault((kind, standing(now), redo), set()).add((now == pre, now == new))
    for kind, st, redo in itertools.product(OP_KINDS, Standing.ALL, (False, True)):
        assert seen[kind, st, redo] == possible_relations(kind, st), (kind, st, redo)


def test_every_action_is_reachable():
    actions = {plan_step(kind, new, pre, now, redo=redo, placed=placed).action
               for kind, new, pre, now, redo, placed in cases()}
    assert actions == set(Action.ALL)


def test_standing_names_what_a_fingerprint_describes():
    assert [standing(f) for f in NOW] == [
        Standing.ABSENT, Standing.FILE, Standing.FILE, Standing.LINK, Standing.LINK,
        Standing.DIR, Standing.OTHER]


# -- the rules that matter ---------------------------------------------------------------------

def test_redo_skips_a_file_already_in_place_and_makes_its_mode_right():
    step = plan_step("write", FILE_A, FILE_B, FILE_A, redo=True)
    assert step == Step(Action.IN_PLACE, fix_mode=True)


def test_the_apply_after_prepare_puts_a_file_again_even_when_it_holds_the_new_content():
    """Only a redo takes content in place as done: right after prepare, a write of what the
    file already holds is put like any other (its pre-image kept)."""
    assert plan_step("write", FILE_A, FILE_A, FILE_A, redo=False) == Step(
        Action.PUT, displace=True)
    assert plan_step("write", FILE_A, FILE_A, FILE_A, redo=True).action == Action.IN_PLACE


def test_redo_leaves_a_file_someone_else_changed_after_the_decision_as_diverged():
    assert plan_step("write", FILE_A, None, FILE_B, redo=True).action == Action.DIVERGED
    assert plan_step("write", FILE_A, FILE_B, LINK_B, redo=True).action == Action.DIVERGED
    assert plan_step("write", FILE_A, FILE_B, None, redo=True).action == Action.DIVERGED


def test_a_write_puts_over_what_it_staged_over_and_keeps_its_pre_image():
    assert plan_step("write", FILE_A, FILE_B, FILE_B, redo=True) == Step(
        Action.PUT, displace=True)
    assert plan_step("write", FILE_A, None, None, redo=False) == Step(Action.PUT)
    assert plan_step("write", FILE_A, LINK_B, LINK_B, redo=False) == Step(
        Action.PUT, displace=True)


def test_a_write_or_link_staged_over_a_directory_expects_the_deletes_to_have_removed_it():
    assert replaces_dir("write", DIR_FINGERPRINT) and replaces_dir("symlink", DIR_FINGERPRINT)
    assert not replaces_dir("mkdir", DIR_FINGERPRINT) and not replaces_dir("write", FILE_B)
    for redo in (False, True):
        assert plan_step("write", FILE_A, DIR_FINGERPRINT, None, redo=redo) == Step(Action.PUT)
        assert plan_step("symlink", LINK_A, DIR_FINGERPRINT, None, redo=redo) == Step(
            Action.PUT)
        # The directory is still there (someone filled it after prepare): left as it is.
        assert plan_step("write", FILE_A, DIR_FINGERPRINT, DIR_FINGERPRINT,
                         redo=redo).action == Action.DIVERGED


def test_a_link_already_in_place_is_skipped_by_the_apply_too():
    assert plan_step("symlink", LINK_A, LINK_A, LINK_A, redo=False) == Step(Action.IN_PLACE)
    assert plan_step("symlink", LINK_A, None, LINK_A, redo=False) == Step(Action.IN_PLACE)


def test_a_redo_drops_the_placed_copy_of_a_target_already_in_place():
    assert plan_step("write", FILE_A, None, FILE_A, redo=True, placed=True).drop_placed
    assert plan_step("symlink", LINK_A, None, LINK_A, redo=True, placed=True).drop_placed
    # Right after prepare the placed copy is renamed in, never dropped.
    assert not plan_step("symlink", LINK_A, LINK_A, LINK_A, redo=False,
                         placed=True).drop_placed


def test_mkdir_takes_any_directory_as_in_place_and_a_redo_makes_its_mode_right():
    assert plan_step("mkdir", DIR_FINGERPRINT, None, DIR_FINGERPRINT, redo=False) == Step(
        Action.IN_PLACE)
    assert plan_step("mkdir", DIR_FINGERPRINT, FILE_B, DIR_FINGERPRINT, redo=True) == Step(
        Action.IN_PLACE, fix_mode=True)


def test_a_file_or_link_standing_where_a_directory_goes_gives_way():
    assert plan_step("mkdir", DIR_FINGERPRINT, FILE_B, FILE_B, redo=True) == Step(
        Action.MAKE_DIR, displace=True)
    assert plan_step("mkdir", DIR_FINGERPRINT, LINK_B, LINK_B, redo=False) == Step(
        Action.MAKE_DIR, displace=True)
    assert plan_step("mkdir", DIR_FINGERPRINT, None, None, redo=False) == Step(Action.MAKE_DIR)


def test_a_delete_that_an_earlier_run_did_is_reported_done_and_one_of_nothing_is_not():
    assert plan_step("delete", None, FILE_B, None, redo=True) == Step(Action.GONE)
    assert plan_step("delete", None, None, None, redo=True) == Step(Action.NOTHING)


def test_a_delete_removes_only_what_stood_there_when_it_was_staged():
    assert plan_step("delete", None, FILE_B, FILE_B, redo=False) == Step(Action.REMOVE)
    assert plan_step("delete", None, LINK_B, LINK_B, redo=True) == Step(Action.REMOVE)
    assert plan_step("delete", None, DIR_FINGERPRINT, DIR_FINGERPRINT,
                     redo=True) == Step(Action.REMOVE_DIR)
    assert plan_step("delete", None, FILE_B, FILE_A, redo=True) == Step(Action.DIVERGED)
    assert plan_step("delete", None, None, FILE_A, redo=True) == Step(Action.DIVERGED)


def test_something_no_op_puts_at_the_path_is_never_overwritten():
    for kind in OP_KINDS:
        for pre, redo in itertools.product(PRE, (False, True)):
            assert plan_step(kind, NEW[kind], pre, OTHER, redo=redo).action == Action.DIVERGED


def test_a_step_is_immutable_and_compares_by_value():
    step = Step(Action.PUT, displace=True)
    with pytest.raises(AttributeError):
        step.action = Action.REMOVE
    assert step == Step(Action.PUT, displace=True) != Step(Action.PUT)
    assert len({step, Step(Action.PUT, displace=True)}) == 1
    assert repr(step) == "Step(PUT, displace)"
    with pytest.raises(AssertionError):
        Step("overwrite")


# -- the file participant carries the plan out -------------------------------------------------

@pytest.mark.timeout(120)
def test_a_redo_takes_what_an_earlier_run_did_as_done_and_leaves_a_changed_target_as_it_is(
        tmp_path):
    """Killed after four steps of the apply (two deletes, bin.dat and mod1.txt put); then
    someone writes mod2.py by hand. The redo skips what is in place, puts what is left, and
    leaves mod2.py as that writer left it, reported as diverged."""
    root = tmp_path / "repo"
    root.mkdir()
    client = make_repo(root)
    tid = stage_everything(client)
    killed = cli(root, "commit", "--tid", tid, env={"AGENT2PC_CRASH_AT": "commit.mid_apply:4"})
    assert killed.returncode == 137, killed.stderr
    halfway = snapshot(root)
    assert "gone.txt" not in halfway and halfway["bin.dat"][0] == bytes(reversed(range(256)))
    assert "new/deep/file.txt" not in halfway
    (root / "mod2.py").write_text("by hand\n")
    out = json.loads(cli(root, "recover").stdout)
    assert out["rolled_forward"] == [tid] and out["diverged"] == ["mod2.py"], out
    after = snapshot(root)
    assert after["mod2.py"] == (b"by hand\n", 0o755)
    assert after["new/deep/file.txt"] == (b"created\n", 0o600)
    assert after["bin.dat"] == halfway["bin.dat"] and after["mod1.txt"] == halfway["mod1.txt"]
