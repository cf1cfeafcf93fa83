"""The engine metrics Tailwatch joins to requests, and every spelling under which they arrive.

One table (ENGINE_METRICS) maps each canonical metric to the names serving engines expose it under;
the name table of docs/engine-metrics.md is generated from it (`python -m collector.engine_names --write`
rewrites it, and a test fails while the page differs), and `metrics.names` in the configuration adds
names to it. A name is matched by its spelling: the Collector's prometheus receiver keeps `vllm:` but may
strip `_total`, underscore escaping turns `vllm:` into `vllm_`, an OpenTelemetry SDK's push spells it
`vllm.`, and Ray Serve prefixes vLLM's metrics with `ray_vllm:` or `ray_vllm_`; all of them reduce to one
spelling before the lookup.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path


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
    # The same waiting requests split by why they wait (vLLM >= 0.32: `capacity`, `deferred`), so it is its
    # own metric: under requests_waiting the join would count every waiting request twice.
    "requests_waiting_by_reason": EngineMetric(
        Kind.GAUGE,
        "requests",
        "Waiting requests by the `reason` label: `capacity` (no room to schedule) or `deferred` (held by a "
        "LoRA budget, a KV transfer or a blocked status); they sum to `requests_waiting`.",
        ("vllm:num_requests_waiting_by_reason",),
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
    # vLLM's second cached-token source. It counts tokens a KV connector brought from another instance too,
    # so it is kept apart from the prefix-cache pair rather than mixed into one replica's hit rate.
    "prompt_tokens": EngineMetric(
        Kind.COUNTER, "tokens", "Prompt tokens the engine took in (SGLang's count is `prefix_cache_queries`).",
        ("vllm:prompt_tokens",),
    ),
    "prompt_tokens_cached": EngineMetric(
        Kind.COUNTER, "tokens", "Prompt tokens served from a cache, the local prefix cache or a KV connector's.",
        ("vllm:prompt_tokens_cached",),
    ),
    "preemptions": EngineMetric(
        Kind.COUNTER, "preemptions", "Requests preempted (KV cache exhausted); SGLang calls them retracted.",
        ("vllm:num_preemptions", "sglang:num_retracted_requests"),
    ),
    "step_tokens": EngineMetric(
        Kind.HISTOGRAM, "tokens", "Tokens scheduled per engine step (batch size in tokens).",
        ("vllm:iteration_tokens_total",),
    ),
    "queue_time": EngineMetric(
        Kind.HISTOGRAM, "seconds", "Time finished requests spent waiting before they were scheduled.",
        ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds"),
    ),
}  # fmt: skip

# What vLLM's V1 engine (0.32) shows on its own /metrics, by the name it registers and its kind: the names
# above and the rest, which Tailwatch stores unjoined when they arrive. Prometheus shows a counter as
# <name>_total and a histogram as <name>_bucket, <name>_sum and <name>_count, each with a <name>_created
# gauge beside it. The Grafana dashboard (deploy/grafana/tailwatch.json) queries vLLM by these names only,
# and the tests hold it to them and them to a real 0.32 page.
VLLM_METRICS: dict[str, Kind] = {
    "vllm:num_requests_running": Kind.GAUGE,
    "vllm:num_requests_waiting": Kind.GAUGE,
    "vllm:num_requests_waiting_by_reason": Kind.GAUGE,  # label reason: capacity, deferred
    "vllm:kv_cache_usage_perc": Kind.GAUGE,
    "vllm:gpu_cache_usage_perc": Kind.GAUGE,  # deprecated since 0.9 for kv_cache_usage_perc
    "vllm:cache_config_info": Kind.GAUGE,
    "vllm:engine_sleep_state": Kind.GAUGE,
    "vllm:prefix_cache_queries": Kind.COUNTER,
    "vllm:prefix_cache_hits": Kind.COUNTER,
    "vllm:external_prefix_cache_queries": Kind.COUNTER,
    "vllm:external_prefix_cache_hits": Kind.COUNTER,
    "vllm:mm_cache_queries": Kind.COUNTER,
    "vllm:mm_cache_hits": Kind.COUNTER,
    "vllm:num_preemptions": Kind.COUNTER,
    "vllm:prompt_tokens": Kind.COUNTER,
    "vllm:prompt_tokens_by_source": Kind.COUNTER,  # label source: local_compute, local_cache_hit, external_kv_transfer
    "vllm:prompt_tokens_cached": Kind.COUNTER,
    "vllm:prompt_tokens_cached_by_source": Kind.COUNTER,  # label source: device, host, disk, p2p, ...
    "vllm:generation_tokens": Kind.COUNTER,
    "vllm:request_success": Kind.COUNTER,
    "vllm:admission_rejections": Kind.COUNTER,
    "vllm:estimated_flops_per_gpu": Kind.COUNTER,
    "vllm:estimated_read_bytes_per_gpu": Kind.COUNTER,
    "vllm:estimated_write_bytes_per_gpu": Kind.COUNTER,
    "vllm:iteration_tokens_total": Kind.HISTOGRAM,
    "vllm:request_prompt_tokens": Kind.HISTOGRAM,
    "vllm:request_generation_tokens": Kind.HISTOGRAM,
    "vllm:request_max_num_generation_tokens": Kind.HISTOGRAM,
    "vllm:request_params_n": Kind.HISTOGRAM,
    "vllm:request_params_max_tokens": Kind.HISTOGRAM,
    "vllm:request_num_preemptions": Kind.HISTOGRAM,
    "vllm:request_prefill_kv_computed_tokens": Kind.HISTOGRAM,
    "vllm:time_to_first_token_seconds": Kind.HISTOGRAM,
    "vllm:inter_token_latency_seconds": Kind.HISTOGRAM,  # per token; time_per_output_token_seconds before 0.11
    "vllm:request_time_per_output_token_seconds": Kind.HISTOGRAM,  # per request, as llm_requests.tpot_ms
    "vllm:e2e_request_latency_seconds": Kind.HISTOGRAM,
    "vllm:request_queue_time_seconds": Kind.HISTOGRAM,
    "vllm:request_inference_time_seconds": Kind.HISTOGRAM,
    "vllm:request_prefill_time_seconds": Kind.HISTOGRAM,
    "vllm:request_decode_time_seconds": Kind.HISTOGRAM,
}

# Each engine's metric prefix and the other spellings that reach Tailwatch for it: underscore escaping
# (`vllm_`), an OpenTelemetry SDK's dotted instrument names (`vllm.`), Ray's metrics agent (`ray_vllm:`, ...).
SPELLINGS: dict[str, tuple[str, ...]] = {
    "vllm:": ("vllm_", "vllm.", "ray_vllm:", "ray_vllm_", "ray_vllm."),
    "sglang:": ("sglang_", "sglang."),
}

_TOTAL = "_total"


def spelling(name: str) -> str:
    """The one spelling every variant of a metric name reduces to."""
    n = name.strip().lower()
    for prefix, variants in SPELLINGS.items():
        for variant in variants:
            if n.startswith(variant):
                n = prefix + n[len(variant) :]
                break
    return n[: -len(_TOTAL)] if n.endswith(_TOTAL) else n


def spellings(name: str) -> tuple[str, ...]:
    """Every spelling of a table name that reaches the same metric (with `_total` too, for a counter's)."""
    for prefix, variants in SPELLINGS.items():
        if name.startswith(prefix):
            return (name, *(variant + name[len(prefix) :] for variant in variants))
    return (name,)


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


# ---------------------------------------------------------------------------------------------------
# The name table of docs/engine-metrics.md, generated from the tables above.

DOC = Path(__file__).resolve().parent.parent / "docs" / "engine-metrics.md"
BEGIN = "<!-- engine names: generated by `python -m collector.engine_names --write`; edit collector/engine_names.py -->"
END = "<!-- end of engine names -->"


def names_table() -> str:
    """The canonical metrics and their names, then the spellings each engine prefix is also matched by."""
    lines = [
        "| canonical metric | type | unit | meaning | names |",
        "|---|---|---|---|---|",
        *(
            f"| `{canonical}` | {m.kind.value} | {m.unit} | {m.meaning} | {', '.join(f'`{n}`' for n in m.names)} |"
            for canonical, m in ENGINE_METRICS.items()
        ),
        "",
        "| a name spelt | is also matched as |",
        "|---|---|",
        *(f"| `{prefix}x` | {', '.join(f'`{v}x`' for v in variants)} |" for prefix, variants in SPELLINGS.items()),
    ]
    return "\n".join(lines) + "\n"


def with_table(page: str) -> str:
    """The page with the text between its generated-table markers replaced by `names_table()`."""
    head, begin, rest = page.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{DOC.name} lacks the generated-table markers")
    return f"{head}{BEGIN}\n{names_table()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check, or rewrite, the engine name table of the docs.")
    parser.add_argument("--write", action="store_true", help=f"rewrite the table in {DOC.name}")
    args = parser.parse_args(argv)
    page = DOC.read_text()
    wanted = with_table(page)
    if args.write:
        DOC.write_text(wanted)
        return 0
    if page != wanted:
        print(f"{DOC} differs from collector/engine_names.py: run python -m collector.engine_names --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
