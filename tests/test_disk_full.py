"""The database on a small filesystem that fills (a tmpfs the test mounts): the service refuses spans as retryable,
keeps every acknowledged span and nothing else, tells the operator once (log, /readyz, a metric), and takes
spans again when space returns, without a restart."""

from __future__ import annotations

import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest
from builders import request, span
from conftest import RunningService, service_settings
from small_disks import resize, tmpfs
from waiting import HANG_GUARD

from storage.duckdb.space import RESUME_MARGIN, DiskSpace

PROTOBUF = "application/x-protobuf"
BATCH = 500


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", "24m") as mount:
        yield mount


def post(svc: RunningService, body: bytes) -> tuple[int, str | None]:
    req = urllib.request.Request(f"{svc.http_url}/v1/traces", data=body, headers={"Content-Type": PROTOBUF})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("Retry-After")
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Retry-After")


def ready(svc: RunningService) -> int:
    try:
        with urllib.request.urlopen(f"{svc.api_url}/readyz", timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def batch(i: int) -> bytes:
    # Distinct, hardly compressible attributes: the disk fills in a few dozen batches.
    return request(
        [span(attributes={"gen_ai.request.model": "m", "payload": f"{i}-{j}-" + "q" * 1500}) for j in range(BATCH)]
    ).SerializeToString()


def test_a_full_disk_refuses_as_retryable_loses_nothing_tells_once_and_recovers(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING),
        RunningService(service_settings(small_disk / "tailwatch.duckdb", ingest={"decode_workers": 0})) as svc,
    ):
        acked, answers, i = 0, [], 0
        while i < 200 and not any(status != 200 for status, _ in answers[-3:]):
            answers.append(post(svc, batch(i)))
            acked += BATCH if answers[-1][0] == 200 else 0
            i += 1
        assert acked > 0 and answers[-1] == (503, "1"), answers[-3:]  # UNAVAILABLE with a retry hint
        for _ in range(3):  # more refusals while full: still retryable, told no more
            assert post(svc, batch(i))[0] == 503
            i += 1
        assert ready(svc) == 503
        assert svc.metric("tailwatch_storage_full") == 1
        told = [r for r in caplog.records if "is full" in r.getMessage()]
        assert len(told) == 1 and told[0].levelno == logging.ERROR
        assert not [r for r in caplog.records if r.exc_info or "cannot rollback" in r.getMessage()]
        assert svc.rows("SELECT count(*) FROM spans") == [(acked,)]  # every acknowledged span, nothing more

        # Space returns (the filesystem grows): ready again before anything is sent, then spans are stored.
        resize(small_disk, "96m")
        assert ready(svc) == 200
        assert svc.metric("tailwatch_storage_full") == 0
        assert post(svc, batch(i)) == (200, None)
        assert svc.rows("SELECT count(*) FROM spans") == [(acked + BATCH,)]
        assert any("space again" in r.getMessage() for r in caplog.records)


def test_on_a_full_disk_retention_frees_space_and_spans_are_taken_again(small_disk: Path) -> None:
    """The filesystem never grows: spans older than the retention age are all that can make room. Deleting
    them needs a little WAL space itself; then new spans go into the blocks they freed."""
    now_ns = int(datetime.now(UTC).timestamp() * 1e9)
    old = now_ns - 9 * 86_400 * 10**9

    def aged(i: int, start: int) -> bytes:
        attrs = {"gen_ai.request.model": "m", "payload": f"{i}-" + os.urandom(600).hex()}
        return request([span(start=start, attributes=attrs) for _ in range(BATCH)]).SerializeToString()

    settings = service_settings(small_disk / "tailwatch.duckdb", storage={"reserve_mb": 256})
    with RunningService(settings) as svc:
        i = 0
        while post(svc, aged(i, old))[0] == 200:
            i += 1
            assert i < 400, "the disk never filled"
        assert ready(svc) == 503
        stored_old = svc.rows("SELECT count(*) FROM spans")[0][0]
        assert stored_old > 0

        assert svc.service.enforce_retention() == stored_old
        assert ready(svc) == 200
        fresh = 0
        while fresh < stored_old // BATCH // 2 and post(svc, aged(i, now_ns))[0] == 200:
            fresh += 1
            i += 1
        assert fresh == stored_old // BATCH // 2  # half as much again fits where the old spans were
        assert svc.rows("SELECT count(*) FROM spans") == [(fresh * BATCH,)]


