"""What joining engine metrics costs a detector pass: the same 10M requests with their engine facts on
the spans, and without them but with the engines' metrics (one series per replica every 5 s).

    .venv/bin/python bench/engine_join.py [--spans 10000000] [--rounds 2] [--keep DIR] [--compare REV [--repo DIR]]

Two databases hold the same requests (bench/detection.py's generator): in `spans.duckdb` each span carries
queue_depth, replica_count and cache_hit_ratio, as a custom-instrumented fleet's would; in `engine.duckdb` the
spans carry none of them, as vLLM's do, and engine_metrics holds what 16 replicas' /metrics would have said
every 5 s over the day, so the request model fills them by the join. Before the passes, the engine database's
spans are settled as the service's job would have settled them by `at` (all but the last
`settle_after_seconds`), and what that costs is reported beside the passes. The full detection pass (every
detector over the whole day) runs on each, alternating, `--rounds` times; the figure is the ratio of the
medians, both measured in this run on this machine.

`--compare REV` measures the code of a git revision first (its tree exported to a temporary directory and this
script run there with the same options, on databases it builds itself), then this one, and reports both and
the ratios of this code to that: settling the day (the join over every request) and the full pass with facts
joined, each also divided by the same run's pass with facts on the spans, which takes the machine's load out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from detection import GENERATE, SCORES  # bench/ is on sys.path when a bench script runs

from detectors.registry import REGISTRY
from tailwatch.compose import detection_pass, open_storage
from tailwatch.settings import Settings, load_settings

REPLICAS = 8  # per deployment; bench/detection.py spreads requests over r0..r7 of two deployments

# One scrape per replica every 5 s, as the Collector forwards vLLM's /metrics: the gauges at the scrape,
# the counters growing with the requests of the replica (hits at the replica's running hit rate).
METRICS = f"""
INSERT INTO engine_metrics (time, start_time, name, metric, kind, value, replica_id, deployment, model, engine,
    source, interval_s, attributes, resource, ingested_at)
WITH scrapes AS (
    SELECT ?::TIMESTAMP + to_seconds(5 * s) AS time, s, d.deployment, d.deployment || '-r' || r AS replica_id
    FROM range(CAST((86400 + 3 * 3600) / 5 AS BIGINT)) t(s),
         (VALUES ('vllm-a'), ('vllm-b')) d(deployment),
         range({REPLICAS}) q(r)
),
values AS (
    SELECT time, deployment, replica_id, name, metric, kind, value FROM scrapes,
    LATERAL (VALUES
        ('vllm:num_requests_waiting', 'requests_waiting', 'gauge', (random() * 5)::INT::DOUBLE),
        ('vllm:num_requests_running', 'requests_running', 'gauge', (8 + random() * 24)::INT::DOUBLE),
        ('vllm:kv_cache_usage_perc', 'kv_cache_usage', 'gauge', 0.3 + random() * 0.6),
        ('vllm:prefix_cache_queries_total', 'prefix_cache_queries', 'cumulative', 40000.0 * s),
        ('vllm:prefix_cache_hits_total', 'prefix_cache_hits', 'cumulative', 40000.0 * s * (0.5 + 0.4 * random())),
        ('vllm:num_preemptions_total', 'preemptions', 'cumulative', floor(s / 60)::DOUBLE),
        ('vllm:iteration_tokens_total_sum', 'step_tokens_sum', 'cumulative', 2048.0 * 50 * s),
        ('vllm:iteration_tokens_total_count', 'step_tokens_count', 'cumulative', 50.0 * s)
    ) v(name, metric, kind, value)
)
SELECT time, CASE WHEN kind = 'gauge' THEN NULL ELSE ?::TIMESTAMP END, name, metric, kind, value, replica_id,
    deployment, 'llama-3.1-8b', '0', 'otlp', 5.0, '{{"engine": "0"}}', '{{}}', time
