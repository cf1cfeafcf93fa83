"""Crash cycles: `kill -9` the service every 60 s under full load, ten times, restarting on the same file.

    .venv/bin/python bench/crash_cycles.py [--cycles 10] [--every 60] [--in-flight 4] [--set KEY=VALUE]

Senders act as a retrying exporter, `--in-flight` of them at once: each request (1,000 vLLM-style spans of
~20 attributes, numbered so that every span's id follows from its request's number) is sent over gRPC until
it is acknowledged, resending on any failure (the service is down, refused, or the answer was lost with the
process). After the last cycle the service is stopped cleanly and the table checked span by span: every
span of every acknowledged request must be stored exactly once.

The service runs with its defaults, so the ingest spool is on: a request that arrives while
`ingest.spool_backlog_spans` spans already wait for the writer is answered once it is synced to the spool,
before its commit, and the restart after a kill commits what the spool holds past the last commit before it
takes a request. Each cycle records what the killed process had acknowledged from the spool
(`tailwatch_spool_acknowledged_spans_total`, read just before the kill), what the restart replayed (its
WARNING line) and how long it took to be ready (`/readyz` 200: spool and WAL replay, migrations check,
decoder workers). The run fails (exit 1) if an acknowledged span is lost or stored twice, the last stop
is not clean, or (the spool on) no span at all was acknowledged from the spool: that run proved nothing
about it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from acknowledged import NumberedRequests, metrics, tally, total
from llm_spans import unique_requests
from serverproc import ServerProcess

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
SPANS_PER_REQUEST = 1000
REPLAYED = re.compile(r"replayed (\d+) spans acknowledged before the last stop from the ingest spool")


class Exporter:
    """Retrying senders: a request counts as acknowledged once an OK answer arrives, never before."""

    def __init__(self, target: list[str], in_flight: int) -> None:
        self._target = target  # the current gRPC address; the list is replaced on restart
        [payload] = unique_requests(1, SPANS_PER_REQUEST, seed=1, t0_ns=time.time_ns())
        self._requests = NumberedRequests(payload)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.acked: list[int] = []
        self.attempts = 0
        self._numbers = itertools.count(1)
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
            payload = self._requests.request(n)
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


@dataclass(frozen=True)
class Cycle:
    acknowledged_requests: int  # by the senders, since the first start, when the kill came
    spool_acknowledged_spans: int  # by the killed process, read just before the kill
    replayed_spans: int  # committed from the spool by the restart, before it took a request
    startup_seconds: float


def spool_acknowledged(server: ServerProcess) -> int:
    return round(total(metrics(server.api_port), "tailwatch_spool_acknowledged_spans_total"))


def start(db: Path, log: Path, settings: dict[str, str]) -> tuple[ServerProcess, int, float]:
    """A service on `db`; with the spans its start replayed from the spool and the seconds it took to be ready."""
    offset = log.stat().st_size if log.exists() else 0
    began = time.perf_counter()
    server = ServerProcess(db, log, **settings).start(timeout=300)
    ready = time.perf_counter() - began
    with log.open("rb") as f:
        f.seek(offset)
        replayed = sum(int(m) for m in REPLAYED.findall(f.read().decode(errors="replace")))
    return server, replayed, ready


def run(
    work: Path,
    *,
    cycles: int,
    in_flight: int,
    before_kill: Callable[[Exporter, ServerProcess], None],
    settings: dict[str, str] | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Kill -9 a loaded service on a database in `work` `cycles` times, each once `before_kill(senders, service)`
    returns; returns the figures and, under "failures", what broke."""
    env = settings or {}
    db, log = work / "tailwatch.duckdb", work / "serve.log"
    server, _, _ = start(db, log, env)
    target = [server.grpc_target]
    exporter = Exporter(target, in_flight)
    exporter.start()
    done: list[Cycle] = []
    try:
        for number in range(1, cycles + 1):
            before_kill(exporter, server)
            spooled = spool_acknowledged(server)
            server.kill()
            acked = len(exporter.acked)
            server, replayed, ready = start(db, log, env)
            target[0] = server.grpc_target
            done.append(Cycle(acked, spooled, replayed, round(ready, 2)))
            say(f"cycle {number}: killed with {acked} requests acknowledged ({spooled} spans of the process's from the "
                f"spool); {replayed} spans replayed at the restart, ready in {ready:.2f} s")  # fmt: skip
        before_kill(exporter, server)
        last_spooled = spool_acknowledged(server)
    finally:
        exporter.stop()
        code = server.terminate()
    counted = tally(db, exporter.acked, SPANS_PER_REQUEST)
    results: dict[str, Any] = {
        "cycles": cycles, "in_flight": in_flight, "settings": env,
        "requests_acknowledged": len(set(exporter.acked)), "attempts": exporter.attempts, **asdict(counted),
        "spool_acknowledged_spans": sum(c.spool_acknowledged_spans for c in done) + last_spooled,
        "replayed_spans": sum(c.replayed_spans for c in done), "exit_code": code,
        "per_cycle": [asdict(c) for c in done],
    }  # fmt: skip
    failures = []
    if not counted.exactly_once:
        failures.append(f"acknowledged spans lost ({counted.lost}) or stored twice ({counted.stored_twice})")
    if code != 0:
        failures.append(f"the last stop exited {code}")
    if env.get("TAILWATCH_INGEST__SPOOL", "true").lower() != "false" and not results["spool_acknowledged_spans"]:
        failures.append("no span was acknowledged from the spool: the run did not cover it")
    results["failures"] = failures
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--every", type=float, default=60.0, help="seconds of load before each kill")
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a server setting, e.g. ingest.spool=false"
    )
    args = parser.parse_args()
    settings = {"TAILWATCH_" + k.upper().replace(".", "__"): v for k, v in (item.split("=", 1) for item in args.set)}
    work = Path(tempfile.mkdtemp(prefix="tw-crash-"))
    results = run(
        work, cycles=args.cycles, in_flight=args.in_flight, before_kill=lambda *_: time.sleep(args.every),
        settings=settings,
    )  # fmt: skip
    print(json.dumps(results, indent=2))
    if results["failures"]:
        raise SystemExit("crash cycles failed: " + "; ".join(results["failures"]))


if __name__ == "__main__":
    main()
