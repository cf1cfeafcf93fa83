"""Bytes on disk per stored span, at a realistic size (10M spans by default), and how each column is stored.

    .venv/bin/python bench/storage_bytes.py [--spans 10000000] [--keep /path/spans.duckdb]

The ingest benchmark's spans (vLLM-style, 20 attributes, 5 resource attributes, every id unique) are
decoded by the production decoder and inserted into a migrated database 10,000 rows a commit, as the
writer's group commits do under load; then a checkpoint, and the file's size over the rows. Memory
stays bounded: requests are generated, decoded and inserted a chunk at a time.
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

BATCH = 1000
PER_COMMIT = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, help="keep the database here instead of a temporary directory")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tw-bytes-"))
    path = args.keep or workdir / "spans.duckdb"
    con = open_database(path)
    migrate.upgrade(con)
    stamp = datetime.now(UTC).replace(tzinfo=None)
    t0 = (int(time.time()) - 3600) * 10**9
    started = time.perf_counter()
    rows = 0
    for chunk in range(args.spans // (BATCH * 100)):
        requests = unique_requests(100, BATCH, seed=chunk, t0_ns=t0)
        tables = [decode_traces(r, Encoding.PROTOBUF).spans for r in requests]
        for i in range(0, len(tables), PER_COMMIT):
            group = pa.concat_tables([t for t in tables[i : i + PER_COMMIT] if t is not None])
            columns = ", ".join(group.column_names)
            con.register("batch", group)
            con.execute(f"INSERT INTO spans ({columns}, ingested_at) SELECT {columns}, ? FROM batch", [stamp])
            con.unregister("batch")
            rows += group.num_rows
        if chunk % 10 == 9:
            print(f"{rows:,} spans stored, {time.perf_counter() - started:.0f} s", flush=True)
    con.execute("CHECKPOINT")
    compression = con.execute(
        "SELECT column_name, string_agg(DISTINCT compression, ', ') FROM pragma_storage_info('spans') "
        "GROUP BY column_name ORDER BY column_name"
    ).fetchall()
    con.close()
    size = path.stat().st_size
    print(f"decoder: {DEFAULT_DECODER.value}")
    print(f"{rows:,} spans, database file {size / 2**20:,.0f} MiB: {size / rows:.1f} bytes per stored span")
    print("compression per column:", "; ".join(f"{c}: {k}" for c, k in compression))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
