"""slo_burn's cost: one evaluation of 100 SLO groups over 30 days of stored counts, and what counting a
window's requests costs per request.

    .venv/bin/python bench/slo_burn.py [--groups 100] [--days 30] [--requests 1000000]

A migrated database gets 30 days of per-minute counts for 100 tenants (what 30 days of 5-minute
evaluations store: 4.3 million rows) and one 5-minute window of `--requests` LLM requests spread over
the tenants. Then the detection pass evaluates slo_burn (one SLO grouped by tenant, the default rules:
six trailing windows) three times, as the scheduler would: the figures, the alerts and the window's
minutes are persisted each time. Reported: the pass's seconds, and the same with an empty window (the
stored counts alone), so the difference is the cost of counting the window's requests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from detectors.detection import DetectionPass
from detectors.slo_burn import KEY, Config, Sli, Slo
from storage.duckdb.backend import DuckDBStorage

AT = datetime(2026, 11, 20, 12, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--requests", type=int, default=1_000_000)
    args = parser.parse_args()
    config = Config(slos=(Slo(name="ttft-2s", objective=0.99, sli=Sli(ttft_ms_max=2000), group_by=("tenant_id",)),))
    window = config.window(AT)
    with tempfile.TemporaryDirectory(prefix="tw-slo-") as tmp:
        storage = DuckDBStorage.open(Path(tmp) / "slo.duckdb")
        try:
            started = time.perf_counter()
            storage.writer.submit(lambda con: _history(con, window.start, args.groups, args.days)).result()
            print(f"stored counts: {args.groups * args.days * 1440:,} minutes in {time.perf_counter() - started:.0f} s")
            detection = DetectionPass(storage.windows, storage.detector_store, {KEY: config})
            empty = _timed(detection, 3)
            storage.writer.submit(lambda con: _window(con, window.start, args.groups, args.requests)).result()
            full = _timed(detection, 3)
            [(rows,)] = storage.reader.rows("SELECT count(*) FROM slo_burn WHERE window_end = ?", [window.end])
            [(firing,)] = storage.reader.rows("SELECT count(*) FROM alerts WHERE state = 'firing'")
        finally:
            storage.close()
    print(f"{args.groups} groups x {args.days} days, empty window: {_show(empty)}")
    print(f"{args.groups} groups x {args.days} days, window of {args.requests:,} requests: {_show(full)}")
    per_request = (statistics.median(full) - statistics.median(empty)) / args.requests * 1e6
    print(f"counting the window: {per_request:.2f} us a request; figures rows {rows}, firing alerts {firing}")


def _history(con, before: datetime, groups: int, days: int) -> None:  # type: ignore[no-untyped-def]
    # One row per tenant and minute, 20 requests a minute, tenant 7 burning 5 % for the last hour.
    con.execute(
        """
        INSERT INTO slo_burn_minutes
        SELECT m - INTERVAL 4 MINUTE, m + INTERVAL 1 MINUTE, m + INTERVAL 3 MINUTE, 'ttft-2s',
               printf('t%03d', g), NULL, NULL, m,
               CASE WHEN g = 7 AND m >= ?::TIMESTAMP - INTERVAL 1 HOUR THEN 19 ELSE 20 END, 20,
               CASE WHEN g = 7 AND m >= ?::TIMESTAMP - INTERVAL 1 HOUR THEN false ELSE true END
        FROM range(?) AS a(g),
             LATERAL (SELECT ?::TIMESTAMP - to_minutes(? - i) AS m FROM range(?) AS b(i))
        """,
        [before, before, groups, before, days * 1440, days * 1440],
    )


def _window(con, start: datetime, groups: int, requests: int) -> None:  # type: ignore[no-untyped-def]
    con.execute(
        """
        INSERT INTO span_rows (trace_id, span_id, name, kind, start_time, end_time, duration_ms, status_code, tenant_id,
                           is_llm, llm_role, ttft_ms, e2e_ms, ingested_at)
        SELECT 't' || i, 's', 'llm_request', 'SERVER', e, e, 0, 'OK', printf('t%03d', i % ?), true, 'server',
               CASE WHEN i % 50 = 0 THEN 5000.0 ELSE 300.0 END, 1000.0, e
        FROM range(?) AS r(i), LATERAL (SELECT ?::TIMESTAMP + to_microseconds(i * (300000000 // ?)) AS e)
        """,
        [groups, requests, start, requests],
    )


def _timed(detection: DetectionPass, times: int) -> list[float]:
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        [result] = detection.run(AT, only=[KEY])
        seconds.append(time.perf_counter() - started)
        assert result.outcome == "ok", result.error
    return seconds


def _show(seconds: list[float]) -> str:
    return f"median {statistics.median(seconds):.3f} s (runs: {', '.join(f'{s:.3f}' for s in seconds)})"


if __name__ == "__main__":
    main()
