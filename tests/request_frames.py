"""Hand-built detector inputs: the window the detector tests evaluate, the scores frame and the ways to
fill it, latency spreads, and the frames a detector reads. Each test module builds its own requests (a
cache bucket, a prompt-length cell, a replica) by its detector's request columns."""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import polars as pl

from detectors.base import Window

WINDOW = Window(datetime(2026, 11, 20, 12, 0), datetime(2026, 11, 20, 12, 5))
SCORE_SCHEMA = {"trace_id": pl.String, "span_id": pl.String, "name": pl.String, "score": pl.Float64}


def spread(low: float, high: float, n: int) -> list[float]:
    """n values evenly from low to high: a deterministic stand-in for a distribution."""
    return [low + (high - low) * i / (n - 1) for i in range(n)] if n > 1 else [low]


def scores_of(requests: pl.DataFrame, name: str, values: list[float]) -> pl.DataFrame:
    """A score of `name` for each of the first len(values) requests, in order."""
    head = requests.head(len(values))
    return pl.DataFrame(
        {"trace_id": head["trace_id"], "span_id": head["span_id"], "name": [name] * len(values), "score": values},
        schema=SCORE_SCHEMA,
    )


def noisy_scores(requests: pl.DataFrame, name: str, mean: float, seed: int = 7, noise: float = 0.02) -> pl.DataFrame:
    """A score of `name` per request, drawn around `mean` (seeded) and kept within 0..1."""
    rng = random.Random(seed)
    return scores_of(requests, name, [min(1.0, max(0.0, rng.gauss(mean, noise))) for _ in range(requests.height)])


def alternating_scores(requests: pl.DataFrame, name: str, mean: float) -> pl.DataFrame:
    """Scores alternating 0.02 either side of `mean`: over an even count, exactly that mean."""
    return scores_of(requests, name, [mean + (0.02 if i % 2 else -0.02) for i in range(requests.height)])


def even_scores(requests: pl.DataFrame, name: str, mean: float) -> pl.DataFrame:
    """Scores of `name` spread evenly ±0.05 around `mean`, so the mean is exact."""
    return scores_of(requests, name, spread(mean - 0.05, mean + 0.05, requests.height))


def detector_frames(
    requests: list[pl.DataFrame] | tuple[pl.DataFrame, ...],
    scores: list[pl.DataFrame] | None,
    request_schema: Mapping[str, Any],
) -> dict[str, pl.DataFrame]:
    """The requests and scores a detector reads, each concatenated; typed and empty when there are none."""
    return {
        "requests": pl.concat(requests) if requests else pl.DataFrame(schema=request_schema),
        "scores": pl.concat(scores) if scores else pl.DataFrame(schema=SCORE_SCHEMA),
    }
