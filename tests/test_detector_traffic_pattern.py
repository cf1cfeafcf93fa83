"""traffic_pattern on hand-built frames: bursts are labelled from arrivals or queue depth, and a worse burst fires."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from request_frames import WINDOW

from detectors.base import Detection, Window
from detectors.frames import IDS
from detectors.traffic_pattern import LABELS, Config, detect, inputs
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.window_source import DuckDBWindowSource
from storage.ports import Requests, Scores

LOOKBACK = timedelta(seconds=30)
REQUEST_SCHEMA = pl.Schema(
    [
        ("request_key", pl.UInt64()),
        ("start_time", pl.Datetime("us")),
        ("end_time", pl.Datetime("us")),
        ("deployment", pl.String()),
        ("e2e_ms", pl.Float64()),
        ("tpot_ms", pl.Float64()),
        ("queue_depth", pl.Int64()),
        ("replica_count", pl.Int64()),
    ]
)
# Built requests carry a readable trace_id beside the key the query fetches; the detector ignores it.
BUILT_SCHEMA = pl.Schema({**REQUEST_SCHEMA, "trace_id": pl.String()})
SCORE_SCHEMA = pl.Schema(
    {"trace_id": pl.String, "span_id": pl.String, "request_key": pl.UInt64, "name": pl.String, "score": pl.Float64}
)
KEYS = itertools.count()
SPIKE = (100.0, 120.0)  # seconds after the window start


def stream(
    rate: float,
    start: float,
    stop: float,
    *,
    seed: int,
    prefix: str,
    depth: Callable[[float], int | None] = lambda t: None,
    replica_count: int | None = None,
    deployment: str | None = "vllm-a",
    e2e: tuple[float, float] = (500.0, 3000.0),
) -> pl.DataFrame:
    """Poisson arrivals at `rate`/s between `start` and `stop` seconds after the window start."""
    rng = random.Random(seed)
    rows: list[tuple[object, ...]] = []
    t = start
    while (t := t + rng.expovariate(rate)) < stop:
        arrival = WINDOW.start + timedelta(seconds=t)
        ms = rng.uniform(*e2e)
        rows.append(
            (next(KEYS), arrival, arrival + timedelta(milliseconds=ms), deployment, ms, 20.0, depth(t), replica_count,
             f"{prefix}{len(rows)}")
        )  # fmt: skip
    return pl.DataFrame(rows, schema=BUILT_SCHEMA, orient="row")


def fetched(*streams: pl.DataFrame) -> pl.DataFrame:
    """What the requests query returns: whatever ended in [window start - 30 s, window end)."""
    ends = pl.col("end_time")
    return pl.concat(streams).filter((ends >= WINDOW.start - LOOKBACK) & (ends < WINDOW.end))


def scores_for(requests: pl.DataFrame, mean: Callable[[str], float], seed: int = 5) -> pl.DataFrame:
    """json_adherence around mean(trace_id), with a little noise."""
    rng = random.Random(seed)
    ids = requests["trace_id"].to_list()
    return pl.DataFrame(
        {
            "trace_id": ids,
            "span_id": ["s"] * len(ids),
            "request_key": requests["request_key"],
            "name": ["json_adherence"] * len(ids),
            "score": [rng.gauss(mean(i), 0.02) for i in ids],
        },
        schema=SCORE_SCHEMA,
    )


def run(requests: pl.DataFrame, scores: pl.DataFrame | None = None, config: Config | None = None) -> Detection:
    frames = {"requests": requests, "scores": pl.DataFrame(schema=SCORE_SCHEMA) if scores is None else scores}
    return detect(frames, config or Config(), WINDOW)


def labels(out: Detection) -> pl.DataFrame:
    """The stored labels: one row per (deployment, arrival second, replica_count)."""
    return out.extra_tables["traffic_pattern_labels"]


def request_labels(requests: pl.DataFrame, out: Detection) -> pl.DataFrame:
    """Each request that ended in the window with its label, joined as request_traffic_patterns joins them."""
    keys = ["deployment", "arrival_second", "replica_count"]
    ended = requests.filter(pl.col("end_time").is_between(WINDOW.start, WINDOW.end, closed="left"))
    offset = (pl.col("start_time") - pl.lit(WINDOW.start)).dt.total_microseconds() / 1e6
    return ended.select(
        "trace_id", *keys[::2], pl.col("start_time").dt.truncate("1s").alias("arrival_second"), offset.alias("t")
    ).join(labels(out).select(*keys, "pattern", "signal"), on=keys, how="left", nulls_equal=True)


def arrival_seconds(requests: pl.DataFrame, out: Detection) -> pl.DataFrame:
    """Each label beside its request's arrival, in seconds after the window start."""
    return request_labels(requests, out)


