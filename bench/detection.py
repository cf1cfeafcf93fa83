"""Detector benchmark: one full pass over a 24-hour window of 10 million spans, then incremental runs.

    .venv/bin/python bench/detection.py [--spans 10000000] [--keep DB] [--threads N]

Spans are generated straight into DuckDB with SQL (sending 10M spans over OTLP would take minutes and
measure ingest, not detection): 50 tenants with skewed rates, 8 replicas, 3 models, realistic token
counts and latencies, cache hit ratios, queue depth and scores on a tenth of the requests.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from detectors.registry import REGISTRY
from tailwatch.compose import detection_pass, open_storage
from tailwatch.settings import load_settings

GENERATE = """
INSERT INTO span_rows (trace_id, span_id, name, kind, start_time, end_time, duration_ms, status_code, service_name,
    tenant_id, replica_id, deployment, model, operation, is_llm, llm_role, input_tokens, output_tokens,
    cached_input_tokens, ttft_ms, tpot_ms, queue_ms, prefill_ms, decode_ms, e2e_ms, cache_hit_ratio, queue_depth,
    replica_count, batch_size, prefill_tokens_in_batch, quantization, attributes_rest, resource, ingested_at)
SELECT md5(i::VARCHAR), left(md5(i::VARCHAR || 's'), 16), 'llm_request', 'SERVER',
    end_time - to_milliseconds(e2e::BIGINT), end_time, e2e, CASE WHEN random() < 0.01 THEN 'ERROR' ELSE 'OK' END,
    deployment, tenant, 'r' || (i % 8), deployment, model, 'chat', true, 'server', input_tokens, output_tokens,
    cached, ttft, tpot, queue, ttft - queue, tpot * (output_tokens - 1), e2e, cached / input_tokens, qd, 8, 32,
    prefill, quant, '{}', '{}', end_time
FROM (
    SELECT i, end_time, tenant, model, deployment, input_tokens, output_tokens, cached, qd, prefill, quant,
        queue, ttft, tpot, queue + ttft + tpot * (output_tokens - 1) AS e2e
    FROM (
        SELECT i,
            ?::TIMESTAMP + to_microseconds((i::DOUBLE / ? * 86400e6)::BIGINT) AS end_time,
            'tenant-' || (floor(pow(random(), 3) * 50))::INT AS tenant,
            ['llama-3.1-8b', 'qwen2.5-32b', 'mistral-7b'][1 + i % 3] AS model,
            ['vllm-a', 'vllm-b'][1 + i % 2] AS deployment,
            (50 + random() * 8000)::INT AS input_tokens,
            (2 + random() * 1500)::INT AS output_tokens,
            ((50 + random() * 8000) * random())::INT AS cached,
            (random() * 40)::INT AS qd,
            (random() * 8000)::INT AS prefill,
            ['fp16', 'fp8', 'int4'][1 + i % 3] AS quant,
            random() * 50 AS queue, 80 + random() * 400 AS ttft, 8 + random() * 12 AS tpot
        FROM range(?) t(i)
    )
)
"""

SCORES = """
INSERT INTO span_scores
SELECT trace_id, span_id, name, score, NULL, NULL, 'attribute', end_time, end_time
FROM (SELECT trace_id, span_id, end_time FROM spans USING SAMPLE 10%) s,
     (VALUES ('json_adherence'), ('groundedness')) n(name), LATERAL (SELECT 0.6 + random() * 0.4 AS score)
"""


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, help="reuse or keep the generated database at this path")
    parser.add_argument("--only", nargs="*", help="run only these detectors (default: every one)")
    parser.add_argument("--threads", default="auto", help="storage.threads: DuckDB's worker threads (default auto)")
    args = parser.parse_args()
    at = datetime(2026, 11, 21, 0, 0)
    start = at - timedelta(hours=24)
    workdir = Path(tempfile.mkdtemp(prefix="tw-detect-bench-"))
    db = args.keep or workdir / "bench.duckdb"
    fresh = not db.exists()
    # The service's defaults (512MB for DuckDB), built as `serve` and `detect` build them.
    defaults = load_settings(None, {"db": str(db), "storage": {"threads": args.threads}}, environ={})
    # Full pass: every detector over the whole day as one window (token_latency: its last window against
    # the full 24-hour baseline, which is what it always reads).
    day = {"window_seconds": 86400, "settle_seconds": 0}
    # A day of 10 million requests as one window is a backfill: its frames take gigabytes, past what the
    # pass holds by default (storage.detection_memory_mb), so this run lifts the bound.
    full = load_settings(
        None,
        {
            "db": str(db),
            "storage": {"detection_memory_mb": 65536, "threads": args.threads},
            "detectors": {k: day for k in REGISTRY if k != "token_latency"},
        },
        environ={},
    )
    storage = open_storage(defaults)
    if fresh:
        t = time.perf_counter()

        def generate(con: Any) -> None:
            con.execute(GENERATE, [start, args.spans, args.spans])
            con.execute(SCORES)

        storage.writer.submit(generate).result()
        storage.writer.submit(lambda con: con.execute("CHECKPOINT")).result()
        print(f"generated {args.spans:,} spans in {time.perf_counter() - t:.1f}s", flush=True)

    results = {}
    t = time.perf_counter()
    for r in detection_pass(full, storage).run(at, args.only):
        results[f"full/{r.detector}"] = round(r.seconds, 2)
        assert r.outcome == "ok", r.error
    results["full_pass_seconds"] = round(time.perf_counter() - t, 2)
    first_four = ("token_latency", "cache_curve", "traffic_pattern", "tenant_fairness")
    if all(f"full/{k}" in results for k in first_four):
        results["full_pass_seconds_first_four"] = round(sum(results[f"full/{k}"] for k in first_four), 2)
    results["full_pass_peak_rss_mib"] = round(peak_rss_mib())

    incremental = detection_pass(defaults, storage)
    times = []
    for step in range(3):
        t = time.perf_counter()
        for r in incremental.run(at - timedelta(minutes=5 * step), args.only):
            results[f"incremental{'_cold' if step == 0 else ''}/{r.detector}"] = round(r.seconds, 2)
            assert r.outcome == "ok", r.error
        times.append(time.perf_counter() - t)
    # The first pass reads the day-long token_latency baseline; the pass then reuses it for the hour.
    results["incremental_pass_seconds_cold"] = round(times[0], 2)
    results["incremental_pass_seconds_warm_max"] = round(max(times[1:]), 2)
    results["peak_rss_mib"] = round(peak_rss_mib())
    storage.close()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
