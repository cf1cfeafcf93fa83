"""The vllm emitter's engine metrics: each replica's vLLM /metrics as the Collector scrapes and forwards
them, computed from the requests the replica served."""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from simulator.model import DEPLOYMENT, INTERVAL_NS, MODEL, NS, REPLICAS, Request, pod, scrape_floor

# What the Collector's prometheus receiver calls itself in the scope of the metrics it forwards.
SCRAPE_SCOPE = ("github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver", "0.139.0")
STEP_NS = 12_000_000  # one engine step (a decode iteration) while the replica has anything running
# vLLM sets its gauges from the scheduler's lists after each engine step, and a request joins the waiting
# list only at the scheduling pass after the step in flight when it arrived: one that pass admits is never
# seen waiting. Healthy requests' 2-20 ms queue is that wait for the pass; a longer queue shows from here on.
FIRST_PASS_NS = 20_000_000
# vLLM's buckets for vllm:iteration_tokens_total (tokens scheduled per engine step).
ITERATION_BOUNDS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
UP_BEFORE_NS = 3600 * NS  # the engines had been up an hour before the first scrape sent
SCRAPES_PER_EXPORT = 1000  # scrapes in one export: about the Collector batch processor's 8192 points
KV_LOOKBACK_NS = 60 * NS
LIVE_LAG_NS = 30 * NS  # live scrapes wait until every request in flight at their time has finished
HELP = {
    "vllm:num_requests_waiting": "Number of requests waiting to be processed.",
    "vllm:num_requests_running": "Number of requests in model execution batches.",
    "vllm:kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "vllm:prefix_cache_queries_total": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits_total": "Prefix cache hits, in terms of number of cached tokens.",
    "vllm:num_preemptions_total": "Cumulative number of preemption from the engine.",
    "vllm:iteration_tokens_total": "Histogram of number of tokens per engine_step.",
}


@dataclass(frozen=True)
class _Run:
    """One request on its replica, in Unix nanoseconds: queued, scheduled, first token, finished."""

    arrival: int
    scheduled: int
    first_token: int
    end: int
    prompt: int
    output: int
    hits: int
    kv: float | None
    preemptions: int
    quantization: str

    @classmethod
    def of(cls, r: Request) -> _Run:
        arrival, end = r.span_ns()
        scheduled = min(end, arrival + int(r.queue_ms * 1e6))
        first = min(end, scheduled + int(r.prefill_ms * 1e6))
        hits = round(r.prompt_tokens * r.cache_hit_ratio)
        return cls(arrival, scheduled, first, end, r.prompt_tokens, r.output_tokens, hits, r.kv_cache_usage,
                   r.preemptions, r.quantization)  # fmt: skip

    def decoded(self, lo: int, hi: int) -> int:
        """Tokens it generated in [lo, hi): the first at first_token, then evenly until the last at end."""
        if self.output <= 1 or self.end <= self.first_token:
            return self.output if lo <= self.first_token < hi else 0
        step = (self.end - self.first_token) / (self.output - 1)

        def before(t: int) -> int:
            return min(self.output, max(0, math.ceil((t - self.first_token) / step)))

        return before(hi) - before(lo)


@dataclass(frozen=True)
class _Scrape:
    """One replica's values at one scrape; counters and the histogram since `start` (its process start)."""

    time: int
    start: int
    waiting: int
    running: int
    kv: float
    queries: float
    hits: float
    preemptions: float
    step_tokens: float
    steps: int
    buckets: tuple[int, ...]


