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
