"""saturation on hand-built frames: quality falling off as the queue per replica grows fires for the scaling bucket."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pydantic
import pytest
import test_engine_join as engine_join
from builders import gauge
from detector_tables import assert_fits_migrated_table
from request_frames import SCORE_SCHEMA, WINDOW, detector_frames, noisy_scores, spread

from detectors.base import Detection, Window
from detectors.saturation import LABELS, Config, detect, inputs
from storage.duckdb.backend import DuckDBStorage

REQUEST_SCHEMA = {
    "trace_id": pl.String,
    "span_id": pl.String,
    "e2e_ms": pl.Float64,
    "tpot_ms": pl.Float64,
    "queue_depth": pl.Int64,
    "replica_count": pl.Int64,
}
# Queue depths over 4 replicas: 0.5, 5, 12 and 20 queued per replica.
DEPTHS = {"idle": 2, "warm": 20, "saturating": 48, "scaling": 80}


def bucket(name: str, n: int, e2e: list[float] | None = None) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "trace_id": [f"{name}-{i}" for i in range(n)],
            "span_id": ["s"] * n,
            "e2e_ms": spread(800, 1200, n) if e2e is None else e2e,
            "tpot_ms": spread(15, 25, n),
            "queue_depth": [DEPTHS[name]] * n,
            "replica_count": [4] * n,
        },
        schema=REQUEST_SCHEMA,
    )


def loads(pairs: list[tuple[int | None, int | None]]) -> pl.DataFrame:
    """One request per (queue_depth, replica_count), equal latency."""
    n = len(pairs)
    return pl.DataFrame(
        {
            "trace_id": [f"t{i}" for i in range(n)],
            "span_id": ["s"] * n,
            "e2e_ms": [1000.0] * n,
            "tpot_ms": [20.0] * n,
            "queue_depth": [depth for depth, _ in pairs],
            "replica_count": [count for _, count in pairs],
        },
        schema=REQUEST_SCHEMA,
    )


def run(
    requests: list[pl.DataFrame], scores: list[pl.DataFrame] | None = None, config: Config | None = None
) -> Detection:
    return detect(detector_frames(requests, scores, REQUEST_SCHEMA), config or Config(), WINDOW)


def cliff() -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """json_adherence at 0.88 / 0.86 / 0.79 / 0.71 from idle to scaling, equal latency everywhere."""
    frames = [bucket("idle", 900), bucket("warm", 700), bucket("saturating", 500), bucket("scaling", 312)]
    means = [0.88, 0.86, 0.79, 0.71]
    return frames, [
        noisy_scores(f, "json_adherence", m, seed=i) for i, (f, m) in enumerate(zip(frames, means, strict=True))
    ]


def test_the_cliff_reproduces_the_means_and_fires_for_the_scaling_bucket_only() -> None:
    out = run(*cliff())
    means = {r["bucket"]: r["score_mean"] for r in out.figures.iter_rows(named=True)}
    assert means == {
        "idle": pytest.approx(0.88, abs=0.01),
        "warm": pytest.approx(0.86, abs=0.01),
        "saturating": pytest.approx(0.79, abs=0.01),
        "scaling": pytest.approx(0.71, abs=0.01),
    }
    assert out.figures["bucket"].to_list() == ["idle", "warm", "saturating", "scaling"]
    assert out.figures["n"].to_list() == [900, 700, 500, 312]
    assert out.figures["score_n"].to_list() == [900, 700, 500, 312]
    # Saturating sits 0.09 below idle: under the 0.10 threshold, so the scaling bucket is the only one.
    assert 0.08 < means["idle"] - means["saturating"] < 0.10

    [condition] = out.conditions
    assert condition.labels == {"bucket": "scaling", "signal": "json_adherence"}
    assert tuple(condition.labels) == LABELS
    assert condition.value == pytest.approx(means["idle"] - means["scaling"])
    assert condition.threshold == 0.10
    assert condition.severity is None
    assert condition.summary == (
        f"scaling bucket (queue ≥ 16 per replica): json_adherence mean {means['scaling']:.2f} vs "
        f"{means['idle']:.2f} when idle (−{condition.value:.2f}) over 2026-11-20 12:00–12:05 UTC, n=312 vs 900; "
        "the autoscaler lags the load: lower target_ongoing_requests or pre-warm replicas before the burst"
    )


def test_a_drop_at_the_saturating_bucket_never_fires_however_deep() -> None:
    idle, saturating = bucket("idle", 200), bucket("saturating", 200)
    out = run(
        [idle, saturating], [noisy_scores(idle, "json_adherence", 0.9), noisy_scores(saturating, "json_adherence", 0.3)]
    )
    assert out.conditions == []


def test_a_p99_tripling_fires_on_latency_and_just_under_does_not() -> None:
    idle = bucket("idle", 200, e2e=[1000.0] * 200)
    out = run([idle, bucket("warm", 100, e2e=[5000.0] * 100), bucket("scaling", 100, e2e=[900.0] * 50 + [3000.0] * 50)])
    [condition] = out.conditions
    assert condition.labels == {"bucket": "scaling", "signal": "latency_p99"}
    assert condition.value == pytest.approx(3.0)
    assert condition.threshold == 3.0
    assert condition.summary == (
        "scaling bucket (queue ≥ 16 per replica): e2e p99 3.0 s is 3.0x the idle bucket's 1.0 s over "
        "2026-11-20 12:00–12:05 UTC, n=100 vs 200; the autoscaler lags the load: lower target_ongoing_requests or "
        "pre-warm replicas before the burst"
    )
    row = out.figures.filter(pl.col("bucket") == "scaling").row(0, named=True)
    assert row["latency_p50"] == pytest.approx(1950.0)
    assert row["latency_p99"] == pytest.approx(3000.0)
    assert row["tpot_p99"] == pytest.approx(24.9, abs=0.01)

    assert run([idle, bucket("scaling", 100, e2e=[2900.0] * 100)]).conditions == []


def test_a_clean_dataset_fires_nothing() -> None:
    frames = [
        bucket("idle", 400, e2e=spread(800, 1200, 400)),
        bucket("warm", 300, e2e=spread(850, 1500, 300)),
        bucket("saturating", 200, e2e=spread(900, 2000, 200)),
        bucket("scaling", 100, e2e=spread(950, 2500, 100)),
    ]
    scores = [noisy_scores(f, "json_adherence", 0.88, seed=i) for i, f in enumerate(frames)]
    scores += [noisy_scores(f, "helpfulness", 0.74 - 0.01 * i, seed=10 + i) for i, f in enumerate(frames)]
    out = run(frames, scores)
    assert out.conditions == []
    assert out.figures.height == 4 * 2
    assert out.figures.filter(pl.col("bucket") == "warm")["latency_p99"].n_unique() == 1


def test_bucket_edges_belong_to_the_bucket_above_and_move_with_the_config() -> None:
    # Per replica: 0, 1.75, 2, 7.5, 8, 15.5, 16, 40.
    requests = loads([(0, 3), (7, 4), (2, 1), (15, 2), (8, 1), (31, 2), (16, 1), (80, 2)])
    out = run([requests])
    assert dict(out.figures.select("bucket", "n").iter_rows()) == {"idle": 2, "warm": 2, "saturating": 2, "scaling": 2}

    moved = run([requests], config=Config(idle_below=1, warm_below=4, saturating_below=40))
    assert dict(moved.figures.select("bucket", "n").iter_rows()) == {
        "idle": 1,
        "warm": 2,
        "saturating": 4,
        "scaling": 1,
    }
    with pytest.raises(pydantic.ValidationError):
        Config(warm_below=16, saturating_below=16)
    with pytest.raises(pydantic.ValidationError):
        Config(idle_below=9)


def test_requests_without_a_queue_depth_or_replica_count_or_with_zero_replicas_are_left_out() -> None:
    requests = loads([(None, 4), (20, None), (None, None), (5, 0), (80, 4)])
    unknown = requests.head(4)
    out = run([requests], [noisy_scores(requests, "json_adherence", 0.5)])
    assert out.figures.select("bucket", "n", "score_n").rows() == [("scaling", 1, 1)]

    # Out of the comparison too: 120 unmeasurable requests scoring 0.1 would otherwise sink some bucket.
    idle, scaling = bucket("idle", 100), bucket("scaling", 100)
    unmeasured = pl.concat([unknown] * 30).with_columns(trace_id=pl.format("u{}", pl.int_range(pl.len())))
    scores = [noisy_scores(idle, "json_adherence", 0.9), noisy_scores(scaling, "json_adherence", 0.85)]
    with_unmeasured = run([idle, scaling, unmeasured], [*scores, noisy_scores(unmeasured, "json_adherence", 0.1)])
    assert with_unmeasured.conditions == []
    assert with_unmeasured.figures["n"].to_list() == [100, 100]


def test_min_samples_gates_the_scaling_and_the_idle_bucket() -> None:
    idle = bucket("idle", 200, e2e=[1000.0] * 200)
    idle_scores = noisy_scores(idle, "json_adherence", 0.9)
    for n, fires in [(29, False), (30, True)]:
        scaling = bucket("scaling", n, e2e=[5000.0] * n)
        out = run([idle, scaling], [idle_scores, noisy_scores(scaling, "json_adherence", 0.5)])
        assert {c.labels["signal"] for c in out.conditions} == ({"json_adherence", "latency_p99"} if fires else set())

    for n, fires in [(29, False), (30, True)]:
        thin_idle = bucket("idle", n, e2e=[1000.0] * n)
        scaling = bucket("scaling", 200, e2e=[5000.0] * 200)
        out = run(
            [thin_idle, scaling],
            [noisy_scores(thin_idle, "json_adherence", 0.9), noisy_scores(scaling, "json_adherence", 0.5)],
        )
        assert bool(out.conditions) is fires, n

    # Enough requests but a handful of scores: no mean to judge by.
    scaling = bucket("scaling", 200)
    assert run([idle, scaling], [idle_scores, noisy_scores(scaling.head(29), "json_adherence", 0.3)]).conditions == []

    # Two judges per request: 40 scores, but from 20 requests, too few for a verdict on either side.
    thin_idle, thin_scaling = bucket("idle", 20), bucket("scaling", 20)
    twice_idle = [noisy_scores(thin_idle, "json_adherence", 0.9, seed=s) for s in (1, 2)]
    twice_scaling = [noisy_scores(thin_scaling, "json_adherence", 0.3, seed=s) for s in (1, 2)]
    assert run([thin_idle, scaling], [*twice_idle, noisy_scores(scaling, "json_adherence", 0.3)]).conditions == []
    assert run([idle, thin_scaling], [idle_scores, *twice_scaling]).conditions == []


def test_empty_frames_give_no_conditions_and_typed_empty_figures() -> None:
    out = run([])
    assert out.conditions == []
    assert out.figures.height == 0
    assert out.figures.schema["window_start"] == pl.Datetime("us")
    assert out.figures.schema["n"] == pl.Int64
    assert out.figures.schema["bucket"] == pl.String
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

    # Only idle requests: nothing to compare, nothing to fire.
    assert run([bucket("idle", 100)]).conditions == []


def test_figures_match_the_migrated_table_and_inputs_match_the_hand_built_frames(tmp_path: Path) -> None:
    assert_fits_migrated_table(
        tmp_path,
        "saturation",
        run(*cliff()).figures,
        rows=4,
        inputs=inputs,
        detect=detect,
        config=Config(),
        window=WINDOW,
        schemas={"requests": REQUEST_SCHEMA, "scores": SCORE_SCHEMA},
    )


# --- over the request model: the engine join fills what vLLM's spans lack ----------------------------------

T0 = engine_join.T0
STORED = Window(T0 - timedelta(minutes=5), T0 + timedelta(minutes=5))


@pytest.fixture(params=["live", "settled"])
def store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[DuckDBStorage]:
    """A database read live, or settled first (tests/test_engine_join.py's way): both must give the same."""
    storage = DuckDBStorage.open(tmp_path / "saturation.duckdb")
    if request.param == "settled":
        engine_join.SETTLED.add(id(storage))
    yield storage
    engine_join.SETTLED.discard(id(storage))
    storage.close()


def stored_saturation(storage: DuckDBStorage) -> Detection:
    engine_join.settle_if_asked(storage)
    frames = {name: pl.from_arrow(read.fetch(storage.windows)) for name, read in inputs(Config(), STORED).items()}
    return detect({k: v for k, v in frames.items() if isinstance(v, pl.DataFrame)}, Config(), STORED)


def two_pods_under_job_vllm(storage: DuckDBStorage, load_from: datetime, waiting: float) -> None:
    """pod-a and pod-b of the 70B fleet, scraped under job `vllm`: idle until `load_from`, then `waiting` each."""
    times = engine_join.around_t0()
    for name in ("pod-a", "pod-b"):
        series = [(t, 0.0 if t < engine_join.ns(load_from) else waiting) for t in times]
        metrics = [gauge("vllm:num_requests_waiting", series, {"engine": "0", "model_name": "llama-70b"})]
        engine_join.store_metrics(storage, engine_join.scraped(name, metrics))


def fleet_requests(first: int, count: int, start: datetime, e2e_ms: float, **timings: float) -> list[dict[str, Any]]:
    return [
        engine_join.request_span(
            first + 2 * i, f"pod-{'ab'[i % 2]}", start + timedelta(milliseconds=100 * i),
            start + timedelta(milliseconds=100 * i + e2e_ms), deployment="vllm-llama70b", **timings,
        )
        for i in range(count)
    ]  # fmt: skip


def test_a_fleet_scraped_under_a_job_not_named_as_its_spans_service_has_saturation_rows(store: DuckDBStorage) -> None:
    # 40 waiting on each of two replicas from T0 + 60 s: 40 queued per replica, the scaling bucket.
    two_pods_under_job_vllm(store, T0 + timedelta(seconds=60), 40.0)
    idle = fleet_requests(1, 30, T0 + timedelta(seconds=1), 1000.0)
    loaded = fleet_requests(101, 30, T0 + timedelta(seconds=61), 1000.0)
    engine_join.store_spans(store, idle + loaded)
    out = stored_saturation(store)
    assert dict(out.figures.select("bucket", "n").iter_rows()) == {"idle": 30, "scaling": 30}


def test_the_head_of_a_burst_lands_in_the_scaling_bucket_and_its_latency_fires(store: DuckDBStorage) -> None:
    # The burst's first scrape is at T0 + 60 s; its head arrived just before and waited 3 s in the queue,
    # which made it three times slower than the idle requests. Read at arrival alone, it would be idle too.
    two_pods_under_job_vllm(store, T0 + timedelta(seconds=60), 40.0)
    idle = fleet_requests(1, 30, T0 + timedelta(seconds=1), 1000.0, queue_ms=0.0)
    head = fleet_requests(101, 30, T0 + timedelta(seconds=57), 4000.0, queue_ms=3000.0)
    engine_join.store_spans(store, idle + head)
    out = stored_saturation(store)
    assert dict(out.figures.select("bucket", "n").iter_rows()) == {"idle": 30, "scaling": 30}
    assert [c.labels for c in out.conditions] == [{"bucket": "scaling", "signal": "latency_p99"}]
