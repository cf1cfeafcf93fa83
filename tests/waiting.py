"""Waiting in tests: every wait has a deadline, and missing it fails the test saying what never happened.

The deadlines are hang guards, not performance claims: they are generous so a loaded machine does not
trip them. How fast things are is measured by the scripts in bench/.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

# Long enough for a busy two-core machine, short enough that a hang still ends the run.
HANG_GUARD = 60.0


def wait_until(predicate: Callable[[], T], what: str, timeout: float = HANG_GUARD, interval: float = 0.02) -> T:
    """Poll `predicate` until it returns something truthy and return that; fail the test after `timeout` s.

    `what` completes the sentence "timed out waiting for ...".
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def join(thread: threading.Thread, what: str, timeout: float = HANG_GUARD) -> None:
    """Join `thread`; fail the test if it is still running after `timeout` s."""
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
