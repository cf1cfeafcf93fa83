"""slo_burn through the real pass on a real database: planted fast and slow burns, a blip, one tenant burning
under a healthy aggregate, recovery, low traffic, time slices, and counts kept per minute instead of rescanned."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from detector_tables import assert_fits_migrated_table
from waiting import HANG_GUARD

from detectors.alerts import fingerprint
from detectors.base import Severity, Window
from detectors.detection import DetectionPass
from detectors.slo_burn import (
    DEFAULT_RULES,
    FIGURE_COLUMNS,
    KEY,
    LABELS,
    Config,
    Sli,
    Slo,
    detect,
    inputs,
    window_name,
)
from storage.duckdb.backend import DuckDBStorage
from tailwatch.settings import SettingsError, load_settings

T0 = datetime(2026, 11, 20, 12, 0)
TTFT_2S = Sli(ttft_ms_max=2000)


def per_tenant(objective: float, **more: Any) -> Slo:
    return Slo(name="ttft-2s", objective=objective, sli=TTFT_2S, group_by=("tenant_id",), **more)


class Fleet:
    """A migrated database, spans planted a minute at a time, and slo_burn evaluated as the scheduler would."""

    def __init__(self, storage: DuckDBStorage, config: Config) -> None:
        self.storage = storage
        self.config = config
        self.detection = DetectionPass(storage.windows, storage.detector_store, {KEY: config})

    def plant(
        self, tenant: str, start: datetime, minutes: int, per_minute: int, bad_share: float, series: str = ""
    ) -> None:
        """`per_minute` requests each minute, ending inside it; the first `bad_share` of them have a slow TTFT.
        Planting the same tenant's minutes twice needs another `series`, so the ids differ."""

        def insert(con: duckdb.DuckDBPyConnection) -> None:
            con.execute(
                """
                INSERT INTO span_rows (trace_id, span_id, name, kind, start_time, end_time, duration_ms, status_code,
                                   tenant_id, deployment, model, is_llm, llm_role, ttft_ms, e2e_ms, ingested_at)
                SELECT ? || '-' || m || '-' || i, 's', 'llm_request', 'SERVER', e - INTERVAL 1 SECOND, e, 1000,
                       'OK', ?, 'chat', 'llama', true, 'server',
                       CASE WHEN i < ? THEN 5000.0 ELSE 300.0 END, 6000.0, e
                FROM range(?) AS a(m), range(?) AS b(i),
                     LATERAL (SELECT ?::TIMESTAMP + to_minutes(m) + to_milliseconds(i * 50) AS e)
                """,
                [series + tenant, tenant, round(bad_share * per_minute), minutes, per_minute, start],
            )

        self.storage.writer.submit(insert).result(HANG_GUARD)

    def evaluate(self, at: datetime) -> list[tuple[str, dict[str, str]]]:
        """One pass at `at`; the firing alerts after it, as (severity, labels)."""
        [result] = self.detection.run(at, only=[KEY])
        assert result.outcome == "ok", result.error
        return sorted(((a.severity, a.labels) for a in result.firing), key=lambda a: (a[0], sorted(a[1].items())))

    def every(self, start: datetime, end: datetime) -> Iterator[tuple[datetime, list[tuple[str, dict[str, str]]]]]:
        """Evaluate at each point of the detector's grid in [start, end]."""
        step = timedelta(seconds=self.config.interval_seconds)
        at = start
        while at <= end:
            yield at, self.evaluate(at)
            at += step

    def rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.storage.reader.rows(sql, params)


