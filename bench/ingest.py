"""End-to-end ingest benchmark: sustained durable spans/s and peak RSS, next to the decode-only ceiling.

Run on a quiet machine:  .venv/bin/python bench/ingest.py [--workload flat|mix] [--spans 1200000] [--concurrency 4]
Into ClickHouse in-process (chDB): add --set storage.backend=clickhouse --set storage.clickhouse.dsn=chdb:///DIR
The ceiling is measured in the same run because this machine's speed varies by about ±40%.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import duckdb
import grpc

sys.path.insert(0, str(Path(__file__).parent))
from workloads import WORKLOADS

from collector.decode import Encoding, choose_decoder, decode_traces
from storage.clickhouse.client import ClickHouse
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.space import reserve_path
from storage.duckdb.stored_attributes import insert_spans_sql, with_moved
from tailwatch.settings import StorageSettings

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
ROOT = Path(__file__).resolve().parent.parent


def _decode_count(payload: bytes, split: bool = False) -> int:
    return decode_traces(payload, Encoding.PROTOBUF, split_attributes=split).items


def ceiling(requests: list[bytes], processes: int, split: bool) -> float:
    """Decode-only spans/s: parse + walk + Arrow batch, in this process or a pool, no server; `split`: the
    attributes split as `storage.attributes: split` has the service decode them."""
    started = time.perf_counter()
    count = partial(_decode_count, split=split)
    if processes <= 1:
        n = sum(count(r) for r in requests)
    else:
        with ProcessPoolExecutor(processes) as pool:
            list(pool.map(count, requests[:processes]))  # start the workers outside the timing
            started = time.perf_counter()
            n = sum(pool.map(count, requests, chunksize=4))
    return n / (time.perf_counter() - started)


def insert_ceiling(requests: list[bytes], workdir: Path, split: bool) -> float:
    """DuckDB alone: rows/s inserting already-decoded batches into a migrated spans table, a commit each."""
    tables = [with_moved(decode_traces(r, Encoding.PROTOBUF, split_attributes=split).spans) for r in requests]
    con = open_database(workdir / "insert-ceiling.duckdb")
    migrate.upgrade(con)
    stamp = datetime.now(UTC).replace(tzinfo=None)
    started = time.perf_counter()
    rows = 0
    for table in tables:
        assert table is not None
        con.register("batch", table)
        # As the writer inserts.
        con.execute(insert_spans_sql("batch", tuple(table.column_names)), [stamp])
        con.unregister("batch")
        rows += table.num_rows
    con.execute("CHECKPOINT")
    seconds = time.perf_counter() - started
    con.close()
    return rows / seconds


def descendants(pid: int) -> list[int]:
    """Every process `pid` started, and theirs (the decoder processes and their fork server)."""
    found: list[int] = []
    parents = [pid]
    while parents:
        for task in Path(f"/proc/{parents.pop()}/task").glob("*/children"):
            # Every thread's children: the decoder processes are started from a worker thread, not the main one.
            with contextlib.suppress(OSError):
                kids = [int(c) for c in task.read_text().split()]
                found.extend(kids)
                parents.extend(kids)
    return found


def rss_kib(pid: int) -> int:
    """RSS of a process and all its descendants (the decoder workers), in KiB."""
    total = 0
    for p in (pid, *descendants(pid)):
        try:
            with open(f"/proc/{p}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total


class RssSampler:
    """Peak RSS of a process tree, sampled every 100 ms on a background thread."""

    def __init__(self, pid: int) -> None:
        self.peak = 0
        self._pid = pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_kib(self._pid))
            time.sleep(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
UNNAMED = "unnamed (DuckDB's, Arrow's pools)"


def _on_cpu_ns(pid: int) -> list[tuple[str, int]]:
    """(kernel name, nanoseconds on a CPU so far) of each live thread of `pid` (schedstat's first field: the
    scheduler's own count, exact where /proc's utime and stime are 10 ms ticks)."""
    used: list[tuple[str, int]] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):  # empty once the process has ended
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            name = "main (event loop)" if task.name == str(pid) else (task / "comm").read_text().strip()
            used.append((name, int((task / "schedstat").read_text().split()[0])))
    return used


def cpu_by_thread(pid: int) -> dict[str, int]:
    """Nanoseconds on a CPU so far of the server's threads, summed by kernel name (digits dropped, so both
    decoder threads are one line), and of its decoder processes."""
    used: dict[str, int] = {}
    for thread, ns in _on_cpu_ns(pid):
        name = thread.rstrip("0123456789").rstrip("_-") or thread
        # Threads the service did not start inherit the process's name: DuckDB's and Arrow's own pools.
        group = UNNAMED if name in ("python", "tailwatch") else name
        used[group] = used.get(group, 0) + ns
    children = sum(ns for child in descendants(pid) for _, ns in _on_cpu_ns(child))
    if children:
        used["decoder processes"] = children
    return used


def machine_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of every core since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle and iowait
    return sum(values) - idle, sum(values)


class CpuAccount:
    """Where the CPU of one pass went, µs per span: each server thread, the benchmark's own client (this
    process: the gRPC client and the RSS sampler), and everything else on the machine."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._server = cpu_by_thread(pid)
        self._client = _own_seconds()
        self._busy, self._total = machine_ticks()

    def per_span(self, spans: int) -> dict[str, float]:
        server = cpu_by_thread(self._pid)
        busy, total = machine_ticks()
        us = 1e6 / spans
        shares = {k: (v - self._server.get(k, 0)) / 1e9 * us for k, v in server.items()}
        shares = {k: round(v, 2) for k, v in sorted(shares.items(), key=lambda kv: -kv[1]) if v > 0}
        server_us = sum(shares.values())
        client_us = (_own_seconds() - self._client) * us
        machine_us = (busy - self._busy) / CLOCK_TICKS * us
        return {
            **{f"server: {k}": v for k, v in shares.items()},
            "server, all": round(server_us, 2),
            "benchmark client": round(client_us, 2),
            "rest of the machine": round(machine_us - server_us - client_us, 2),
            "machine busy, share of all cores": round((busy - self._busy) / (total - self._total), 3),
        }