def spiked(
    seed: int = 1, spike_e2e: tuple[float, float] = (500.0, 3000.0), deployment: str | None = "vllm-a"
) -> pl.DataFrame:
    """10 arrivals/s throughout, 100/s for the 20 seconds of SPIKE."""
    steady = stream(10, -120, 300, seed=seed, prefix="steady-", deployment=deployment)
    spike = stream(90, *SPIKE, seed=seed + 1, prefix="spike-", e2e=spike_e2e, deployment=deployment)
    return fetched(steady, spike)


def ending_at_the_window_end(n: int, arrival: timedelta) -> pl.DataFrame:
    """n requests that arrive `arrival` before the window end and end exactly at it: the next window's."""
    start, ms = WINDOW.end - arrival, arrival.total_seconds() * 1000
    rows = [(next(KEYS), start, WINDOW.end, "vllm-a", ms, 20.0, None, None, f"end-{i}") for i in range(n)]
    return pl.DataFrame(rows, schema=BUILT_SCHEMA, orient="row")


def test_a_steady_stream_is_all_steady_and_silent_up_to_the_window_edges() -> None:
    with_depth = fetched(stream(20, -120, 300, seed=1, prefix="r", depth=lambda t: 4, replica_count=4))
    out = run(with_depth, scores_for(with_depth, lambda _: 0.85))
    assert labels(out)["pattern"].unique().to_list() == ["steady"]
    assert labels(out)["signal"].unique().to_list() == ["queue_depth"]
    assert out.conditions == []

    # Without queue depth the arrival rate decides; the neighbourhoods cut at the fetched edges must not read
    # the unfetched seconds as a lull that makes ordinary traffic look like a burst.
    by_rate = fetched(stream(20, -120, 300, seed=2, prefix="r"))
    out = run(by_rate)
    assert labels(out)["pattern"].unique().to_list() == ["steady"]
    assert labels(out)["signal"].unique().to_list() == ["arrival_rate"]
    assert out.figures.select("pattern", "n").rows() == [("steady", labels(out)["requests"].sum())]


def test_only_requests_that_ended_in_the_window_are_labelled() -> None:
    requests = fetched(stream(20, -120, 300, seed=3, prefix="r"))
    out = run(requests)
    inside = requests.filter(pl.col("end_time") >= WINDOW.start)
    assert 0 < inside.height < requests.height
    assert labels(out)["requests"].sum() == inside.height == out.figures["n"].sum()
    assert request_labels(requests, out)["pattern"].null_count() == 0
    assert labels(out).columns == [
        "window_start", "window_end", "deployment", "arrival_second", "replica_count", "requests", "pattern", "signal",
    ]  # fmt: skip
    assert labels(out)["window_start"].unique().to_list() == [WINDOW.start]
    # One row per key: a second's arrivals share it.
    assert labels(out).height == inside["start_time"].dt.truncate("1s").n_unique()


def test_inputs_reach_half_a_neighbourhood_before_the_window_for_requests_only() -> None:
    reads = inputs(Config(), WINDOW)
    assert isinstance(reads["requests"], Requests) and isinstance(reads["scores"], Scores)
    assert reads["requests"].window == Window(WINDOW.start - LOOKBACK, WINDOW.end)
    assert reads["scores"].window == WINDOW
    wider = inputs(Config(neighbourhood_seconds=120), WINDOW)["requests"]
    assert isinstance(wider, Requests)
    assert wider.window.start == WINDOW.start - 2 * LOOKBACK


def test_a_ten_fold_arrival_spike_labels_its_requests_burst() -> None:
    requests = spiked()
    timed = arrival_seconds(requests, run(requests))
    during = timed.filter(pl.col("t").is_between(*SPIKE, closed="left"))
    assert during.height > 1500
    assert during["pattern"].unique().to_list() == ["burst"]
    assert during["signal"].unique().to_list() == ["arrival_rate"]
    # A minute around an arrival labels it, so only requests more than half a minute from the spike are steady.
    far = timed.filter((pl.col("t") < SPIKE[0] - 31) | (pl.col("t") >= SPIKE[1] + 31))
    assert far.height > 1500
    assert far["pattern"].unique().to_list() == ["steady"]


