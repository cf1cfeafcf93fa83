"""Waiting in tests: every wait has a deadline, and missing it fails the test saying what never happened.

The deadlines are hang guards, not performance claims: they are generous so a loaded machine does not
trip them. How fast things are is measured by the scripts in bench/.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

import pytest

T = TypeVar("T")

# Long enough for a busy two-core machine, short enough that a hang still ends the run.
HANG_GUARD = 60.0


class _Submits(Protocol):
    def submit(self, fn: Callable[[Any], bool]) -> Future[bool]: ...


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


class WriterHold:
    """Holds a writer in a job until released, so requests queue up behind it.

    Entering waits until the job is *running*: a job only queued may be overtaken, since the writer
    commits every span batch it has taken before the jobs taken with them.
    """

    def __init__(self, writer: _Submits) -> None:
        self._writer = writer
        self._running = threading.Event()
        self._gate = threading.Event()
        self.job: Future[bool] | None = None

    def _hold(self, _con: object) -> bool:
        self._running.set()
        return self._gate.wait(2 * HANG_GUARD)  # outlasts every wait in a test

    def __enter__(self) -> WriterHold:
        self.job = self._writer.submit(self._hold)
        wait_until(self._running.is_set, "the writer to start the holding job")
        return self

    @property
    def held(self) -> bool:
        return self.job is not None and not self.job.done()

    def __exit__(self, *_exc: object) -> None:
        self._gate.set()  # also when the test failed: a held writer would stall the service's shutdown
        if self.job is not None:
            self.job.result(HANG_GUARD)
