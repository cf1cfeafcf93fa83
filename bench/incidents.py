"""Incidents benchmark: what building incidents adds to a scheduled pass, on a day of 10 million spans.

    .venv/bin/python bench/incidents.py [--spans 10000000] [--keep DB] [--alerts 120]

The spans are bench/detection.py's (generated straight into DuckDB; `--keep` reuses its database). On top, a bad
day's evidence is stored through the detector store, as passes would have: `--alerts` alerts on replicas,
tenants and buckets spread over the day (a third of them still firing) and three clusters a window naming
their groups. Then, as of the end of the day:

- a warm scheduled pass with incidents off (every detector over its 5-minute window), the ceiling;
- the incident pass alone, cold (every incident new: each open one reads its replicas' engine facts);
- the incident pass again, warm (nothing changed: no engine read for incidents past their first hour, no write);
- the incident pass after one alert joins the youngest open incident (on its replicas: no engine read);
- the incident pass after an alert opens an incident of its own (its hour before and first minutes are read).

Both incident figures are reported as a ratio to the pass (the target: at most 0.10).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from detection import GENERATE, SCORES

from detectors.alerts import fingerprint
from detectors.base import Window
from detectors.incidents import IncidentPass, Tied
from storage.ports import Alert, EvaluationRecord, RunRecord
from tailwatch.compose import detection_pass, open_storage
from tailwatch.settings import load_settings

GROUPS = (
    [("replica_skew", {"replica_id": f"r{i}", "signal": "json_adherence"}) for i in range(8)]
    + [("tenant_fairness", {"tenant_id": f"tenant-{i}", "signal": "latency_p99"}) for i in range(10)]
    + [("cache_curve", {"bucket": b, "signal": "groundedness"}) for b in ("low", "medium")]
)


def bad_day(at: datetime, alerts: int, rng: random.Random) -> tuple[list[Alert], list[dict[str, Any]]]:
    """`alerts` alerts over the day before `at`, each lasting 10 to 90 minutes (a third still firing), and three
    clusters in each window one fires in, one of them naming its group."""
    out, clusters = [], []
    for i in range(alerts):
        detector, labels = GROUPS[i % len(GROUPS)]
        started = at - timedelta(minutes=rng.randrange(60, 24 * 60, 5))
        lasting = timedelta(minutes=rng.randrange(10, 95, 5))
        resolved = started + lasting if i % 3 else None
        if resolved is not None and resolved >= at:
            resolved = None
        out.append(Alert(
            alert_id=f"bench-{i:05d}", detector=detector, fingerprint=fingerprint(detector, labels),
            severity="warning", state="firing" if resolved is None else "resolved", labels=labels,
            summary=f"{detector} on {labels}", value=2.0, threshold=1.5, window_start=started - timedelta(minutes=5),
            window_end=started, started_at=started, resolved_at=resolved, updated_at=resolved or at,
        ))  # fmt: skip
        end = started
        signature = {k if k != "bucket" else "cache_bucket": v for k, v in labels.items() if k != "signal"}
        for rank, sig in enumerate([signature, {"model": "llama-3.1-8b"}, {"quantization": "int4"}], start=1):
            clusters.append({
                "window_start": end - timedelta(minutes=5), "window_end": end, "cluster_id": f"c{i:05d}{rank}",
                "detector": "clusters", "rank": rank, "signature": json.dumps(sig), "size": 400, "support": 0.5,
                "risk_ratio": 3.0, "score": 0.3, "summary": f"{sig} is bad 30 % of the time: 120 of 400",
                "suggested_fix": "fix it", "example_trace_ids": ["t1", "t2"], "bad_reason": "x",
                "symptom": "latency_tail", "excess": 80.0, "bad": 120,
            })  # fmt: skip
    return out, clusters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, help="reuse or keep the generated database at this path")
    parser.add_argument("--alerts", type=int, default=120)
    args = parser.parse_args()
    at = datetime(2026, 11, 21, 0, 0)
    db = args.keep or Path(tempfile.mkdtemp(prefix="tw-incident-bench-")) / "bench.duckdb"
    fresh = not db.exists()
    off = load_settings(None, {"db": str(db), "incidents": {"enabled": False}}, environ={})
    storage = open_storage(off)
    results: dict[str, Any] = {"spans": args.spans, "alerts": args.alerts}
    try:
        if fresh:
            t = time.perf_counter()

            def generate(con: Any) -> None:
                con.execute(GENERATE, [at - timedelta(hours=24), args.spans, args.spans])
                con.execute(SCORES)

            storage.writer.submit(generate).result()
            storage.writer.submit(lambda con: con.execute("CHECKPOINT")).result()
            results["generated_seconds"] = round(time.perf_counter() - t, 1)
        storage.writer.submit(
            lambda con: con.execute("DELETE FROM alerts; DELETE FROM clusters; DELETE FROM incidents")
        ).result()
        alerts, clusters = bad_day(at, args.alerts, random.Random(7))
        window = Window(at - timedelta(minutes=5), at)
        storage.detector_store.persist(
            EvaluationRecord(RunRecord("replica_skew", at, window, "ok", 0.0), {}, fired=alerts)
        )
        by_window: dict[datetime, list[dict[str, Any]]] = {}
        for c in clusters:
            by_window.setdefault(c["window_end"], []).append(c)
        for end, rows in by_window.items():
            run = RunRecord("clusters", end, Window(end - timedelta(minutes=5), end), "ok", 0.0)
            storage.detector_store.persist(EvaluationRecord(run, {"clusters": pl.DataFrame(rows)}))

        scheduled = detection_pass(off, storage)
        scheduled.run(at - timedelta(minutes=5))  # the day-long baseline read once: the pass below is warm
        t = time.perf_counter()
        scheduled.run(at)
        results["pass_seconds_warm"] = round(pass_seconds := time.perf_counter() - t, 3)

        incidents = IncidentPass(storage.incident_store, off.incidents, source=storage.windows)

        def timed(name: str, fired: Alert | None = None) -> Tied:
            """The incident pass as of `at` (after `fired` is stored), its seconds and its share of the pass."""
            if fired is not None:
                run = RunRecord(fired.detector, at, window, "ok", 0.0)
                storage.detector_store.persist(EvaluationRecord(run, {}, fired=[fired]))
            t = time.perf_counter()
            tied = incidents.run(at)
            seconds = time.perf_counter() - t
            results[f"incidents_seconds_{name}"] = round(seconds, 3)
            results[f"incidents_over_pass_{name}"] = round(seconds / pass_seconds, 3)
            return tied

        timed("cold")
        tied = timed("warm")
        results["incidents"] = len(tied.incidents)
        results["open_incidents"] = sum(i.state == "open" for i in tied.incidents)
        # One incident grows (an alert joins it on its replicas): its engine facts are kept.
        youngest = max((i for i in tied.incidents if i.state == "open"), key=lambda i: i.started_at)
        [joining] = [a for a in alerts if a.alert_id == youngest.alert_ids[0]]
        timed("one_grown", replace(joining, alert_id="bench-joins", fingerprint="bench-joins", started_at=at,
                                   updated_at=at))  # fmt: skip
        # One incident opens (an alert on a replica no incident holds): its hour before and first minutes are read.
        labels = {"replica_id": "r-new", "signal": "json_adherence"}
        timed("one_opened", replace(joining, alert_id="bench-opens", fingerprint=fingerprint("replica_skew", labels),
                                    detector="replica_skew", labels=labels, started_at=at, updated_at=at))  # fmt: skip
    finally:
        storage.close()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
