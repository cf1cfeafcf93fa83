"""What settling stores of a span's engine facts, and how much of it one step takes, for either backend.

Settling (docs/engine-metrics.md) computes each LLM span's engine facts once, with the request model's own
join, and stores them in its `engine_*` columns, so later reads join nothing.
"""

from __future__ import annotations

from datetime import timedelta

# One hour of spans a step: DuckDB's writer commits ingest between steps, and a step's engine states stay small.
CHUNK = timedelta(hours=1)

# The facts stored, each in `engine_<fact>`, as the request model's `span_engine_facts_between` gives them.
FACTS = ("queue_depth", "replica_count", "cache_hit_ratio", "kv_cache_usage", "running_requests", "preemptions",
          "step_tokens", "facts_reason")  # fmt: skip