def test_the_reserve_takes_at_most_half_the_free_space_and_is_given_up_whole(tmp_path: Path) -> None:
    reserve = tmp_path / "tailwatch.duckdb.reserve"
    free = {"bytes": 20 << 20}
    disk = DiskSpace(tmp_path, lambda _: free["bytes"], reserve=reserve, reserve_bytes=64 << 20)
    assert disk.keep_reserve() == 10 << 20  # half of 20 MiB free, not the 64 asked for
    free["bytes"] = 200 << 20
    assert disk.keep_reserve() == 64 << 20  # grown to its size once there is room
    assert os.stat(reserve).st_blocks * 512 >= 64 << 20  # allocated, not a sparse file
    assert disk.give_up_reserve() == 64 << 20
    assert not reserve.exists()
    assert disk.give_up_reserve() == 0  # nothing left to give up
    assert DiskSpace(tmp_path, reserve=reserve, reserve_bytes=0).keep_reserve() == 0


def test_only_a_failure_for_lack_of_space_is_a_full_disk_and_it_is_over_past_the_space_then_and_a_margin(
    tmp_path: Path,
) -> None:
    free = {"bytes": 100 << 20}  # DuckDB can run out with this much free: a checkpoint writes before it frees
    disk = DiskSpace(tmp_path, lambda _: free["bytes"])
    assert not disk.failed(duckdb.ConstraintException("Constraint Error: Duplicate key"))
    assert not disk.full
    assert disk.failed(duckdb.IOException("IO Error: Could not write file: No space left on device"))
    free["bytes"] += RESUME_MARGIN  # some space freed, not yet room for a group commit and a checkpoint
    assert disk.full
    free["bytes"] += 1
    assert not disk.full


@pytest.mark.parametrize(
    ("attributes", "payload", "failure"),
    [("whole", 600, duckdb.FatalException), ("split", 280, duckdb.TransactionException)],
)
def test_without_a_reserve_a_retention_that_cannot_write_fails_once_and_nothing_hangs(
    small_disk: Path, attributes: str, payload: int, failure: type[Exception]
) -> None:
    """No reserve (storage.reserve_mb: 0) and a disk full to the last block: retention has no room. Where the disk
    ends decides which write fails: the checkpoint, and DuckDB invalidates the database, or the DELETE's own WAL
    write, a plain transaction error, and then the closing checkpoint. Either way the writer survives it:
    retention fails instead of waiting forever, spans are refused as retryable, /readyz is 503, and the service
    stops cleanly. The spans' size decides where the disk ends; the two cases are sized so that each failure is
    met (a change to what a file holds, a migration's view, say, can move it: resize the case that changed)."""
    now_ns = int(datetime.now(UTC).timestamp() * 1e9)
    old = now_ns - 9 * 86_400 * 10**9

    def aged(i: int, start: int) -> bytes:
        attrs = {"gen_ai.request.model": "m", "payload": f"{i}-" + os.urandom(payload).hex()}
        return request([span(start=start, attributes=attrs) for _ in range(BATCH)]).SerializeToString()

    storage = {"reserve_mb": 0, "attributes": attributes}
    with RunningService(service_settings(small_disk / "tailwatch.duckdb", storage=storage)) as svc:
        i = 0
        while post(svc, aged(i, old))[0] == 200:
            i += 1
            assert i < 400, "the disk never filled"
        outcome: list[BaseException | int] = []
        retention = threading.Thread(target=lambda: outcome.append(_outcome(svc.service.enforce_retention)))
        retention.start()
        retention.join(HANG_GUARD)
        assert not retention.is_alive(), "retention hung"
        assert isinstance(outcome[0], failure), outcome
        assert ready(svc) == 503
        assert post(svc, aged(i, now_ns)) == (503, "1")


def _outcome(fn: Callable[[], int]) -> BaseException | int:
    try:
        return fn()
    except BaseException as exc:
        return exc