def _union(segments: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(segments):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


class Engine:
    """Each replica's /metrics, scraped every 5 s, computed from the requests the replica served: what
    vLLM would have counted while serving them. At a scrape time t, waiting = the replica's requests
    with arrival + 20 ms <= t < arrival + queue time (vLLM samples its waiting list after each step, so
    a request the first scheduling pass admits is never seen waiting: FIRST_PASS_NS), running = those
    past their queue and not finished. The prefix-cache counters grow at each arrival by its prompt tokens
    and the prompt x its hit ratio, preemptions by what a scenario planted; iteration tokens count each
    step's uncached prompt and generated tokens, steps of 12 ms while anything runs (one scrape
    interval's steps in the bucket of their mean). KV usage is a healthy 0.4-0.7 (a slow wave plus the
    running requests) unless a request in flight carries a scenario's `kv_cache_usage`. A change of
    quantization is a new engine process: its counters restart from zero at a scrape, with a new start
    time."""

    def __init__(self, seed: int, anchor_ns: int = 0) -> None:
        self._anchor = anchor_ns
        rng = random.Random(seed ^ 0xE61E)
        self._phase = {r: rng.uniform(0, 2 * math.pi) for r in REPLICAS}
        self._prior = {r: float(rng.randint(2_000_000, 9_000_000)) for r in REPLICAS}
        self._runs: dict[str, list[_Run]] = {}
        self._start: int | None = None
        self._first: dict[str, int] = {}
        self._sent: dict[str, int] = {}

    def add(self, r: Request) -> None:
        self._runs.setdefault(r.replica, []).append(_Run.of(r))

    def last_end(self) -> int:
        return max((run.end for runs in self._runs.values() for run in runs), default=0)

    def scrapes(self, until_ns: int) -> list[ExportMetricsServiceRequest]:
        """Every scrape at or before `until_ns` not returned yet, as the Collector would export them."""
        if not self._runs:
            return []
        if self._start is None:
            # Every replica reports from before the first request on, so all of them count from the start.
            self._start = min(r.arrival for runs in self._runs.values() for r in runs)
        scraped: list[tuple[int, int, metrics_pb2.ResourceMetrics]] = []
        for replica, runs in sorted(self._runs.items()):
            first = self._first.setdefault(replica, scrape_floor(replica, self._start, self._anchor) - INTERVAL_NS)
            sent = self._sent.get(replica, first - INTERVAL_NS)
            last = scrape_floor(replica, until_ns, self._anchor)
            if last <= sent:
                continue
            times = list(range(first, last + 1, INTERVAL_NS))
            for s in self._replica(replica, runs, times):
                if s.time > sent:
                    scraped.append(
                        (s.time, REPLICAS.index(replica) if replica in REPLICAS else -1, _message(replica, s))
                    )
            self._sent[replica] = last
        scraped.sort(key=lambda x: (x[0], x[1]))
        out = []
        for i in range(0, len(scraped), SCRAPES_PER_EXPORT):
            request = ExportMetricsServiceRequest()
            request.resource_metrics.extend(m for _, _, m in scraped[i : i + SCRAPES_PER_EXPORT])
            out.append(request)
        return out

    def _replica(self, replica: str, unsorted: list[_Run], times: list[int]) -> list[_Scrape]:
        n = len(times)
        runs = sorted(unsorted, key=lambda r: r.arrival)
        # Bin k holds what happened in [times[k-1], times[k]), reported by the scrape at times[k].
        queries, hits, preempted, tokens = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
        busy = [0] * n
        for r in runs:
            k = bisect_right(times, r.arrival)
            if k < n:
                queries[k] += r.prompt
                hits[k] += r.hits
                preempted[k] += r.preemptions
            k = bisect_right(times, r.scheduled)
            if k < n:
                tokens[k] += r.prompt - r.hits  # a cached prefix is not computed again
            for k in range(max(1, bisect_right(times, r.first_token)), min(n, bisect_right(times, r.end) + 1)):
                tokens[k] += r.decoded(times[k - 1], times[k])
        for lo, hi in _union((r.scheduled, r.end) for r in runs):
            for k in range(max(1, bisect_right(times, lo)), min(n, bisect_right(times, hi) + 1)):
                busy[k] += max(0, min(hi, times[k]) - max(lo, times[k - 1]))

        # One engine process per build, from its first request's scrape interval on: the replica restarted.
        processes = [(times[0] - UP_BEFORE_NS, runs[0].quantization)]
        for r in runs:
            if all(r.quantization != q for _, q in processes):
                restart = scrape_floor(replica, r.arrival, self._anchor)
                processes.append((max(processes[-1][0] + 1, restart), r.quantization))
        starts = [start for start, _ in processes]

        # Seen waiting only once a scheduling pass has left it waiting (FIRST_PASS_NS).
        left_waiting = [r for r in runs if r.scheduled > r.arrival + FIRST_PASS_NS]
        waits_from = sorted(r.arrival + FIRST_PASS_NS for r in left_waiting)
        waits_until = sorted(r.scheduled for r in left_waiting)
        scheduled = sorted(r.scheduled for r in runs)
        ends = sorted(r.end for r in runs)
        hinted = [r for r in runs if r.kv is not None]
        hinted_arrivals = [r.arrival for r in hinted]
        prior = self._prior.get(replica, 0.0)

        out: list[_Scrape] = []
        process = 0
        # What the engine had counted in the hour before: ~0.93 of its prompt tokens hit, ~12 tokens a step.
        q, h, p, step_tokens, steps = prior, float(round(prior * 0.93)), 0.0, prior * 0.3, int(prior // 40)
        buckets = [0] * (len(ITERATION_BOUNDS) + 1)
        buckets[bisect_left(ITERATION_BOUNDS, 12.0)] = steps
        for k, t in enumerate(times):
            now = bisect_right(starts, t) - 1
            if now != process:  # a new engine process: its counters start from nothing
                process, q, h, p, step_tokens, steps = now, 0.0, 0.0, 0.0, 0.0, 0
                buckets = [0] * (len(ITERATION_BOUNDS) + 1)
            elif k > 0:
                q, h, p = q + queries[k], h + hits[k], p + preempted[k]
                n_steps = round(busy[k] / STEP_NS)
                if tokens[k] > 0:
                    n_steps = max(1, n_steps)
                if n_steps:
                    buckets[bisect_left(ITERATION_BOUNDS, tokens[k] / n_steps)] += n_steps
                step_tokens, steps = step_tokens + tokens[k], steps + n_steps
            running = bisect_right(scheduled, t) - bisect_right(ends, t)
            waiting = bisect_right(waits_from, t) - bisect_right(waits_until, t)
            kv = 0.47 + 0.07 * math.sin(2 * math.pi * t / (1800 * NS) + self._phase.get(replica, 0.0))
            kv = min(0.97, kv + 0.015 * running)
            i = bisect_right(hinted_arrivals, t) - 1
            while i >= 0 and hinted_arrivals[i] > t - KV_LOOKBACK_NS:
                r = hinted[i]
                if r.kv is not None and (r.end > t or r.arrival > t - INTERVAL_NS):
                    kv = max(kv, r.kv)
                i -= 1
            out.append(
                _Scrape(t, starts[process], waiting, running, round(kv, 4), q, h, p, step_tokens, steps, tuple(buckets))
            )
        return out


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def scrape_resource(replica: str) -> dict[str, str]:
    """The resource the Collector gives a scrape of the replica: the job as service.name, the target as
    service.instance.id, and the pod name the k8sattributes processor adds (the spans carry it too)."""
    address = f"10.42.0.{11 + (REPLICAS.index(replica) if replica in REPLICAS else 0)}"
    return {
        "service.name": DEPLOYMENT,
        "service.instance.id": f"{address}:8000",
        "server.address": address,
        "server.port": "8000",
        "url.scheme": "http",
        "k8s.pod.name": pod(replica),
        "k8s.namespace.name": "serving",
    }


def _message(replica: str, s: _Scrape) -> metrics_pb2.ResourceMetrics:
    rm = metrics_pb2.ResourceMetrics()
    rm.resource.attributes.extend(_kv(k, v) for k, v in scrape_resource(replica).items())
    sm = rm.scope_metrics.add()
    sm.scope.CopyFrom(InstrumentationScope(name=SCRAPE_SCOPE[0], version=SCRAPE_SCOPE[1]))
    labels = [_kv("engine", "0"), _kv("model_name", MODEL)]

    def metric(name: str) -> Any:
        return sm.metrics.add(name=name, description=HELP[name])

    for name, value in (
        ("vllm:num_requests_waiting", float(s.waiting)),
        ("vllm:num_requests_running", float(s.running)),
        ("vllm:kv_cache_usage_perc", s.kv),
    ):
        metric(name).gauge.data_points.add(time_unix_nano=s.time, as_double=value).attributes.extend(labels)
    for name, value in (
        ("vllm:prefix_cache_queries_total", s.queries),
        ("vllm:prefix_cache_hits_total", s.hits),
        ("vllm:num_preemptions_total", s.preemptions),
    ):
        m = metric(name)
        m.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
        m.sum.is_monotonic = True
        m.sum.data_points.add(time_unix_nano=s.time, start_time_unix_nano=s.start, as_double=value).attributes.extend(
            labels
        )
    m = metric("vllm:iteration_tokens_total")
    m.histogram.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    dp = m.histogram.data_points.add(
        time_unix_nano=s.time, start_time_unix_nano=s.start, count=s.steps, sum=s.step_tokens
    )
    dp.bucket_counts.extend(s.buckets)
    dp.explicit_bounds.extend(ITERATION_BOUNDS)
    dp.attributes.extend(labels)
    return rm
