"""The monitor's tests make many clients, monitors and servers. Engines hold reference cycles
(and, through their cached lock objects, file descriptors) that only the cyclic collector
frees: collect after each test, so that the descriptors of this directory's tests do not pile
up in the pytest process (past 1024, select() fails in the staged view's code)."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True)
def _collect_cycles():
    yield
    gc.collect()
