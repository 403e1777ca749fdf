"""The monitor's tests open many clients, and an engine dropped without ``engine.close()`` is a
reference cycle: its log and lock descriptors are closed when the cyclic collector frees it.
Collect after each test, so that this directory does not pile descriptors up in the pytest
process."""

from __future__ import annotations

import gc

import pytest


@pytest.fixture(autouse=True)
def _collect_what_the_test_left():
    yield
    gc.collect()
