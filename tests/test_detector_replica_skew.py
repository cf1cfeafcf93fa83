"""replica_skew on hand-built frames: a replica drifting from the fleet fires naming it; a level fleet stays silent."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from detector_tables import assert_fits_migrated_table
from request_frames import SCORE_SCHEMA, WINDOW, detector_frames, even_scores, spread

from detectors.base import Detection
from detectors.replica_skew import LABELS, Config, detect, inputs

REQUEST_SCHEMA = {
    "trace_id": pl.String,
    "span_id": pl.String,
    "status_code": pl.String,
    "replica_id": pl.String,
    "e2e_ms": pl.Float64,
    "tpot_ms": pl.Float64,
}
FLEET = [f"r{i}" for i in range(8)]


def replica(
    name: str | None, n: int, e2e: list[float] | None = None, tpot: list[float] | None = None, errors: int = 0
) -> pl.DataFrame:
    prefix = name or "untagged"
    return pl.DataFrame(
        {
            "trace_id": [f"{prefix}-{i}" for i in range(n)],
            "span_id": ["s"] * n,
            "status_code": ["ERROR"] * errors + ["OK"] * (n - errors),
            "replica_id": [name] * n,
            "e2e_ms": spread(800, 1200, n) if e2e is None else e2e,
            "tpot_ms": spread(15, 25, n) if tpot is None else tpot,
        },
        schema=REQUEST_SCHEMA,
    )


def run(
    requests: list[pl.DataFrame], scores: list[pl.DataFrame] | None = None, config: Config | None = None
) -> Detection:
    return detect(detector_frames(requests, scores, REQUEST_SCHEMA), config or Config(), WINDOW)


def fleet(drifted: dict[str, float] | None = None, n: int = 300) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """Eight replicas scoring 0.88 on json_adherence and 0.75 on helpfulness, except `drifted` json_adherence means."""
    replicas = [replica(r, n) for r in FLEET]
    scores = [
        even_scores(frame, "json_adherence", (drifted or {}).get(r, 0.88))
        for r, frame in zip(FLEET, replicas, strict=True)
    ]
    scores += [even_scores(frame, "helpfulness", 0.75) for frame in replicas]
    return replicas, scores


def row(out: Detection, replica_id: str, score_name: str | None = None) -> dict[str, object]:
    frame = out.figures.filter(pl.col("replica_id") == replica_id)
    if score_name is not None:
        frame = frame.filter(pl.col("score_name") == score_name)
    assert frame.height >= 1
    return frame.row(0, named=True)


def test_a_replica_six_points_down_on_json_adherence_fires_naming_it_and_no_other() -> None:
    out = run(*fleet({"r7": 0.82}))
    [condition] = out.conditions
    assert condition.labels == {"replica_id": "r7", "signal": "json_adherence"}
    assert tuple(condition.labels) == LABELS
    assert condition.value == pytest.approx(0.06)
    assert condition.threshold == 0.05
    assert condition.severity is None
    assert condition.summary == (
        "replica r7: json_adherence mean 0.82 vs 0.88 on the rest of the fleet (−0.06) over "
        "2026-11-20 12:00–12:05 UTC, n=300 vs 2,100; structured output drifts first: drain and reload the replica"
    )

    drifted = row(out, "r7", "json_adherence")
    assert drifted["score_mean"] == pytest.approx(0.82)
    assert drifted["fleet_score_mean"] == pytest.approx(0.88)
    assert drifted["score_n"] == 300
    # Every other replica's rest of the fleet holds r7, so it sits a little below 0.88 and they look better.
    peer = row(out, "r0", "json_adherence")
    assert peer["fleet_score_mean"] == pytest.approx((6 * 0.88 + 0.82) / 7)


def test_a_replica_with_twice_the_fleets_p99_fires_on_latency_and_says_where_the_time_went() -> None:
    replicas = [replica(r, 300, e2e=[1000.0] * 300) for r in FLEET[:7]]
    slow_decode = replica("r7", 300, e2e=[2000.0] * 300, tpot=spread(30, 50, 300))
    out = run([*replicas, slow_decode])
    [condition] = out.conditions
    assert condition.labels == {"replica_id": "r7", "signal": "latency_p99"}
    assert condition.value == pytest.approx(2.0)
    assert condition.threshold == 1.5
    assert condition.summary == (
        "replica r7: e2e p99 2.0 s is 2.0x the rest of the fleet's 1.0 s over 2026-11-20 12:00–12:05 UTC, "
        "n=300 vs 2,100; its TPOT p99 50 ms is 2.0x the fleet's 25 ms, so it decodes slower on the same traffic: "
        "check its GPU (clocks, thermals, memory errors) and drain it"
    )
    figures = row(out, "r7")
    assert figures["latency_p99"] == pytest.approx(2000.0)
    assert figures["fleet_latency_p99"] == pytest.approx(1000.0)
    assert figures["tpot_p99"] == pytest.approx(49.8, abs=0.01)
    assert figures["fleet_n"] == 2100

    queued = run([*replicas, replica("r7", 300, e2e=[2000.0] * 300)])
    [condition] = queued.conditions
    assert condition.summary.endswith(
        "its TPOT p99 25 ms is in line with the fleet's 25 ms, so the time goes before decoding: "
        "check that the load balancer is not sending it more than its share"
    )


def test_latency_at_exactly_the_factor_fires_and_just_below_does_not() -> None:
    replicas = [replica(r, 300, e2e=[1000.0] * 300) for r in FLEET[:7]]
    at = run([*replicas, replica("r7", 300, e2e=[1500.0] * 300)])
    assert [c.labels for c in at.conditions] == [{"replica_id": "r7", "signal": "latency_p99"}]
    assert run([*replicas, replica("r7", 300, e2e=[1490.0] * 300)]).conditions == []


def test_a_score_drop_of_exactly_the_threshold_fires_and_a_smaller_one_does_not() -> None:
    # 0.88 - 0.78 comes out below 0.10 in floating point; the summary shows 0.10, so it must fire.
    for drifted, score_drop in [(0.83, 0.05), (0.78, 0.10)]:
        exact = run(*fleet({"r2": drifted}), config=Config(score_drop=score_drop))
        assert [c.labels for c in exact.conditions] == [{"replica_id": "r2", "signal": "json_adherence"}], score_drop
        assert run(*fleet({"r2": drifted + 0.01}), config=Config(score_drop=score_drop)).conditions == []


def test_a_level_fleet_fires_nothing_even_with_a_replica_better_than_the_rest() -> None:
    # r4 scores 0.07 above the fleet and r7 is twice as fast: only the worse side of a gap alerts.
    means = [0.86, 0.87, 0.88, 0.89, 0.95, 0.87, 0.88, 0.89]
    replicas = [replica(r, 250 + 10 * i, e2e=spread(800, 1000 + 40 * i, 250 + 10 * i)) for i, r in enumerate(FLEET)]
    replicas[7] = replica("r7", 320, e2e=spread(300, 600, 320))
    scores = [even_scores(frame, "json_adherence", m) for frame, m in zip(replicas, means, strict=True)]
    scores += [even_scores(frame, "helpfulness", 0.75) for frame in replicas]
    out = run(replicas, scores)
    assert out.conditions == []
    # Long: a row per (replica, score), the replica's request figures repeated on each.
    assert out.figures.height == 2 * len(FLEET)
    assert out.figures.filter(pl.col("replica_id") == "r3")["latency_p99"].n_unique() == 1
    assert out.figures["replica_id"].to_list() == [r for r in FLEET for _ in range(2)]
    assert out.figures["score_name"].to_list() == ["helpfulness", "json_adherence"] * len(FLEET)


def test_structured_scores_come_first_and_other_scores_get_their_own_advice() -> None:
    replicas = [replica(r, 300, e2e=[1000.0] * 300) for r in FLEET[:7]]
    bad = replica("r7", 300, e2e=[3000.0] * 300)
    scores = [even_scores(frame, name, 0.88) for frame in replicas for name in ("helpfulness", "tool_call_correctness")]
    scores += [even_scores(bad, "helpfulness", 0.70), even_scores(bad, "tool_call_correctness", 0.80)]
    out = run([*replicas, bad], scores)
    assert [c.labels["signal"] for c in out.conditions] == ["tool_call_correctness", "helpfulness", "latency_p99"]
    assert out.conditions[0].summary.endswith("structured output drifts first: drain and reload the replica")
    assert out.conditions[1].summary.endswith(
        "it answers worse than its peers on the same traffic: compare its weights, adapters and engine version with "
        "the rest of the fleet's, then drain and reload it"
    )

    plain = run([*replicas, bad], scores, config=Config(structured_scores=()))
    assert [c.labels["signal"] for c in plain.conditions] == ["helpfulness", "tool_call_correctness", "latency_p99"]
    assert "structured output" not in plain.conditions[1].summary


@pytest.mark.parametrize(
    ("side", "n", "fires"), [("replica", 29, False), ("replica", 30, True), ("fleet", 29, False), ("fleet", 30, True)]
)
def test_min_samples_gates_the_replica_and_the_rest_of_the_fleet(side: str, n: int, fires: bool) -> None:
    # Two replicas: "bad" scores 0.5 at 5 s, "good" 0.9 at 1 s; `side` says which one is thin.
    bad = replica("bad", n if side == "replica" else 200, e2e=[5000.0] * (n if side == "replica" else 200))
    good = replica("good", n if side == "fleet" else 200, e2e=[1000.0] * (n if side == "fleet" else 200))
    out = run([bad, good], [even_scores(bad, "json_adherence", 0.5), even_scores(good, "json_adherence", 0.9)])
    expected = {"json_adherence", "latency_p99"} if fires else set()
    assert {c.labels["signal"] for c in out.conditions} == expected
    assert {c.labels["replica_id"] for c in out.conditions} <= {"bad"}


def test_enough_requests_but_too_few_scores_on_either_side_stays_silent() -> None:
    bad, good = replica("bad", 200), replica("good", 200)
    few_bad = run(
        [bad, good], [even_scores(bad.head(29), "json_adherence", 0.5), even_scores(good, "json_adherence", 0.9)]
    )
    assert few_bad.conditions == []
    few_good = run(
        [bad, good], [even_scores(bad, "json_adherence", 0.5), even_scores(good.head(29), "json_adherence", 0.9)]
    )
    assert few_good.conditions == []
    enough = run(
        [bad, good], [even_scores(bad, "json_adherence", 0.5), even_scores(good.head(30), "json_adherence", 0.9)]
    )
    assert [c.labels for c in enough.conditions] == [{"replica_id": "bad", "signal": "json_adherence"}]

    # Two judges per request: 40 scores, but from 20 requests, too few for a verdict on either side.
    thin_bad, thin_good = replica("bad", 20), replica("good", 20)
    twice_bad = [even_scores(thin_bad, "json_adherence", 0.5)] * 2
    twice_good = [even_scores(thin_good, "json_adherence", 0.9)] * 2
    assert run([thin_bad, good], [*twice_bad, even_scores(good, "json_adherence", 0.9)]).conditions == []
    assert run([bad, thin_good], [even_scores(bad, "json_adherence", 0.5), *twice_good]).conditions == []


def test_untagged_requests_are_their_own_group_and_alert_without_a_replica_label() -> None:
    replicas = [replica(r, 300, e2e=[1000.0] * 300) for r in FLEET[:3]]
    untagged = replica(None, 100, e2e=[4000.0] * 100)
    out = run([*replicas, untagged])
    figures = out.figures.filter(pl.col("replica_id").is_null()).row(0, named=True)
    assert (figures["n"], figures["fleet_n"]) == (100, 900)
    # The untagged requests are part of every named replica's rest of the fleet.
    assert row(out, "r0")["fleet_n"] == 700
    assert out.figures["replica_id"].to_list() == ["r0", "r1", "r2", None]
    [condition] = out.conditions
    assert condition.labels == {"signal": "latency_p99"}
    assert condition.summary.startswith("requests without a replica_id: e2e p99 4.0 s is 4.0x")


def test_error_rates_are_figures_against_the_rest_of_the_fleet_and_fire_nothing() -> None:
    out = run([replica("r0", 200, errors=2), replica("r1", 100, errors=30), replica("r2", 100)])
    assert out.conditions == []
    rates = {r["replica_id"]: (r["error_rate"], r["fleet_error_rate"]) for r in out.figures.iter_rows(named=True)}
    assert rates == {
        "r0": (pytest.approx(0.01), pytest.approx(30 / 200)),
        "r1": (pytest.approx(0.30), pytest.approx(2 / 300)),
        "r2": (pytest.approx(0.0), pytest.approx(32 / 300)),
    }


def test_empty_frames_and_a_lone_replica_give_no_conditions_and_typed_figures() -> None:
    out = run([])
    assert out.conditions == []
    assert out.figures.height == 0
    assert out.figures.schema["window_start"] == pl.Datetime("us")
    assert out.figures.schema["n"] == pl.Int64
    assert out.figures.schema["fleet_n"] == pl.Int64
    # Frames with no rows may come without types; the figures keep theirs.
    untyped = detect(
        {
            "requests": pl.DataFrame({c: [] for c in REQUEST_SCHEMA}),
            "scores": pl.DataFrame({c: [] for c in SCORE_SCHEMA}),
        },
        Config(),
        WINDOW,
    )
    assert untyped.figures.schema == out.figures.schema

    # One replica has no rest of the fleet to be compared with.
    alone = replica("r0", 100)
    lone = run([alone], [even_scores(alone, "json_adherence", 0.5)])
    assert lone.conditions == []
    figures = lone.figures.row(0, named=True)
    assert figures["fleet_n"] == 0
    assert figures["fleet_latency_p99"] is None and figures["fleet_score_mean"] is None


def test_figures_match_the_migrated_table_and_inputs_match_the_hand_built_frames(tmp_path: Path) -> None:
    replicas, scores = fleet({"r7": 0.82})
    assert_fits_migrated_table(
        tmp_path,
        "replica_skew",
        run([*replicas, replica(None, 40)], scores).figures,
        rows=17,
        inputs=inputs,
        detect=detect,
        config=Config(),
        window=WINDOW,
        schemas={"requests": REQUEST_SCHEMA, "scores": SCORE_SCHEMA},
    )