def test_a_fast_burn_pages_within_one_evaluation_of_the_5_minute_window_filling_and_names_only_that_tenant(
    storage: DuckDBStorage,
) -> None:
    """acme sends a hundred times smallco's traffic, all healthy; after six healthy hours smallco goes 20 %
    bad. Against 99.9 %, that is a burn of 200: the 1-hour window passes 14.4 once eight bad minutes are in
    it, which is also when the first 5-minute window is wholly bad (the evaluation 10 minutes in; the one
    at 5 minutes sees three). The aggregate SLO over every tenant stays quiet: smallco is 1 % of it."""
    aggregate = Slo(name="ttft-2s-all", objective=0.999, sli=TTFT_2S)
    fleet = Fleet(storage, Config(slos=(per_tenant(0.999), aggregate)))
    burn = T0 + timedelta(hours=6)
    fleet.plant("acme", T0, 6 * 60 + 30, 500, 0.0)
    fleet.plant("smallco", T0, 6 * 60, 5, 0.0)
    fleet.plant("smallco", burn, 30, 5, 0.2)

    seen = dict(fleet.every(T0 + timedelta(minutes=5), burn + timedelta(minutes=5)))
    assert all(alerts == [] for at, alerts in seen.items() if at < burn + timedelta(minutes=5))
    # Three bad minutes already burn the ticket's budget (1.7x over 3 days and 6 hours), not yet a page's.
    ticket = [(Severity.WARNING.value, {"slo": "ttft-2s", "tenant_id": "smallco"})]
    assert seen[burn + timedelta(minutes=5)] == ticket
    page = [(Severity.CRITICAL.value, {"slo": "ttft-2s", "tenant_id": "smallco"})]
    assert fleet.evaluate(burn + timedelta(minutes=10)) == page  # [+3, +8): the first 5 bad minutes
    assert fleet.rows("SELECT count(*) FROM alerts") == [(1,)]  # the ticket became the page

    [(rate_1h, rate_5m, left)] = fleet.rows(
        "SELECT max(burn_rate) FILTER (WHERE burn_window = '1h'), max(burn_rate) FILTER (WHERE burn_window = '5m'),"
        " any_value(budget_remaining) FROM slo_burn WHERE slo = 'ttft-2s' AND tenant_id = 'smallco' "
        "AND window_end = ?",
        [burn + timedelta(minutes=8)],
    )
    assert rate_5m == pytest.approx(200)
    assert rate_1h == pytest.approx((8 / 300) / 0.001)  # 8 bad of the hour's 300 requests
    assert left == pytest.approx(1 - (8 / 1840) / 0.001)  # the 30-day window holds the 368 minutes planted
    status = fleet.rows(
        "SELECT slo, tenant_id, severity, round(burn_5m), round(burn_1h, 1) FROM slo_status ORDER BY ALL NULLS FIRST"
    )
    assert status == [
        ("ttft-2s", "acme", None, 0.0, 0.0),
        ("ttft-2s", "smallco", "critical", 200.0, 26.7),
        ("ttft-2s-all", None, None, 2.0, 0.3),
    ]
    [(summary,)] = fleet.rows("SELECT summary FROM alerts WHERE state = 'firing'")
    assert summary.startswith(
        "SLO ttft-2s (ttft_ms <= 2000, objective 0.999) for tenant_id smallco: error budget burning 26.7x over 1h "
        "and 200.0x over 5m (rule: above 14.4x on both)"
    )
    assert f"(rule: above 14.4x on both); {left:.0%} of its 30-day budget left; " in summary


def test_a_slow_burn_raises_a_ticket_and_no_page_and_recovery_resolves_it(storage: DuckDBStorage) -> None:
    """2 % bad for a day against 99 %: a burn of 2, above the ticket's 1 over 3 days and 6 hours, far
    below the pages' 14.4 and 6. Evaluated hourly (the window equals the interval, so every minute is
    counted once). Healthy again, the ticket resolves once under half of the 6-hour window is the burn:
    3 h 2 min of it is a burn of 1.01, 2 h 2 min one of 0.68."""
    fleet = Fleet(storage, Config(slos=(per_tenant(0.99),), interval_seconds=3600, window_seconds=3600))
    fleet.plant("acme", T0, 24 * 60, 50, 0.02)
    fleet.plant("acme", T0 + timedelta(hours=24), 5 * 60, 50, 0.0)

    seen = dict(fleet.every(T0 + timedelta(hours=1), T0 + timedelta(hours=29)))
    ticket = [(Severity.WARNING.value, {"slo": "ttft-2s", "tenant_id": "acme"})]
    severities = {a[0] for alerts in seen.values() for a in alerts}
    assert severities == {Severity.WARNING.value}  # never a page
    assert all(seen[T0 + timedelta(hours=h)] == ticket for h in range(1, 28))
    assert seen[T0 + timedelta(hours=28)] == []
    [(state, resolved_at)] = fleet.rows("SELECT state, resolved_at FROM alerts")
    assert state == "resolved"
    assert resolved_at == T0 + timedelta(hours=28)


