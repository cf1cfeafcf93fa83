"""Clusters kept on evidence, symptom by symptom: the causes a lumped "bad" flag and a fixed risk-ratio bar
missed are found, and clean traffic stays quiet.

Windows are built by hand as a fleet's would look: four replicas, three tenants, a pass/fail
json_adherence score that fails now and then everywhere, continuous latencies.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

import polars as pl
import pytest

from detectors.base import Window
from detectors.clusters import Config, detect
from detectors.evidence import Evidence, holm, p_written, written

START = datetime(2026, 11, 20, 12, 0)
FIVE_MINUTES = Window(START, START + timedelta(minutes=5))
FIFTEEN_MINUTES = Window(START, START + timedelta(minutes=15))
NO_ALERTS = pl.DataFrame(schema={"alert_id": pl.String, "detector": pl.String, "labels": pl.String})

# (row, rng) -> the probability that the row's json_adherence fails, and the row, perhaps slower.
Traffic = Callable[[dict[str, Any], random.Random], tuple[float, dict[str, Any]]]


def healthy(row: dict[str, Any], rng: random.Random) -> tuple[float, dict[str, Any]]:
    return 0.08, row


def fleet(n: int, seed: int, traffic: Traffic = healthy, scored: float = 1.0) -> dict[str, pl.DataFrame]:
    rng = random.Random(seed)
    rows, scores = [], []
    for i in range(n):
        row = {
            "trace_id": f"{seed:08x}{i:024x}", "span_id": f"{i:016x}", "status_code": "OK",
            "tenant_id": rng.choice(["acme", "globex", "initech"]), "replica_id": f"r{i % 4}",
            "deployment": "vllm", "model": "llama", "input_tokens": rng.randint(100, 6000),
            "tpot_ms": rng.gauss(12, 1), "e2e_ms": rng.lognormvariate(7.6, 0.25), "ttft_ms": rng.gauss(180, 30),
            "cache_hit_ratio": rng.uniform(0.5, 0.99), "queue_depth": rng.randint(0, 20), "replica_count": 4,
            "quantization": "fp16", "finish_reason": "stop", "prefill_tokens_in_batch": rng.randint(200, 6000),
            "traffic_pattern": None, "kv_cache_usage": rng.uniform(0.3, 0.99), "preemptions": rng.randint(0, 1),
        }  # fmt: skip
        fail, row = traffic(row, rng)
        rows.append(row)
        if rng.random() < scored:
            passed = 0.0 if rng.random() < fail else 1.0
            scores.append({"trace_id": row["trace_id"], "span_id": row["span_id"], "name": "json_adherence",
                           "score": passed})  # fmt: skip
    return {
        "requests": pl.DataFrame(rows).with_columns(pl.col("traffic_pattern").cast(pl.String)),
        "scores": pl.DataFrame(
            scores, schema={"trace_id": pl.String, "span_id": pl.String, "name": pl.String, "score": pl.Float64}
        ),
        "alerts": NO_ALERTS,
    }


def worse_replica(row: dict[str, Any], rng: random.Random) -> tuple[float, dict[str, Any]]:
    """r3 fails json_adherence 13% of the time against the fleet's 8%: a few points, a risk ratio of 1.6."""
    return (0.13 if row["replica_id"] == "r3" else 0.08), row


def slow(tenant: str, share: float) -> Traffic:
    """`share` of the tenant's requests wait an extra second: its share of the latency tail grows."""

    def traffic(row: dict[str, Any], rng: random.Random) -> tuple[float, dict[str, Any]]:
        if row["tenant_id"] == tenant and rng.random() < share:
            return 0.08, {**row, "e2e_ms": row["e2e_ms"] + 1000}
        return 0.08, row

    return traffic


# One request of globex's in twelve a second slower: a risk ratio of about 1.7 on the latency tail.
slow_globex = slow("globex", 0.08)


def both(row: dict[str, Any], rng: random.Random) -> tuple[float, dict[str, Any]]:
    """r3 worse on json_adherence, and one request of globex's in eight a second slower."""
    fail, row = worse_replica(row, rng)
    return fail, slow("globex", 0.12)(row, rng)[1]


def clusters(frames: dict[str, pl.DataFrame], window: Window = FIVE_MINUTES) -> list[tuple[dict[str, str], str]]:
    figures = detect(frames, Config(), window).figures
    return [(json.loads(s), sym) for s, sym in figures.select("signature", "symptom").iter_rows()]


