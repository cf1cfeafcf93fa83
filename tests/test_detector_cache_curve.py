"""cache_curve on hand-built frames: a low cache-hit bucket scoring worse fires, the buckets' edges hold."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pydantic
import pytest
from detector_tables import assert_fits_migrated_table
from request_frames import SCORE_SCHEMA, WINDOW, detector_frames, noisy_scores, spread

from detectors.base import Detection
from detectors.cache_curve import LABELS, Config, detect, inputs

REQUEST_SCHEMA = {
    "trace_id": pl.String,
    "span_id": pl.String,
    "cache_hit_ratio": pl.Float64,
    "e2e_ms": pl.Float64,
    "tpot_ms": pl.Float64,
}
RATIOS = {"high": 0.95, "medium": 0.70, "low": 0.30}


def bucket(name: str, n: int, e2e: list[float] | None = None, ratio: float | None = None) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "trace_id": [f"{name}-{i}" for i in range(n)],
            "span_id": ["s"] * n,
            "cache_hit_ratio": [RATIOS[name] if ratio is None else ratio] * n,
            "e2e_ms": spread(800, 1200, n) if e2e is None else e2e,
            "tpot_ms": spread(15, 25, n),
        },
        schema=REQUEST_SCHEMA,
    )


def run(
    requests: list[pl.DataFrame], scores: list[pl.DataFrame] | None = None, config: Config | None = None
) -> Detection:
    return detect(detector_frames(requests, scores, REQUEST_SCHEMA), config or Config(), WINDOW)


def reference() -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Scores at 0.88 / 0.81 / 0.68 in the high / medium / low buckets, equal latency everywhere."""
    high, medium, low = bucket("high", 980), bucket("medium", 600), bucket("low", 412)
    scores = [
        noisy_scores(high, "json_adherence", 0.88, seed=1),
        noisy_scores(medium, "json_adherence", 0.81, seed=2),
        noisy_scores(low, "json_adherence", 0.68, seed=3),
    ]
    return [high, medium, low], scores


def test_reference_curve_reproduces_the_means_and_fires_for_the_low_bucket_only() -> None:
    out = run(*reference())
    means = {r["bucket"]: r["score_mean"] for r in out.figures.iter_rows(named=True)}
    assert means == {
        "high": pytest.approx(0.88, abs=0.01),
        "medium": pytest.approx(0.81, abs=0.01),
        "low": pytest.approx(0.68, abs=0.01),
    }
    assert out.figures["bucket"].to_list() == ["high", "medium", "low"]
    assert out.figures["n"].to_list() == [980, 600, 412]
    assert out.figures["score_n"].to_list() == [980, 600, 412]

    [condition] = out.conditions
    assert condition.labels == {"bucket": "low", "signal": "json_adherence"}
    assert tuple(condition.labels) == LABELS
    assert condition.value == pytest.approx(means["high"] - means["low"])
    assert condition.threshold == 0.10
    assert condition.severity is None
    assert condition.summary == (
        f"low cache-hit bucket (<0.55): json_adherence mean {means['low']:.2f} vs {means['high']:.2f} in the high "
        f"bucket (−{condition.value:.2f}) over 2026-11-20 12:00–12:05 UTC, n=412 vs 980; KV-cache pressure is "
        "costing quality: give the cache more memory or route shared prefixes together"
    )


def test_a_smaller_score_drop_threshold_also_catches_the_medium_bucket() -> None:
    out = run(*reference(), config=Config(score_drop=0.05))
    assert [c.labels["bucket"] for c in out.conditions] == ["medium", "low"]
    assert out.conditions[0].summary.startswith("medium cache-hit bucket (0.55–0.85): json_adherence mean 0.81")


def test_a_score_drop_of_exactly_the_threshold_fires_and_a_smaller_one_does_not() -> None:
    # 0.90 - 0.80 comes out a hair under 0.10 in floating point; the summary shows 0.10, so it must fire.
    high, low = bucket("high", 100), bucket("low", 100)
    high_scores = noisy_scores(high, "json_adherence", 0.90, noise=0)
    exact = run([high, low], [high_scores, noisy_scores(low, "json_adherence", 0.80, noise=0)])
    [condition] = exact.conditions
    assert condition.labels == {"bucket": "low", "signal": "json_adherence"}
    assert condition.value < 0.10
    assert f"(−{condition.value:.2f})" in condition.summary and "(−0.10)" in condition.summary
    assert run([high, low], [high_scores, noisy_scores(low, "json_adherence", 0.81, noise=0)]).conditions == []


def test_bucket_edges_are_inclusive_for_medium_and_null_ratios_are_left_out() -> None:
    ratios = [0.85, 0.55, 0.8500001, 1.0, 0.5499999, 0.0, None, None]
    requests = pl.DataFrame(
        {
            "trace_id": [f"t{i}" for i in range(len(ratios))],
            "span_id": ["s"] * len(ratios),
            "cache_hit_ratio": ratios,
            "e2e_ms": [1000.0] * len(ratios),
            "tpot_ms": [20.0] * len(ratios),
        },
        schema=REQUEST_SCHEMA,
    )
    out = run([requests])
    assert dict(out.figures.select("bucket", "n").iter_rows()) == {"high": 2, "medium": 2, "low": 2}

    moved = run([requests], config=Config(high_threshold=0.9, low_threshold=0.5))
    assert dict(moved.figures.select("bucket", "n").iter_rows()) == {"high": 1, "medium": 4, "low": 1}
    with pytest.raises(pydantic.ValidationError):
        Config(high_threshold=0.5, low_threshold=0.6)


