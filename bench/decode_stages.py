"""Decoder cost by stage, in µs per span, on the ingest benchmark's spans: compiled vs Python, one run.

Best of 5, one core, the same 20 requests of 1,000 spans (20 attributes each) for every row:
- the walk alone (parse, validate, stored columns, gathered keys), compiled and Python;
- the shared finish alone (scores, first-token times, normalization, the final batch), also in the form
  DuckDB stores (split attributes, derived values left out: what the service runs);
- the whole `decode_traces` with each decoder.

.venv/bin/python bench/decode_stages.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llm_spans import unique_requests

from collector import native_walk, span_walk
from collector.decode import Decoder, Encoding, decode_traces, default_plan, finish
from model.attribute_split import gathered_keys, left_out


def best_of(fn: Callable[[], object], spans: int, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best / spans * 1e6


def main() -> None:
    requests = unique_requests(20, 1000, seed=1, t0_ns=(int(time.time()) - 3600) * 10**9)
    n = 20 * 1000
    plan = default_plan()
    keys = (plan.walk_span_keys, plan.walk_resource_keys)
    walked = [span_walk.walk(r, *keys) for r in requests]
    split_keys = gathered_keys(plan.walk_span_keys)
    walked_split = [span_walk.walk(r, split_keys, plan.walk_resource_keys, left_out(split_keys)) for r in requests]

    stages: list[tuple[str, Callable[[], object]]] = [
        ("python walk", lambda: [span_walk.walk(r, *keys) for r in requests]),
        ("shared finish (normalize, scores, batch)", lambda: [finish(w, plan) for w in walked]),
        ("shared finish, as DuckDB stores it", lambda: [finish(w, plan, split_attributes=True) for w in walked_split]),
        (
            "full decode_traces, python",
            lambda: [decode_traces(r, Encoding.PROTOBUF, decoder=Decoder.PYTHON) for r in requests],
        ),
    ]
    if native_walk.AVAILABLE:
        stages[1:1] = [("compiled walk", lambda: [native_walk.walk(r, *keys) for r in requests])]
        stages.append(
            (
                "full decode_traces, compiled",
                lambda: [decode_traces(r, Encoding.PROTOBUF, decoder=Decoder.NATIVE) for r in requests],
            )
        )
    else:
        print("the compiled decoder is not installed: only the Python rows", file=sys.stderr)
    figures = {name: best_of(fn, n) for name, fn in stages}
    for name, us in figures.items():
        print(f"{name:45s} {us:6.2f} µs/span   {1e6 / us:>9,.0f} spans/s per core")
    if native_walk.AVAILABLE:
        ratio = figures["full decode_traces, python"] / figures["full decode_traces, compiled"]
        print(f"compiled decode_traces is {ratio:.1f}x the Python one")


if __name__ == "__main__":
    main()