def _own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def add_settings_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a server setting, e.g. ingest.decoder=python"
    )


def server_settings(args: argparse.Namespace) -> dict[str, str]:
    return dict(item.split("=", 1) for item in args.set)


def run_server(db: Path, workdir: Path, settings: dict[str, str]) -> tuple[subprocess.Popen[bytes], int, int]:
    grpc_port, http_port, api_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILWATCH_")}
    env.update({"TAILWATCH_" + key.upper().replace(".", "__"): value for key, value in settings.items()})
    log = (workdir / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailwatch", "serve", "--db", str(db), "--grpc-port", str(grpc_port),
         "--http-port", str(http_port), "--api-port", str(api_port)],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
    )  # fmt: skip
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{api_port}/readyz", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return proc, grpc_port, api_port


def send_all(target: str, requests: list[bytes], concurrency: int, method: str = EXPORT) -> dict[str, float]:
    """Send every request with `concurrency` in flight; retry refused ones like an exporter would."""
    channel = grpc.insecure_channel(
        target, options=[("grpc.max_send_message_length", 64 * 2**20), ("grpc.max_receive_message_length", 64 * 2**20)]
    )
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    slots = threading.Semaphore(concurrency)
    lock = threading.Lock()
    stats = {"acked_requests": 0, "refused": 0}
    done = threading.Event()
    remaining = [len(requests)]

    def submit(payload: bytes) -> None:
        slots.acquire()
        future = call.future(payload, timeout=120)

        def finished(f: grpc.Future) -> None:
            slots.release()
            if f.exception() is not None:
                with lock:
                    stats["refused"] += 1
                time.sleep(0.05)  # retry hint from the server is 1 s; a short pause is enough here
                threading.Thread(target=submit, args=(payload,)).start()
                return
            with lock:
                stats["acked_requests"] += 1
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        future.add_done_callback(finished)

    started = time.perf_counter()
    for payload in requests:
        submit(payload)
    done.wait()
    stats["seconds"] = time.perf_counter() - started
    channel.close()
    return stats


def stored_spans(db: Path, settings: dict[str, str]) -> tuple[int, int]:
    """(rows, distinct span ids) the stopped server stored: in its DuckDB file, or (`--set
    storage.backend=clickhouse`) in the ClickHouse its settings name, as Tailwatch reads them. Every sent
    span has its own id, so both equal the spans sent when each acknowledged span is stored once."""
    if settings.get("storage.backend") == "clickhouse":
        client = ClickHouse(settings["storage.clickhouse.dsn"])
        try:
            rows = int(client.command("SELECT count() FROM spans FINAL"))
            return rows, int(client.command("SELECT uniqExact(trace_id, span_id) FROM spans FINAL"))
        finally:
            client.close()
    con = duckdb.connect(str(db), read_only=True)
    try:
        found = con.execute("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans").fetchall()[0]
        return int(found[0]), int(found[1])
    finally:
        con.close()


