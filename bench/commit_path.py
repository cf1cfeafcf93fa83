"""Where the writer's time goes per span: each step of a group commit, by group size, on one thread.

    .venv/bin/python bench/commit_path.py [--batches 200]

The ingest benchmark's spans, decoded by the production decoder, are committed as the DuckDB writer
commits them (each batch's identities as it is queued; then concatenate the queued batches, find the new
rows, INSERT from Arrow, COMMIT), into a fresh migrated database per group size, timing each step
(`--split`: of batches decoded as `storage.attributes: split` stores them). A second part prices the
split: decoding the same requests whole and split (the split is done in the decoder), and inserting the
two forms.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa

from collector import native_walk

sys.path.insert(0, str(Path(__file__).parent))
from llm_spans import unique_requests

from collector.decode import Decoder, Encoding, decode_traces
from storage.dedup import Identities, RecentSpans, first_in_group
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.stored_attributes import insert_spans_sql, with_moved


def fresh(workdir: Path, name: str) -> duckdb.DuckDBPyConnection:
    con = open_database(workdir / f"{name}.duckdb")
    migrate.upgrade(con)
    return con


def steps(tables: list[pa.Table], group: int, workdir: Path) -> dict[str, float]:
    """µs per span of each step, committing `group` batches at a time."""
    con = fresh(workdir, f"group-{group}")
    stamp = datetime.now(UTC).replace(tzinfo=None)
    spent = dict.fromkeys(("identities (at submit)", "concatenate", "new rows", "insert", "commit"), 0.0)
    recent = RecentSpans(300, 1_000_000)  # the writer's duplicate window, at its defaults
    for i in range(0, len(tables), group):
        z = time.perf_counter()
        # Computed as each batch is queued, on the thread that decoded it; the writer's steps follow.
        queued = [with_moved(t) for t in tables[i : i + group]]
        identities = [Identities.of(t) for t in queued]
        a = time.perf_counter()
        batch = pa.concat_tables(queued)
        b = time.perf_counter()
        keys = [k for ids in identities for k in ids.keys]
        keep = first_in_group(identities, batch)
        recent.contains(keys)
        if not all(keep):
            batch = batch.filter(pa.array(keep, pa.bool_()))
        recent.add(keys, time.time())
        c = time.perf_counter()
        con.execute("BEGIN")
        con.register("batch", batch)
        con.execute(insert_spans_sql("batch", tuple(batch.column_names)), [stamp])
        d = time.perf_counter()
        con.execute("COMMIT")
        con.unregister("batch")
        e = time.perf_counter()
        for step, seconds in zip(spent, (a - z, b - a, c - b, d - c, e - d), strict=True):
            spent[step] += seconds
    con.close()
    rows = sum(t.num_rows for t in tables)
    return {step: round(seconds / rows * 1e6, 2) for step, seconds in spent.items()}


def split_prices(requests: list[bytes], workdir: Path) -> dict[str, float]:
    """µs per span: decoding whole and split (each decoder), and inserting the two forms."""
    rows = 0
    prices = {}
    decoders = [d for d in Decoder if d is Decoder.PYTHON or native_walk.AVAILABLE]
    forms: dict[str, list[pa.Table]] = {}
    for decoder in decoders:
        for split in (False, True):
            started = time.perf_counter()
            tables = [
                decode_traces(r, Encoding.PROTOBUF, decoder=decoder, split_attributes=split).spans for r in requests
            ]
            seconds = time.perf_counter() - started
            rows = sum(t.num_rows for t in tables if t is not None)
            form = "split" if split else "whole"
            prices[f"decode {form}, {decoder.value}"] = seconds / rows * 1e6
            forms[form] = [with_moved(t) for t in tables if t is not None]
    stamp = datetime.now(UTC).replace(tzinfo=None)
    for form, batches in forms.items():
        con = fresh(workdir, f"insert-{form}")
        started = time.perf_counter()
        for batch in batches:
            con.register("batch", batch)
            con.execute(insert_spans_sql("batch", tuple(batch.column_names)), [stamp])
            con.unregister("batch")
        con.execute("CHECKPOINT")
        prices[f"insert {form} + checkpoint"] = (time.perf_counter() - started) / rows * 1e6
        con.close()
    return {k: round(v, 2) for k, v in prices.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=200, help="1,000-span batches")
    parser.add_argument("--split", action="store_true", help="commit batches decoded split (storage.attributes)")
    args = parser.parse_args()
    t0 = (int(time.time()) - 3600) * 10**9
    requests = unique_requests(args.batches, 1000, seed=5, t0_ns=t0)
    tables = [decode_traces(r, Encoding.PROTOBUF, split_attributes=args.split).spans for r in requests]
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="tw-commit-") as tmp:
        for group in (1, 4, 16):
            figures = steps(tables, group, Path(tmp))
            figures["total"] = round(sum(figures.values()), 2)
            results[f"group of {group * 1000} rows"] = figures
            print(f"group of {group * 1000:>6} rows: {figures} µs/span", flush=True)
        results["split"] = split_prices(requests[:60], Path(tmp))
        print(f"split: {results['split']} µs/span", flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
