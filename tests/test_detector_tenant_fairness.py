"""tenant_fairness on hand-built frames: a small tenant behind a big one's burst fires, fair windows stay silent."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from detector_tables import assert_fits_migrated_table
from request_frames import SCORE_SCHEMA, WINDOW, detector_frames, scores_of, spread

from detectors.base import Detection
from detectors.tenant_fairness import LABELS, Config, detect, inputs

REQUEST_SCHEMA = {
    "trace_id": pl.String,
    "span_id": pl.String,
    "tenant_id": pl.String,
    "e2e_ms": pl.Float64,
    "ttft_ms": pl.Float64,
}


def tenant(name: str | None, e2e: list[float], ttft: list[float] | None = None) -> pl.DataFrame:
    n = len(e2e)
    prefix = name or "untagged"
    return pl.DataFrame(
        {
            "trace_id": [f"{prefix}-{i}" for i in range(n)],
            "span_id": [f"s{i}" for i in range(n)],
            "tenant_id": [name] * n,
            "e2e_ms": e2e,
            "ttft_ms": ttft if ttft is not None else [e / 10 for e in e2e],
        },
        schema=REQUEST_SCHEMA,
    )


def run(*tenants: pl.DataFrame, scores: list[pl.DataFrame] | None = None) -> Detection:
    return detect(detector_frames(tenants, scores, REQUEST_SCHEMA), Config(), WINDOW)


def burst() -> tuple[pl.DataFrame, pl.DataFrame]:
    """500 rpm for bigco and 5 rpm for smallco over five minutes; smallco waits behind the burst."""
    big = tenant("bigco", spread(800, 1200, 2500), spread(100, 200, 2500))
    small = tenant("smallco", spread(2500, 3500, 25), spread(1800, 2600, 25))
    return big, small


def test_a_small_tenant_behind_a_burst_fires_while_the_aggregate_looks_fine() -> None:
    out = run(*burst())
    assert [c.labels for c in out.conditions] == [{"tenant_id": "smallco", "signal": "latency_p99"}]
    condition = out.conditions[0]
    assert tuple(condition.labels) == LABELS
    assert condition.value == pytest.approx(3490 / 1199.97, rel=1e-3)
    assert condition.threshold == 1.5
    assert condition.summary == (
        "tenant smallco: p99 latency 3.5 s is 2.9x the aggregate 1.2 s over 2026-11-20 12:00–12:05 UTC "
        "(n=25 of 2525 requests); its TTFT p99 2.6 s is 13.0x the aggregate 200 ms, "
        "so it is queued behind other tenants' load: isolate it or give it a priority lane"
    )

    rows = {r["tenant_id"]: r for r in out.figures.iter_rows(named=True)}
    assert rows["smallco"]["n"] == 25 and rows["bigco"]["n"] == 2500
    aggregate = rows["bigco"]["aggregate_p99"]
    assert aggregate < 1500
    assert aggregate == pytest.approx(rows["bigco"]["latency_p99"], rel=0.01)
    assert rows["smallco"]["aggregate_p99"] == aggregate
    assert rows["smallco"]["score_name"] is None and rows["smallco"]["score_p_low"] is None

    speeds = [aggregate / rows[t]["latency_p99"] for t in ("bigco", "smallco")]
    expected = sum(speeds) ** 2 / (2 * sum(x * x for x in speeds))
    assert rows["bigco"]["jain_index"] == rows["smallco"]["jain_index"] == pytest.approx(expected)
    assert 0.5 < expected < 0.85


def test_a_p99_of_exactly_the_factor_fires_and_a_ttft_of_exactly_the_factor_is_queueing() -> None:
    # The big tenant's flat 1000 ms (TTFT 100 ms) is the aggregate p99 too: the small tenant's 25 sit above p99.
    big = tenant("bigco", [1000.0] * 2500, [100.0] * 2500)
    [condition] = run(big, tenant("smallco", [1500.0] * 25, [150.0] * 25)).conditions
    assert condition.labels == {"tenant_id": "smallco", "signal": "latency_p99"}
    assert condition.value == 1.5
    assert condition.summary.endswith(
        "its TTFT p99 150 ms is 1.5x the aggregate 100 ms, so it is queued behind other tenants' load: "
        "isolate it or give it a priority lane"
    )
    assert run(big, tenant("smallco", [1499.0] * 25, [149.0] * 25)).conditions == []


def test_a_slow_tenant_with_a_normal_ttft_is_blamed_on_decoding_not_queueing() -> None:
    big, _ = burst()
    small = tenant("smallco", spread(2500, 3500, 25), spread(150, 190, 25))
    [condition] = run(big, small).conditions
    assert condition.summary.endswith(
        "(n=25 of 2525 requests); its TTFT p99 190 ms is in line with the aggregate 199 ms, "
        "so the time goes to decoding, not waiting: check whether its requests ask for longer outputs"
    )


def test_similar_tenants_are_fair_and_silent_an_unfair_window_has_a_lower_jain_index() -> None:
    steady = [
        tenant("a", spread(900, 1100, 200)),
        tenant("b", spread(880, 1120, 150)),
        tenant("c", spread(920, 1080, 300)),
        tenant("d", spread(850, 1150, 100)),
    ]
    fair = run(*steady)
    assert fair.conditions == []
    assert fair.figures["jain_index"].n_unique() == 1
    fair_index = fair.figures["jain_index"][0]
    assert 0.95 < fair_index <= 1.0

    unfair = run(*steady[:3], tenant("d", spread(2500, 3500, 100)))
    unfair_index = unfair.figures["jain_index"][0]
    assert unfair.figures["jain_index"].n_unique() == 1
    assert unfair_index < fair_index - 0.05


def test_a_tenant_below_min_samples_never_fires_and_is_left_out_of_jain() -> None:
    big, _ = burst()
    thin = run(big, tenant("smallco", spread(2500, 3500, 19)))
    assert thin.conditions == []
    # One qualifying tenant leaves nothing to compare: no index rather than a perfect 1.0.
    assert thin.figures["jain_index"].null_count() == thin.figures.height
    enough = run(big, tenant("smallco", spread(2500, 3500, 20)))
    assert [c.labels["tenant_id"] for c in enough.conditions] == ["smallco"]
    # Exactly min_samples requests also earn a place in the index.
    assert enough.figures["jain_index"].null_count() == 0


def test_jain_index_is_taken_over_each_tenants_speed_not_its_latency() -> None:
    """Speeds 1, 1 and 1/4 (a tenant four times slower): J = (2.25)^2 / (3 x 2.0625) = 9/11."""
    out = run(
        tenant("a", spread(900, 1100, 100)), tenant("b", spread(900, 1100, 100)), tenant("c", spread(3600, 4400, 100))
    )
    assert out.figures["latency_p99"].to_list() == pytest.approx([1098.0, 1098.0, 4392.0])
    assert out.figures["jain_index"].to_list() == pytest.approx([9 / 11] * 3)


def test_sub_millisecond_tenants_have_a_place_in_jain_and_only_a_zero_p99_is_left_out() -> None:
    """Cached or rejected-early traffic can answer in under a millisecond: still a finite speed."""
    out = run(
        tenant("a", spread(0.2, 0.4, 50)),
        tenant("b", spread(0.5, 0.9, 50)),
        tenant("zero", [0.0] * 50),
    )
    rows = {r["tenant_id"]: r for r in out.figures.iter_rows(named=True)}
    assert rows["zero"]["latency_p99"] == 0.0
    assert 0 < rows["a"]["latency_p99"] < rows["b"]["latency_p99"] < 1
    aggregate = rows["a"]["aggregate_p99"]
    speeds = [aggregate / rows[t]["latency_p99"] for t in ("a", "b")]
    expected = sum(speeds) ** 2 / (2 * sum(x * x for x in speeds))
    assert out.figures["jain_index"].to_list() == pytest.approx([expected] * 3)
    assert expected < 0.99


def test_untagged_requests_are_their_own_group_and_alert_without_a_tenant_label() -> None:
    big, _ = burst()
    out = run(big, tenant(None, spread(2500, 3500, 25)))
    assert out.figures.filter(pl.col("tenant_id").is_null())["n"].to_list() == [25]
    [condition] = out.conditions
    assert condition.labels == {"signal": "latency_p99"}
    assert condition.summary.startswith("requests without a tenant_id: p99 latency")


def score_window(shift: float) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """Tenants of equal latency; small tenant a's json_adherence sits `shift` below the big tenants'."""
    a = tenant("a", spread(900, 1100, 40))
    b, c = (tenant(t, spread(900, 1100, 500)) for t in "bc")
    quiet = tenant("quiet", spread(900, 1100, 30))
    scores = [
        scores_of(a, "json_adherence", [v - shift for v in spread(0.80, 1.00, 40)]),
        scores_of(b, "json_adherence", spread(0.80, 1.00, 500)),
        scores_of(c, "json_adherence", spread(0.80, 1.00, 500)),
        *(scores_of(t, "helpfulness", spread(0.6, 0.9, t.height)) for t in (a, b, c)),
    ]
    return pl.concat([a, b, c, quiet]), scores


def test_a_score_low_tail_well_below_the_aggregate_fires_with_the_score_label() -> None:
    requests, scores = score_window(0.1)
    out = run(requests, scores=scores)
    row = out.figures.filter((pl.col("tenant_id") == "a") & (pl.col("score_name") == "json_adherence")).row(
        0, named=True
    )
    drop = row["aggregate_score_p_low"] - row["score_p_low"]
    assert drop == pytest.approx(0.1, abs=0.015)
    [condition] = out.conditions
    assert condition.labels == {"tenant_id": "a", "signal": "json_adherence"}
    assert condition.value == pytest.approx(drop)
    assert condition.threshold == 0.05
    assert condition.summary == (
        "tenant a: json_adherence p10 0.72 is 0.10 below the aggregate p10 0.82 over 2026-11-20 12:00–12:05 UTC "
        "(n=40 scores); its worst answers are worse than other tenants': compare its prompts and the "
        "model/deployment it is routed to with theirs"
    )

    # Long format: a row per (tenant, score) with the latency figures repeated, one bare row when unscored.
    assert out.figures.height == 3 * 2 + 1
    assert out.figures.filter(pl.col("tenant_id") == "a")["latency_p99"].n_unique() == 1
    quiet = out.figures.filter(pl.col("tenant_id") == "quiet")
    assert quiet.height == 1 and quiet["score_name"].to_list() == [None]
    assert quiet["aggregate_score_p_low"].to_list() == [None]


def test_a_small_score_gap_or_a_handful_of_scores_stays_silent() -> None:
    requests, scores = score_window(0.02)
    out = run(requests, scores=scores)
    row = out.figures.filter((pl.col("tenant_id") == "a") & (pl.col("score_name") == "json_adherence")).row(
        0, named=True
    )
    assert 0.01 < row["aggregate_score_p_low"] - row["score_p_low"] < 0.05
    assert out.conditions == []

    # Five bad scores among a tenant's 30 requests are no p10 to judge it by.
    requests, scores = score_window(0.0)
    few = scores_of(requests.filter(pl.col("tenant_id") == "quiet"), "json_adherence", [0.1] * 5)
    assert run(requests, scores=[*scores, few]).conditions == []


def test_a_score_drop_of_exactly_the_threshold_fires_and_a_smaller_one_does_not() -> None:
    # 0.85 - 0.80 comes out a hair under 0.05 in floating point; the summary shows 0.05, so it must fire.
    a, b = tenant("a", spread(900, 1100, 40)), tenant("b", spread(900, 1100, 500))
    for low, fires in ((0.80, True), (0.81, False)):
        scores = [scores_of(a, "json_adherence", [low] * 40), scores_of(b, "json_adherence", [0.85] * 500)]
        out = run(a, b, scores=scores)
        assert [c.labels for c in out.conditions] == ([{"tenant_id": "a", "signal": "json_adherence"}] if fires else [])
        if fires:
            assert out.conditions[0].value < 0.05
            assert " is 0.05 below the aggregate p10 0.85 " in out.conditions[0].summary


def test_a_score_drop_counts_from_exactly_min_samples_scores() -> None:
    a, b = tenant("a", spread(900, 1100, 40)), tenant("b", spread(900, 1100, 500))
    for count, fires in ((19, False), (20, True)):
        scores = [scores_of(a, "json_adherence", [0.5] * count), scores_of(b, "json_adherence", spread(0.8, 1.0, 500))]
        labels = [c.labels for c in run(a, b, scores=scores).conditions]
        assert labels == ([{"tenant_id": "a", "signal": "json_adherence"}] if fires else []), count


def test_score_figures_are_doubles_even_when_the_scores_frame_is_untyped() -> None:
    untyped = pl.DataFrame({"trace_id": [], "span_id": [], "name": [], "score": []})
    out = detect({"requests": tenant("a", spread(900, 1100, 40)), "scores": untyped}, Config(), WINDOW)
    assert out.figures.schema["score_p_low"] == pl.Float64
    assert out.figures.schema["aggregate_score_p_low"] == pl.Float64


def test_empty_frames_give_no_conditions_and_typed_empty_figures() -> None:
    out = run()
    assert out.conditions == []
    assert out.figures.height == 0
    assert out.figures.schema["window_start"] == pl.Datetime("us")
    assert out.figures.schema["n"] == pl.Int64


def test_figures_match_the_migrated_table_and_inputs_match_the_hand_built_frames(tmp_path: Path) -> None:
    assert_fits_migrated_table(
        tmp_path,
        "tenant_fairness",
        run(*burst()).figures,
        rows=2,
        inputs=inputs,
        detect=detect,
        config=Config(),
        window=WINDOW,
        schemas={"requests": REQUEST_SCHEMA, "scores": SCORE_SCHEMA},
    )
