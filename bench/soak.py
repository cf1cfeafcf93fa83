"""Soak: 30 minutes at twice the sustainable rate, with retrying exporters, against a real `tailwatch serve`.

    .venv/bin/python bench/soak.py [--minutes 30] [--rate 60000] [--in-flight 16] [--queue 400]

An open-loop load: a pacer offers `--rate` spans/s (requests of 1,000 vLLM-style spans, ~20 attributes,
every id unique) to exporters that behave as the OpenTelemetry Collector's: a bounded sending queue
(`--queue` requests; when it is full the exporter drops the new batch, as the Collector does, and that
is counted as dropped at the exporter, not sent), `--in-flight` consumers, and every refusal retried
after the hint the service gave (RetryInfo), or 1 s. The default rate is about twice what this
machine sustains end to end (docs/benchmarks.md, ~30k spans/s).

Recorded each minute: spans acknowledged, refusals retried, exporter drops, the acknowledgement latency
of a request (first send to OK, retries included) p50/p99, and the service's peak RSS. At the end the
service is stopped cleanly and the table counted: every acknowledged span stored exactly once.
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
from pathlib import Path

import duckdb
import grpc
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from llm_spans import unique_requests
from serverproc import ServerProcess

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SPANS = 1000


class Template:
    """One serialized request whose 1,000 trace and span ids are rewritten in place for each request number:
    trace id = (request number, span index + 1), span id = request number × 1,000 + span index + 1."""

    def __init__(self) -> None:
        [payload] = unique_requests(1, SPANS, seed=1, t0_ns=(int(time.time()) - 600) * 10**9)
        self.payload = payload
        message = ExportTraceServiceRequest.FromString(payload)
        spans = message.resource_spans[0].scope_spans[0].spans
        self.offsets = [(payload.index(s.trace_id), payload.index(s.span_id)) for s in spans]

    def request(self, number: int) -> bytes:
        out = bytearray(self.payload)
        for i, (trace_at, span_at) in enumerate(self.offsets):
            out[trace_at : trace_at + 16] = number.to_bytes(8, "big") + (i + 1).to_bytes(8, "big")
            out[span_at : span_at + 8] = (number * SPANS + i + 1).to_bytes(8, "big")
        return bytes(out)


class Minute:
    def __init__(self) -> None:
        self.acked = 0
        self.retried = 0
        self.dropped = 0
        self.latencies: list[float] = []
        self.rss_mib = 0


class Exporters:
    """A Collector-like exporter: a bounded queue, consumers that resend refusals after the server's hint."""

    def __init__(self, target: str, in_flight: int, queue_size: int, started: float) -> None:
        self._target = target
        self._queue: queue.Queue[tuple[int, float] | None] = queue.Queue(queue_size)
        self._template = Template()
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
                payload = self._template.request(number)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=60_000, help="spans/s offered")
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--queue", type=int, default=400, help="exporter queue, in requests")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a server setting, e.g. ingest.decode_workers=0"
    )
    args = parser.parse_args()
    env = {"TAILWATCH_" + k.upper().replace(".", "__"): v for k, v in (item.split("=", 1) for item in args.set)}
    work = Path(tempfile.mkdtemp(prefix="tw-soak-"))
    db = work / "tailwatch.duckdb"
    server = ServerProcess(db, work / "serve.log", **env).start(timeout=120)
    assert server.proc is not None
    started = time.monotonic()
    exporters = Exporters(server.grpc_target, args.in_flight, args.queue, started)
    interval = SPANS / args.rate
    number = 0
    next_at = started
    last_sample = 0.0
    while (now := time.monotonic()) < started + args.minutes * 60:
        if now >= next_at:
            number += 1
            exporters.offer(number)
            next_at += interval
        if now - last_sample >= 5:
            last_sample = now
            minute = exporters.minute()
            minute.rss_mib = max(minute.rss_mib, rss_mib(server.proc.pid))
            print(f"{(now - started) / 60:5.1f} min: {len(exporters.acked):,} requests acknowledged", flush=True)
        time.sleep(max(0.0, min(next_at, last_sample + 5) - time.monotonic()))
    exporters.drain()
    code = server.terminate()
    con = duckdb.connect(str(db), read_only=True)
    stored, distinct = con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone()
    per_request = dict(
        con.execute("SELECT ('0x' || left(trace_id, 16))::UBIGINT, count(*) FROM spans GROUP BY 1").fetchall()
    )
    con.close()
    shutil.rmtree(work, ignore_errors=True)  # tens of gigabytes after 30 minutes
    acked = set(exporters.acked)
    lost = sum(SPANS - per_request.get(n, 0) for n in acked)
    rows = []
    for index in sorted(exporters.minutes):
        m = exporters.minutes[index]
        lat = sorted(m.latencies)
        rows.append({
            "minute": index + 1, "spans_acked_per_s": round(m.acked * SPANS / 60), "retried": m.retried,
            "dropped_at_exporter": m.dropped, "rss_mib": m.rss_mib,
            "ack_p50_s": round(statistics.median(lat), 2) if lat else None,
            "ack_p99_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None,
        })  # fmt: skip
    results = {
        "minutes": args.minutes, "offered_spans_per_s": args.rate, "settings": args.set, "requests_offered": number,
        "requests_acknowledged": len(acked), "spans_stored": stored, "lost_acknowledged_spans": lost,
        "duplicates": stored - distinct, "stored_not_acknowledged": stored - len(acked) * SPANS,
        "peak_rss_mib": max(r["rss_mib"] for r in rows), "exit_code": code, "per_minute": rows,
    }  # fmt: skip
    print(json.dumps(results, indent=1))
    if lost or stored != distinct or code != 0:
        raise SystemExit(f"acknowledged spans lost ({lost}), stored twice ({stored - distinct}) or exit {code}")


if __name__ == "__main__":
    main()
