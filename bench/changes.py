"""Changes benchmark: what finding the fleet's changes adds to a scheduled pass, on a day of 10 million spans.

    .venv/bin/python bench/changes.py [--spans 10000000] [--keep DB]

The spans are bench/detection.py's (generated straight into DuckDB; `--keep` reuses its database): two
deployments of eight replicas over a day. As of the end of the day:

- a warm scheduled pass with change tracking off (every detector over its 5-minute window), the ceiling;
- the change pass cold: its whole lookback read (a fresh process, a replay);
- the change pass warm, a minute later: only the minutes since the last pass, and the relook, read.

Both are reported as a ratio to the pass (the target: at most 0.05). Ingest does no change tracking at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from detection import GENERATE, SCORES

from detectors.changes import ChangePass
from tailwatch.compose import detection_pass, open_storage
from tailwatch.settings import load_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spans", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, help="reuse or keep the generated database at this path")
    args = parser.parse_args()
    at = datetime(2026, 11, 21, 0, 0)
    db = args.keep or Path(tempfile.mkdtemp(prefix="tw-changes-bench-")) / "bench.duckdb"
    fresh = not db.exists()
    off = load_settings(None, {"db": str(db), "changes": {"enabled": False}, "incidents": {"enabled": False}},
                        environ={})  # fmt: skip
    storage = open_storage(off)
    results: dict[str, Any] = {"spans": args.spans}
    try:
        if fresh:
            t = time.perf_counter()

            def generate(con: Any) -> None:
                con.execute(GENERATE, [at - timedelta(hours=24), args.spans, args.spans])
                con.execute(SCORES)

            storage.writer.submit(generate).result()
            storage.writer.submit(lambda con: con.execute("CHECKPOINT")).result()
            results["generated_seconds"] = round(time.perf_counter() - t, 1)
        scheduled = detection_pass(off, storage)
        scheduled.run(at - timedelta(minutes=5))  # the day-long baseline read once: the pass below is warm
        t = time.perf_counter()
        scheduled.run(at)
        results["pass_seconds_warm"] = round(pass_seconds := time.perf_counter() - t, 3)
        changes = ChangePass(storage.change_store, off.changes)
        for name, when in (("cold", at), ("warm", at + timedelta(minutes=1))):
            t = time.perf_counter()
            found = changes.run(when)
            seconds = time.perf_counter() - t
            results[f"changes_seconds_{name}"] = round(seconds, 3)
            results[f"changes_over_pass_{name}"] = round(seconds / pass_seconds, 3)
        results["changes_found"] = len(found.changes)
        results["sightings_kept"] = changes.sightings(at + timedelta(minutes=2)).height
    finally:
        storage.close()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(main())
