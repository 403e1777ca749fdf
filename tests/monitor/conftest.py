"""The monitor's tests open many clients. An engine dropped without ``engine.close()`` keeps
its log's descriptor open forever (storage/log.py's Log has no finalizer) and its lock
descriptors until the cyclic collector runs (an engine is a reference cycle). After each test,
close the logs that the test's engines left and collect them, so that this directory does not
pile descriptors up in the pytest process (past 1024, select() fails in the staged view's
code, isolation/_view.py)."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True)
def _close_what_the_test_left():
    yield
    from agent_2pc.storage.log import Log

    for obj in gc.get_objects():
        if isinstance(obj, Log):
            obj.close()
    gc.collect()
