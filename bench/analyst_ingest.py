"""Ingest while analysts query: durable spans/s with and without a heavy query running the whole time.

    .venv/bin/python bench/analyst_ingest.py [--history 2000000] [--spans 300000] [--concurrency 4]

The database starts with `--history` LLM request spans (generated with SQL, as bench/detection.py
does), so the analyst's query has a real day to chew on. Then the same number of spans is sent three
times through OTLP/gRPC: alone, with an analyst query loop running back to back over POST /v1/sql, and
alone again. The figure is the middle run against the mean of the two around it, from the same
process on the same data, so machine noise largely cancels.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).parent))
from detection import GENERATE, SCORES
from ingest import add_settings_flag, run_server, send_all, server_settings
from llm_spans import unique_requests

from storage.duckdb import migrate
from storage.duckdb.database import open_database

# A day of requests, paired and grouped: what an analyst asking "p99 by tenant and model" costs.
HEAVY = """
    SELECT tenant_id, model, count(*) AS requests, quantile_cont(e2e_ms, 0.99) AS e2e_p99_ms,
           quantile_cont(tpot_ms, 0.99) AS tpot_p99_ms, avg(cache_hit_ratio) AS cache_hit_mean
    FROM llm_requests GROUP BY ALL ORDER BY e2e_p99_ms DESC
"""


def query(api_port: int, statement: str) -> float:
    body = json.dumps({"sql": statement}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{api_port}/v1/sql", body, {"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:
        resp.read()
    return time.perf_counter() - started


def analyst_loop(api_port: int, stop: threading.Event, seconds: list[float]) -> None:
    while not stop.is_set():
        seconds.append(query(api_port, HEAVY))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=2_000_000, help="request spans already stored")
    parser.add_argument("--spans", type=int, default=300_000, help="spans sent in each of the three runs")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    add_settings_flag(parser)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="tw-analyst-bench-"))
    db = workdir / "bench.duckdb"
    con = open_database(db)
    migrate.upgrade(con)
    start = datetime.now().replace(microsecond=0) - timedelta(hours=24)
    con.execute(GENERATE, [start, args.history, args.history])
    con.execute(SCORES)
    con.execute("CHECKPOINT")
    con.close()

    n = args.spans // args.batch
    t0 = (int(time.time()) - 3600) * 10**9
    runs = [unique_requests(n, args.batch, seed=seed, t0_ns=t0) for seed in (11, 12, 13)]

    proc, grpc_port, api_port = run_server(db, workdir, server_settings(args))
    results: dict[str, object] = {}
    try:
        idle = [query(api_port, HEAVY) for _ in range(3)]
        results["query_seconds_idle_median"] = round(statistics.median(idle), 2)
        rates = []
        during: list[float] = []
        for i, requests in enumerate(runs):
            stop = threading.Event()
            worker = threading.Thread(target=analyst_loop, args=(api_port, stop, during)) if i == 1 else None
            if worker:
                worker.start()
                time.sleep(0.5)  # the first query is already running when ingest starts
            stats = send_all(f"127.0.0.1:{grpc_port}", requests, args.concurrency)
            stop.set()
            if worker:
                worker.join()
            rates.append(n * args.batch / stats["seconds"])
        alone = (rates[0] + rates[2]) / 2
        results |= {
            "spans_per_s_alone": [round(rates[0]), round(rates[2])],
            "spans_per_s_with_analyst": round(rates[1]),
            "ratio_with_analyst_to_alone": round(rates[1] / alone, 2),
            "analyst_queries_during_ingest": len(during),
            "query_seconds_during_ingest_median": round(statistics.median(during), 2) if during else None,
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        results["server_exit_code"] = proc.wait(120)
    con = duckdb.connect(str(db), read_only=True)
    stored = con.execute("SELECT count(*) FROM spans").fetchall()[0][0]
    con.close()
    results["every_acked_span_stored"] = stored == args.history + 3 * n * args.batch
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