FROM values
"""

# Replicas named as pods are, unique across deployments (the generator reuses r0..r7 in both); in the
# engine database the spans carry no engine facts. Generated so rather than UPDATEd afterwards: an
# UPDATE of every row leaves a table DuckDB plans worse, which would be measured instead of the join.
WITH_FACTS = GENERATE.replace("'r' || (i % 8)", "['vllm-a', 'vllm-b'][1 + i % 2] || '-r' || (i % 8)")
assert WITH_FACTS != GENERATE
WITHOUT_FACTS = WITH_FACTS.replace("cached / input_tokens, qd, 8, 32", "NULL, NULL, NULL, 32")
assert WITHOUT_FACTS != WITH_FACTS


def build(db: Path, spans: int, start: datetime, with_metrics: bool) -> None:
    storage = open_storage(load_settings(None, {"db": str(db)}, environ={}))

    def generate(con: Any) -> None:
        con.execute(WITHOUT_FACTS if with_metrics else WITH_FACTS, [start, spans, spans])
        con.execute(SCORES)
        if with_metrics:
            begin = start - timedelta(hours=2)
            con.execute(METRICS, [begin, begin - timedelta(days=1)])

    t = time.perf_counter()
    storage.writer.submit(generate).result()
    storage.writer.submit(lambda con: con.execute("CHECKPOINT")).result()
    storage.close()
    print(f"built {db.name} in {time.perf_counter() - t:.1f}s", flush=True)


def settle(db: Path, at: datetime) -> tuple[int, float]:
    """Settle the spans the service's job would have settled by `at`, then checkpoint; (spans, seconds)."""
    settings = load_settings(None, {"db": str(db)}, environ={})
    storage = open_storage(settings)
    try:
        t = time.perf_counter()
        settled = storage.engine_facts.settle(at - timedelta(seconds=settings.metrics.settle_after_seconds))
        storage.writer.submit(lambda con: con.execute("CHECKPOINT")).result()
        return settled, time.perf_counter() - t
    finally:
        storage.close()


def full_pass(settings: Settings, at: datetime, per_detector: dict[str, list[float]]) -> float:
    storage = open_storage(settings)
    try:
        t = time.perf_counter()
        for r in detection_pass(settings, storage).run(at):
            assert r.outcome == "ok", r.error
            per_detector.setdefault(r.detector, []).append(r.seconds)
        return time.perf_counter() - t
    finally:
        storage.close()


def _warm(times: list[float]) -> list[float]:
    """The passes after the first of each round of three (the first reads the 24-hour baseline)."""
    return [t for i, t in enumerate(times) if i % 3]