def test_a_replica_a_few_points_worse_on_a_pass_fail_score_that_fails_everywhere_is_found() -> None:
    found = clusters(fleet(10_000, seed=3, traffic=worse_replica))
    assert found[0] == ({"replica_id": "r3"}, "score:json_adherence")


def test_a_replica_a_few_points_worse_is_found_when_only_half_the_requests_are_scored() -> None:
    frames = fleet(16_000, seed=4, traffic=worse_replica, scored=0.5)
    found = clusters(frames)
    assert found[0] == ({"replica_id": "r3"}, "score:json_adherence")
    # Measured on r3's scored requests only: an unscored request is no evidence either way.
    scored_on_r3 = (
        frames["requests"].join(frames["scores"], on=["trace_id", "span_id"]).filter(pl.col("replica_id") == "r3")
    )
    assert detect(frames, Config(), FIVE_MINUTES).figures["size"][0] == scored_on_r3.height < 4000 * 0.6


def test_a_weak_but_real_latency_effect_over_a_fifteen_minute_window_is_found() -> None:
    frames = fleet(30_000, seed=5, traffic=slow_globex)
    found = clusters(frames, FIFTEEN_MINUTES)
    assert ({"tenant_id": "globex"}, "latency_tail") in found
    figures = detect(frames, Config(), FIFTEEN_MINUTES).figures.filter(pl.col("symptom") == "latency_tail")
    assert figures["risk_ratio"][0] < 2.0  # weak: under the old fixed bar


def test_two_causes_on_different_symptoms_are_two_clusters_each_on_its_symptom() -> None:
    found = clusters(fleet(30_000, seed=6, traffic=both), FIFTEEN_MINUTES)
    assert ({"replica_id": "r3"}, "score:json_adherence") in found[:2]
    assert ({"tenant_id": "globex"}, "latency_tail") in found[:2]


def test_a_score_floor_can_be_set_per_score_name() -> None:
    frames = fleet(4000, seed=7)
    # json_adherence is pass/fail: with its floor at 0 nothing is below it, so the symptom has no bad requests.
    out = detect(frames, Config(score_floors={"json_adherence": 0.0}), FIVE_MINUTES)
    assert "score:json_adherence" not in out.figures["symptom"].to_list()
    with pytest.raises(ValueError, match=r"'json_adherence' is 1\.5; a floor is between 0 and 1"):
        Config(score_floors={"json_adherence": 1.5})


def upper_tail(population: int, bad: int, size: int, k: int) -> float:
    """P(X >= k) for X hypergeometric: `size` drawn from `population` holding `bad`, summed exactly."""
    ways = sum(math.comb(bad, x) * math.comb(population - bad, size - x) for x in range(k, min(bad, size) + 1))
    return float(Fraction(ways, math.comb(population, size)))


@pytest.mark.parametrize(
    ("population", "bad", "size", "k"),
    [
        (1000, 100, 100, 11),  # one past the mean of 10: the tail is 3.3x the point's chance
        (1000, 100, 100, 15),
        (1000, 100, 100, 40),  # far tail, 7e-18
        (20000, 400, 2000, 41),  # one past the mean of 40: 7x the point
        (20000, 400, 2000, 60),
        (50, 10, 25, 6),
        (4000, 30, 200, 30),  # every bad request in the group: the tail is that one term
    ],
)
def test_the_p_value_is_the_chance_of_at_least_the_groups_bad_requests_in_a_random_group_of_its_size(
    population: int, bad: int, size: int, k: int
) -> None:
    evidence = Evidence(size=size, bad=k, outside=population - size, bad_outside=bad - k)
    assert evidence.p_value == pytest.approx(upper_tail(population, bad, size, k), rel=1e-9, abs=0)


CLEAN_SEEDS = range(1000, 1200)


def firing_on(
    detector: str, labels: dict[str, str], started_at: datetime = START, alert_id: str = "a1"
) -> pl.DataFrame:
    """One firing alert as the pass reads it."""
    return pl.DataFrame(
        {"alert_id": ["a1"], "detector": [detector], "labels": [json.dumps(labels)], "started_at": [started_at]}
    )


