"""One detection pass at a time: a `POST /v1/detect` that arrives during a scheduled pass waits for it,
then evaluates on the state that pass stored."""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import RunningService, service_settings
from waiting import HANG_GUARD, join, wait_until

from detectors.base import Detection, Window
from detectors.detection import RunResult
from detectors.grid import grid_time
from detectors.registry import REGISTRY
from detectors.scheduler import scheduled_pass
from simulator import simulate

ONLY = "replica_skew"


def test_a_detect_request_during_a_scheduled_pass_waits_and_neither_duplicates_nor_loses_an_evaluation(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A daily interval: the service's own scheduler ticks at midnight only, so no pass of its own
    # joins in; the test runs the scheduled job by hand, as of the last midnight.
    day = 86400
    at = grid_time(datetime.now(UTC).replace(tzinfo=None), day)
    end = at - timedelta(seconds=30)  # the default settle: the evaluated window ends here
    inside, release = threading.Event(), threading.Event()
    real = REGISTRY[ONLY].detect

    def first_call_holds(frames: dict[str, pl.DataFrame], config: Any, window: Window) -> Detection:
        if not inside.is_set():
            inside.set()
            release.wait(HANG_GUARD)
        return real(frames, config, window)

    monkeypatch.setitem(REGISTRY, ONLY, dataclasses.replace(REGISTRY[ONLY], detect=first_call_holds))
    only_one: dict[str, Any] = {key: {"enabled": key == ONLY} for key in REGISTRY}
    only_one[ONLY]["interval_seconds"] = day
    with RunningService(service_settings(db_path, detectors=only_one)) as svc:
        simulate.run(
            ["replica_drift"], endpoint=svc.grpc_target, protocol="grpc", seed=7, end=end, history_hours=1.0,
            history_rate=0.1, rate=3.0,
        )  # fmt: skip
        svc.wait_committed()
        detection = svc.service.detection
        assert detection is not None
        scheduled: list[RunResult] = []
        answer: list[dict[str, Any]] = []

        def post() -> None:
            request = urllib.request.Request(
                f"{svc.api_url}/v1/detect", data=json.dumps({"at": at.isoformat() + "Z"}).encode(), method="POST"
            )
            with urllib.request.urlopen(request, timeout=2 * HANG_GUARD) as resp:
                answer.append(json.loads(resp.read()))

        tick = threading.Thread(target=lambda: scheduled.extend(scheduled_pass(detection, clock=lambda: at)))
        tick.start()
        assert inside.wait(HANG_GUARD), "the scheduled pass never reached the detector"
        request = threading.Thread(target=post)
        request.start()
        wait_until(lambda: detection.waiting == 1, "the detect request to wait for the scheduled pass")
        release.set()
        join(tick, "the scheduled pass")
        join(request, "the detect request")

        assert [(r.detector, r.outcome) for r in scheduled] == [(ONLY, "ok")]
        [posted] = answer[0]["results"]
        assert (posted["detector"], posted["outcome"]) == (ONLY, "ok")
        assert scheduled[0].firing, "replica_drift should make replica_skew fire"
        fingerprints = {a.fingerprint for a in scheduled[0].firing}
        rows = svc.rows("SELECT fingerprint, count(*), any_value(state) FROM alerts GROUP BY fingerprint")
        assert {fp for fp, _n, _state in rows} == fingerprints
        assert all((n, state) == (1, "firing") for _fp, n, state in rows), rows  # no duplicate alert
        # Both evaluations are stored, and the second counted the first's breach: nothing was lost.
        assert svc.rows("SELECT evaluated_at, outcome FROM detector_runs") == [(at, "ok"), (at, "ok")]
        assert svc.rows("SELECT DISTINCT breaches FROM alert_conditions") == [(2,)]
