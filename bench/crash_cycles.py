"""Crash cycles: `kill -9` the service every 60 s under full load, ten times, restarting on the same file.

    .venv/bin/python bench/crash_cycles.py [--cycles 10] [--every 60] [--in-flight 4]

Senders act as a retrying exporter: each request (1,000 spans of ~20 attributes) is sent over gRPC until it
is acknowledged, waiting and resending on any failure (the service is down, refused, or the answer was lost
with the process). After the last cycle the service is stopped cleanly and the table counted: every
acknowledged span must be stored exactly once (0 lost, 0 duplicates). Start-up time after each crash (to
/readyz 200: WAL replay, migrations check, decoder workers) is recorded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from builders import request, span
from serverproc import ServerProcess

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SPANS_PER_REQUEST = 1000


def make_request(n: int) -> bytes:
    attrs = {
        "gen_ai.request.model": "meta-llama/Llama-3.1-8B-Instruct", "gen_ai.system": "vllm",
        "gen_ai.usage.input_tokens": 812, "gen_ai.usage.output_tokens": 240, "tenant.id": "acme",
        "gen_ai.latency.time_to_first_token": 0.21, "gen_ai.latency.e2e": 3.4, "request": n,
    }  # fmt: skip
    return request([span(attributes=attrs) for _ in range(SPANS_PER_REQUEST)]).SerializeToString()


class Exporter:
    """Retrying senders: a request counts as acknowledged once an OK answer arrives, never before."""

    def __init__(self, target: list[str], in_flight: int) -> None:
        self._target = target  # the current gRPC address; the list is replaced on restart
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.acked: list[int] = []
        self.attempts = 0
        self._numbers = itertools.count()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(in_flight)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                n = next(self._numbers)
            payload = make_request(n)
            while not self._stop.is_set():
                with self._lock:
                    self.attempts += 1
                try:
                    with grpc.insecure_channel(self._target[0]) as ch:
                        ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)(payload, timeout=30)
                except grpc.RpcError:
                    time.sleep(0.2)  # down, refused or the answer lost: resend, as an exporter's retry does
                    continue
                with self._lock:
                    self.acked.append(n)
                break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--every", type=float, default=60.0)
    parser.add_argument("--in-flight", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tw-crash-"))
    db = work / "tailwatch.duckdb"
    server = ServerProcess(db, work / "serve.log").start(timeout=120)
    target = [server.grpc_target]
    exporter = Exporter(target, args.in_flight)
    exporter.start()
    startups = []
    for cycle in range(args.cycles):
        time.sleep(args.every)
        server.kill()
        acked = len(exporter.acked)
        t = time.perf_counter()
        server = ServerProcess(db, work / "serve.log").start(timeout=300)
        startups.append(round(time.perf_counter() - t, 2))
        target[0] = server.grpc_target
        print(f"cycle {cycle + 1}: killed with {acked} requests acknowledged, back in {startups[-1]} s", flush=True)
    time.sleep(5)
    exporter.stop()
    assert server.terminate() == 0
    con = duckdb.connect(str(db), read_only=True)
    stored, distinct = con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchone()
    by_request = dict(con.execute("SELECT (attributes->>'request')::BIGINT, count(*) FROM spans GROUP BY 1").fetchall())
    con.close()
    acked = set(exporter.acked)
    lost = sum(SPANS_PER_REQUEST - by_request.get(n, 0) for n in acked)
    results = {
        "cycles": args.cycles,
        "every_seconds": args.every,
        "requests_acknowledged": len(acked),
        "spans_acknowledged": len(acked) * SPANS_PER_REQUEST,
        "attempts": exporter.attempts,
        "spans_stored": stored,
        "lost_acknowledged_spans": lost,
        "duplicates": stored - distinct,
        # Stored but never acknowledged: committed just before a kill took the answer with it (the exporter
        # resent them, and de-duplication kept one copy).
        "stored_unacknowledged_requests": sorted(set(by_request) - acked),
        "startup_seconds": startups,
    }
    print(json.dumps(results, indent=2))
    if lost or stored != distinct:
        raise SystemExit(f"acknowledged spans lost ({lost}) or stored twice ({stored - distinct})")


if __name__ == "__main__":
    main()