def test_a_burn_above_6x_over_6_hours_and_30_minutes_pages_though_it_never_reaches_14_4x_over_an_hour(
    storage: DuckDBStorage,
) -> None:
    """Seven hours against 99 %, one request in 10 slow for acme (a burn of 10), one in 16 for initech (6.25),
    one in 17 for globex (5.88), evaluated hourly. None comes near the fast page's 14.4 over an hour; the
    slow page (6 over 6 hours and 30 minutes) takes acme and initech, and globex, just under it, gets the
    ticket (1 over 3 days and 6 hours) only."""
    fleet = Fleet(storage, Config(slos=(per_tenant(0.99),), interval_seconds=3600, window_seconds=3600))
    for tenant, per_minute in (("acme", 10), ("initech", 16), ("globex", 17)):
        fleet.plant(tenant, T0, 7 * 60, per_minute, 1 / per_minute)
    [*_, (last, alerts)] = fleet.every(T0 + timedelta(hours=1), T0 + timedelta(hours=7))
    assert alerts == [
        (Severity.CRITICAL.value, {"slo": "ttft-2s", "tenant_id": "acme"}),
        (Severity.CRITICAL.value, {"slo": "ttft-2s", "tenant_id": "initech"}),
        (Severity.WARNING.value, {"slo": "ttft-2s", "tenant_id": "globex"}),
    ]
    rates = fleet.rows(
        "SELECT tenant_id, burn_window, burn_rate FROM slo_burn WHERE window_end = ? AND burn_window IN "
        "('30m', '1h', '6h') ORDER BY tenant_id, window_seconds",
        [last - timedelta(minutes=2)],
    )
    assert rates == [
        (tenant, window, pytest.approx(rate))
        for tenant, rate in (("acme", 10.0), ("globex", 100 / 17), ("initech", 6.25))
        for window in ("30m", "1h", "6h")
    ]
    [(summary,)] = fleet.rows("SELECT summary FROM alerts WHERE state = 'firing' AND labels->>'tenant_id' = 'acme'")
    assert "error budget burning 10.0x over 6h and 10.0x over 30m (rule: above 6x on both)" in summary


