"""token_latency on hand-built frames: the spike fires with its reason, a steady window stays silent; and on a
real database, the baseline leaves out the windows that breached."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from request_frames import WINDOW
from waiting import HANG_GUARD

from detectors.alerts import evaluate
from detectors.base import Condition, Detection, Severity, Window
from detectors.detection import DetectionPass
from detectors.token_latency import KEY, LABELS, Config, detect, inputs
from storage.duckdb.backend import DuckDBStorage
from storage.ports import Breached, Requests, RequestSummary

BASELINE_COLUMNS = [
    "model",
    "deployment",
    "tenant_id",
    "grouping_set",
    "baseline_n",
    "baseline_p99",
    "baseline_cache_hit_mean",
]


ENGINE_TYPES = {"kv_cache_usage": pl.Float64, "preemptions": pl.Int64, "step_tokens": pl.Float64}


def window_frame(tpots: list[float], **columns: Sequence[object]) -> pl.DataFrame:
    n = len(tpots)
    base: dict[str, Sequence[object]] = {
        "model": ["llama"] * n,
        "deployment": ["vllm-a"] * n,
        "tenant_id": ["acme"] * n,
        "tpot_ms": list(tpots),
        "prefill_tokens_in_batch": [500] * n,
        "cache_hit_ratio": [0.9] * n,
        "queue_ms": [5.0] * n,
        "e2e_ms": [2000.0] * n,
        # No engine metrics unless a test says otherwise, as the spans alone would give.
        "kv_cache_usage": [None] * n,
        "preemptions": [None] * n,
        "step_tokens": [None] * n,
    }
    return pl.DataFrame({**base, **columns}).cast(ENGINE_TYPES)


def baseline(p99: float, n: int = 5000, cache: float = 0.9) -> pl.DataFrame:
    rows = [("llama", "vllm-a", None, 0, n, p99, cache), ("llama", "vllm-a", "acme", 1, n, p99, cache)]
    return pl.DataFrame(
        rows,
        schema=BASELINE_COLUMNS,
        orient="row",
    )


def test_a_doubled_p99_fires_with_prefill_burst_as_the_reason() -> None:
    tpots = [10.0] * 190 + [45.0] * 10
    prefill = [500] * 190 + [6000] * 10
    out = detect(
        {"window": window_frame(tpots, prefill_tokens_in_batch=prefill), "baseline": baseline(20.0)}, Config(), WINDOW
    )
    model = [c for c in out.conditions if "tenant_id" not in c.labels]
    assert len(model) == 1
    tenant = [c for c in out.conditions if "tenant_id" in c.labels]
    assert [tuple(c.labels) for c in tenant] == [LABELS]
    assert model[0].labels == {"model": "llama", "deployment": "vllm-a"}
    assert model[0].value >= 2.0
    assert "prefill_burst" in model[0].summary and "100% of the slow requests" in model[0].summary
    row = out.figures.filter(pl.col("grouping") == "model").row(0, named=True)
    assert row["reason"] == "prefill_burst" and row["breached"]


def test_cache_drop_is_tagged_kv_eviction_and_queueing_scheduler_starve() -> None:
    tpots = [10.0] * 190 + [45.0] * 10
    kv = detect(
        {"window": window_frame(tpots, cache_hit_ratio=[0.5] * 200), "baseline": baseline(20.0, cache=0.9)},
        Config(per_tenant=False),
        WINDOW,
    )
    assert "likely kv_eviction" in kv.conditions[0].summary
    starve = detect(
        {"window": window_frame(tpots, queue_ms=[1500.0] * 200), "baseline": baseline(20.0)},
        Config(per_tenant=False),
        WINDOW,
    )
    assert "likely scheduler_starve" in starve.conditions[0].summary


def test_steady_window_and_thin_samples_stay_silent() -> None:
    steady = detect({"window": window_frame([10.0] * 200), "baseline": baseline(12.0)}, Config(), WINDOW)
    assert steady.conditions == []
    thin = detect({"window": window_frame([50.0] * 10), "baseline": baseline(10.0)}, Config(), WINDOW)
    assert thin.conditions == []
    no_baseline = detect({"window": window_frame([50.0] * 200), "baseline": baseline(10.0, n=20)}, Config(), WINDOW)
    assert no_baseline.conditions == []


def test_critical_at_three_times_the_baseline() -> None:
    out = detect(
        {"window": window_frame([10.0] * 150 + [80.0] * 50), "baseline": baseline(20.0)},
        Config(per_tenant=False),
        WINDOW,
    )
    assert out.conditions[0].severity == "critical"


# --------------------------------------------------------------------------------------------------
# Exact bounds: every threshold is "at least", so a value exactly on it breaches.
# --------------------------------------------------------------------------------------------------


def model_conditions(out: Detection) -> list[Condition]:
    return [c for c in out.conditions if "tenant_id" not in c.labels]


def model_row(out: Detection) -> dict[str, Any]:
    rows = out.figures.filter(pl.col("grouping") == "model").to_dicts()
    assert len(rows) == 1
    return rows[0]


def effective_severity(condition: Condition, config: Config) -> str:
    """The severity the alert built from this condition carries."""
    evaluation = evaluate(
        "token_latency",
        [condition],
        {},
        {},
        for_evaluations=1,
        default_severity=config.severity,
        window=WINDOW,
        at=WINDOW.end,
    )
    assert len(evaluation.fired) == 1
    return evaluation.fired[0].severity


@pytest.mark.parametrize(
    ("window_p99", "fires"),
    [(199.0, False), (200.0, True), (201.0, True)],
    ids=["1.99x-silent", "exactly-2.0x-fires", "2.01x-fires"],
)
def test_ratio_threshold_is_reached_at_exactly_twice_the_baseline_p99(window_p99: float, fires: bool) -> None:
    out = detect(
        {"window": window_frame([window_p99] * 200), "baseline": baseline(100.0)}, Config(per_tenant=False), WINDOW
    )
    row = model_row(out)
    assert row["ratio"] == pytest.approx(window_p99 / 100.0, rel=1e-12)
    assert row["breached"] is fires
    conditions = model_conditions(out)
    assert len(conditions) == (1 if fires else 0)
    if fires:
        assert conditions[0].value == pytest.approx(window_p99 / 100.0, rel=1e-12)
        assert conditions[0].threshold == 2.0


def test_a_ratio_a_rounding_error_under_the_threshold_still_reaches_it() -> None:
    # 0.1 x 3 is 0.30000000000000004, so 0.6 and 0.9 over it come out a hair under 2.0 and 3.0.
    baseline_p99 = 0.1 * 3
    for window_p99, threshold, severity in ((0.6, 2.0, None), (0.9, 3.0, Severity.CRITICAL)):
        out = detect(
            {"window": window_frame([window_p99] * 200), "baseline": baseline(baseline_p99)},
            Config(per_tenant=False),
            WINDOW,
        )
        assert model_row(out)["ratio"] < threshold
        assert model_row(out)["breached"] is True
        [condition] = model_conditions(out)
        assert condition.severity == severity


@pytest.mark.parametrize(
    ("window_p99", "severity", "effective"),
    [
        (201.0, None, "warning"),
        (299.0, None, "warning"),
        (300.0, Severity.CRITICAL, "critical"),
        (301.0, Severity.CRITICAL, "critical"),
    ],
    ids=["2.01x-warning", "2.99x-warning", "exactly-3.0x-critical", "3.01x-critical"],
)
def test_alert_is_critical_from_exactly_the_critical_ratio_and_otherwise_takes_the_configured_severity(
    window_p99: float, severity: Severity | None, effective: str
) -> None:
    config = Config(per_tenant=False)
    out = detect({"window": window_frame([window_p99] * 200), "baseline": baseline(100.0)}, config, WINDOW)
    [condition] = model_conditions(out)
    assert condition.value == pytest.approx(window_p99 / 100.0, rel=1e-12)
    assert condition.severity == severity
    assert effective_severity(condition, config) == effective


def test_a_non_critical_breach_takes_whatever_severity_the_detector_is_configured_with() -> None:
    config = Config(per_tenant=False, severity=Severity.INFO)
    out = detect({"window": window_frame([250.0] * 200), "baseline": baseline(100.0)}, config, WINDOW)
    [condition] = model_conditions(out)
    assert condition.severity is None
    assert effective_severity(condition, config) == "info"


@pytest.mark.parametrize(
    ("n", "fires"), [(49, False), (50, True), (51, True)], ids=["49-silent", "50-fires", "51-fires"]
)
def test_window_needs_at_least_min_samples_requests(n: int, fires: bool) -> None:
    out = detect({"window": window_frame([250.0] * n), "baseline": baseline(100.0)}, Config(per_tenant=False), WINDOW)
    row = model_row(out)
    assert row["n"] == n
    assert row["breached"] is fires
    assert len(out.conditions) == (1 if fires else 0)


@pytest.mark.parametrize(
    ("baseline_n", "fires"), [(199, False), (200, True), (201, True)], ids=["199-silent", "200-fires", "201-fires"]
)
def test_baseline_needs_at_least_min_baseline_samples_requests(baseline_n: int, fires: bool) -> None:
    out = detect(
        {"window": window_frame([250.0] * 200), "baseline": baseline(100.0, n=baseline_n)},
        Config(per_tenant=False),
        WINDOW,
    )
    row = model_row(out)
    assert row["baseline_n"] == baseline_n
    assert row["breached"] is fires
    assert len(out.conditions) == (1 if fires else 0)


def test_a_group_without_any_baseline_never_breaches() -> None:
    empty = baseline(100.0).clear()
    out = detect({"window": window_frame([900.0] * 200), "baseline": empty}, Config(), WINDOW)
    assert out.conditions == []
    assert out.figures["breached"].to_list() == [False, False]
    assert out.figures["reason"].to_list() == [None, None]


# --------------------------------------------------------------------------------------------------
# Reasons: each threshold exactly, and their precedence.
# All 100 window requests decode at 250 ms against a 100 ms baseline p99, so every one is "slow".
# --------------------------------------------------------------------------------------------------


def reason_of(frame: pl.DataFrame, base: pl.DataFrame | None = None) -> str:
    out = detect(
        {"window": frame, "baseline": baseline(100.0) if base is None else base}, Config(per_tenant=False), WINDOW
    )
    [condition] = out.conditions
    reason = model_row(out)["reason"]
    assert f"likely {reason}:" in condition.summary
    return str(reason)


@pytest.mark.parametrize(
    ("big", "reason"),
    [(49, "unknown"), (50, "prefill_burst"), (51, "prefill_burst")],
    ids=["share-0.49", "share-exactly-0.5", "share-0.51"],
)
def test_prefill_burst_from_exactly_half_the_slow_requests_beside_a_big_prefill(big: int, reason: str) -> None:
    frame = window_frame([250.0] * 100, prefill_tokens_in_batch=[6000] * big + [500] * (100 - big))
    assert reason_of(frame) == reason


@pytest.mark.parametrize(
    ("prefill_tokens", "reason"),
    [(3999, "unknown"), (4000, "unknown"), (4001, "prefill_burst")],
    ids=["3999-tokens", "exactly-4000-tokens-is-not-more", "4001-tokens"],
)
def test_a_big_prefill_is_strictly_more_than_prefill_tokens_threshold(prefill_tokens: int, reason: str) -> None:
    frame = window_frame([250.0] * 100, prefill_tokens_in_batch=[prefill_tokens] * 100)
    assert reason_of(frame) == reason


def test_prefill_share_counts_only_requests_slower_than_the_baseline_p99() -> None:
    # 60 fast requests (one exactly at the baseline p99) saw big prefills; none of the 40 slow ones did.
    tpots = [50.0] * 59 + [100.0] + [250.0] * 40
    frame = window_frame(tpots, prefill_tokens_in_batch=[9000] * 60 + [500] * 40)
    out = detect({"window": frame, "baseline": baseline(100.0)}, Config(per_tenant=False), WINDOW)
    row = model_row(out)
    assert row["prefill_share"] == 0.0
    assert row["reason"] == "unknown"


@pytest.mark.parametrize(
    ("baseline_cache", "window_cache", "reason"),
    [
        (0.14, 0.0, "unknown"),
        (0.15, 0.0, "kv_eviction"),
        (0.16, 0.0, "kv_eviction"),
        (0.9, 0.76, "unknown"),
        (0.9, 0.74, "kv_eviction"),
        (0.7, 0.55, "kv_eviction"),  # 0.7 - 0.55 computes a hair under 0.15
        (0.5, 0.9, "unknown"),
    ],
    ids=["drop-0.14", "drop-exactly-0.15", "drop-0.16", "0.9-to-0.76", "0.9-to-0.74", "0.7-to-0.55", "cache-rose"],
)
def test_kv_eviction_from_a_cache_hit_drop_of_exactly_kv_drop_threshold(
    baseline_cache: float, window_cache: float, reason: str
) -> None:
    frame = window_frame([250.0] * 100, cache_hit_ratio=[window_cache] * 100)
    assert reason_of(frame, baseline(100.0, cache=baseline_cache)) == reason


@pytest.mark.parametrize(
    ("queue_ms", "reason"),
    [(999.0, "unknown"), (1000.0, "scheduler_starve"), (1001.0, "scheduler_starve")],
    ids=["share-0.4995", "share-exactly-0.5", "share-0.5005"],
)
def test_scheduler_starve_from_a_median_queue_share_of_exactly_half(queue_ms: float, reason: str) -> None:
    frame = window_frame([250.0] * 100, queue_ms=[queue_ms] * 100, e2e_ms=[2000.0] * 100)
    assert reason_of(frame) == reason


@pytest.mark.parametrize(
    ("prefill", "cache_drop", "queued", "reason"),
    [
        (True, True, True, "prefill_burst"),
        (True, False, True, "prefill_burst"),
        (True, True, False, "prefill_burst"),
        (False, True, True, "kv_eviction"),
        (False, False, True, "scheduler_starve"),
        (False, False, False, "unknown"),
    ],
    ids=["all-three", "prefill-and-queue", "prefill-and-cache", "cache-and-queue", "queue-only", "none"],
)
def test_reason_precedence_is_prefill_burst_then_kv_eviction_then_scheduler_starve_then_unknown(
    prefill: bool, cache_drop: bool, queued: bool, reason: str
) -> None:
    frame = window_frame(
        [250.0] * 100,
        prefill_tokens_in_batch=[6000 if prefill else 500] * 100,
        cache_hit_ratio=[0.5 if cache_drop else 0.9] * 100,
        queue_ms=[1500.0 if queued else 5.0] * 100,
    )
    assert reason_of(frame, baseline(100.0, cache=0.9)) == reason


def test_a_breach_without_prefill_or_queue_figures_is_not_blamed_on_either() -> None:
    """Spans that carry no prefill_tokens_in_batch or queue_ms give no evidence of a burst or a starved queue."""
    frame = window_frame([250.0] * 100, prefill_tokens_in_batch=[None] * 100, queue_ms=[None] * 100)
    assert reason_of(frame, baseline(100.0, cache=0.9)) == "unknown"


# --------------------------------------------------------------------------------------------------
# Figures: every column worked out by hand on a five-request frame.
# --------------------------------------------------------------------------------------------------

FIVE = pl.DataFrame(
    {
        "model": ["llama"] * 5,
        "deployment": ["vllm-a"] * 5,
        "tenant_id": ["acme", "globex", "acme", "globex", "globex"],
        "tpot_ms": [10.0, 20.0, 30.0, 40.0, 50.0],
        # tpot 10 and 20 are not above the 20 ms baseline p99: their big prefills do not count.
        "prefill_tokens_in_batch": [9000, 9000, 6000, 4000, 4001],
        "cache_hit_ratio": [0.5, 0.25, 0.75, 1.0, 0.0],
        "queue_ms": [100.0, 200.0, 300.0, 400.0, 500.0],
        "e2e_ms": [1000.0] * 5,
        # Only the slow three (30, 40, 50 ms) count toward the engine figures.
        "kv_cache_usage": [0.1, 0.2, 0.9, 0.96, 0.99],
        "preemptions": [5, 5, 0, 1, 2],
        "step_tokens": [100.0, 200.0, 300.0, 400.0, 500.0],
    }
)
FIVE_BASELINE = pl.DataFrame(
    [
        ("llama", "vllm-a", None, 0, 900, 20.0, 0.75),
        ("llama", "vllm-a", "acme", 1, 300, 10.0, 0.5),
        ("llama", "vllm-a", "globex", 1, 600, 25.0, 0.875),
    ],
    schema=BASELINE_COLUMNS,
    orient="row",
)
LOW_BOUNDS = {"min_samples": 1, "min_baseline_samples": 1}


def approx(value: float) -> Any:
    return pytest.approx(value, rel=1e-12)


def test_model_figures_are_computed_exactly_with_linear_interpolated_percentiles() -> None:
    out = detect({"window": FIVE, "baseline": FIVE_BASELINE}, Config(per_tenant=False, **LOW_BOUNDS), WINDOW)
    assert out.figures.height == 1
    row = model_row(out)
    assert row == {
        "model": "llama",
        "deployment": "vllm-a",
        "tenant_id": None,
        "n": 5,
        "tpot_p50": approx(30.0),
        "tpot_p99": approx(49.6),  # rank 0.99 * 4 = 3.96: 40 + 0.96 * (50 - 40)
        "baseline_n": 900,
        "baseline_p99": 20.0,
        "cache_hit_mean": approx(0.5),
        "baseline_cache_hit_mean": 0.75,
        "queue_share": approx(0.3),  # median of 0.1 .. 0.5
        "prefill_share": approx(2 / 3),  # slow: 30 ms (6000), 40 ms (4000, not more), 50 ms (4001)
        "preempted_share": approx(2 / 3),  # slow: 0, 1, 2 preemptions
        "kv_usage_p50": approx(0.96),
        "step_tokens_p50": approx(400.0),
        "grouping": "model",
        "ratio": approx(49.6 / 20.0),
        "breached": True,
        "reason": "prefill_burst",
        "window_start": WINDOW.start,
        "window_end": WINDOW.end,
    }


def test_per_tenant_adds_one_row_per_tenant_measured_against_its_own_baseline() -> None:
    out = detect({"window": FIVE, "baseline": FIVE_BASELINE}, Config(per_tenant=True, **LOW_BOUNDS), WINDOW)
    rows = {(r["grouping"], r["tenant_id"]): r for r in out.figures.to_dicts()}
    assert set(rows) == {("model", None), ("tenant", "acme"), ("tenant", "globex")}
    assert rows[("model", None)]["tpot_p99"] == approx(49.6)

    acme = rows[("tenant", "acme")]  # tpot 10, 30
    assert (acme["n"], acme["baseline_n"], acme["baseline_p99"]) == (2, 300, 10.0)
    assert acme["tpot_p50"] == approx(20.0)
    assert acme["tpot_p99"] == approx(29.8)  # rank 0.99: 10 + 0.99 * 20
    assert acme["ratio"] == approx(2.98)
    assert acme["cache_hit_mean"] == approx(0.625)
    assert acme["baseline_cache_hit_mean"] == 0.5
    assert acme["queue_share"] == approx(0.2)
    assert acme["prefill_share"] == approx(1.0)  # both above 10 ms; 9000 and 6000 tokens
    assert (acme["breached"], acme["reason"]) == (True, "prefill_burst")

    globex = rows[("tenant", "globex")]  # tpot 20, 40, 50
    assert (globex["n"], globex["baseline_n"], globex["baseline_p99"]) == (3, 600, 25.0)
    assert globex["tpot_p50"] == approx(40.0)
    assert globex["tpot_p99"] == approx(49.8)  # rank 1.98: 40 + 0.98 * 10
    assert globex["ratio"] == approx(49.8 / 25.0)
    assert globex["cache_hit_mean"] == approx(0.4166666666666667)
    assert globex["queue_share"] == approx(0.4)
    assert globex["prefill_share"] == approx(0.5)  # 40 ms (4000) and 50 ms (4001)
    assert (globex["breached"], globex["reason"]) == (False, None)

    labels = sorted((dict(c.labels) for c in out.conditions), key=len)
    assert labels == [
        {"model": "llama", "deployment": "vllm-a"},
        {"model": "llama", "deployment": "vllm-a", "tenant_id": "acme"},
    ]


def test_per_tenant_off_gives_only_the_model_grouping() -> None:
    out = detect({"window": FIVE, "baseline": FIVE_BASELINE}, Config(per_tenant=False, **LOW_BOUNDS), WINDOW)
    assert out.figures["grouping"].to_list() == ["model"]
    assert out.figures["tenant_id"].to_list() == [None]
    assert out.figures.schema["tenant_id"] == pl.String  # the results table's column, not an untyped null
    assert [dict(c.labels) for c in out.conditions] == [{"model": "llama", "deployment": "vllm-a"}]


# --------------------------------------------------------------------------------------------------
# Summary text and labels.
# --------------------------------------------------------------------------------------------------


def test_summary_names_the_ratio_to_one_decimal_the_baseline_hours_and_the_group() -> None:
    config = Config(per_tenant=True, baseline_hours=6)
    out = detect({"window": window_frame([244.0] * 200), "baseline": baseline(100.0)}, config, WINDOW)
    by_len = sorted(out.conditions, key=lambda c: len(c.labels))
    assert [dict(c.labels) for c in by_len] == [
        {"model": "llama", "deployment": "vllm-a"},
        {"model": "llama", "deployment": "vllm-a", "tenant_id": "acme"},
    ]
    assert by_len[0].summary == (
        "tpot p99 244.0 ms is 2.4x the 6h baseline 100.0 ms for model=llama, deployment=vllm-a "
        "over 2026-11-20 12:00–12:05 UTC (n=200); likely unknown: "
        "no prefill burst, preemption, KV pressure, cache drop or queueing explains it"
    )
    assert by_len[1].summary.startswith(
        "tpot p99 244.0 ms is 2.4x the 6h baseline 100.0 ms for model=llama, deployment=vllm-a, tenant_id=acme over "
    )
    assert by_len[0].value == pytest.approx(2.44, rel=1e-12)


def test_requests_without_model_or_deployment_are_one_group_judged_against_their_own_baseline() -> None:
    n = 100
    frame = window_frame([250.0] * n, model=[None] * n, deployment=[None] * n, tenant_id=[None] * n).with_columns(
        pl.col("model", "deployment", "tenant_id").cast(pl.String)  # typed as fetched from the database
    )
    untagged = baseline(100.0).with_columns(pl.lit(None, pl.String).alias(c) for c in ("model", "deployment"))
    [condition] = detect({"window": frame, "baseline": untagged}, Config(per_tenant=False), WINDOW).conditions
    assert condition.labels == {}
    assert condition.value == pytest.approx(2.5)
    assert condition.summary.startswith(
        "tpot p99 250.0 ms is 2.5x the 24h baseline 100.0 ms for all requests over 2026-11-20 12:00–12:05 UTC (n=100)"
    )


def test_summary_keeps_fractional_baseline_hours_and_the_reason_evidence() -> None:
    config = Config(per_tenant=False, baseline_hours=1.5)
    frame = window_frame([250.0] * 100, prefill_tokens_in_batch=[6000] * 75 + [500] * 25)
    [condition] = detect({"window": frame, "baseline": baseline(100.0)}, config, WINDOW).conditions
    assert condition.summary == (
        "tpot p99 250.0 ms is 2.5x the 1.5h baseline 100.0 ms for model=llama, deployment=vllm-a "
        "over 2026-11-20 12:00–12:05 UTC (n=100); likely prefill_burst: "
        "75% of the slow requests decoded beside > 4000 prefill tokens"
    )


@pytest.mark.parametrize(
    ("columns", "base_cache", "evidence"),
    [
        (
            {"cache_hit_ratio": [0.5] * 100},
            0.9,
            "likely kv_eviction: cache hit ratio fell to 0.50 from a baseline 0.90",
        ),
        (
            {"queue_ms": [1200.0] * 100, "e2e_ms": [2000.0] * 100},
            0.9,
            "likely scheduler_starve: the median request spent 60% of its time queued",
        ),
    ],
    ids=["kv_eviction", "scheduler_starve"],
)
def test_summary_ends_with_the_figures_behind_the_reason(
    columns: dict[str, list[object]], base_cache: float, evidence: str
) -> None:
    frame = window_frame([250.0] * 100, **columns)
    [condition] = detect(
        {"window": frame, "baseline": baseline(100.0, cache=base_cache)}, Config(per_tenant=False), WINDOW
    ).conditions
    assert condition.summary.endswith(evidence)


def test_baseline_read_ends_at_the_last_full_hour_before_the_window() -> None:
    window = Window(datetime(2026, 11, 20, 12, 7), datetime(2026, 11, 20, 12, 12))
    reads = inputs(Config(baseline_hours=6), window)
    assert isinstance(reads["window"], Requests) and isinstance(reads["baseline"], RequestSummary)
    assert reads["window"].window == window
    assert reads["baseline"].window == Window(datetime(2026, 11, 20, 6, 0), datetime(2026, 11, 20, 12, 0))
    assert reads["baseline"].cacheable and not reads["window"].cacheable
    # A window starting off the minute (a settle time in seconds) still ends the baseline on the hour.
    odd = Window(datetime(2026, 11, 20, 12, 7, 31, 250_000), datetime(2026, 11, 20, 12, 12, 31, 250_000))
    odd_baseline = inputs(Config(baseline_hours=6), odd)["baseline"]
    assert isinstance(odd_baseline, RequestSummary)
    assert odd_baseline.window == Window(datetime(2026, 11, 20, 6, 0), datetime(2026, 11, 20, 12, 0))


def test_the_baseline_leaves_out_a_models_breaches_for_all_its_tenants_and_a_tenants_for_it_alone() -> None:
    window = Window(datetime(2026, 11, 20, 12, 7), datetime(2026, 11, 20, 12, 12))
    baseline = inputs(Config(), window)["baseline"]
    assert isinstance(baseline, RequestSummary)
    # tenant_id is optional: a model's row (no tenant) matches every tenant's requests, a tenant's only its own.
    assert baseline.leave_out == Breached(KEY, keys=("model", "deployment"), optional=("tenant_id",))
    off = inputs(Config(baseline_excludes_breaches=False), window)["baseline"]
    assert isinstance(off, RequestSummary) and off.leave_out is None


# --------------------------------------------------------------------------------------------------
# Reasons from the engines (engine metrics joined to each request).
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("preempted", "reason"), [(50, "preemption"), (49, "unknown")])
def test_preemption_from_exactly_half_the_slow_requests_running_beside_preemptions(preempted: int, reason: str) -> None:
    frame = window_frame([250.0] * 100, preemptions=[1] * preempted + [0] * (100 - preempted))
    assert reason_of(frame, baseline(100.0, cache=0.9)) == reason


@pytest.mark.parametrize(("usage", "reason"), [(0.95, "kv_pressure"), (0.94, "unknown")])
def test_kv_pressure_from_a_median_kv_cache_usage_of_exactly_the_threshold(usage: float, reason: str) -> None:
    frame = window_frame([250.0] * 100, kv_cache_usage=[usage] * 100)
    assert reason_of(frame, baseline(100.0, cache=0.9)) == reason


@pytest.mark.parametrize(("tokens", "reason"), [(4096.0, "batch_tokens"), (4095.0, "unknown")])
def test_batch_tokens_from_a_median_of_exactly_the_threshold_tokens_per_step(tokens: float, reason: str) -> None:
    frame = window_frame([250.0] * 100, step_tokens=[tokens] * 100)
    assert reason_of(frame, baseline(100.0, cache=0.9)) == reason


def test_engine_reasons_come_after_prefill_burst_and_before_cache_drop_and_batch_tokens() -> None:
    everything = {
        "preemptions": [1] * 100, "kv_cache_usage": [0.99] * 100, "cache_hit_ratio": [0.5] * 100,
        "step_tokens": [8000.0] * 100, "queue_ms": [1500.0] * 100,
    }  # fmt: skip
    order = ["preemption", "kv_pressure", "kv_eviction", "batch_tokens", "scheduler_starve"]
    for i, reason in enumerate(order):
        columns = dict(everything)
        for earlier in order[:i]:
            columns.pop({"preemption": "preemptions", "kv_pressure": "kv_cache_usage", "kv_eviction": "cache_hit_ratio",
                         "batch_tokens": "step_tokens"}[earlier])  # fmt: skip
        assert reason_of(window_frame([250.0] * 100, **columns), baseline(100.0, cache=0.9)) == reason
    burst = window_frame([250.0] * 100, prefill_tokens_in_batch=[6000] * 100, **everything)
    assert reason_of(burst, baseline(100.0, cache=0.9)) == "prefill_burst"


def test_the_summary_says_what_the_engines_were_doing_while_p99_rose() -> None:
    frame = window_frame(
        [250.0] * 100, kv_cache_usage=[0.97] * 100, preemptions=[2] * 60 + [0] * 40, step_tokens=[2048.0] * 100
    )
    [condition] = detect({"window": frame, "baseline": baseline(100.0)}, Config(per_tenant=False), WINDOW).conditions
    assert (
        "(n=100); while the KV cache sat at 97%, 60% of the slow requests saw preemptions, steps ran 2048 tokens; "
        "likely preemption: 60% of the slow requests ran while their replica preempted"
    ) in condition.summary


# --- the baseline leaves the fault out (a real pass on a real database) ------------------------------------

DAY0 = datetime(2026, 11, 20, 0, 0)


def plant_tpot(storage: DuckDBStorage, start: datetime, minutes: int, spread: tuple[float, float]) -> None:
    """60 requests a minute of tenant acme on llama, their tpot_ms evenly over `spread`, ending inside it."""
    low, high = spread

    def insert(con: duckdb.DuckDBPyConnection) -> None:
        con.execute(
            """
            INSERT INTO span_rows (trace_id, span_id, name, kind, start_time, end_time, duration_ms, status_code,
                                   tenant_id, deployment, model, is_llm, llm_role, tpot_ms, e2e_ms, ingested_at)
            SELECT ?::VARCHAR || '-' || m || '-' || i, 's', 'llm_request', 'SERVER', e - INTERVAL 1 SECOND, e, 1000,
                   'OK', 'acme', 'chat', 'llama', true, 'server', ? + (? - ?) * i / 59.0, 1000.0, e
            FROM range(?) AS a(m), range(60) AS b(i),
                 LATERAL (SELECT ?::TIMESTAMP + to_minutes(m) + to_milliseconds(i * 900) AS e)
            """,
            [start.isoformat(), low, high, low, minutes, start],
        )

    storage.writer.submit(insert).result(HANG_GUARD)


def evaluated_baseline(detection: DetectionPass, at: datetime, storage: DuckDBStorage) -> tuple[float, bool]:
    """The model row's baseline p99 and whether it breached, for the evaluation at `at`."""
    [result] = detection.run(at, only=[KEY])
    assert result.outcome == "ok", result.error
    [(p99, breached)] = storage.reader.rows(
        "SELECT baseline_p99, breached FROM token_latency WHERE grouping = 'model' AND window_end = ?",
        [Config().window(at).end],
    )
    return p99, breached


