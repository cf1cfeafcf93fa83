"""The ingest spool: an append-only log that makes a request durable before the writer commits it.

When the writer is behind, a request that waited for its own commit would wait for every commit ahead of it
too, and with a few requests in flight the writer would commit small groups forever (each DuckDB commit has
a fixed cost of milliseconds). Instead its decoded batch is appended here, fsynced (one `fdatasync` for
every record written since the last), and acknowledged; the writer commits it moments later in a larger
group and records how far the spool is committed in the same transaction. A restart replays what lies past
that point, so an acknowledged span is never lost and never stored twice.

Records live in segment files named by the spool offset of their first record (`<offset>.spool`, 20
digits); an offset counts bytes across segments and never goes back, so a record's end offset names it. A
record is an 8-byte header (payload length, CRC-32 of the payload, both little-endian u32) and the payload.
A crash can leave a torn record at the end of the last segment; it was never acknowledged, and reading stops
there. One thread writes and syncs; `append` only queues, so callers never wait on the disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

from model.thread_names import name_this_thread

log = logging.getLogger(__name__)
_HEADER = struct.Struct("<II")
_SUFFIX = ".spool"
SEGMENT_BYTES = 64 * 2**20


def _segments(directory: Path) -> list[tuple[int, Path]]:
    """The segment files in offset order."""
    found = []
    for path in directory.glob(f"*{_SUFFIX}"):
        with contextlib.suppress(ValueError):
            found.append((int(path.stem), path))
    return sorted(found)


def read_spool(directory: Path, after: int) -> Iterator[tuple[int, bytes]]:
    """Every intact record ending past `after`, as (end offset, payload), in offset order."""
    for start, path in _segments(directory):
        data = path.read_bytes()
        at = 0
        while at + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, at)
            end = at + _HEADER.size + length
            if end > len(data) or zlib.crc32(data[at + _HEADER.size : end]) != crc:
                log.warning("spool segment %s ends in a torn record at byte %d: never acknowledged, skipped", path, at)
                break
            if start + end > after:
                yield start + end, data[at + _HEADER.size : end]
            at = end


class Spool:
    """Appends records from any thread; one thread of its own writes and syncs them, then calls `durable`
    with the offset everything up to is on disk (or `failed` with the offset up to which records were lost to
    an error: their callers fall back to waiting for the commit)."""

    def __init__(
        self,
        directory: Path,
        start: int,
        *,
        durable: Callable[[int], None],
        failed: Callable[[int, OSError], None],
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        """A new spool at offset `start`: any segments already in `directory` are removed, so replay them first."""
        directory.mkdir(parents=True, exist_ok=True)
        for _, path in _segments(directory):
            path.unlink()
        self._directory = directory
        self._durable = durable
        self._failed = failed
        self._segment_bytes = segment_bytes
        self._cv = threading.Condition()
        self._pending: list[bytes] = []
        self._offset = start  # where the next appended record starts
        self._written = start  # where the next written record starts
        self._closing = False
        self._file: int | None = None
        self._file_start = start
        self._file_bytes = 0
        self._closed_segments: deque[tuple[int, Path]] = deque()  # (end offset, path), oldest first
        self._segments_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="tailwatch-spool", daemon=True)
        self._thread.start()

    def append(self, payload: bytes) -> int:
        """Queue a record; returns its end offset. Call in the order the records must be replayed."""
        record = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        with self._cv:
            self._pending.append(record)
            self._offset += len(record)
            self._cv.notify()
            return self._offset

    def trim(self, committed_through: int) -> None:
        """Remove the closed segments whose every record is committed. One that cannot be removed stays (a
        replay skips what it holds, and the next start removes it): the writer calls this after its commit."""
        with self._segments_lock:
            while self._closed_segments and self._closed_segments[0][0] <= committed_through:
                _, path = self._closed_segments.popleft()
                with contextlib.suppress(OSError):
                    path.unlink()

    def close(self) -> None:
        """Write and sync what is queued, then stop. The segments stay: what they hold that is not yet
        committed is replayed at the next start."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join()

    def _run(self) -> None:
        name_this_thread()
        while True:
            with self._cv:
                while not self._pending and not self._closing:
                    self._cv.wait()
                if not self._pending:
                    break
                records, self._pending = self._pending, []
            size = sum(len(r) for r in records)
            try:
                self._write(records)
            except OSError as exc:
                self._abandon_segment()
                self._written += size
                self._failed(self._written, exc)
            else:
                self._written += size
                self._durable(self._written)
        self._abandon_segment()

    def _write(self, records: list[bytes]) -> None:
        if self._file is not None and self._file_bytes >= self._segment_bytes:
            os.close(self._file)  # its last write was synced
            with self._segments_lock:
                self._closed_segments.append((self._written, self._path(self._file_start)))
            self._file = None
        if self._file is None:
            self._file_start, self._file_bytes = self._written, 0
            self._file = os.open(self._path(self._written), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
            _sync_directory(self._directory)  # the new file's name must survive a crash too
        data = b"".join(records)
        view = memoryview(data)
        while view:
            view = view[os.write(self._file, view) :]
        os.fdatasync(self._file)
        self._file_bytes += len(data)

    def _abandon_segment(self) -> None:
        """Close the current segment (after a failed write it may end torn; later records go to a new one)."""
        if self._file is None:
            return
        with contextlib.suppress(OSError):
            os.close(self._file)
        with self._segments_lock:
            self._closed_segments.append((self._written, self._path(self._file_start)))
        self._file = None

    def _path(self, start: int) -> Path:
        return self._directory / f"{start:020d}{_SUFFIX}"


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