def test_a_burst_just_before_the_window_labels_the_first_requests_of_the_window() -> None:
    steady = stream(10, -120, 300, seed=4, prefix="steady-")
    before = stream(90, -28, -10, seed=5, prefix="spike-")
    requests = fetched(steady, before)
    assert requests.filter(pl.col("trace_id").str.starts_with("spike-")).height > 1000
    timed = arrival_seconds(requests, run(requests))
    assert "spike-0" not in timed["trace_id"].to_list()
    first = timed.filter(pl.col("t").is_between(0, 5))
    assert first.height > 20
    assert first["pattern"].unique().to_list() == ["burst"]


def test_traffic_out_of_silence_is_a_burst_because_the_quiet_seconds_count_as_zeros() -> None:
    requests = fetched(stream(20, 100, 300, seed=10, prefix="r"))
    timed = arrival_seconds(requests, run(requests))
    assert timed.filter(pl.col("t") < 105)["pattern"].unique().to_list() == ["burst"]
    assert timed.filter(pl.col("t") >= 131)["pattern"].unique().to_list() == ["steady"]


def test_queue_depth_spikes_label_burst_through_the_queue_depth_signal() -> None:
    # Arrivals stay even, so only the queue depth can tell the burst apart.
    requests = fetched(
        stream(10, -120, 300, seed=6, prefix="r", depth=lambda t: 40 if 100 <= t < 110 else 4, replica_count=8)
    )
    timed = arrival_seconds(requests, run(requests))
    assert timed["signal"].unique().to_list() == ["queue_depth"]
    during = timed.filter(pl.col("t").is_between(100, 110, closed="left"))
    assert during.height > 50
    assert during["pattern"].unique().to_list() == ["burst"]
    far = timed.filter((pl.col("t") < 100 - 31) | (pl.col("t") >= 110 + 31))
    assert far["pattern"].unique().to_list() == ["steady"]


def test_a_request_ending_exactly_at_the_window_end_is_left_to_the_next_window() -> None:
    """The window is half-open on end_time: neither labelled nor counted, whatever the frames hand over."""
    requests = fetched(stream(10, -120, 300, seed=11, prefix="r"))
    inside = requests.filter(pl.col("end_time") >= WINDOW.start).height
    out = run(pl.concat([requests, ending_at_the_window_end(5, timedelta(seconds=2))]))
    assert labels(out)["requests"].sum() == inside == out.figures["n"].sum()


def test_arrivals_at_the_window_end_count_in_the_neighbourhood_of_the_windows_last_requests() -> None:
    """A hundred zero-length requests at the very end are not the window's, but the minute around each of
    the last half-minute's arrivals reaches them: those arrivals were in a burst."""
    requests = fetched(stream(10, -120, 300, seed=12, prefix="r"))
    end_burst = ending_at_the_window_end(100, timedelta(0))
    timed = arrival_seconds(requests, run(pl.concat([requests, end_burst])))
    assert "end-0" not in timed["trace_id"].to_list()
    last = timed.filter(pl.col("t") >= 270)
    assert last.height > 200
    assert last["pattern"].unique().to_list() == ["burst"]
    assert timed.filter(pl.col("t") < 269)["pattern"].unique().to_list() == ["steady"]


def test_requests_without_a_deployment_are_labelled_from_their_own_arrivals() -> None:
    """NULL is a deployment of its own (untagged traffic), not a key that matches no neighbourhood."""
    requests = spiked(deployment=None)
    out = run(requests)
    assert labels(out)["deployment"].null_count() == labels(out).height
    timed = arrival_seconds(requests, out)
    during = timed.filter(pl.col("t").is_between(*SPIKE, closed="left"))
    assert during.height > 1500
    assert during["pattern"].unique().to_list() == ["burst"]
    far = timed.filter((pl.col("t") < SPIKE[0] - 31) | (pl.col("t") >= SPIKE[1] + 31))
    assert far["pattern"].unique().to_list() == ["steady"]


def test_high_constant_load_against_few_replicas_is_sustained() -> None:
    def pattern_of(requests: pl.DataFrame) -> list[str]:
        return labels(run(fetched(requests)))["pattern"].unique().to_list()

    # 30 queued against 0.7 x 2 x 16 = 22.4.
    assert pattern_of(stream(10, -60, 300, seed=7, prefix="r", depth=lambda t: 30, replica_count=2)) == ["sustained"]
    assert pattern_of(stream(10, -60, 300, seed=7, prefix="r", depth=lambda t: 30, replica_count=3)) == ["steady"]
    assert pattern_of(stream(10, -60, 300, seed=7, prefix="r", depth=lambda t: 30, replica_count=None)) == ["steady"]
    # The same test on the arrival rate: 20/s against 0.7 x 1 x 16 = 11.2.
    assert pattern_of(stream(20, -60, 300, seed=8, prefix="r", replica_count=1)) == ["sustained"]
    assert pattern_of(stream(20, -60, 300, seed=8, prefix="r", replica_count=2)) == ["steady"]