@pytest.mark.parametrize("leaves_out", [True, False])
def test_after_an_hour_long_breach_the_baseline_stays_at_its_level_before_it(db_path: Path, leaves_out: bool) -> None:
    """A day at 15–30 ms, then an hour at three times that: were the breaching hour in the next day's
    baseline (4 % of it, above the 1 % a p99 lets through), the baseline p99 would triple with it and the
    next fault would have to be three times as bad again to be seen."""
    storage = DuckDBStorage.open(db_path)
    try:
        plant_tpot(storage, DAY0, 26 * 60, (15.0, 30.0))
        plant_tpot(storage, DAY0 + timedelta(hours=26), 60, (45.0, 90.0))
        plant_tpot(storage, DAY0 + timedelta(hours=27), 120, (15.0, 30.0))
        # Judged per model alone: its breach must leave out every tenant's requests (acme's, here).
        config = Config(baseline_excludes_breaches=leaves_out, per_tenant=False)
        detection = DetectionPass(storage.windows, storage.detector_store, {KEY: config})
        before, _ = evaluated_baseline(detection, DAY0 + timedelta(hours=26, minutes=5), storage)
        breaches = [
            evaluated_baseline(detection, DAY0 + timedelta(hours=26, minutes=m), storage)[1] for m in range(10, 65, 5)
        ]
        assert all(breaches)
        after, breached = evaluated_baseline(detection, DAY0 + timedelta(hours=28, minutes=5), storage)
        assert not breached
        if leaves_out:
            assert after == pytest.approx(before, rel=0.01)
        else:
            assert after > 2 * before  # what leaving the breach in does: the bar rose with the fault
    finally:
        storage.close()
