"""context_length: whether long prompts or long outputs get worse answers than the rest of the traffic.

A long prompt fills the KV cache, gets chunked across steps and pushes the relevant passage far from
the question; a long output drifts. Either shows as a lower score in one prompt-length x output-length
cell than in the best cell of the window, while the aggregate barely moves.

Definitions, per window (requests that ended in it; a request without input_tokens or output_tokens is
left out, as it has no cell):

- prompt_bucket, by input_tokens against prompt_edges (default 8192, 32768, 65536): "0-8k" below the
  first edge, "8k-32k" and "32k-64k" between edges, "64k+" from the last one. An edge belongs to the
  bucket it opens. Edges that are multiples of 1024 are written in k, others in tokens.
- output_bucket, by output_tokens against output_edges (default 500, 2000): "<500", "500-2000", "2000+".
- n, latency_p50 / latency_p99 (of e2e_ms), tpot_p99: per cell.
- score_mean / score_n: the mean and count of each score name over the cell's requests.
- best cell of a score: the highest mean of that score among the cells with min_samples requests and
  as many scores of that name; a tie goes to the shorter prompts, then the shorter outputs.

Figures are long: one row per (prompt_bucket, output_bucket, score name), the cell's latency figures
repeated; a cell without scores has one row whose score columns are NULL.

A cell with min_samples requests and as many scores of a name breaches when its mean of that score is
at least score_drop below the best cell's (signal: the score name).

Alert labels (LABELS): prompt_bucket, output_bucket (the cell), signal (the score name).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any, Self

import polars as pl
from pydantic import Field, model_validator

from detectors.base import Condition, Detection, DetectorConfig, Read, Window
from detectors.buckets import OUTPUT_EDGES, PROMPT_EDGES, Buckets, output_length, prompt_length
from detectors.frames import breaches, curve, ids_as_strings, requests, scores

KEY = "context_length"
SUMMARY = "Quality and latency by prompt-length x output-length cell, against the best cell."
LABELS = ("prompt_bucket", "output_bucket", "signal")
REQUEST_COLUMNS = ("input_tokens", "output_tokens", "e2e_ms", "tpot_ms")
FIGURE_COLUMNS = [
    "window_start",
    "window_end",
    "prompt_bucket",
    "output_bucket",
    "n",
    "latency_p50",
    "latency_p99",
    "tpot_p99",
    "score_name",
    "score_mean",
    "score_n",
]


class Config(DetectorConfig):
    prompt_edges: tuple[int, ...] = Field(
        PROMPT_EDGES,
        min_length=1,
        description="input_tokens where each prompt-length bucket after the first begins, ascending.",
    )
    output_edges: tuple[int, ...] = Field(
        OUTPUT_EDGES,
        min_length=1,
        description="output_tokens where each output-length bucket after the first begins, ascending.",
    )
    score_drop: float = Field(
        0.10, gt=0, description="Alert when a cell's mean of a score is at least this below the best cell's."
    )
    min_samples: int = Field(
        30,
        ge=1,
        description="Requests (and scores of a name) a cell needs to be judged or to be the best cell.",
    )

    @model_validator(mode="after")
    def _edges_ascending(self) -> Self:
        for name, edges in (("prompt_edges", self.prompt_edges), ("output_edges", self.output_edges)):
            if edges[0] < 1 or any(a >= b for a, b in pairwise(edges)):
                raise ValueError(f"{name} must be positive and strictly ascending")
        return self

    def prompt_length(self) -> Buckets:
        return prompt_length(self.prompt_edges)

    def output_length(self) -> Buckets:
        return output_length(self.output_edges)


def inputs(config: Config, window: Window) -> dict[str, Read]:
    return {"requests": requests(window, REQUEST_COLUMNS), "scores": scores(window)}


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    prompts, outputs = config.prompt_length(), config.output_length()
    # Hand-built or empty frames may carry Null dtypes; the figures table needs the real ones.
    reqs = (
        frames["requests"]
        .with_columns(
            *ids_as_strings(frames["requests"]),
            pl.col("input_tokens", "output_tokens").cast(pl.Int64),
            pl.col("e2e_ms", "tpot_ms").cast(pl.Float64),
        )
        .filter(pl.col("input_tokens").is_not_null() & pl.col("output_tokens").is_not_null())
        .with_columns(
            # One struct key so the shared one-column curve can group by the two buckets together.
            pl.struct(
                prompts.expr(pl.col("input_tokens")).alias("prompt_bucket"),
                outputs.expr(pl.col("output_tokens")).alias("output_bucket"),
            ).alias("cell")
        )
    )
    score_frame = frames["scores"].with_columns(
        *ids_as_strings(frames["scores"]), pl.col("name").cast(pl.String), pl.col("score").cast(pl.Float64)
    )

    _cells, long = curve(reqs, score_frame, "cell")
    figures = (
        long.unnest("cell")
        .with_columns(
            window_start=pl.lit(window.start, pl.Datetime("us")), window_end=pl.lit(window.end, pl.Datetime("us"))
        )
        .sort(
            [
                pl.col("prompt_bucket").replace_strict({b: i for i, b in enumerate(prompts.names)}),
                pl.col("output_bucket").replace_strict({b: i for i, b in enumerate(outputs.names)}),
                pl.col("score_name"),
            ],
            nulls_last=True,
        )
        .select(FIGURE_COLUMNS)
    )
    return Detection(figures=figures, conditions=_score_conditions(figures, config, window))


def _score_conditions(figures: pl.DataFrame, config: Config, window: Window) -> list[Condition]:
    enough = pl.min_horizontal("n", "score_n").fill_null(0) >= config.min_samples
    judged = figures.filter(enough & pl.col("score_name").is_not_null())
    # Figures are sorted shortest cell first, so the first of equal means is the shortest cell.
    best = (
        judged.sort("score_mean", descending=True, maintain_order=True)
        .group_by("score_name", maintain_order=True)
        .first()
        .select(
            "score_name",
            pl.col("prompt_bucket").alias("best_prompt_bucket"),
            pl.col("output_bucket").alias("best_output_bucket"),
            pl.col("score_mean").alias("best_score_mean"),
            pl.col("score_n").alias("best_score_n"),
        )
    )
    breached = (
        judged.join(best, on="score_name", maintain_order="left")
        .with_columns(drop=pl.col("best_score_mean") - pl.col("score_mean"))
        .filter(breaches(pl.col("drop"), config.score_drop))
    )
    return [_score_condition(row, config, window) for row in breached.iter_rows(named=True)]


def _score_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    prompt, output, name = str(row["prompt_bucket"]), str(row["output_bucket"]), str(row["score_name"])
    drop = float(row["drop"])
    if prompt != row["best_prompt_bucket"]:
        advice = "route long contexts to a dedicated deployment or raise gpu_memory_utilization"
    else:
        # Same prompt length as the best cell: the output length is what differs, not the context.
        advice = "check whether these generations hit max_tokens and split long outputs into shorter requests"
    summary = (
        f"prompts {prompt} with outputs {output}: {name} mean {row['score_mean']:.2f} vs "
        f"{row['best_score_mean']:.2f} in the best cell ({row['best_prompt_bucket']}, {row['best_output_bucket']}) "
        f"(−{drop:.2f}) over {window.label()}, n={row['score_n']} vs {row['best_score_n']}; {advice}"
    )
    return Condition(
        labels={"prompt_bucket": prompt, "output_bucket": output, "signal": name},
        value=drop,
        threshold=config.score_drop,
        summary=summary,
    )