def test_requests_naming_no_tenant_are_a_group_of_their_own_beside_the_tenants(storage: DuckDBStorage) -> None:
    """An SLO grouped by tenant over requests some of which name none: their group (no tenant) is judged beside
    the named ones, and ordering the groups does not compare a missing tenant with a name."""
    fleet = Fleet(storage, Config(slos=(per_tenant(0.99),)))
    fleet.plant("acme", T0, 10, 30, 0.0)
    fleet.plant("", T0, 10, 30, 1.0, series="none")

    def unnamed(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("UPDATE span_rows SET tenant_id = NULL WHERE tenant_id = ''")

    storage.writer.submit(unnamed).result(HANG_GUARD)
    assert fleet.evaluate(T0 + timedelta(minutes=12)) == [
        (Severity.CRITICAL.value, {"slo": "ttft-2s", "tenant_id": None})
    ]
    groups = fleet.rows("SELECT DISTINCT tenant_id FROM slo_burn ORDER BY 1 NULLS FIRST")
    assert groups == [(None,), ("acme",)]


def test_a_three_minute_blip_fires_nothing(storage: DuckDBStorage) -> None:
    """Every request bad for three minutes after six healthy hours: 5 % of an hour (a burn of 5, under the
    page's 14.4) and 0.8 % of six hours (0.83, under the ticket's 1)."""
    fleet = Fleet(storage, Config(slos=(per_tenant(0.99),)))
    blip = T0 + timedelta(hours=6)
    fleet.plant("acme", T0, 6 * 60, 20, 0.0)
    fleet.plant("acme", blip, 3, 20, 1.0)
    fleet.plant("acme", blip + timedelta(minutes=3), 57, 20, 0.0)
    assert all(alerts == [] for _, alerts in fleet.every(T0 + timedelta(minutes=5), blip + timedelta(minutes=65)))
    [(highest,)] = fleet.rows("SELECT max(burn_rate) FROM slo_burn WHERE burn_window = '5m'")
    assert highest == pytest.approx(60)  # the 5-minute window passed the page's rate; the hour did not


def test_a_tenant_with_too_few_requests_gets_no_verdict(storage: DuckDBStorage) -> None:
    fleet = Fleet(storage, Config(slos=(per_tenant(0.99, min_events=100),)))
    fleet.plant("tiny", T0, 60, 1, 1.0)  # every request bad, but under a hundred an hour
    fleet.plant("busy", T0, 60, 1, 1.0)
    fleet.plant("busy", T0, 60, 1, 0.0, series="2")  # two a minute: over a hundred an hour, half bad
    [*_, (_, last)] = fleet.every(T0 + timedelta(minutes=5), T0 + timedelta(minutes=65))
    assert last == [(Severity.CRITICAL.value, {"slo": "ttft-2s", "tenant_id": "busy"})]


def test_the_windows_read_the_stored_minutes_not_the_spans_and_a_replay_does_not_count_twice(
    storage: DuckDBStorage,
) -> None:
    fleet = Fleet(storage, Config(slos=(per_tenant(0.99),)))
    fleet.plant("acme", T0, 120, 10, 0.1)
    for _ in fleet.every(T0 + timedelta(minutes=5), T0 + timedelta(minutes=120)):
        pass
    assert fleet.rows("SELECT sum(total), count(DISTINCT minute) FROM slo_burn_minutes") == [(1180, 118)]

    # Spans gone (retention): the trailing windows still hold what the earlier evaluations counted.
    fleet.storage.writer.submit(
        lambda con: con.execute("DELETE FROM span_rows WHERE end_time < ?", [T0 + timedelta(hours=1)])
    ).result(HANG_GUARD)
    at = T0 + timedelta(minutes=125)
    fleet.evaluate(at)
    fleet.evaluate(at)  # a replay of the same window replaces its minutes
    fleet.evaluate(at - timedelta(minutes=2, seconds=30))  # off the schedule: overlaps the windows either side
    fleet.evaluate(at)
    query = "SELECT burn_window, total FROM slo_burn WHERE window_end = ? ORDER BY window_seconds"
    # The window is [1:58, 2:03): the planted minutes end at 2:00.
    expected = [("5m", 20), ("30m", 270), ("1h", 570), ("6h", 1200), ("3d", 1200), ("30d", 1200)]
    assert fleet.rows(query, [at - timedelta(minutes=2)]) == expected
    # The minutes the windows either side of the one off the schedule counted again replaced what was stored.
    assert fleet.rows("SELECT sum(total), count(*) FROM slo_burn_minutes") == [(1200, 120)]


def test_time_slices_count_minutes_judged_whole() -> None:
    """Ten minutes, one of them with 30 % of its requests slow: 1 bad slice of 10 against 95 % is a burn of 2."""
    config = Config(
        slos=(
            Slo(name="slices", objective=0.95, sli=TTFT_2S, budgeting="timeslices", timeslice_target=0.9, min_events=5),
        ),
        rules=DEFAULT_RULES[2:],
        window_seconds=600,
        interval_seconds=600,
    )
    window = Window(T0, T0 + timedelta(minutes=10))
    ends = [T0 + timedelta(minutes=m, seconds=s) for m in range(10) for s in range(10)]
    ttft = [5000.0 if m == 4 and s < 3 else 100.0 for m in range(10) for s in range(10)]
    frames = {
        "requests": pl.DataFrame({"request_key": range(100), "end_time": ends, "tenant_id": ["a"] * 100,
                                  "deployment": ["d"] * 100, "model": ["m"] * 100, "ttft_ms": ttft,
                                  "e2e_ms": [1.0] * 100, "tpot_ms": [1.0] * 100, "status_code": ["OK"] * 100}),
        "stored": pl.DataFrame(schema={"slo": pl.String, "tenant_id": pl.String, "deployment": pl.String,
                                       "model": pl.String, "window_seconds": pl.Int64, "good": pl.Int64,
                                       "total": pl.Int64, "good_slices": pl.Int64, "slices": pl.Int64}),
    }  # fmt: skip
    out = detect(frames, config, window)
    day = out.figures.filter(pl.col("burn_window") == "3d")
    assert day.select("good", "total", "burn_rate").row(0) == (9, 10, pytest.approx(2.0))  # minutes, not requests
    assert [c.labels for c in out.conditions] == [{"slo": "slices"}]
    assert out.conditions[0].value == pytest.approx(2.0)


def test_config_rejects_windows_that_would_skip_minutes_and_the_window_follows_the_interval() -> None:
    with pytest.raises(ValueError, match="window_seconds must be at least interval_seconds"):
        Config(window_seconds=120)
    with pytest.raises(ValueError, match="multiple of 60"):
        Config(window_seconds=330, interval_seconds=300)
    with pytest.raises(ValueError, match="at least one condition"):
        Sli()
    with pytest.raises(ValueError, match="share a name"):
        Config(slos=(per_tenant(0.99), per_tenant(0.9)))
    assert Config.model_validate({"interval_seconds": 3600}).window_seconds == 3600
    # Off the minute, the window still ends on one: every minute it counts is whole.
    assert Config().window(datetime(2026, 11, 20, 12, 5, 17)) == Window(
        datetime(2026, 11, 20, 11, 58), T0 + timedelta(minutes=3)
    )


def test_slos_come_from_the_settings_file_and_an_unknown_key_is_named(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "detectors:\n  slo_burn:\n    slos:\n      - {name: ttft-2s, objective: 0.99, sli: {ttft_ms_max: 2000},"
        " group_by: [tenant_id]}\n"
    )
    [slo] = load_settings(good).detectors.slo_burn.slos
    assert slo == per_tenant(0.99)
    bad = tmp_path / "bad.yaml"
    bad.write_text("detectors:\n  slo_burn:\n    slos:\n      - {name: x, objective: 0.99, sli: {ttft_max: 2000}}\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'detectors\.slo_burn\.slos\.0\.sli\.ttft_max'"):
        load_settings(bad)


def test_window_names_and_labels() -> None:
    assert [window_name(s) for s in (300, 1800, 3600, 21_600, 259_200, 2_592_000)] == [
        "5m", "30m", "1h", "6h", "3d", "30d",
    ]  # fmt: skip
    assert LABELS == ("slo", "tenant_id", "deployment", "model")
    assert fingerprint(KEY, {"slo": "a"}) != fingerprint(KEY, {"slo": "b"})


def test_figures_fit_the_migrated_table(tmp_path: Path) -> None:
    config = Config(slos=(per_tenant(0.99),))
    window = config.window(T0)
    frames = {
        "requests": pl.DataFrame({"request_key": [1], "end_time": [window.start], "tenant_id": ["a"],
                                  "deployment": ["d"], "model": ["m"], "ttft_ms": [5000.0], "e2e_ms": [1.0],
                                  "tpot_ms": [1.0], "status_code": ["OK"]}),
        "stored": pl.DataFrame(schema={"slo": pl.String, "tenant_id": pl.String, "deployment": pl.String,
                                       "model": pl.String, "window_seconds": pl.Int64, "good": pl.Int64,
                                       "total": pl.Int64, "good_slices": pl.Int64, "slices": pl.Int64}),
    }  # fmt: skip
    out = detect(frames, config, window)
    assert out.figures.columns == FIGURE_COLUMNS
    assert_fits_migrated_table(
        tmp_path,
        KEY,
        out.figures,
        rows=len(config.trailing_windows()),
        inputs=inputs,
        detect=detect,
        config=config,
        window=window,
        schemas={},
    )


def test_a_score_floor_judges_only_scored_requests_by_their_lowest_score_and_no_error_fails_errors() -> None:
    """Four requests: scored 0.9, scored 0.9 and 0.5 (its lowest counts), unscored, and a scored one that
    errored. Against groundedness >= 0.7 and no error: three judged, one good."""
    config = Config(
        slos=(Slo(name="grounded", objective=0.9, sli=Sli(score_min={"groundedness": 0.7}, no_error=True)),)
    )
    window = config.window(T0)
    at = window.start + timedelta(seconds=10)
    frames = {
        "requests": pl.DataFrame({"request_key": [1, 2, 3, 4], "end_time": [at] * 4, "tenant_id": ["a"] * 4,
                                  "deployment": ["d"] * 4, "model": ["m"] * 4, "ttft_ms": [1.0] * 4,
                                  "e2e_ms": [1.0] * 4, "tpot_ms": [1.0] * 4,
                                  "status_code": ["OK", "OK", "OK", "ERROR"]}),
        "scores": pl.DataFrame({"request_key": [1, 2, 2, 4], "name": ["groundedness"] * 4,
                                "score": [0.9, 0.9, 0.5, 0.95]}),
        "stored": pl.DataFrame(schema={"slo": pl.String, "tenant_id": pl.String, "deployment": pl.String,
                                       "model": pl.String, "window_seconds": pl.Int64, "good": pl.Int64,
                                       "total": pl.Int64, "good_slices": pl.Int64, "slices": pl.Int64}),
    }  # fmt: skip
    assert set(inputs(config, window)) == {"requests", "stored", "scores"}
    out = detect(frames, config, window)
    assert out.extra_tables["slo_burn_minutes"].select("good", "total").rows() == [(1, 3)]
