"""Console benchmark: how long each page takes to draw over a day of 10 million stored spans, in a real browser.

    .venv/bin/python bench/console.py [--spans 10000000] [--keep DB] [--runs 5]

Builds (or reuses, with --keep) a store holding a day of spans ending now (generated with the detection
benchmark's SQL) and the day's figures (the detectors evaluated every 5 minutes over it, as the scheduler
would have), starts `tailwatch serve` on it, and opens each page in the system's headless Chromium, timing
from navigation to the page's drawn flag. The ceiling, measured in the same run, is the time the API takes
to answer the same requests without a browser: what is left is the browser's share.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from detection import GENERATE, SCORES  # the detection benchmark's generator (bench/ is on sys.path)
from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serverproc import ServerProcess

from tailwatch.compose import detection_pass, open_storage
from tailwatch.settings import load_settings

STEP = timedelta(minutes=5)
VIEWS = ["overview", "tokens", "tenants", "curves", "request"]


def build(db: Path, spans: int, end: datetime) -> None:
    settings = load_settings(None, {"db": str(db)}, environ={})
    storage = open_storage(settings)
    try:
        t = time.perf_counter()
        start = end - timedelta(hours=24)
        storage.writer.submit(lambda con: (con.execute(GENERATE, [start, spans, spans]), con.execute(SCORES))).result()
        storage.writer.submit(lambda con: con.execute("CHECKPOINT")).result()
        print(f"generated {spans:,} spans in {time.perf_counter() - t:.0f} s", flush=True)
        t = time.perf_counter()
        detection = detection_pass(settings, storage)
        at = start + STEP
        while at <= end:
            for r in detection.run(at + timedelta(seconds=30)):
                assert r.outcome == "ok", r.error
            at += STEP
        print(f"evaluated the day's 288 windows in {time.perf_counter() - t:.0f} s", flush=True)
    finally:
        storage.close()


def fetch_seconds(base: str, paths: list[str]) -> float:
    t = time.perf_counter()
    for path in paths:
        with urllib.request.urlopen(base + path, timeout=60) as response:
            response.read()
    return time.perf_counter() - t


def api_paths(view: str, trace: str, first_group: str) -> list[str]:
    """What each view asks the API for over the default range (the last 24 hours), in the same order."""
    now = datetime.now(UTC).replace(tzinfo=None)
    day = f"from={now - timedelta(hours=24):%Y-%m-%dT%H:%M:%SZ}&to={now:%Y-%m-%dT%H:%M:%SZ}"
    before = f"from={now - timedelta(hours=48):%Y-%m-%dT%H:%M:%SZ}&to={now - timedelta(hours=24):%Y-%m-%dT%H:%M:%SZ}"
    if view == "overview":
        return ["/v1/alerts?state=firing&limit=200", "/v1/alerts?limit=200", "/v1/clusters?limit=200", "/v1/status"]
    if view == "tokens":
        listing = f"/v1/figures/token_latency?{day}&columns=grouping,model,deployment,tenant_id&distinct=true"
        return [listing, f"/v1/figures/token_latency?{day}&{first_group}"]
    if view == "tenants":
        columns = "window_end,tenant_id,n,latency_p99,ttft_p99,aggregate_p99,aggregate_ttft_p99,jain_index"
        return [f"/v1/figures/tenant_fairness?{day}&distinct=true&columns={columns}"]
    if view.startswith("request"):
        return [trace]
    names = ["cache_curve", "saturation", "traffic_pattern", "replica_skew", "quantization_delta", "context_length"]
    return [f"/v1/figures/{n}?{day}" for n in names] + [f"/v1/figures/{n}?{before}" for n in names[:2]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, help="reuse or keep the database at this path")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="tw-console-bench-"))
    db = args.keep or workdir / "bench.duckdb"
    if not db.exists():
        now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
        build(db, args.spans, now - timedelta(minutes=now.minute % 5))
    server = ServerProcess(db, workdir / "serve.log").start(timeout=300)
    results: dict[str, Any] = {"spans": args.spans}
    try:
        base = f"http://127.0.0.1:{server.api_port}"
        # A request from the middle of the day, opened as a cluster's example is (its window bounds the search).
        sql = json.dumps({"sql": "SELECT trace_id, end_time FROM spans ORDER BY end_time LIMIT 1 OFFSET ?",
                          "params": [args.spans // 2]}).encode()  # fmt: skip
        req = urllib.request.Request(base + "/v1/sql", data=sql, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as response:
            [[trace_id, end_time]] = json.loads(response.read())["rows"]
        at = datetime.fromisoformat(end_time.rstrip("Z"))
        bound = f"from={at - timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}&to={at + timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}"
        trace = f"/v1/traces/{trace_id}?{bound}"
        # The per-token page's first group, which it opens on: the first model-level one.
        first_group = "grouping=model&model=llama-3.1-8b&deployment=vllm-a"
        fragments = {v: v for v in VIEWS} | {"request": f"request?trace={trace_id}&at={end_time}"}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for view in VIEWS:
                draws, apis = [], []
                for _ in range(args.runs):
                    page.goto("about:blank")
                    t = time.perf_counter()
                    page.goto(f"{base}/#/{fragments[view]}")  # the default range: the last 24 hours
                    page.wait_for_selector("body[data-rendered='1']", timeout=60_000)
                    draws.append(time.perf_counter() - t)
                    apis.append(fetch_seconds(base, api_paths(view, trace, first_group)))
                drawn, api = statistics.median(draws), statistics.median(apis)
                results[view] = {
                    "render_seconds_median": round(drawn, 3),
                    "render_seconds_max": round(max(draws), 3),
                    "api_seconds_median": round(api, 3),
                    "api_share": round(api / drawn, 2),
                    "target_ratio": round(drawn / 1.0, 2),  # against the 1 s target
                }
                print(view, results[view], flush=True)
            browser.close()
    finally:
        server.terminate()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
