"""Windows nobody evaluated are caught up: after a tick's own windows, the scheduler evaluates the windows it
missed (the service was down, or started after its spans arrived) oldest first, within its share of the tick;
`tailwatch detect --from --to` backfills a range. Caught-up windows are history: figures and SLO minutes, no
alert judged or sent."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from test_detector_slo_burn import Fleet, per_tenant

from detectors.base import DetectorConfig
from detectors.catch_up import Config as CatchUp
from detectors.catch_up import backfill, in_range, missed
from detectors.detection import DetectionPass
from detectors.registry import REGISTRY
from detectors.scheduler import scheduled_pass
from detectors.slo_burn import KEY, Config
from storage.duckdb.backend import DuckDBStorage
from tailwatch import cli
from tailwatch.settings import load_settings

T0 = datetime(2026, 11, 20, 12, 0)
MINUTE = timedelta(minutes=1)
SLOS = Config(slos=(per_tenant(0.99),), interval_seconds=60)
NEVER_LATE: Callable[[], float] = lambda: 0.0  # noqa: E731 - a timer that never reaches the tick's share


def minutes(n: int) -> timedelta:
    return n * MINUTE


# --- which windows are missed -------------------------------------------------------------------------------


def test_missed_windows_are_grid_points_without_a_run_after_the_data_begins_oldest_first_by_time() -> None:
    every_minute = DetectorConfig(interval_seconds=60, window_seconds=60, settle_seconds=0)
    every_five = DetectorConfig(interval_seconds=300, window_seconds=300, settle_seconds=0)
    logged = {"a": {T0 + minutes(2)}, "b": set[datetime]()}
    found = missed(
        {"a": every_minute, "b": every_five}, T0, T0 + minutes(6), lambda key: logged[key], data_from=T0 + MINUTE
    )
    # [since, until): 12:00 and 12:01 end at or before the data's first span; 12:02 was evaluated; 12:06 is now.
    assert found == [(T0 + minutes(3), ["a"]), (T0 + minutes(4), ["a"]), (T0 + minutes(5), ["a", "b"])]
    assert missed({"a": every_minute}, T0, T0 + minutes(6), lambda key: set(), data_from=None) == []


def test_a_window_is_missed_once_it_ends_after_the_first_span_counting_the_settle_time() -> None:
    settled = DetectorConfig(interval_seconds=60, window_seconds=60, settle_seconds=120)
    # Evaluated at 12:05, the window is [12:02, 12:03): the first one holding a span that ended at 12:02:30.
    found = missed({"a": settled}, T0, T0 + minutes(10), lambda key: set(), data_from=T0 + minutes(2) + MINUTE / 2)
    assert found[0] == (T0 + minutes(5), ["a"])


def test_a_backfill_range_includes_both_ends_on_each_detectors_grid() -> None:
    every_minute = DetectorConfig(interval_seconds=60, window_seconds=60)
    every_five = DetectorConfig(interval_seconds=300, window_seconds=300)
    found = in_range({"a": every_minute, "b": every_five}, T0 + MINUTE / 2, T0 + minutes(5))
    assert found == [(T0 + minutes(m), ["a", "b"] if m == 5 else ["a"]) for m in range(1, 6)]


def test_clusters_are_not_caught_up_they_explain_the_alerts_firing_now(db_path: Path) -> None:
    storage = DuckDBStorage.open(db_path)
    try:
        detection = DetectionPass(storage.windows, storage.detector_store, load_settings().detector_configs())
        assert detection.history_keys() == [key for key in REGISTRY if key != "clusters"]
    finally:
        storage.close()


# --- the scheduler catches up -------------------------------------------------------------------------------


def slo_fleet(storage: DuckDBStorage) -> Fleet:
    """slo_burn alone enabled, evaluated every minute, as a scheduler runs it."""
    fleet = Fleet(storage, SLOS)
    configs = load_settings(overrides={"detectors": {k: {"enabled": False} for k in REGISTRY}}).detector_configs()
    fleet.detection = DetectionPass(storage.windows, storage.detector_store, {**configs, KEY: SLOS})
    return fleet


def tick(
    fleet: Fleet, now: datetime, timer: Callable[[], float] = NEVER_LATE, catch_up: CatchUp | None = None
) -> list[tuple[datetime, str]]:
    """One scheduled tick at `now` with catching up; the windows it evaluated, by evaluation time."""
    results = scheduled_pass(fleet.detection, clock=lambda: now, catch_up=catch_up or CatchUp(), timer=timer)
    assert all(r.outcome == "ok" for r in results), [r.error for r in results]
    return [(r.window.end + timedelta(seconds=SLOS.settle_seconds), r.detector) for r in results]


def runs(fleet: Fleet) -> list[tuple[datetime, int]]:
    return fleet.rows(
        "SELECT evaluated_at, count(*) FROM detector_runs WHERE detector = ? GROUP BY 1 ORDER BY 1", [KEY]
    )


def test_a_service_down_for_an_hour_evaluates_every_missed_window_once_and_its_slo_minutes_have_no_gap(
    db_path: Path,
) -> None:
    storage = DuckDBStorage.open(db_path)
    fleet = slo_fleet(storage)
    fleet.plant("acme", T0, minutes=180, per_minute=10, bad_share=0.0)
    try:
        # Started half an hour after the spans began: the first tick catches up on the half hour before it.
        for m in range(30, 61):
            tick(fleet, T0 + minutes(m))
    finally:
        storage.close()
    # Down for an hour, then started again on the same file: the first tick catches up on the hour.
    storage = DuckDBStorage.open(db_path)
    try:
        fleet = slo_fleet(storage)
        for m in range(121, 184):
            tick(fleet, T0 + minutes(m))
        # slo_burn's window ends two minutes (its settle) before the evaluation: the first holding a span is
        # evaluated at 12:03 ([12:00, 12:01)).
        assert runs(fleet) == [(T0 + minutes(m), 1) for m in range(3, 184)]
        assert fleet.rows(
            "SELECT count(DISTINCT minute), count(*), min(minute), max(minute) FROM slo_burn_minutes"
        ) == [(180, 180, T0, T0 + minutes(179))]
        assert fleet.rows("SELECT count(*) FROM alerts") == [(0,)]
    finally:
        storage.close()


def test_a_tick_evaluates_its_own_window_first_then_the_oldest_missed_until_its_share_is_spent(
    storage: DuckDBStorage,
) -> None:
    fleet = slo_fleet(storage)
    fleet.plant("acme", T0, minutes=30, per_minute=5, bad_share=0.0)
    # The tick is 60 s and catching up may take half of it; each look at the timer finds 10 s gone.
    first = tick(fleet, T0 + minutes(20), timer=itertools.count(step=10).__next__)
    assert first == [(T0 + minutes(20), KEY), (T0 + minutes(3), KEY), (T0 + minutes(4), KEY)]
    second = tick(fleet, T0 + minutes(21), timer=itertools.count(step=10).__next__)
    assert second == [(T0 + minutes(21), KEY), (T0 + minutes(5), KEY), (T0 + minutes(6), KEY)]
    # With time to spare, the rest: each missed window once, oldest first, the current ones not again.
    rest = tick(fleet, T0 + minutes(22))
    assert rest == [(T0 + minutes(22), KEY), *((T0 + minutes(m), KEY) for m in range(7, 20))]
    assert tick(fleet, T0 + minutes(23)) == [(T0 + minutes(23), KEY)]


def test_no_catching_up_beyond_its_hours_nor_with_hours_zero(storage: DuckDBStorage) -> None:
    fleet = slo_fleet(storage)
    fleet.plant("acme", T0, minutes=10, per_minute=5, bad_share=0.0)
    now = T0 + timedelta(hours=1, minutes=5)
    evaluated = tick(fleet, now, catch_up=CatchUp(hours=1))
    # An hour back from 13:05 is 12:05: the windows of 12:03 and 12:04 hold spans but are beyond the bound.
    assert sorted(at for at, _ in evaluated) == [T0 + minutes(m) for m in range(5, 66)]
    assert tick(fleet, now + MINUTE, catch_up=CatchUp(hours=0)) == [(now + MINUTE, KEY)]


# --- history judges no alert --------------------------------------------------------------------------------


def firing(fleet: Fleet) -> list[tuple[str, str]]:
    return fleet.rows("SELECT state, json_extract_string(labels, '$.tenant_id') FROM alerts ORDER BY started_at")


def test_a_caught_up_breach_fires_nothing_and_leaves_the_alert_firing_now_as_it_is(storage: DuckDBStorage) -> None:
    fleet = slo_fleet(storage)
    fleet.plant("acme", T0, minutes=60, per_minute=20, bad_share=0.0)
    fleet.plant("acme", T0 + minutes(60), minutes=30, per_minute=20, bad_share=0.5, series="bad-")
    backfill(fleet.detection, T0, T0 + minutes(95))
    assert firing(fleet) == []
    assert fleet.rows(f"SELECT count(*) > 0 FROM {KEY} WHERE burn_rate > 14.4") == [(True,)]
    # Judged on time, the breach fires; judging the past again neither resolves nor fires anything.
    fleet.evaluate(T0 + minutes(95))
    assert firing(fleet) == [("firing", "acme")]
    conditions = fleet.rows("SELECT fingerprint, breaches FROM alert_conditions ORDER BY 1")
    backfill(fleet.detection, T0, T0 + minutes(50))
    assert firing(fleet) == [("firing", "acme")]
    assert fleet.rows("SELECT fingerprint, breaches FROM alert_conditions ORDER BY 1") == conditions


# --- tailwatch detect --from --to ---------------------------------------------------------------------------


def test_detect_from_to_backfills_every_window_of_the_range_once(
    db_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = DuckDBStorage.open(db_path)
    try:
        slo_fleet(storage).plant("acme", T0, minutes=20, per_minute=5, bad_share=0.0)
    finally:
        storage.close()
    config = tmp_path / "tailwatch.yaml"
    slo = {"name": "ttft-2s", "objective": 0.99, "sli": {"ttft_ms_max": 2000}, "group_by": ["tenant_id"]}
    config.write_text(yaml.safe_dump({"detectors": {KEY: {"interval_seconds": 60, "slos": [slo]}}}))
    argv = ["detect", "--config", str(config), "--db", str(db_path), "--detector", KEY]
    assert cli.main([*argv, "--from", "2026-11-20T12:05:00Z", "--to", "2026-11-20T12:15:00Z"]) == 0
    # Only the detector asked for, though the others are enabled.
    assert capsys.readouterr().out.splitlines() == [f"{KEY}: 11 windows evaluated"]
    assert cli.main([*argv, "--from", "2026-11-20T12:10:00Z", "--to", "2026-11-20T12:20:00Z"]) == 0
    storage = DuckDBStorage.open(db_path)
    try:
        # The overlap was evaluated again: it replaced its figures and minutes ([12:02, 12:18) in all), and the
        # run log says so.
        assert storage.reader.rows(
            "SELECT count(DISTINCT evaluated_at), count(*) FROM detector_runs WHERE detector = ?", [KEY]
        ) == [(16, 22)]
        assert storage.reader.rows("SELECT count(DISTINCT minute), count(*) FROM slo_burn_minutes") == [(16, 16)]
        assert storage.reader.rows("SELECT count(*) FROM detector_runs WHERE detector <> ?", [KEY]) == [(0,)]
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--to", "2026-11-20T12:00:00Z", "--once"], "--to needs --from"),
        (["--from", "2026-11-20T12:10:00Z", "--to", "2026-11-20T12:00:00Z"], "is before --from"),
        (["--from", "2026-11-20T12:10:00Z", "--at", "2026-11-20T12:00:00Z"], "--at is for --once"),
    ],
)
def test_detect_refuses_a_range_it_cannot_backfill_with_a_sentence(
    db_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["detect", "--db", str(db_path), *args]) != 0
    assert message in capsys.readouterr().err
