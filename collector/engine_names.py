"""The engine metrics Tailwatch joins to requests, and every spelling under which they arrive.

One table (ENGINE_METRICS) maps each canonical metric to the names serving engines expose it under;
docs/engine-metrics.md is generated from the same table, and `metrics.names` in the configuration adds
names to it. A name is matched by its spelling: the Collector's prometheus receiver keeps `vllm:` but may
strip `_total`, underscore escaping turns `vllm:` into `vllm_`, and Ray Serve prefixes vLLM's metrics with
`ray_vllm:` or `ray_vllm_`; all of them reduce to one spelling before the lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cache


class Kind(StrEnum):
    """How a metric's values are read: a level now, or a count that only grows (read as differences)."""

    GAUGE = "gauge"
    COUNTER = "counter"
    HISTOGRAM = "histogram"  # stored as <metric>_sum and <metric>_count counters


@dataclass(frozen=True)
class EngineMetric:
    kind: Kind
    unit: str
    meaning: str
    names: tuple[str, ...]


ENGINE_METRICS: dict[str, EngineMetric] = {
    "requests_waiting": EngineMetric(
        Kind.GAUGE,
        "requests",
        "Requests waiting to be scheduled on the replica.",
        ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "ray_serve_deployment_queued_queries"),
    ),
    "requests_running": EngineMetric(
        Kind.GAUGE,
        "requests",
        "Requests in the replica's running batch.",
        ("vllm:num_requests_running", "sglang:num_running_reqs", "ray_serve_num_ongoing_requests_at_replicas"),
    ),
    "kv_cache_usage": EngineMetric(
        Kind.GAUGE,
        "0..1",
        "Share of the KV cache in use.",
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    ),
    "prefix_cache_queries": EngineMetric(
        Kind.COUNTER,
        "tokens",
        "Prompt tokens looked up in the prefix cache.",
        ("vllm:prefix_cache_queries", "sglang:prompt_tokens"),
    ),
    "prefix_cache_hits": EngineMetric(
        Kind.COUNTER,
        "tokens",
        "Prompt tokens found in the prefix cache.",
        ("vllm:prefix_cache_hits", "sglang:cached_tokens"),
    ),
    "cache_hit_rate": EngineMetric(
        Kind.GAUGE, "0..1", "The engine's own recent prefix-cache hit rate.", ("sglang:cache_hit_rate",)
    ),
    "preemptions": EngineMetric(
        Kind.COUNTER, "preemptions", "Requests preempted (KV cache exhausted).", ("vllm:num_preemptions",)
    ),
    "step_tokens": EngineMetric(
        Kind.HISTOGRAM, "tokens", "Tokens scheduled per engine step (batch size in tokens).",
        ("vllm:iteration_tokens_total",),
    ),
}  # fmt: skip

# What vLLM's V1 engine shows on its own /metrics, by the name it registers and its kind: the names
# above and the rest, which Tailwatch stores unjoined when they arrive. Prometheus shows a counter as
# <name>_total and a histogram as <name>_bucket, <name>_sum and <name>_count. The Grafana dashboard
# (deploy/grafana/tailwatch.json) queries vLLM by these names only, and the tests hold it to them.
VLLM_METRICS: dict[str, Kind] = {
    "vllm:num_requests_running": Kind.GAUGE,
    "vllm:num_requests_waiting": Kind.GAUGE,
    "vllm:kv_cache_usage_perc": Kind.GAUGE,
    "vllm:gpu_cache_usage_perc": Kind.GAUGE,  # deprecated since 0.9 for kv_cache_usage_perc
    "vllm:cache_config_info": Kind.GAUGE,
    "vllm:prefix_cache_queries": Kind.COUNTER,
    "vllm:prefix_cache_hits": Kind.COUNTER,
    "vllm:external_prefix_cache_queries": Kind.COUNTER,
    "vllm:external_prefix_cache_hits": Kind.COUNTER,
    "vllm:num_preemptions": Kind.COUNTER,
    "vllm:prompt_tokens": Kind.COUNTER,
    "vllm:generation_tokens": Kind.COUNTER,
    "vllm:request_success": Kind.COUNTER,
    "vllm:iteration_tokens_total": Kind.HISTOGRAM,
    "vllm:request_prompt_tokens": Kind.HISTOGRAM,
    "vllm:request_generation_tokens": Kind.HISTOGRAM,
    "vllm:request_max_num_generation_tokens": Kind.HISTOGRAM,
    "vllm:request_params_n": Kind.HISTOGRAM,
    "vllm:request_params_max_tokens": Kind.HISTOGRAM,
    "vllm:time_to_first_token_seconds": Kind.HISTOGRAM,
    "vllm:inter_token_latency_seconds": Kind.HISTOGRAM,  # per token; time_per_output_token_seconds before 0.11
    "vllm:request_time_per_output_token_seconds": Kind.HISTOGRAM,  # per request, as llm_requests.tpot_ms
    "vllm:e2e_request_latency_seconds": Kind.HISTOGRAM,
    "vllm:request_queue_time_seconds": Kind.HISTOGRAM,
    "vllm:request_inference_time_seconds": Kind.HISTOGRAM,
    "vllm:request_prefill_time_seconds": Kind.HISTOGRAM,
    "vllm:request_decode_time_seconds": Kind.HISTOGRAM,
}

_TOTAL = "_total"


def spelling(name: str) -> str:
    """The one spelling every variant of a metric name reduces to."""
    n = name.strip().lower()
    if n.startswith(("ray_vllm:", "ray_vllm_")):
        n = "vllm:" + n[len("ray_vllm:") :]
    for engine in ("vllm", "sglang"):
        if n.startswith(engine + "_"):
            n = engine + ":" + n[len(engine) + 1 :]
    return n[: -len(_TOTAL)] if n.endswith(_TOTAL) else n


@dataclass(frozen=True)
class EngineNames:
    """The name table in use: the built-in one plus `metrics.names`; hashable, so decoders cache it."""

    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    interval_seconds: float = 5.0

    def lookup(self, name: str) -> tuple[str, Kind] | None:
        """The canonical metric a name reported as, with the kind it must arrive as; None when unknown."""
        return _table(self.extra).get(spelling(name))


@cache
def _table(extra: tuple[tuple[str, tuple[str, ...]], ...]) -> dict[str, tuple[str, Kind]]:
    table: dict[str, tuple[str, Kind]] = {}
    for canonical, metric in ENGINE_METRICS.items():
        for name in metric.names:
            table[spelling(name)] = (canonical, metric.kind)
    for canonical, names in extra:
        for name in names:
            table[spelling(name)] = (canonical, ENGINE_METRICS[canonical].kind)
    return table
