"""The bucket rule: which cache-hit, queue-per-replica and prompt-length bucket a request falls in.

cache_curve, saturation and context_length put each request in a bucket by edges their configs set,
and label their alerts with it (`bucket=low`, `prompt_bucket=64k+`). clusters splits a window by the
same buckets to explain those alerts, so both must draw the lines in the same place: the default
edges, the bucket names and the expression live here once, each detector's Config builds its
`Buckets` from its own edges, and the detection pass hands clusters the configured ones
(clusters.following).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import polars as pl
from polars.datatypes import DataType

# cache_curve: above HIGH is high, below LOW is low, medium holds both its ends.
CACHE_HIGH = 0.85
CACHE_LOW = 0.55
CACHE_NAMES = ("low", "medium", "high")
# saturation: queued requests per replica where warm, saturating and scaling begin.
SATURATION_EDGES = (2.0, 8.0, 16.0)
SATURATION_NAMES = ("idle", "warm", "saturating", "scaling")
# context_length: input_tokens and output_tokens where each bucket after the first begins.
PROMPT_EDGES = (8192, 32768, 65536)
OUTPUT_EDGES = (500, 2000)


@dataclass(frozen=True)
class Buckets:
    """Buckets of one number, lowest first: `names[0]` below `edges[0]`, then one bucket from each edge on.

    An edge belongs to the bucket it opens, except the last one when `above_last`: then the top bucket
    starts only above it (cache_curve's high bucket is above its threshold, so medium holds both ends).
    """

    names: tuple[str, ...]
    edges: tuple[float, ...]
    above_last: bool = False

    def __post_init__(self) -> None:
        if len(self.names) != len(self.edges) + 1:
            raise ValueError(f"{len(self.edges)} edges make {len(self.edges) + 1} buckets, not {len(self.names)}")

    def expr(self, value: pl.Expr, dtype: DataType | type[DataType] = pl.String) -> pl.Expr:
        """Each value's bucket name as `dtype`; NULL for a NULL value, which is in no bucket."""
        reaches = [value >= edge for edge in self.edges]
        if self.above_last:
            reaches[-1] = value > self.edges[-1]
        bucket = pl.lit(self.names[0], dtype)
        for reached, name in zip(reaches, self.names[1:], strict=True):
            bucket = pl.when(reached).then(pl.lit(name, dtype)).otherwise(bucket)
        return pl.when(value.is_not_null()).then(bucket)

    def enum(self) -> pl.Enum:
        """The names as an enum: a byte a request where a window's requests carry the bucket."""
        return pl.Enum(list(self.names))


def cache_hit(high: float = CACHE_HIGH, low: float = CACHE_LOW) -> Buckets:
    return Buckets(CACHE_NAMES, (low, high), above_last=True)


def queue_per_replica(edges: tuple[float, float, float] = SATURATION_EDGES) -> Buckets:
    return Buckets(SATURATION_NAMES, edges)


def per_replica_load() -> pl.Expr:
    """Queued requests per replica as the request saw them. Every request was served by some replica, so a
    replica_count of 0 is a missing value (NULL: no bucket), not an infinite load."""
    replicas = pl.col("replica_count")
    return pl.col("queue_depth") / pl.when(replicas > 0).then(replicas)


def prompt_length(edges: tuple[int, ...] = PROMPT_EDGES) -> Buckets:
    return Buckets(tuple(prompt_buckets(edges)), edges)


def output_length(edges: tuple[int, ...] = OUTPUT_EDGES) -> Buckets:
    return Buckets(tuple(output_buckets(edges)), edges)


def prompt_buckets(edges: tuple[int, ...]) -> list[str]:
    """Prompt bucket names, shortest first: '0-8k', '8k-32k', '32k-64k', '64k+' for the defaults."""
    bounds = ["0", *(_tokens(e) for e in edges)]
    return [f"{a}-{b}" for a, b in pairwise(bounds)] + [f"{bounds[-1]}+"]


def output_buckets(edges: tuple[int, ...]) -> list[str]:
    """Output bucket names, shortest first: '<500', '500-2000', '2000+' for the defaults."""
    middle = [f"{a}-{b}" for a, b in pairwise(edges)]
    return [f"<{edges[0]}", *middle, f"{edges[-1]}+"]


def _tokens(edge: int) -> str:
    return f"{edge // 1024}k" if edge % 1024 == 0 else str(edge)
