"""What DuckDB's checkpoints cost the writer, and whether anything can take them off its path.

    .venv/bin/python bench/checkpoint_cost.py [--spans 1200000]

The ingest benchmark's spans, decoded as the service decodes them, committed 1,000 at a time on one thread
into a fresh migrated database (`storage.threads: 1`, the default on 2 cores), three ways:
- checkpointing every 150k / 300k / 600k spans: the checkpoints' and the commits' CPU a span, and the file;
- one checkpoint of the WAL 300k spans leave, with one DuckDB thread and with two (wall time and CPU);
- a checkpoint on another cursor while the writer goes on committing: how long the commit that starts
  during it takes, against the checkpoint's own time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
from llm_spans import unique_requests

from collector.decode import Encoding, decode_traces
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.stored_attributes import insert_spans_sql, with_moved

BATCH = 1000
NEVER = "1000GB"  # DuckDB's own checkpoint threshold, so that only the ones timed here run


class Store:
    def __init__(self, workdir: Path, name: str, threads: int = 1) -> None:
        self.path = workdir / f"{name}.duckdb"
        self.con = open_database(self.path, threads=threads, checkpoint_threshold=NEVER)
        migrate.upgrade(self.con)
        self.con.execute("CHECKPOINT")
        self.stamp = datetime.now(UTC).replace(tzinfo=None)

    def commit(self, batch: pa.Table) -> None:
        con = self.con
        con.execute("BEGIN")
        con.register("_batch", batch)
        con.execute(insert_spans_sql("_batch", tuple(batch.column_names)), [self.stamp])
        con.execute("COMMIT")
        con.unregister("_batch")

    def wal_bytes(self) -> int:
        wal = Path(f"{self.path}.wal")
        return wal.stat().st_size if wal.exists() else 0


def by_interval(batches: list[pa.Table], every: int, workdir: Path) -> dict[str, float]:
    """CPU µs a span in commits and in checkpoints, checkpointing every `every` batches."""
    store = Store(workdir, f"every-{every}")
    commits = checkpoints = 0.0
    for i, batch in enumerate(batches, 1):
        t = time.thread_time()
        store.commit(batch)
        commits += time.thread_time() - t
        if i % every == 0:
            t = time.thread_time()
            store.con.execute("CHECKPOINT")
            checkpoints += time.thread_time() - t
    store.con.close()
    spans = len(batches) * BATCH
    return {
        "checkpoints_us_per_span": round(checkpoints / spans * 1e6, 2),
        "commits_us_per_span": round(commits / spans * 1e6, 2),
        "file_bytes_per_span": round(store.path.stat().st_size / spans),
    }


def one_checkpoint(batches: list[pa.Table], threads: int, workdir: Path) -> dict[str, float]:
    """Wall and process CPU seconds of one checkpoint of `batches`, DuckDB on `threads` threads."""
    store = Store(workdir, f"threads-{threads}", threads=threads)
    for batch in batches:
        store.commit(batch)
    wal = store.wal_bytes()
    cpu, wall = time.process_time(), time.perf_counter()
    store.con.execute("CHECKPOINT")
    result = {
        "wal_bytes_per_span": round(wal / (len(batches) * BATCH)),
        "wall_s": round(time.perf_counter() - wall, 3),
        "cpu_s": round(time.process_time() - cpu, 3),
    }
    store.con.close()
    return result


def beside(batches: list[pa.Table], later: list[pa.Table], workdir: Path) -> dict[str, float]:
    """A checkpoint on another cursor while the writer commits: the first commit's wall time against it."""
    store = Store(workdir, "beside")
    for batch in batches:
        store.commit(batch)
    cursor = store.con.cursor()
    took: list[float] = []

    def checkpoint() -> None:
        t = time.perf_counter()
        cursor.execute("CHECKPOINT")
        took.append(time.perf_counter() - t)

    thread = threading.Thread(target=checkpoint)
    thread.start()
    time.sleep(0.01)  # let the checkpoint begin
    t = time.perf_counter()
    store.commit(later[0])
    commit = time.perf_counter() - t
    thread.join()
    store.con.close()
    return {"checkpoint_s": round(took[0], 3), "commit_started_during_it_s": round(commit, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=1_200_000, help="spans committed in the first part")
    args = parser.parse_args()
    n = args.spans // BATCH
    print(f"decoding {n} requests of {BATCH} spans ...", file=sys.stderr)
    batches = [
        with_moved(decode_traces(r, Encoding.PROTOBUF, split_attributes=True).spans)
        for r in unique_requests(n, BATCH, 7, time.time_ns())
    ]
    share = min(300, n - 1)  # the WAL the 256MB default leaves: ~300k spans
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        report = {
            "checkpoint every N spans": {
                f"{every * BATCH:,}": by_interval(batches, every, workdir) for every in (150, 300, 600) if every <= n
            },
            "one checkpoint of ~300k spans": {
                f"threads {threads}": one_checkpoint(batches[:share], threads, workdir) for threads in (1, 2)
            },
            "a checkpoint on another cursor": beside(batches[:share], batches[share:], workdir),
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    try:
        main()
    except duckdb.Error as exc:
        sys.exit(f"checkpoint_cost: {exc}")