def test_latency_p99_at_or_above_twice_the_high_bucket_fires_and_just_below_does_not() -> None:
    high = bucket("high", 200, e2e=[1000.0] * 200)
    below = run([high, bucket("low", 100, e2e=[1999.0] * 100)])
    assert below.conditions == []
    [at_factor] = run([high, bucket("low", 100, e2e=[2000.0] * 100)]).conditions
    assert (at_factor.labels, at_factor.value) == ({"bucket": "low", "signal": "latency_p99"}, pytest.approx(2.0))

    above = run([high, bucket("medium", 100, e2e=[900.0] * 50 + [2500.0] * 50)])
    [condition] = above.conditions
    assert condition.labels == {"bucket": "medium", "signal": "latency_p99"}
    assert condition.value == pytest.approx(2.5)
    assert condition.threshold == 2.0
    assert condition.summary == (
        "medium cache-hit bucket (0.55–0.85): e2e p99 2.5 s is 2.5x the high bucket's 1.0 s over "
        "2026-11-20 12:00–12:05 UTC, n=100 vs 200; cache misses are recomputing prefills: give the cache more "
        "memory or route shared prefixes together"
    )
    row = above.figures.filter(pl.col("bucket") == "medium").row(0, named=True)
    assert row["latency_p50"] == pytest.approx(1700.0)
    assert row["latency_p99"] == pytest.approx(2500.0)
    assert row["tpot_p99"] == pytest.approx(24.9, abs=0.01)


def test_a_bucket_or_a_reference_below_min_samples_stays_silent() -> None:
    high = bucket("high", 200)
    high_scores = noisy_scores(high, "json_adherence", 0.9)
    for n, fires in [(29, False), (30, True)]:
        low = bucket("low", n, e2e=[5000.0] * n)
        out = run([high, low], [high_scores, noisy_scores(low, "json_adherence", 0.5)])
        assert bool(out.conditions) is fires, n
        assert {c.labels["signal"] for c in out.conditions} == ({"json_adherence", "latency_p99"} if fires else set())

    thin_high = bucket("high", 29)
    low = bucket("low", 200, e2e=[5000.0] * 200)
    out = run(
        [thin_high, low], [noisy_scores(thin_high, "json_adherence", 0.9), noisy_scores(low, "json_adherence", 0.5)]
    )
    assert out.conditions == []

    # Enough requests but a handful of scores: no mean to judge by.
    low = bucket("low", 200)
    assert run([high, low], [high_scores, noisy_scores(low.head(10), "json_adherence", 0.3)]).conditions == []


def test_a_high_bucket_below_min_samples_requests_stays_silent_however_many_scores_it_has() -> None:
    """Scores of a name can outnumber requests (a request scored twice): the request floor still holds."""
    low = bucket("low", 200)
    low_scores = noisy_scores(low, "json_adherence", 0.5)
    for n, fires in [(29, False), (30, True)]:
        high = bucket("high", n)
        twice = [noisy_scores(high, "json_adherence", 0.9, seed=1), noisy_scores(high, "json_adherence", 0.9, seed=2)]
        out = run([high, low], [*twice, low_scores])
        assert out.figures.filter(pl.col("bucket") == "high").select("n", "score_n").row(0) == (n, 2 * n)
        assert [c.labels for c in out.conditions] == ([{"bucket": "low", "signal": "json_adherence"}] if fires else [])


def test_a_score_drop_of_exactly_score_drop_fires_and_a_larger_threshold_stays_silent() -> None:
    """'At least score_drop below': 0.75 and 0.50 are exact in binary, so the drop is exactly 0.25."""
    high, low = bucket("high", 100), bucket("low", 100)
    scores = [
        noisy_scores(high, "json_adherence", 0.75, noise=0.0),
        noisy_scores(low, "json_adherence", 0.5, noise=0.0),
    ]
    assert run([high, low], scores, config=Config(score_drop=0.26)).conditions == []
    [condition] = run([high, low], scores, config=Config(score_drop=0.25)).conditions
    assert (condition.labels, condition.value) == ({"bucket": "low", "signal": "json_adherence"}, 0.25)


def test_figures_are_long_with_one_bare_row_for_an_unscored_bucket() -> None:
    high, medium, low = bucket("high", 100), bucket("medium", 80), bucket("low", 60)
    scores = [
        noisy_scores(high, "json_adherence", 0.9),
        noisy_scores(high, "helpfulness", 0.7),
        noisy_scores(medium, "json_adherence", 0.9),
        noisy_scores(medium.head(40), "helpfulness", 0.7),
    ]
    out = run([high, medium, low], scores)
    assert out.conditions == []
    assert out.figures.select("bucket", "score_name", "score_n").rows() == [
        ("high", "helpfulness", 100),
        ("high", "json_adherence", 100),
        ("medium", "helpfulness", 40),
        ("medium", "json_adherence", 80),
        ("low", None, None),
    ]
    assert out.figures.filter(pl.col("bucket") == "medium")["latency_p99"].n_unique() == 1
    assert out.figures.filter(pl.col("bucket") == "low")["score_mean"].to_list() == [None]


def test_empty_frames_give_no_conditions_and_typed_empty_figures() -> None:
    out = run([])
    assert out.conditions == []
    assert out.figures.height == 0
    assert out.figures.schema["window_start"] == pl.Datetime("us")
    assert out.figures.schema["n"] == pl.Int64

    # Only high-bucket requests: nothing to compare, nothing to fire.
    assert run([bucket("high", 100)]).conditions == []


def test_figures_match_the_migrated_table_and_inputs_match_the_hand_built_frames(tmp_path: Path) -> None:
    assert_fits_migrated_table(
        tmp_path,
        "cache_curve",
        run(*reference()).figures,
        rows=3,
        inputs=inputs,
        detect=detect,
        config=Config(),
        window=WINDOW,
        schemas={"requests": REQUEST_SCHEMA, "scores": SCORE_SCHEMA},
    )