def bytes_on_disk(db: Path) -> int:
    """The stopped server's store: the DuckDB file and anything beside it (its WAL, a spool left), but not
    the disk-space reserve, a fixed 256 MiB that once tripled the recorded bytes per span."""
    reserve = reserve_path(db)
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*") if p.is_file() and p != reserve)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="flat", help="bench/workloads.py")
    parser.add_argument("--spans", type=int, default=1_200_000, help="spans to send (unique ids)")
    parser.add_argument("--batch", type=int, default=1000, help="spans per export request")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    parser.add_argument(
        "--overload-concurrency", type=int, default=128, help="second pass, far past capacity (0: no second pass)"
    )
    add_settings_flag(parser)
    args = parser.parse_args()
    settings = server_settings(args)
    split = settings.get("storage.attributes", StorageSettings().attributes) == "split"

    n_requests = args.spans // args.batch
    t0 = (int(time.time()) - 3600) * 10**9
    print(f"generating {n_requests} requests of {args.batch} spans ...", flush=True)
    requests = WORKLOADS[args.workload](n_requests, args.batch, seed=1, t0_ns=t0)
    bytes_per_span = sum(map(len, requests[:20])) / (20 * args.batch)

    sample = requests[: max(40, n_requests // 10)]
    ceiling_1 = ceiling(sample, 1, split)
    ceiling_2 = ceiling(sample, os.cpu_count() or 2, split)
    print(f"decode-only ceiling: {ceiling_1:,.0f} spans/s (1 process), {ceiling_2:,.0f} (all cores)", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="tw-bench-"))
    results = {}
    try:
        inserts = insert_ceiling(sample, workdir, split)
        print(f"DuckDB insert-only ceiling: {inserts:,.0f} rows/s (decoded batches, a commit each)", flush=True)
        passes = [("sustained", args.concurrency, requests)]
        if args.overload_concurrency > 0:
            passes.append(("overload", args.overload_concurrency, requests[: n_requests // 3]))
        for label, concurrency, reqs in passes:
            db = workdir / f"{label}.duckdb"
            proc, grpc_port, _api_port = run_server(db, workdir, settings)
            sampler = RssSampler(proc.pid)
            account = CpuAccount(proc.pid)
            stats = send_all(f"127.0.0.1:{grpc_port}", reqs, concurrency)
            cpu = account.per_span(len(reqs) * args.batch)
            peak_kib = sampler.stop()
            proc.send_signal(signal.SIGTERM)
            exit_code = proc.wait(120)
            stored, distinct = stored_spans(db, settings)
            sent = len(reqs) * args.batch
            on_disk = bytes_on_disk(db) if settings.get("storage.backend") != "clickhouse" else None
            results[label] = {
                "concurrency": concurrency,
                "spans": sent,
                "seconds": round(stats["seconds"], 2),
                "spans_per_s": round(sent / stats["seconds"]),
                "refused_requests_retried": int(stats["refused"]),
                "peak_rss_mib": round(peak_kib / 1024),
                "stored": stored,
                "stored_distinct_ids": distinct,
                "bytes_per_stored_span": round(on_disk / stored, 1) if on_disk and stored else None,
                "exit_code": exit_code,
            }
            print(label, json.dumps(results[label]), flush=True)
            print(f"{label}: CPU µs per span", json.dumps(cpu, indent=1, ensure_ascii=False), flush=True)
            assert stored == distinct == sent, f"{label}: stored {stored} rows, {distinct} ids of {sent} acknowledged"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    e2e = results["sustained"]["spans_per_s"]
    summary = {
        "workload": args.workload,
        "bytes_per_span": round(bytes_per_span),
        "ceiling_1_process": round(ceiling_1),
        "ceiling_all_cores": round(ceiling_2),
        "e2e_over_ceiling_all_cores": round(e2e / ceiling_2, 2),
        "e2e_over_ceiling_1_process": round(e2e / ceiling_1, 2),
        "insert_ceiling": round(inserts),
        "e2e_over_insert_ceiling": round(e2e / inserts, 2),
        "decoder": choose_decoder(settings.get("ingest.decoder", "auto")).value,
        "settings": settings,
        **{f"{k}_{m}": v[m] for k, v in results.items() for m in ("spans_per_s", "peak_rss_mib")},
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
