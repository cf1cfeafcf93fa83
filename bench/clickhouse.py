"""ClickHouse (chDB, in-process) beside DuckDB in one run: ingest through the sink, then a full detector pass.

    .venv/bin/python bench/clickhouse.py [--spans 1000000] [--hours 24]

`--spans` LLM server spans (seeded figures, 8 replicas, 3 tenants, 2 models) spread over `--hours`, are
submitted to each backend's sink in batches of 5,000 (as receivers hand them over) and waited for; then
every default detector is evaluated once at the end of the range, as the scheduler does. Reported per
backend: spans/s stored, the pass's seconds, and the ratio of chDB's figures to DuckDB's measured in the
same run (the machine is shared: ratios travel, absolute figures do not).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
from polars.testing import assert_frame_equal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from detectors.registry import REGISTRY
from model.columns import SPAN_BATCH_SCHEMA
from storage.clickhouse.backend import ClickHouseStorage
from storage.duckdb.backend import DuckDBStorage
from tailwatch.compose import detection_pass
from tailwatch.settings import Settings

END = datetime(2026, 11, 20, 12, 0)
BATCH = 5_000


def batches(total: int, hours: float) -> list[pa.Table]:
    rng = np.random.default_rng(7)
    out = []
    first = np.datetime64(END - timedelta(hours=hours), "us")
    step_us = hours * 3600e6 / total
    for offset in range(0, total, BATCH):
        n = min(BATCH, total - offset)
        i = np.arange(offset, offset + n)
        e2e = rng.uniform(200, 4000, n)
        ends = first + (i * step_us).astype("timedelta64[us]")
        columns: dict[str, object] = {
            "trace_id": [f"{k:032x}" for k in i], "span_id": [f"{k + 1:016x}" for k in i],
            "name": ["llm_request"] * n, "kind": ["SERVER"] * n,
            "start_time": ends - (e2e * 1000).astype("timedelta64[us]"), "end_time": ends, "duration_ms": e2e,
            "status_code": np.where(i % 37 == 0, "ERROR", "OK"), "is_llm": np.ones(n, bool),
            "llm_role": ["server"] * n, "model": np.where(i % 2 == 0, "llama", "qwen"),
            "deployment": ["vllm-a"] * n, "tenant_id": np.array(["acme", "globex", "initech"])[i % 3],
            "replica_id": np.array([f"r{k}" for k in range(8)])[i % 8], "input_tokens": rng.integers(50, 9000, n),
            "output_tokens": rng.integers(2, 900, n), "e2e_ms": e2e, "ttft_ms": rng.uniform(50, 400, n),
            "tpot_ms": rng.uniform(8, 40, n), "cache_hit_ratio": rng.random(n),
            "queue_depth": rng.integers(0, 30, n), "replica_count": np.full(n, 8),
            "quantization": np.where(i % 4 == 3, "int4", "fp16"),
        }  # fmt: skip
        arrays = [
            pa.array(columns[f.name]).cast(f.type) if f.name in columns else pa.nulls(n, f.type)
            for f in SPAN_BATCH_SCHEMA
        ]
        out.append(pa.Table.from_arrays(arrays, schema=SPAN_BATCH_SCHEMA))
    return out


def measure(name: str, store: DuckDBStorage | ClickHouseStorage, data: list[pa.Table]) -> dict[str, float]:
    started = time.perf_counter()
    futures = []
    for table in data:
        while (future := store.sink.try_submit(table)) is None:
            time.sleep(0.01)
        futures.append(future)
    for future in futures:
        future.result()
    ingest = time.perf_counter() - started
    spans = sum(t.num_rows for t in data)
    detection = detection_pass(Settings(), store)
    started = time.perf_counter()
    results = detection.run(END)
    seconds = time.perf_counter() - started
    failed = [r.detector for r in results if r.outcome != "ok"]
    print(f"{name}: {spans / ingest:,.0f} spans/s stored; detector pass {seconds:.1f} s; failed: {failed or 'none'}")
    return {"spans_per_s": spans / ingest, "pass_s": seconds}


def figures(store: DuckDBStorage | ClickHouseStorage) -> dict[str, pl.DataFrame]:
    """Every detector table, the alerts and the clusters, without the evaluation's own times."""
    out = {}
    for key in [*REGISTRY, "alerts", "clusters"]:
        frame = pl.from_arrow(store.analyst.run(f"SELECT * FROM {key}", max_rows=10_000_000).table)
        assert isinstance(frame, pl.DataFrame)
        out[key] = frame.drop(
            [c for c in ("evaluated_at", "_version", "started_at", "updated_at") if c in frame.columns]
        )
    return out


def compare(duck: dict[str, pl.DataFrame], click: dict[str, pl.DataFrame]) -> None:
    """Row for row: which tables are identical to the bit, which only within 1e-12 (means), which differ."""
    for key, stored in duck.items():
        d = stored.sort(stored.columns)
        c = click[key].select(d.columns).cast(dict(d.schema), strict=False).sort(d.columns)
        try:
            assert_frame_equal(d, c, check_exact=True)
            verdict = "identical"
        except AssertionError:
            try:
                assert_frame_equal(d, c, check_exact=False, rel_tol=1e-12, abs_tol=0)
                verdict = "equal within 1e-12"
            except AssertionError as exc:
                verdict = f"DIFFERENT: {str(exc).splitlines()[0]}"
        print(f"  {key}: {d.height} rows, {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--hours", type=float, default=24)
    args = parser.parse_args()
    data = batches(args.spans, args.hours)
    work = Path(tempfile.mkdtemp(prefix="tw-bench-ch-"))
    try:
        duck = DuckDBStorage.open(work / "bench.duckdb")
        try:
            d = measure("duckdb", duck, data)
            duck_figures = figures(duck)
        finally:
            duck.close()
        click = ClickHouseStorage.open(f"chdb://{work / 'chdb'}?database=bench")
        try:
            c = measure("chdb", click, data)
            print("figures, chDB against DuckDB:")
            compare(duck_figures, figures(click))
        finally:
            click.close()
        print(
            f"chdb/duckdb: ingest {c['spans_per_s'] / d['spans_per_s']:.2f}x, "
            f"detector pass {c['pass_s'] / d['pass_s']:.2f}x the time"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
