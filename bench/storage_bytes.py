"""Bytes on disk per stored span, at a realistic size (10M spans by default), and how each column is stored.

    .venv/bin/python bench/storage_bytes.py [--spans 10000000] [--keep /path/spans.duckdb]
    .venv/bin/python bench/storage_bytes.py --spans 1000000 --compare     # storage.attributes whole vs split

The ingest benchmark's spans (vLLM-style, 20 attributes, 5 resource attributes, every id unique) are
decoded by the production decoder and inserted into a migrated database 10,000 rows a commit, as the
writer's group commits do under load; then a checkpoint, and the file's size over the rows. Memory
stays bounded: requests are generated, decoded and inserted a chunk at a time. Reported too: the insert
rate (inserts and the checkpoint; decoding, where the split is done, apart) and what reading the
attributes back costs.

Stored as `storage.attributes: split` does (what no canonical column holds); with `--compare` the same
spans go into two databases in one run, `whole` (the default) and `split`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
from llm_spans import unique_requests

from collector.decode import DEFAULT_DECODER, Encoding, decode_traces
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.stored_attributes import insert_spans_sql, with_moved

BATCH = 1000
PER_COMMIT = 10
READS = {
    "a moved value": "SELECT count(*) FROM spans WHERE (attributes->>'gen_ai.latency.e2e')::DOUBLE > 1",
    "a kept value": "SELECT count(DISTINCT attributes->>'gen_ai.request.id') FROM spans",
    "a kept value from attributes_rest": "SELECT count(DISTINCT attributes_rest->>'gen_ai.request.id') FROM spans",
    "the whole JSON": "SELECT sum(length(attributes::VARCHAR)) FROM spans",
}


def fill(path: Path, spans: int, *, split: bool) -> tuple[int, float]:
    """Store `spans` spans; the rows stored and the seconds inserting and checkpointing took."""
    con = open_database(path)
    migrate.upgrade(con)
    stamp = datetime.now(UTC).replace(tzinfo=None)
    t0 = (int(time.time()) - 3600) * 10**9
    rows, inserting = 0, 0.0
    for chunk in range(spans // (BATCH * 100)):
        requests = unique_requests(100, BATCH, seed=chunk, t0_ns=t0)
        tables = [decode_traces(r, Encoding.PROTOBUF, split_attributes=split).spans for r in requests]
        for i in range(0, len(tables), PER_COMMIT):
            group = pa.concat_tables([with_moved(t) for t in tables[i : i + PER_COMMIT] if t is not None])
            con.register("batch", group)
            started = time.perf_counter()
            # As the writer inserts.
            con.execute(insert_spans_sql("batch", tuple(group.column_names)), [stamp])
            inserting += time.perf_counter() - started
            con.unregister("batch")
            rows += group.num_rows
        if chunk % 10 == 9:
            print(f"{rows:,} spans stored", flush=True)
    started = time.perf_counter()
    con.execute("CHECKPOINT")
    inserting += time.perf_counter() - started
    con.close()
    return rows, inserting


def reads(path: Path, rows: int) -> dict[str, float]:
    """µs a span of each read, best of three."""
    con = open_database(path)
    out = {}
    for name, sql in READS.items():
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            con.execute(sql).fetchall()
            best = min(best, time.perf_counter() - started)
        out[name] = best / rows * 1e6
    con.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, help="keep the database here instead of a temporary directory")
    parser.add_argument("--compare", action="store_true", help="also store the spans whole, as by default")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tw-bytes-"))
    print(f"decoder: {DEFAULT_DECODER.value}")
    print("| storage | spans | file (MiB) | bytes per stored span | insert + checkpoint rows/s | "
          + " | ".join(f"read {name} (µs/span)" for name in READS) + " |")  # fmt: skip
    print("|---" * (5 + len(READS)) + "|")
    for split in (False, True) if args.compare else (True,):
        path = args.keep or workdir / f"spans-{split}.duckdb"
        rows, seconds = fill(path, args.spans, split=split)
        size = path.stat().st_size
        cost = reads(path, rows)
        label = "split" if split else "whole"
        print(
            f"| {label} | {rows:,} | {size / 2**20:,.0f} | {size / rows:.1f} | {rows / seconds:,.0f} | "
            + " | ".join(f"{cost[name]:.2f}" for name in READS) + " |",
            flush=True,
        )  # fmt: skip
        con = open_database(path)
        per_column = con.execute(
            "SELECT column_name, string_agg(DISTINCT compression, ', ') FROM pragma_storage_info('span_rows') "
            "GROUP BY column_name ORDER BY column_name"
        ).fetchall()
        con.close()
        print("compression per column:", "; ".join(f"{c}: {k}" for c, k in per_column), flush=True)
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
