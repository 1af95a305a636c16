"""Runs last: after every integration test, no engine process may be left running."""

from __future__ import annotations

import pytest

from tests.conftest import engine_processes

pytestmark = pytest.mark.integration


def test_no_engine_process_left():
    assert engine_processes() == []
