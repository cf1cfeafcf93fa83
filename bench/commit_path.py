"""Where the writer's time goes per span: each step of a group commit, by group size, on one thread.

    .venv/bin/python bench/commit_path.py [--batches 200]

The ingest benchmark's spans, decoded by the production decoder, are committed as the DuckDB writer
commits them (concatenate the queued batches, find the new rows, INSERT from Arrow, COMMIT), into a
fresh migrated database per group size, timing each step. A second part prices `storage.attributes:
split`: the same batches split once on the side, then inserted, against inserting them whole, so the
cost of inserting split rows shows apart from the split itself. (Before migration 0017 `attributes` was
a virtual column that DuckDB checked on every insert: the rows with no bit set told its check apart.)
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

sys.path.insert(0, str(Path(__file__).parent))
from llm_spans import unique_requests

from collector.decode import Encoding, decode_traces
from storage.dedup import RecentSpans, first_occurrences, span_keys
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.stored_attributes import SPAN_ROWS, insert_spans_sql, strip_sql


def fresh(workdir: Path, name: str) -> duckdb.DuckDBPyConnection:
    con = open_database(workdir / f"{name}.duckdb")
    migrate.upgrade(con)
    return con


def steps(tables: list[pa.Table], group: int, workdir: Path) -> dict[str, float]:
    """µs per span of each step, committing `group` batches at a time."""
    con = fresh(workdir, f"group-{group}")
    stamp = datetime.now(UTC).replace(tzinfo=None)
    spent = dict.fromkeys(("concatenate", "new rows", "insert", "commit"), 0.0)
    recent = RecentSpans(300, 1_000_000)  # the writer's duplicate window, at its defaults
    for i in range(0, len(tables), group):
        a = time.perf_counter()
        batch = pa.concat_tables(tables[i : i + group])
        b = time.perf_counter()
        keys = span_keys(batch).to_list()
        keep = first_occurrences(batch).to_list()
        recent.contains(keys)
        batch = batch.filter(pa.array(keep, pa.bool_()))
        recent.add(keys, time.time())
        c = time.perf_counter()
        con.execute("BEGIN")
        con.register("batch", batch)
        con.execute(insert_spans_sql("batch", tuple(batch.column_names), split=False), [stamp])
        d = time.perf_counter()
        con.execute("COMMIT")
        con.unregister("batch")
        e = time.perf_counter()
        for step, seconds in zip(spent, (b - a, c - b, d - c, e - d), strict=True):
            spent[step] += seconds
    con.close()
    rows = sum(t.num_rows for t in tables)
    return {step: round(seconds / rows * 1e6, 2) for step, seconds in spent.items()}


def split_prices(tables: list[pa.Table], workdir: Path) -> dict[str, float]:
    """µs per span: the split on a side connection, and inserts of whole, split and split-without-bits rows."""
    side = duckdb.connect()
    side.execute("SET threads = 1")
    started = time.perf_counter()
    split = []
    for table in tables:
        side.register("b", table)
        select, source = strip_sql("b")
        kept = ", ".join(c for c in table.column_names if c != "attributes")
        split.append(side.sql(f"SELECT {kept}, {select} FROM {source}").to_arrow_table())
        side.unregister("b")
    rows = sum(t.num_rows for t in tables)
    prices = {"split on the side": (time.perf_counter() - started) / rows * 1e6}
    # The same smaller rows with no bit set: what the rebuild would cost if inserting evaluated it.
    no_bits = [
        t.set_column(t.num_columns - 1, "attributes_moved", pa.array([0] * t.num_rows, pa.uint64())) for t in split
    ]
    stamp = datetime.now(UTC).replace(tzinfo=None)
    for name, batches in (("insert whole", tables), ("insert split", split), ("insert split, no bits", no_bits)):
        con = fresh(workdir, name.replace(" ", "-").replace(",", ""))
        started = time.perf_counter()
        for batch in batches:
            con.register("batch", batch)
            if "attributes" in batch.column_names:
                con.execute(insert_spans_sql("batch", tuple(batch.column_names), split=False), [stamp])
            else:
                names = ", ".join(batch.column_names)
                insert = f"INSERT INTO {SPAN_ROWS} ({names}, ingested_at) SELECT {names}, ? FROM batch"
                con.execute(insert, [stamp])
            con.unregister("batch")
        prices[name] = (time.perf_counter() - started) / rows * 1e6
        con.close()
    return {k: round(v, 2) for k, v in prices.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=200, help="1,000-span batches")
    args = parser.parse_args()
    t0 = (int(time.time()) - 3600) * 10**9
    tables = [decode_traces(r, Encoding.PROTOBUF).spans for r in unique_requests(args.batches, 1000, seed=5, t0_ns=t0)]
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="tw-commit-") as tmp:
        for group in (1, 4, 16):
            figures = steps(tables, group, Path(tmp))
            figures["total"] = round(sum(figures.values()), 2)
            results[f"group of {group * 1000} rows"] = figures
            print(f"group of {group * 1000:>6} rows: {figures} µs/span", flush=True)
        results["split"] = split_prices(tables[:60], Path(tmp))
        print(f"split: {results['split']} µs/span", flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