def test_one_deployments_burst_does_not_label_another_deployments_requests() -> None:
    a = spiked()
    b = fetched(stream(10, -120, 300, seed=9, prefix="b-", deployment="vllm-b"))
    out = run(pl.concat([a, b]))
    by_deployment = labels(out)
    assert by_deployment.filter(pl.col("deployment") == "vllm-b")["pattern"].unique().to_list() == ["steady"]
    assert "burst" in by_deployment.filter(pl.col("deployment") == "vllm-a")["pattern"].to_list()


def test_burst_requests_scoring_lower_than_steady_fire_one_condition() -> None:
    requests = spiked()
    burst = set(request_labels(requests, run(requests)).filter(pl.col("pattern") == "burst")["trace_id"].to_list())
    scores = scores_for(requests, lambda i: 0.70 if i in burst else 0.85)
    out = run(requests, scores)
    [condition] = out.conditions
    assert condition.labels == {"pattern": "burst", "signal": "json_adherence"}
    assert tuple(condition.labels) == LABELS
    means = dict(out.figures.select("pattern", "score_mean").iter_rows())
    assert means["burst"] == pytest.approx(0.70, abs=0.01) and means["steady"] == pytest.approx(0.85, abs=0.01)
    assert condition.value == pytest.approx(means["steady"] - means["burst"])
    assert condition.threshold == 0.10
    n = dict(out.figures.select("pattern", "score_n").iter_rows())
    assert condition.summary == (
        f"burst traffic (a 60 s peak above 2.5x its mean): json_adherence mean 0.70 vs 0.85 in steady traffic "
        f"(−{condition.value:.2f}) over 2026-11-20 12:00–12:05 UTC, n={n['burst']} vs {n['steady']}; bursts are "
        "costing quality: add headroom ahead of them or smooth admission at the gateway"
    )

    # The same gap means nothing below min_samples, and a gap inside score_drop is no breach.
    assert run(requests, scores, Config(min_samples=n["burst"] + 1)).conditions == []
    smaller = scores_for(requests, lambda i: 0.77 if i in burst else 0.85)
    assert run(requests, smaller).conditions == []


def test_a_score_drop_of_exactly_the_threshold_fires_and_a_smaller_one_does_not() -> None:
    requests = spiked()
    burst = request_labels(requests, run(requests)).filter(pl.col("pattern") == "burst")["trace_id"].to_list()

    def exact(steady: float, bursty: float) -> pl.DataFrame:
        in_burst = pl.col("trace_id").is_in(burst)
        return scores_for(requests, lambda _: 0.0).with_columns(score=pl.when(in_burst).then(bursty).otherwise(steady))

    # 0.75 and 0.50 and their means are exact in binary: the drop is exactly 0.25, on the threshold.
    at_threshold = Config(score_drop=0.25)
    [condition] = run(requests, exact(0.75, 0.50), at_threshold).conditions
    assert condition.labels == {"pattern": "burst", "signal": "json_adherence"}
    assert condition.value == 0.25
    assert "(−0.25)" in condition.summary
    assert run(requests, exact(0.75, 0.51), at_threshold).conditions == []


def test_a_score_gap_with_fewer_than_min_samples_scores_on_either_side_stays_silent() -> None:
    """Both patterns have hundreds of requests; the scores of the name are what is thin."""
    requests = spiked()
    patterns = request_labels(requests, run(requests))
    burst = patterns.filter(pl.col("pattern") == "burst")["trace_id"].to_list()
    steady = patterns.filter(pl.col("pattern") == "steady")["trace_id"].to_list()
    assert len(burst) > 1500 and len(steady) > 1500

    def scored(burst_scored: int, steady_scored: int) -> pl.DataFrame:
        low = set(burst[:burst_scored])
        picked = requests.filter(pl.col("trace_id").is_in([*low, *steady[:steady_scored]]))
        return scores_for(picked, lambda i: 0.50 if i in low else 0.85)

    assert run(requests, scored(29, 500)).conditions == []
    assert run(requests, scored(500, 29)).conditions == []
    [condition] = run(requests, scored(30, 30)).conditions
    assert condition.labels == {"pattern": "burst", "signal": "json_adherence"}