def decoy(seed: int) -> pl.DataFrame:
    """A firing alert on a group chosen at random, as a detector's false alarm would name one: a replica or a
    tenant, on json_adherence or latency."""
    rng = random.Random(seed)
    if rng.random() < 0.5:
        detector, labels = "replica_skew", {"replica_id": f"r{rng.randrange(4)}"}
    else:
        detector, labels = "tenant_fairness", {"tenant_id": rng.choice(["acme", "globex", "initech"])}
    return firing_on(detector, {**labels, "signal": rng.choice(["json_adherence", "latency_p99"])})


def test_clean_traffic_reports_a_cluster_in_at_most_one_window_in_a_hundred_and_confirms_decoy_alerts_as_rarely() -> (
    None
):
    """200 clean windows of 4,000 requests, each with a firing alert on a random group (docs/detectors.md reports
    both rates with the planted ones'). The search reports a cluster of its own in at most 1 % of them. The alert's
    group is held to its own bar, 0.01 for the one hypothesis: at that level 2 of 200 are expected to pass, and 6
    or fewer do with 99.5 % probability (these seeds: 5, each a p between 0.004 and 0.009, as chance gives them;
    bench/clusters_evidence.py measures the rate over more windows)."""
    noisy, confirmed = [], []
    for seed in CLEAN_SEEDS:
        out = detect({**fleet(4000, seed), "alerts": decoy(seed)}, Config(), FIVE_MINUTES)
        if "clusters" in out.figures["detector"].to_list():
            noisy.append(seed)
        if out.explanations["a1"].startswith("explained by cluster"):
            confirmed.append(seed)
    assert len(noisy) <= len(CLEAN_SEEDS) // 100, noisy
    assert len(confirmed) <= 3 * len(CLEAN_SEEDS) // 100, confirmed


def test_a_replica_too_weak_for_the_window_search_is_the_cluster_of_the_alert_that_names_it() -> None:
    """r3 fails 11.7 % of the time against 8.5 %: p = 0.0019, far above the search's bar over hundreds of
    candidates, so the window alone reports nothing. replica_skew's alert on r3 is one hypothesis chosen
    before the search looked: held to 0.01 / 1, it passes, and its cluster leads with the plain fact."""
    frames = fleet(4000, seed=5, traffic=worse_replica)
    assert clusters(frames) == []
    frames["alerts"] = firing_on("replica_skew", {"replica_id": "r3", "signal": "json_adherence"})
    out = detect(frames, Config(), FIVE_MINUTES)
    [top] = out.figures.rows(named=True)
    assert (json.loads(top["signature"]), top["symptom"], top["detector"]) == (
        {"replica_id": "r3"},
        "score:json_adherence",
        "replica_skew",
    )
    assert (top["size"], top["candidates"]) == (1000, 1)
    assert top["summary"] == (
        "replica r3 fails json_adherence 12 % of the time against 8.5 % on the rest since 12:00 UTC: 117 of its "
        "1,000 requests, 1.4x as likely (p = 0.0019, bar 0.01: Holm over the pass's 1 alert hypothesis); 32 of the "
        "372 bad beyond chance"
    )
    assert out.explanations == {
        "a1": f"explained by cluster {top['cluster_id']} on score:json_adherence: {top['summary']}"
    }


def test_holm_holds_the_smallest_chance_to_the_level_over_all_and_stops_at_the_first_that_fails() -> None:
    # 0.003 against 0.01/3 passes, 0.0051 against 0.01/2 fails, and 0.006 fails with it though under 0.01/1:
    # each is shown the bar it is above.
    assert holm({"a": 0.003, "b": 0.0051, "c": 0.006}, 0.01) == pytest.approx({"a": 0.01 / 3, "b": 0.005, "c": 0.005})
    # All pass: each against the level over the hypotheses left.
    assert holm({"a": 0.009, "b": 0.001, "c": 0.004}, 0.01) == pytest.approx({"b": 0.01 / 3, "c": 0.005, "a": 0.01})
    assert holm({}, 0.01) == {}


@pytest.mark.parametrize(
    ("chance", "text"),
    [
        (0.0, "p < 1e-300"),
        (1e-305, "p < 1e-300"),
        (1e-300, "p = 1e-300"),
        (4.2e-39, "p = 4.2e-39"),
        (0.019, "p = 0.019"),
    ],
)
def test_a_p_value_too_small_for_a_double_is_written_as_a_bound(chance: float, text: str) -> None:
    assert p_written(chance) == text
    assert written(chance) == text.removeprefix("p = ").removeprefix("p ")
