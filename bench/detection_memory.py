"""What a detection pass holds: per detector, its frames and the memory over them; and a whole pass as the
window grows, with and without the bound.

    .venv/bin/python bench/detection_memory.py [--requests 1000000 2000000 4000000]

`storage.detection_memory_mb` bounds the per-request frames a pass holds. The requests (bench/detection.py's
generator) are one day-long window. Each measurement runs in a fresh process, which reports its peak RSS
above itself once storage is open: first after reading a detector's frames (DuckDB's execution, bounded
by `storage.memory_limit`, and the frames), then after the pass (the detector's own work added).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import duckdb

from detectors.registry import REGISTRY
from storage.ports import FrameBudget, Requests, Scores
from tailwatch.compose import detection_pass, open_storage
from tailwatch.settings import Settings, load_settings

AT = datetime(2026, 11, 21, 0, 0)
DAY = {"window_seconds": 86400, "settle_seconds": 0}
UNBOUNDED = 1 << 20  # MiB


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _start() -> float:
    """The RSS now, with the peak reset to it (Linux: clear_refs 5), so opening storage (its duplicate window
    is rebuilt from the newest spans) does not hide what the pass takes."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mib("VmRSS")


def _peak_mib() -> float:
    return _status_mib("VmHWM")


def _settings(db: Path, bound_mib: int, memory_limit: str = "512MB") -> Settings:
    overrides = {
        "db": str(db),
        "storage": {"detection_memory_mb": bound_mib, "memory_limit": memory_limit},
        "detectors": dict.fromkeys(REGISTRY, DAY),
    }
    return load_settings(None, overrides, environ={})


def one(db: Path, key: str) -> dict[str, float]:
    settings = _settings(db, UNBOUNDED)
    storage = open_storage(settings)
    start = _start()
    config = settings.detector_configs()[key]
    budget = FrameBudget(1 << 62)
    for read in REGISTRY[key].inputs(config, config.window(AT)).values():
        if isinstance(read, Requests | Scores):
            read.fetch(storage.windows, budget)
    read_peak = _peak_mib()
    [result] = detection_pass(settings, storage).run(AT, [key])
    storage.close()
    assert result.outcome == "ok", result.error
    return {"frames": budget.used / 2**20, "read": read_peak - start, "pass": _peak_mib() - start}


def whole(db: Path, bound_mib: int, memory_limit: str) -> dict[str, object]:
    settings = _settings(db, bound_mib, memory_limit)
    storage = open_storage(settings)
    start = _start()
    started = time.perf_counter()
    results = detection_pass(settings, storage).run(AT)
    seconds = time.perf_counter() - started
    storage.close()
    # An `error` here is DuckDB refusing a query past storage.memory_limit: bounded too, by the other setting.
    skipped = [r.detector for r in results if r.outcome == "too_large"]
    failed = [r.detector for r in results if r.outcome == "error"]
    assert all("Out of Memory" in str(r.error) for r in results if r.outcome == "error"), [r.error for r in results]
    return {"pass": _peak_mib() - start, "skipped": skipped, "failed": failed, "seconds": seconds}


def _child(*args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{args} failed:\n{done.stderr[-3000:]}")
    out = done.stdout
    answer: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return answer


def _generate(requests: int) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from detection import GENERATE, SCORES  # noqa: PLC0415 - the detection benchmark's generator, run as a script

    db = Path(tempfile.mkdtemp(prefix="tw-detect-mem-")) / "bench.duckdb"
    storage = open_storage(_settings(db, UNBOUNDED))

    def generate(con: duckdb.DuckDBPyConnection) -> None:
        con.execute(GENERATE, [AT - timedelta(hours=24), requests, requests])
        con.execute(SCORES)

    storage.writer.submit(generate).result()
    storage.writer.submit(lambda con: con.execute("CHECKPOINT")).result()
    storage.close()
    return db


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, nargs="+", default=[1_000_000, 2_000_000, 4_000_000])
    parser.add_argument("--one", nargs=2, metavar=("DB", "DETECTOR"), help=argparse.SUPPRESS)
    parser.add_argument("--whole", nargs=3, metavar=("DB", "BOUND_MIB", "MEMORY_LIMIT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--memory-limit",
        nargs="+",
        default=["512MB", "6GB"],
        help="storage.memory_limit for the whole passes: the default, and one that lets DuckDB's queries finish",
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(Path(args.one[0]), args.one[1])))
        return
    if args.whole:
        print(json.dumps(whole(Path(args.whole[0]), int(args.whole[1]), args.whole[2])))
        return
    default = Settings().storage.detection_memory_mb
    dbs = {n: _generate(n) for n in args.requests}
    first = args.requests[0]
    print(f"Each detector alone, {first:,} requests in its window (MiB over the process at start):\n")
    print("| detector | frames | B / request | after reading them | after the pass | (pass − reading) / frames |")
    print("|---|---|---|---|---|---|")
    for key in REGISTRY:
        if key == "slo_burn":
            continue  # reads the per-minute counts it stored: no per-request frame
        got = _child("--one", str(dbs[first]), key)
        frames, read, done = float(got["frames"]), float(got["read"]), float(got["pass"])  # type: ignore[arg-type]
        print(
            f"| {key} | {frames:.0f} | {frames * 2**20 / first:.0f} | {read:.0f} | {done:.0f} | "
            f"{(done - read) / frames:.1f} |",
            flush=True,
        )
    for limit in args.memory_limit:
        print(
            f"\nThe whole pass as the window grows, bounded at the default {default} MiB and unbounded; "
            f"storage.memory_limit {limit}; MiB over the process at start:\n"
        )
        print("| requests in the window | bounded: peak | too_large | error (DuckDB out of memory) | unbounded: peak |")
        print("|---|---|---|---|---|")
        for n, db in dbs.items():
            bounded = _child("--whole", str(db), str(default), limit)
            unbounded = _child("--whole", str(db), str(UNBOUNDED), limit)
            names = [", ".join(bounded[k]) or "none" for k in ("skipped", "failed")]  # type: ignore[arg-type]
            print(f"| {n:,} | {bounded['pass']:.0f} | {names[0]} | {names[1]} | {unbounded['pass']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