def measured_at(revision: str, options: list[str], root: Path) -> dict[str, Any]:
    """This benchmark's figures for the code of `revision` of the repository at `root`: its tree exported and
    run on its own."""
    tree = Path(tempfile.mkdtemp(prefix="tw-join-before-"))
    archive = subprocess.run(["git", "archive", revision], cwd=root, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    # This very measurement, run on that code.
    (tree / "bench" / "engine_join.py").write_text(Path(__file__).read_text())
    # The exported packages come first: the virtualenv's editable install points at this checkout.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "bench/engine_join.py", *options]
    run = subprocess.run(command, check=False, cwd=tree, env=env, capture_output=True, text=True)
    print(run.stdout, run.stderr, sep="\n", flush=True)
    run.check_returncode()
    figures: dict[str, Any] = json.loads(run.stdout[run.stdout.index("\n{") :])
    return figures


def comparison(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """This code over the other: raw, and each divided by its own run's pass with facts on the spans."""

    def median(figures: dict[str, Any], key: str) -> float:
        return float(statistics.median(figures[key]))

    out = {}
    for name, value in (
        ("settle", lambda f: float(f["settle_seconds"])),
        ("full_pass_joined", lambda f: median(f, "full_pass_seconds_facts_joined")),
    ):
        out[f"{name}_after_over_before"] = round(value(after) / value(before), 3)
        out[f"{name}_after_over_before_per_spans_pass"] = round(
            (value(after) / median(after, "full_pass_seconds_facts_on_spans"))
            / (value(before) / median(before, "full_pass_seconds_facts_on_spans")),
            3,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="reuse or keep the two databases in this directory")
    parser.add_argument("--incremental-only", action="store_true", help="skip the full passes")
    parser.add_argument("--compare", metavar="REV", help="measure this git revision's code first, then compare")
    parser.add_argument(
        "--repo", type=Path, default=Path(__file__).resolve().parents[1], help="the repository REV is read from"
    )
    args = parser.parse_args()
    before = None
    if args.compare:
        options = ["--spans", str(args.spans), "--rounds", str(args.rounds)]
        options += ["--incremental-only"] if args.incremental_only else []
        before = measured_at(args.compare, options, args.repo)
    at = datetime(2026, 11, 21, 0, 0)
    start = at - timedelta(hours=24)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="tw-join-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    dbs = {"spans": workdir / "spans.duckdb", "engine": workdir / "engine.duckdb"}
    settled: dict[str, tuple[int, float]] = {}
    for name, db in dbs.items():
        if not db.exists():
            build(db, args.spans, start, with_metrics=name == "engine")
        settled[name] = settle(db, at)
        print(f"settled {db.name}: {settled[name][0]} spans in {settled[name][1]:.1f}s", flush=True)
    day = {"window_seconds": 86400, "settle_seconds": 0}
    detectors = {k: day for k in REGISTRY if k != "token_latency"}
    times: dict[str, list[float]] = {name: [] for name in dbs}
    detectors_seconds: dict[str, dict[str, list[float]]] = {name: {} for name in dbs}
    for _ in range(0 if args.incremental_only else args.rounds):
        for name, db in dbs.items():
            # A day of 10M requests as one window holds gigabytes of frames, past the pass's default bound.
            lifted = {"db": str(db), "detectors": detectors, "storage": {"detection_memory_mb": 65536}}
            settings = load_settings(None, lifted, environ={})
            times[name].append(full_pass(settings, at, detectors_seconds[name]))
            print(name, round(times[name][-1], 2), flush=True)
    # The scheduler's own pass: every detector on its 5-minute window (token_latency against its cached
    # 24-hour baseline), three consecutive windows: the first reads the baseline, the others reuse it.
    incremental: dict[str, list[float]] = {name: [] for name in dbs}
    for _ in range(args.rounds):
        for name, db in dbs.items():
            settings = load_settings(None, {"db": str(db)}, environ={})
            storage = open_storage(settings)
            detection = detection_pass(settings, storage)
            for step in range(3):
                t = time.perf_counter()
                for r in detection.run(at - timedelta(minutes=5 * step)):
                    assert r.outcome == "ok", r.error
                incremental[name].append(time.perf_counter() - t)
            storage.close()
            print(name, "incremental", [round(x, 2) for x in incremental[name][-3:]], flush=True)
    medians = {name: statistics.median(ts) for name, ts in times.items()} if times["spans"] else {}
    engine_rows = open_storage(load_settings(None, {"db": str(dbs["engine"])}, environ={}))
    filled = engine_rows.reader.rows(
        "SELECT count(*), count(*) FILTER (WHERE queue_depth_source = 'engine'), "
        "count(*) FILTER (WHERE cache_hit_ratio_source = 'engine') FROM llm_requests"
    )[0]
    points = engine_rows.reader.rows("SELECT count(*) FROM engine_metrics")[0][0]
    engine_rows.close()
    figures = {
        "spans": args.spans,
        "engine_metric_rows": points,
        "settled_spans": settled["engine"][0],
        "settle_seconds": round(settled["engine"][1], 2),
        "requests_filled_queue_depth": filled[1],
        "requests_filled_cache_hit_ratio": filled[2],
        "full_pass_seconds_facts_on_spans": [round(t, 2) for t in times["spans"]],
        "full_pass_seconds_facts_joined": [round(t, 2) for t in times["engine"]],
        "join_ratio": round(medians["engine"] / medians["spans"], 3) if medians else None,
        "incremental_pass_seconds_facts_on_spans": [round(t, 2) for t in incremental["spans"]],
        "incremental_pass_seconds_facts_joined": [round(t, 2) for t in incremental["engine"]],
        "incremental_join_ratio_warm": round(
            statistics.median(_warm(incremental["engine"])) / statistics.median(_warm(incremental["spans"])), 3
        ),
        "incremental_join_ratio_cold": round(
            statistics.median(incremental["engine"][::3]) / statistics.median(incremental["spans"][::3]), 3
        ),
        "per_detector_median_seconds": {
            name: {k: round(statistics.median(v), 2) for k, v in per.items()} for name, per in detectors_seconds.items()
        },
    }
    if before is not None:
        figures = {"before": before, "after": figures, "compared_to": args.compare, **comparison(before, figures)}
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    sys.exit(main())
