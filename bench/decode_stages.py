"""Ingest cost by stage, in µs per span, for one workload: what each step of a span's way in costs, one core.

Best of 5, the same 20 requests of 1,000 spans for every row, split attributes (what the service runs):
- `walk`: parse, validate, stored columns, gathered keys, scores and first-token events (compiled, and the
  Python reference for comparison);
- `normalize`: the canonical LLM columns from the gathered keys (collector/normalize.py);
- `split`: the attributes split into rest and moved (model/attribute_split.py);
- `finish`: normalize, split and the final batch together (collector/decode.py);
- `pairing keys`: the identity keys the writer de-duplicates by (storage/dedup.py);
- `spool record`: a batch and its scores as the ingest spool's record, on the decoder's thread while the
  writer is behind (storage/duckdb/writer.py; the spool's own thread then writes and syncs it);
- `insert + commit`: DuckDB inserting the decoded batches into a migrated spans table, a commit each.
Receiving (gRPC, the event loop) is measured end to end by bench/ingest.py's per-thread CPU account.

.venv/bin/python bench/decode_stages.py [--workload flat|mix]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
from workloads import WORKLOADS

from collector import native_walk, span_walk
from collector.decode import Encoding, SpanBatch, decode_traces, default_plan, finish, normalize_batch
from collector.span_walk import Walked
from model.attribute_split import gathered_keys, left_out, split
from storage.dedup import Identities
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.stored_attributes import insert_spans_sql, with_moved
from storage.duckdb.writer import to_record
from storage.span_layout import SPAN_ROWS


def best_of(fn: Callable[[], object], spans: int, rounds: int = 5, setup: Callable[[], object] | None = None) -> float:
    best = float("inf")
    for _ in range(rounds):
        if setup is not None:
            setup()
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best / spans * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="flat")
    args = parser.parse_args()
    requests = WORKLOADS[args.workload](20, 1000, seed=1, t0_ns=(int(time.time()) - 3600) * 10**9)
    plan = default_plan()
    keys = gathered_keys(plan.walk_span_keys)
    walk_args = (keys, plan.walk_resource_keys, left_out(keys))
    walk = native_walk.walk if native_walk.AVAILABLE else span_walk.walk
    walked = [walk(r, *walk_args) for r in requests]
    n = sum(w.spans.num_rows for w in walked)
    batches = [
        SpanBatch(w.span_values, w.resource_values, w.spans["resource_index"], w.spans["name"], w.spans["kind"],
                  w.spans["duration_ms"], w.first_tokens)
        for w in walked
    ]  # fmt: skip
    normalized = [normalize_batch(plan, b)[0] for b in batches]
    finished = [finish(w, plan, split_attributes=True) for w in walked]
    decoded = [f.spans for f in finished]
    tables = [with_moved(t) for t in decoded]
    scored = [(t, f.scores if f.scores.num_rows else None) for t, f in zip(tables, finished, strict=True)]
    workdir = Path(tempfile.mkdtemp(prefix="tw-stages-"))
    con = open_database(workdir / "stages.duckdb")
    migrate.upgrade(con)
    stamp = datetime.now(UTC).replace(tzinfo=None)

    reqs = requests

    def split_of(w: Walked, columns: dict[str, pa.Array]) -> object:
        return split(w.spans["attributes"], w.spans["left_out"], w.span_values, columns)

    def insert() -> None:
        for table in tables:
            con.register("batch", table)
            con.execute(insert_spans_sql("batch", tuple(table.column_names)), [stamp])
            con.unregister("batch")

    stages: list[tuple[str, Callable[[], object]]] = [
        ("walk, python reference", lambda: [span_walk.walk(r, *walk_args) for r in requests]),
        ("normalize", lambda: [normalize_batch(plan, b) for b in batches]),
        ("split", lambda: [split_of(w, c) for w, c in zip(walked, normalized, strict=True)]),
        ("finish (normalize, split, batch)", lambda: [finish(w, plan, split_attributes=True) for w in walked]),
        ("pairing keys", lambda: [Identities.of(t) for t in decoded]),
        ("spool record", lambda: [to_record(t, scores) for t, scores in scored]),
        ("insert + commit (DuckDB)", insert),
        ("decode_traces, whole", lambda: [decode_traces(r, Encoding.PROTOBUF, split_attributes=True) for r in reqs]),
    ]
    if native_walk.AVAILABLE:
        stages.insert(0, ("walk, compiled (with scores)", lambda: [native_walk.walk(r, *walk_args) for r in requests]))
    else:
        print("the compiled decoder is not installed: the Python walk serves", file=sys.stderr)
    print(f"workload {args.workload}: {len(requests)} requests, {n} spans, {sum(map(len, requests)) / n:.0f} B/span")
    figures = {}
    for name, fn in stages:
        empty = (lambda: con.execute(f"DELETE FROM {SPAN_ROWS}")) if fn is insert else None
        figures[name] = best_of(fn, n, setup=empty)
        print(f"{name:40s} {figures[name]:6.2f} µs/span   {1e6 / figures[name]:>9,.0f} spans/s per core", flush=True)
    con.close()


if __name__ == "__main__":
    main()
