"""Shared fixtures: the program modules under tests/programs, and a clean engine per test."""

import os
import sys

import pytest

TESTS = os.path.dirname(__file__)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)


@pytest.fixture
def engine():
    """The process-wide engine; every test must leave it with no users (checked)."""
    from rethook.engine.engine import get_engine

    eng = get_engine()
    yield eng
    leftover = eng.users
    eng.stop()
    assert not leftover, f"test left users registered: {leftover}"
