"""The storage writer alone: decoded 1,000-span batches, N in flight, no decoders competing.

.venv/bin/python bench/writer.py [--in-flight 4] [--batches 300]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llm_spans import unique_requests

from collector.decode import Encoding, decode_traces
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.writer import Writer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--batches", type=int, default=300)
    args = parser.parse_args()
    requests = unique_requests(args.batches, 1000, seed=7, t0_ns=(int(time.time()) - 3600) * 10**9)
    tables = [decode_traces(r, Encoding.PROTOBUF).spans for r in requests]
    with tempfile.TemporaryDirectory() as tmp:
        con = open_database(Path(tmp) / "writer.duckdb")
        migrate.upgrade(con)
        writer = Writer(con, max_queued_spans=200_000, dedup_window_seconds=300, dedup_max_spans=1_000_000)
        writer.start()
        slots = threading.Semaphore(args.in_flight)
        started = time.perf_counter()
        futures = []
        for table in tables:
            slots.acquire()
            future = writer.try_submit(table)
            assert future is not None
            future.add_done_callback(lambda _: slots.release())
            futures.append(future)
        for f in futures:
            f.result()
        seconds = time.perf_counter() - started
        writer.close()
        con.close()
    rows = sum(t.num_rows for t in tables)
    print(f"writer alone: {rows / seconds:,.0f} rows/s ({seconds / rows * 1e6:.1f} µs/row), {args.in_flight} in flight")


if __name__ == "__main__":
    main()