def test_burst_latency_at_twice_steady_fires_on_latency_p99() -> None:
    requests = spiked(spike_e2e=(6500.0, 8000.0))
    out = run(requests)
    [condition] = out.conditions
    assert condition.labels == {"pattern": "burst", "signal": "latency_p99"}
    p99 = dict(out.figures.select("pattern", "latency_p99").iter_rows())
    assert condition.value == pytest.approx(p99["burst"] / p99["steady"])
    assert condition.value >= 2.0
    assert condition.threshold == 2.0
    assert " is 2.7x steady traffic's 3.0 s over 2026-11-20 12:00–12:05 UTC" in condition.summary


def test_a_healthy_dataset_with_bursts_fires_nothing() -> None:
    requests = spiked()
    out = run(requests, scores_for(requests, lambda _: 0.85))
    assert out.conditions == []
    assert out.figures["pattern"].to_list() == ["steady", "burst"]
    assert out.figures["score_name"].to_list() == ["json_adherence", "json_adherence"]
    assert out.figures["n"].sum() == labels(out)["requests"].sum()


def test_three_hundred_thousand_requests_are_all_labelled() -> None:
    """Every request of a busy window gets a label. How long labelling takes is measured by
    bench/traffic_pattern.py on the same frames, not asserted here (a loaded machine would make it flaky)."""
    n = 300_000
    span_us = int((WINDOW.end - WINDOW.start).total_seconds() * 1e6)
    i = pl.int_range(n)
    start = pl.lit(WINDOW.start) + pl.duration(microseconds=i * (span_us // n))
    requests = pl.select(
        request_key=i.cast(pl.UInt64),
        start_time=start,
        end_time=start,
        deployment=pl.when(i % 3 == 0).then(pl.lit("vllm-a")).otherwise(pl.lit("vllm-b")),
        e2e_ms=(i % 1000).cast(pl.Float64),
        tpot_ms=(i % 50).cast(pl.Float64),
        queue_depth=pl.when(i % 2 == 0).then(i % 40),
        replica_count=pl.lit(4, pl.Int64),
    )
    assert requests.schema == REQUEST_SCHEMA
    scores = requests.select(
        trace_id=pl.lit("t"),
        span_id=pl.lit("s"),
        request_key="request_key",
        name=pl.lit("json_adherence"),
        score=pl.lit(0.8),
    )
    out = run(requests, scores)
    assert labels(out)["requests"].sum() == n


def test_empty_frames_give_no_conditions_and_typed_empty_tables() -> None:
    out = run(pl.DataFrame(schema=REQUEST_SCHEMA))
    assert out.conditions == []
    assert out.figures.height == 0 and labels(out).height == 0
    assert out.figures.schema["n"] == pl.Int64
    assert labels(out).schema["arrival_second"] == pl.Datetime("us")


def test_tables_match_the_migration_and_inputs_match_the_hand_built_frames(tmp_path: Path) -> None:
    con = open_database(tmp_path / "x.duckdb")
    migrate.upgrade(con)
    requests = spiked()
    out = run(requests, scores_for(requests, lambda _: 0.85))
    for table, frame in [("traffic_pattern", out.figures), ("traffic_pattern_labels", labels(out))]:
        columns = {row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()}
        assert set(frame.columns) == columns - {"evaluated_at"}, table
        # The pass's insert must accept the frame's types and NOT NULL columns as they are.
        con.register("frame", frame.to_arrow())
        con.execute(f"INSERT INTO {table} BY NAME SELECT *, TIMESTAMP '2026-11-20 12:06' AS evaluated_at FROM frame")
        con.unregister("frame")
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone() == (frame.height,)

    fetched_frames: dict[str, pl.DataFrame] = {}
    source = DuckDBWindowSource(con)
    for key, read in inputs(Config(), WINDOW).items():
        result = pl.from_arrow(read.fetch(source))
        assert isinstance(result, pl.DataFrame)
        fetched_frames[key] = result
    assert fetched_frames["requests"].schema == REQUEST_SCHEMA
    # Fetched scores name their request by the key alone; built ones carry readable ids too.
    assert fetched_frames["scores"].schema == pl.Schema({c: t for c, t in SCORE_SCHEMA.items() if c not in IDS})
    empty = detect(fetched_frames, Config(), WINDOW)
    assert empty.conditions == [] and empty.figures.height == 0
    con.close()
