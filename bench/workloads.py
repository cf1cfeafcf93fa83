"""The ingest benchmarks' workloads, by name: `flat` (one vLLM-style span a request row, one resource:
bench/llm_spans.py) and `mix` (the realistic mix a Collector batching a fleet sends: bench/mixed_spans.py)."""

from __future__ import annotations

from collections.abc import Callable

from llm_spans import unique_requests
from mixed_spans import mixed_requests

# (requests, spans per request, seed, first start in ns) -> serialized ExportTraceServiceRequests
WORKLOADS: dict[str, Callable[..., list[bytes]]] = {"flat": unique_requests, "mix": mixed_requests}
