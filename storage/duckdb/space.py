"""Running out of disk: noticed on the commit that fails for it, told once, and over when space returns.

DuckDB frees the space of deleted rows only at a checkpoint, and a checkpoint writes before it frees:
on a filesystem that is full to the last block, retention could delete every expired span and still
not make room for one more. So a reserve file beside the database (`<db>.reserve`) holds some space
back while there is plenty; when the filesystem is full, retention gives it up for its delete and the
checkpoint after it, then takes back what it can.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def reserve_path(db: str | Path) -> Path:
    """The reserve file beside a database: space held back, not data (a store's size leaves it out)."""
    return Path(f"{db}.reserve")


# DuckDB reports a full filesystem with the OS's words (ENOSPC).
NO_SPACE = "no space left on device"
# Free space beyond what was left at the failure before the store counts as writable again: enough for a
# group commit and a WAL checkpoint's first blocks, so readiness does not flap on a few freed kilobytes.
RESUME_MARGIN = 16 * 1024 * 1024


def _free(directory: Path) -> int:
    return shutil.disk_usage(directory).free


class DiskSpace:
    """Whether the database's filesystem is full. The writer reports each commit; readiness asks `full`."""

    def __init__(
        self,
        directory: Path | None,
        free: Callable[[Path], int] = _free,
        *,
        reserve: Path | None = None,
        reserve_bytes: int = 0,
    ) -> None:
        self._directory = directory  # None for an in-memory database
        self._free = free
        self._reserve = reserve
        self._reserve_bytes = reserve_bytes if reserve is not None else 0
        self._full = False
        self._free_then = 0
        self.changed: Callable[[bool], None] = lambda full: None

    def failed(self, error: BaseException) -> bool:
        """A commit failed: True when for lack of space (told once, however many commits fail)."""
        if NO_SPACE not in str(error).lower():
            return False
        if not self._full:
            self._free_then = self._free(self._directory) if self._directory else 0
            self._set(True)
            log.error(
                "the filesystem of the database (%s) is full: spans are refused as retryable (503 / UNAVAILABLE, "
                "nothing acknowledged is lost) and /readyz answers 503 until space returns; free space there, "
                "or lower storage.retention_hours",
                self._directory,
            )
        return True

    def committed(self) -> None:
        if self._full:
            self._set(False)
            log.warning("the database's filesystem has space again: writing resumed")

    @property
    def full(self) -> bool:
        if self._full and self._directory is not None and self._free(self._directory) > self._free_then + RESUME_MARGIN:
            # Space came back while nothing was sent (a load balancer stops sending to an unready target).
            self._set(False)
            log.warning("the database's filesystem has space again: ready to write")
        return self._full

    def keep_reserve(self) -> int:
        """Grow the reserve file towards its size, taking at most half the free space (a small disk keeps
        room for the database); returns its size. The blocks are allocated, not written: it costs no I/O."""
        if self._reserve is None or self._directory is None:
            return 0
        if not self._reserve_bytes:
            self._reserve.unlink(missing_ok=True)
            return 0
        with self._reserve.open("ab") as f:
            have = os.fstat(f.fileno()).st_size
            want = min(self._reserve_bytes, have + self._free(self._directory) // 2)
            step = 8 << 20
            while have < want:
                n = min(step, want - have)
                try:
                    os.posix_fallocate(f.fileno(), have, n)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                have += n
        return self._reserve.stat().st_size

    def give_up_reserve(self) -> int:
        """Delete the reserve file so its space can be written; returns the bytes it held."""
        if self._reserve is None or not self._reserve.exists():
            return 0
        size = self._reserve.stat().st_size
        self._reserve.unlink()
        log.warning("the database's filesystem is full: gave up the %d-byte reserve to make room", size)
        return size

    def _set(self, full: bool) -> None:
        self._full = full
        self.changed(full)
