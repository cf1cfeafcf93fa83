"""Soak: an hour of LLM request spans with the detectors running on their schedule, against a real `tailwatch serve`.

    .venv/bin/python bench/soak.py [--minutes 60] [--rate 3000] [--in-flight 16] [--queue 400]
                                   [--detect-every SECONDS] [--set KEY=VALUE]

An open-loop load: a pacer offers `--rate` spans/s (requests of 1,000 vLLM-style server spans, ~20 attributes,
each span one LLM request, every id unique and every time current) to exporters that behave as the
OpenTelemetry Collector's: a bounded sending queue (`--queue` requests; when it is full the exporter drops
the new batch, as the Collector does, and that is counted as dropped at the exporter, not sent),
`--in-flight` consumers, and every refusal retried after the hint the service gave (RetryInfo), or 1 s.

The detectors run on the service's own schedule (every 5 minutes, or `--detect-every`), over the spans just
sent. The default rate puts about 900,000 requests in a 5-minute window, which the default detection bound
(`storage.detection_memory_mb`, 256) holds for every detector (docs/configuration.md, "Memory"), so no pass
may be skipped as `too_large`.

Recorded each minute: spans acknowledged (and of those, acknowledged from the ingest spool), refusals retried,
exporter drops, the acknowledgement latency of a request (first send to OK, retries included) p50/p99, the
service's peak RSS, and the detector evaluations that ended in it by outcome. At the end the service is
stopped cleanly, every pass is read from the run log (`detector_runs`) and the table is checked span by span.
The run fails (exit 1) if an acknowledged span is missing or stored twice, the service did not exit 0, a
scheduled pass did not happen, or an evaluation was skipped as `too_large` or failed.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import grpc
from google.rpc import error_details_pb2, status_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from acknowledged import NumberedRequests, metrics, tally, total
from llm_spans import unique_requests
from serverproc import ServerProcess

from detectors.registry import REGISTRY

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SPANS = 1000
SAMPLE_SECONDS = 5.0
OUTCOMES = ("ok", "too_large", "error")


def vllm_requests() -> NumberedRequests:
    """Numbered copies of one request of 1,000 vLLM-style server spans."""
    [payload] = unique_requests(1, SPANS, seed=1, t0_ns=time.time_ns())
    return NumberedRequests(payload)


@dataclass
class Minute:
    acked: int = 0
    retried: int = 0
    dropped: int = 0
    latencies: list[float] = field(default_factory=list)
    rss_mib: int = 0
    service: dict[str, float] = field(default_factory=dict)  # the service's counters at the minute's last sample


class Exporters:
    """A Collector-like exporter: a bounded queue, consumers that resend refusals after the server's hint."""

    def __init__(self, target: str, in_flight: int, queue_size: int, started: float) -> None:
        self._target = target
        self._queue: queue.Queue[tuple[int, float] | None] = queue.Queue(queue_size)
        self._requests = vllm_requests()
        self._started = started
        self._lock = threading.Lock()
        self.minutes: dict[int, Minute] = {}
        self.acked: list[int] = []
        self._threads = [threading.Thread(target=self._consume, daemon=True) for _ in range(in_flight)]
        for t in self._threads:
            t.start()

    def minute(self) -> Minute:
        return self.minutes.setdefault(int((time.monotonic() - self._started) // 60), Minute())

    def offer(self, number: int) -> None:
        try:
            self._queue.put_nowait((number, time.monotonic()))
        except queue.Full:
            with self._lock:
                self.minute().dropped += 1

    def drain(self) -> None:
        self._queue.join()
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(300)

    def _consume(self) -> None:
        with grpc.insecure_channel(self._target) as channel:
            export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            while (item := self._queue.get()) is not None:
                number, queued = item
                payload = self._requests.request(number)
                while True:
                    try:
                        export(payload, timeout=60)
                        break
                    except grpc.RpcError as exc:
                        with self._lock:
                            self.minute().retried += 1
                        time.sleep(_retry_delay(exc))
                with self._lock:
                    now = self.minute()
                    now.acked += 1
                    now.latencies.append(time.monotonic() - queued)
                    self.acked.append(number)
                self._queue.task_done()
            self._queue.task_done()


def _retry_delay(exc: grpc.RpcError) -> float:
    """The server's RetryInfo delay, jittered as exporters do, else 1 s."""
    if isinstance(exc, grpc.Call):
        details = dict(exc.trailing_metadata() or ()).get("grpc-status-details-bin")
        if isinstance(details, bytes):
            for detail in status_pb2.Status.FromString(details).details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.ToTimedelta().total_seconds() * random.uniform(1.0, 1.5)
    return 1.0


def rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024


def service_counters(server: ServerProcess) -> dict[str, float]:
    """The service's own counts the soak follows: evaluations by outcome, their seconds, spool acknowledgements."""
    samples = metrics(server.api_port)
    counters = {o: total(samples, "tailwatch_detector_runs_total", outcome=o) for o in OUTCOMES}
    counters["evaluation_seconds"] = total(samples, "tailwatch_detector_run_seconds_sum")
    counters["spool_acknowledged_spans"] = total(samples, "tailwatch_spool_acknowledged_spans_total")
    return counters


class Sampler:
    """Every few seconds, on a thread of its own so the pacer keeps its pace: the service's RSS and counters."""

    def __init__(self, server: ServerProcess, exporters: Exporters, say: Callable[[str], None]) -> None:
        assert server.proc is not None
        self._server = server
        self._pid = server.proc.pid
        self._exporters = exporters
        self._say = say
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            counters = service_counters(self._server)
            minute = self._exporters.minute()
            minute.rss_mib = max(minute.rss_mib, rss_mib(self._pid))
            minute.service = counters
            evaluations = ", ".join(f"{counters[o]:.0f} {o}" for o in OUTCOMES)
            self._say(f"{len(self._exporters.acked):,} requests acknowledged; evaluations {evaluations}")


def enable_schedule(every: int | None) -> dict[str, str]:
    """Settings that run every detector each `every` seconds (None: their defaults, every 5 minutes)."""
    if every is None:
        return {}
    return {f"TAILWATCH_DETECTORS__{key.upper()}__INTERVAL_SECONDS": str(every) for key in REGISTRY}


def passes(db: Path, scheduled_from: datetime) -> list[dict[str, Any]]:
    """Every detection pass in the run log: its evaluations by outcome, the detectors evaluated, their time, and
    the requests its 5-minute windows held (those of clusters, which holds the most a request; None for a pass
    without it). A pass before `scheduled_from`, the scheduler's first grid time, is `caught_up`: a window whose
    spans the service got only after its time (the first requests end up to a minute before they are sent),
    evaluated as history by a later tick (detectors/catch_up.py), without the detectors reading firing alerts."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("""
            SELECT evaluated_at,
                   count(*) FILTER (outcome = 'ok'), count(*) FILTER (outcome = 'too_large'),
                   count(*) FILTER (outcome = 'error'),
                   sum(seconds), max(seconds), arg_max(detector, seconds),
                   any_value(window_start) FILTER (detector = 'clusters'),
                   any_value(window_end) FILTER (detector = 'clusters'),
                   string_agg(DISTINCT error, ' | '), list(DISTINCT detector ORDER BY detector)
            FROM detector_runs GROUP BY evaluated_at ORDER BY evaluated_at
        """).fetchall()
        out = []
        for at, ok, too_large, error, seconds, slowest, slowest_detector, start, end, errors, detectors in rows:
            [(requests,)] = (
                con.execute("SELECT count(*) FROM llm_requests_between(?, ?)", [start, end]).fetchall()
                if start is not None
                else [(None,)]
            )
            out.append({
                "at": at.isoformat(), "caught_up": at < scheduled_from, "detectors": detectors,
                "ok": ok, "too_large": too_large, "error": error,
                "seconds": round(seconds, 1), "slowest": slowest_detector, "slowest_seconds": round(slowest, 1),
                "window_requests": requests, "errors": errors,
            })  # fmt: skip
        return out
    finally:
        con.close()


def first_tick(started: float, every: int) -> int:
    """The scheduler's first grid time after a start at `started` (detectors/scheduler.py)."""
    return int(started // every + 1) * every


def grid_points(started: float, ended: float, every: int) -> list[str]:
    """The scheduler's times within the run, less the last minute (a pass then may still be running at
    the stop): each must have its pass in the run log."""
    first = first_tick(started, every)
    return [
        datetime.fromtimestamp(t, UTC).replace(tzinfo=None).isoformat() for t in range(first, int(ended - 60), every)
    ]


def per_minute(exporters: Exporters) -> list[dict[str, Any]]:
    rows = []
    before: dict[str, float] = {}
    for index in sorted(exporters.minutes):
        m = exporters.minutes[index]
        lat = sorted(m.latencies)
        delta = {k: v - before.get(k, 0.0) for k, v in m.service.items()}
        before = m.service or before
        rows.append({
            "minute": index + 1, "spans_acked_per_s": round(m.acked * SPANS / 60),
            "spool_acked_per_s": round(delta.get("spool_acknowledged_spans", 0) / 60),
            "retried": m.retried, "dropped_at_exporter": m.dropped, "rss_mib": m.rss_mib,
            "ack_p50_s": round(statistics.median(lat), 2) if lat else None,
            "ack_p99_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None,
            "evaluations": {o: round(delta.get(o, 0)) for o in OUTCOMES if delta.get(o)},
            "evaluation_seconds": round(delta.get("evaluation_seconds", 0), 1),
        })  # fmt: skip
    return rows


def run(
    work: Path,
    *,
    minutes: float,
    rate: float,
    in_flight: int = 16,
    queue_size: int = 400,
    detect_every: int | None = None,
    settings: dict[str, str] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Soak a service on a database in `work`; returns the figures and, under "failures", what broke."""
    env = {**enable_schedule(detect_every), **(settings or {})}
    db = work / "tailwatch.duckdb"
    server = ServerProcess(db, work / "serve.log", **env).start(timeout=120)
    started, wall_started = time.monotonic(), time.time()
    exporters = Exporters(server.grpc_target, in_flight, queue_size, started)
    sampler = Sampler(server, exporters, lambda line: say(f"{(time.monotonic() - started) / 60:5.1f} min: {line}"))
    interval = SPANS / rate
    number = 0
    next_at = started
    while (now := time.monotonic()) < started + minutes * 60:
        if now >= next_at:
            number += 1
            exporters.offer(number)
            next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    exporters.drain()
    wall_ended = time.time()
    sampler.stop()
    code = server.terminate()
    counted = tally(db, exporters.acked, SPANS)
    every = detect_every or 300
    evaluated = passes(db, datetime.fromtimestamp(first_tick(wall_started, every), UTC).replace(tzinfo=None))
    missed = sorted(set(grid_points(wall_started, wall_ended, every)) - {p["at"] for p in evaluated})
    rows = per_minute(exporters)
    logged = [
        line for line in (work / "serve.log").read_text().splitlines() if " WARNING " in line or " ERROR " in line
    ]
    results: dict[str, Any] = {
        "minutes": minutes, "offered_spans_per_s": rate, "in_flight": in_flight, "settings": env,
        "requests_offered": number, "requests_acknowledged": len(set(exporters.acked)), **asdict(counted),
        "spool_acknowledged_spans": round(max((m.service.get("spool_acknowledged_spans", 0)
                                               for m in exporters.minutes.values()), default=0)),
        "peak_rss_mib": max(r["rss_mib"] for r in rows), "exit_code": code, "passes": evaluated,
        "passes_missed": missed, "log_warnings_and_errors": len(logged), "log_first": logged[:10], "per_minute": rows,
    }  # fmt: skip
    failures = []
    if not counted.exactly_once:
        failures.append(f"acknowledged spans lost ({counted.lost}) or stored twice ({counted.stored_twice})")
    if code != 0:
        failures.append(f"the service exited {code}")
    if not evaluated:
        failures.append("no detection pass ran")
    if missed:
        failures.append(f"no detection pass at {', '.join(missed)}")
    for p in evaluated:
        if p["too_large"] or p["error"]:
            first = (p["errors"] or "").split(" | ")[0]
            failures.append(
                f"the pass at {p['at']} skipped {p['too_large']} as too_large and {p['error']} failed ({first})"
            )
    results["failures"] = failures
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--rate", type=float, default=3000, help="spans/s offered")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--queue", type=int, default=400, help="exporter queue, in requests")
    parser.add_argument("--detect-every", type=int, default=None, help="every detector's interval_seconds")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a server setting, e.g. ingest.decode_workers=0"
    )
    args = parser.parse_args()
    settings = {"TAILWATCH_" + k.upper().replace(".", "__"): v for k, v in (item.split("=", 1) for item in args.set)}
    work = Path(tempfile.mkdtemp(prefix="tw-soak-"))
    try:
        results = run(
            work, minutes=args.minutes, rate=args.rate, in_flight=args.in_flight, queue_size=args.queue,
            detect_every=args.detect_every, settings=settings,
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)  # gigabytes after an hour
    print(json.dumps(results, indent=1, default=str))
    if results["failures"]:
        raise SystemExit("soak failed: " + "; ".join(results["failures"]))


if __name__ == "__main__":
    main()
