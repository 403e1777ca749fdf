"""The fence's Record classes have typed constructors for mypy (fence/_record.py), at no run-time
cost: mypy reads a constructor from a class's annotations, in order, so they must be its slots
in order (the fields with a default last, annotated for mypy only); and mypy refuses a wrong call.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from agent_2pc.fence import _cert, _ledger, _types
from agent_2pc.fence._record import Record

RECORDS = sorted({obj for mod in (_cert, _ledger, _types) for obj in vars(mod).values()
                  if isinstance(obj, type) and issubclass(obj, Record) and obj is not Record},
                 key=lambda cls: cls.__name__)


def test_every_record_class_is_found() -> None:
    assert {c.__name__ for c in RECORDS} >= {"Certificate", "Entry", "Domain", "Decision",
                                            "EffectRequest", "Ticket", "Fresh", "Replay",
                                            "AbortResult"}


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_a_records_annotations_are_its_slots_in_order_defaults_last(cls: Any) -> None:
    annotated = list(vars(cls).get("__annotations__", {}))
    assert annotated + list(cls._defaults) == list(cls.__slots__)


def test_record_is_a_plain_class_at_run_time() -> None:
    assert Record.__mro__ == (Record, object)


SNIPPET = '''
from agent_2pc.fence._ledger import Domain
from agent_2pc.fence._types import AbortResult, Fresh, Ticket

t = Ticket("i", 1, 2, "lease", "fp")
Fresh(t, 1.0)
Domain("d", seq=1)
AbortResult(intent=1, state="x", changed=True)
Fresh(t, 1.0, takeover="yes")
Domain("d", nope=1)
AbortResult("i", "s")
'''


@pytest.mark.slow
def test_mypy_refuses_a_record_built_with_wrong_arguments(tmp_path: Any) -> None:
    path = tmp_path / "calls.py"
    path.write_text(SNIPPET)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(path)],
        capture_output=True, text=True, timeout=600, cwd=root,
        env={**os.environ, "MYPYPATH": os.path.join(root, "src")})
    lines = [ln for ln in proc.stdout.splitlines() if ": error:" in ln]
    assert [int(ln.split(":")[1]) for ln in lines] == [8, 9, 10, 11], proc.stdout
    assert 'Argument "intent" to "AbortResult" has incompatible type "int"' in lines[0]
    assert 'Argument "takeover" to "Fresh" has incompatible type "str"' in lines[1]
    assert 'Unexpected keyword argument "nope" for "Domain"' in lines[2]
    assert 'Missing positional argument "changed"' in lines[3]
