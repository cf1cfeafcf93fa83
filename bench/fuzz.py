"""Fuzz every decoder entry point for a million inputs each, one after another, and report what libFuzzer saw.

    .venv/bin/python bench/fuzz.py [--runs 1000000] [--only traces_protobuf ...]

Each target runs in its own process (tests/fuzz/run.py) from the committed corpus; a crash, a hang past
10 s or memory past 2 GiB stops that target with a non-zero exit and its input in build/fuzz/.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fuzz"))
from targets import TARGETS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--only", nargs="*", default=list(TARGETS))
    args = parser.parse_args()
    results = {}
    for target in args.only:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "fuzz" / "run.py"), target, f"-runs={args.runs}",
             "-print_final_stats=1"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        log = done.stderr
        stat = {m[0]: int(m[1]) for m in re.findall(r"stat::(\w+):\s+(\d+)", log)}
        cov = re.findall(r"cov: (\d+) ft: (\d+)", log)
        results[target] = {
            "exit": done.returncode,
            "runs": stat.get("number_of_executed_units"),
            "seconds": round(time.perf_counter() - started, 1),
            "execs_per_second": stat.get("average_exec_per_sec"),
            "peak_rss_mb": stat.get("peak_rss_mb"),
            "coverage_edges": int(cov[-1][0]) if cov else None,
            "features": int(cov[-1][1]) if cov else None,
            "crash": next((line for line in log.splitlines() if "Test unit written" in line), None),
        }
        print(target, results[target], flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
