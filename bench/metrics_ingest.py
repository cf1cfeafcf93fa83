"""Engine metrics ingest: sustained durable data points/s over OTLP/gRPC, next to the decode-only ceiling.

Run on a quiet machine:  .venv/bin/python bench/metrics_ingest.py [--points 1000000] [--concurrency 4]

Each request is what an OpenTelemetry Collector's prometheus receiver forwards after scraping 10 vLLM
replicas once: per replica a resource (service.name, service.instance.id, k8s.pod.name, ...) and vLLM's
series (gauges, counters with start times, and iteration-token histograms; labels model_name and
engine) — 1,000 data points a request, every scrape at its own time so nothing is a duplicate. The
ceiling decodes the same requests in-process (parse, validate, name lookup, Arrow batch), no server.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import duckdb
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

sys.path.insert(0, str(Path(__file__).parent))
from ingest import RssSampler, add_settings_flag, run_server, send_all, server_settings

from collector.decode import Encoding, decode_metrics

EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
REPLICAS = 10
GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
COUNTERS = (
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
)  # fmt: skip
HISTOGRAMS = ("vllm:iteration_tokens_total", "vllm:time_to_first_token_seconds")
ENGINES = 2  # data-parallel engines per replica, each its own series
MODELS = 10  # model_name label values (LoRA adapters), to reach 100 points per replica per scrape


def _kv(key: str, value: str) -> KeyValue:
    kv = KeyValue(key=key)
    kv.value.string_value = value
    return kv


def scrape_request(scrape: int, t_ns: int) -> bytes:
    """One scrape of every replica as the Collector forwards it: 100 points per replica."""
    req = ExportMetricsServiceRequest()
    for r in range(REPLICAS):
        rm = req.resource_metrics.add()
        rm.resource.attributes.extend(
            [_kv("service.name", "vllm-llama8b"), _kv("service.instance.id", f"10.0.0.{r}:8000"),
             _kv("k8s.pod.name", f"vllm-llama8b-{r}"), _kv("server.port", "8000"), _kv("url.scheme", "http")]
        )  # fmt: skip
        metrics = rm.scope_metrics.add().metrics
        for m in range(MODELS):
            for e in range(ENGINES):
                labels = [_kv("engine", str(e)), _kv("model_name", f"llama-8b-lora-{m}")]
                for name in GAUGES:
                    dp = metrics.add(name=name).gauge.data_points.add(time_unix_nano=t_ns, as_double=scrape % 7)
                    dp.attributes.extend(labels)
                for name in COUNTERS[:2]:
                    s = metrics.add(name=name).sum
                    s.is_monotonic = True
                    s.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
                    dp = s.data_points.add(time_unix_nano=t_ns, start_time_unix_nano=1, as_double=1000.0 * scrape)
                    dp.attributes.extend(labels)
    return req.SerializeToString()


def _decode_count(payload: bytes) -> int:
    return decode_metrics(payload, Encoding.PROTOBUF).items


def ceiling(requests: list[bytes], processes: int) -> float:
    """Decode-only data points/s, in this process or a pool, no server."""
    if processes <= 1:
        started = time.perf_counter()
        n = sum(_decode_count(r) for r in requests)
        return n / (time.perf_counter() - started)
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(_decode_count, requests[:processes]))  # start the workers outside the timing
        started = time.perf_counter()
        n = sum(pool.map(_decode_count, requests, chunksize=4))
    return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--points", type=int, default=1_000_000, help="data points to send")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    add_settings_flag(parser)
    args = parser.parse_args()
    per_request = REPLICAS * MODELS * ENGINES * (len(GAUGES) + 2)
    n_requests = args.points // per_request
    t0 = (int(time.time()) - 3600) * 10**9
    requests = [scrape_request(i, t0 + i * 5 * 10**9) for i in range(n_requests)]
    assert _decode_count(requests[0]) == per_request
    sample = requests[: max(40, n_requests // 10)]
    ceiling_1 = ceiling(sample, 1)
    ceiling_all = ceiling(sample, os.cpu_count() or 2)
    print(f"decode-only ceiling: {ceiling_1:,.0f} points/s (1 process), {ceiling_all:,.0f} (all cores)", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="tw-metrics-bench-"))
    try:
        db = workdir / "metrics.duckdb"
        proc, grpc_port, _api_port = run_server(db, workdir, server_settings(args))
        sampler = RssSampler(proc.pid)
        stats = send_all(f"127.0.0.1:{grpc_port}", requests, args.concurrency, EXPORT)
        peak_kib = sampler.stop()
        proc.send_signal(signal.SIGTERM)
        exit_code = proc.wait(120)
        con = duckdb.connect(str(db), read_only=True)
        stored = con.execute("SELECT count(*) FROM engine_metrics").fetchall()[0][0]
        con.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    sent = n_requests * per_request
    assert stored == sent, f"stored {stored} of {sent} acknowledged points"
    e2e = sent / stats["seconds"]
    print(
        json.dumps(
            {
                "points": sent,
                "points_per_request": per_request,
                "bytes_per_point": round(sum(map(len, requests[:20])) / (20 * per_request)),
                "seconds": round(stats["seconds"], 2),
                "points_per_s": round(e2e),
                "refused_requests_retried": int(stats["refused"]),
                "ceiling_1_process": round(ceiling_1),
                "ceiling_all_cores": round(ceiling_all),
                "e2e_over_ceiling_all_cores": round(e2e / ceiling_all, 2),
                "peak_rss_mib": round(peak_kib / 1024),
                "stored": stored,
                "exit_code": exit_code,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
