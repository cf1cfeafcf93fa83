"""quantization_delta: whether a quantized variant of a model answers worse, or slower, than its baseline.

Quantization trades precision for memory and speed. The loss is often invisible on free-form answers
and shows first where exact tokens matter: JSON that must parse, a tool call whose arguments must
match a schema. So the same model served at several precisions is compared variant by variant.

Definitions, per window (requests that ended in it; a request without a model or a quantization is
left out, as it has no baseline of the same model to be compared with):

- variant: the request's quantization, per model.
- baseline: per model, the configured `baseline` variant when the window has it (matched ignoring case;
  a model without it has NULL baseline columns), else the highest-precision variant seen for that
  model, in the order fp32 > bf16 = fp16 > fp8 > int8 > int4 > any unrecognised name (see `precision`).
  Ties go to the variant with more requests, then to the name.
- n, latency_p99 (of e2e_ms): per variant; baseline_n, baseline_latency_p99: the baseline's.
  latency_delta = latency_p99 − baseline_latency_p99 (ms).
- score_mean / score_n: the mean and count of each score name over the variant's requests;
  baseline_score_mean: the baseline's mean of that name; score_delta = score_mean − baseline_score_mean.

Figures are long: one row per (model, variant, score name), the variant's latency figures repeated; a
variant without scores has one row whose score columns are NULL. The baseline has rows too, its
deltas 0.

A variant other than the baseline breaches when a score's mean is at least structured_drop below the
baseline's for a score named in structured_scores, or at least any_drop below for any score (signal:
the score name), or when its latency_p99 is at least latency_factor x the baseline's (signal
latency_p99). Both sides need min_samples requests, and for a score as many scores of that name.

Alert labels (LABELS): model, quantization (the variant), signal (the score name, or latency_p99).
"""

from __future__ import annotations

from typing import Any

import polars as pl
from pydantic import Field

from detectors.base import Condition, Detection, DetectorConfig, Read, Window
from detectors.frames import breaches, format_duration, ids_as_strings, percentile, requests, score_means, scores

KEY = "quantization_delta"
SUMMARY = "Each quantization variant's scores and latency against the highest-precision variant."
LABELS = ("model", "quantization", "signal")
REQUEST_COLUMNS = ("model", "quantization", "e2e_ms")
FIGURE_COLUMNS = [
    "window_start",
    "window_end",
    "model",
    "quantization",
    "baseline_quantization",
    "n",
    "baseline_n",
    "latency_p99",
    "baseline_latency_p99",
    "latency_delta",
    "score_name",
    "score_mean",
    "baseline_score_mean",
    "score_delta",
    "score_n",
]

# Higher is more precise. Names as serving engines and model hubs spell them; AWQ and GPTQ checkpoints
# are almost always 4-bit weights, W8A8 is 8-bit weights and activations.
_PRECISION = {
    **dict.fromkeys(("fp32", "float32", "f32"), 5),
    **dict.fromkeys(("bf16", "bfloat16", "fp16", "float16", "f16", "half"), 4),
    **dict.fromkeys(("fp8", "float8", "fp8_e4m3", "fp8_e5m2", "w8a8_fp8"), 3),
    **dict.fromkeys(("int8", "w8a8", "w8a16", "w8a8_int8", "smoothquant"), 2),
    **dict.fromkeys(("int4", "w4a16", "awq", "gptq", "awq_marlin", "gptq_marlin", "nf4"), 1),
}
_UNKNOWN = 0


def precision(quantization: str) -> int:
    """Rank of a quantization name: 5 fp32, 4 bf16/fp16, 3 fp8, 2 int8, 1 int4, 0 unrecognised."""
    name = quantization.strip().lower()
    if name in _PRECISION:
        return _PRECISION[name]
    # Engines suffix formats with kernels or layouts (fp8_dynamic, awq_gemm, gptq_exllama).
    for prefix, rank in (("fp8", 3), ("awq", 1), ("gptq", 1)):
        if name.startswith(prefix):
            return rank
    return _UNKNOWN


class Config(DetectorConfig):
    baseline: str | None = Field(
        None,
        description="The variant every other one of a model is compared with (e.g. 'fp16'); None: the "
        "highest-precision variant of that model in the window.",
    )
    structured_scores: tuple[str, ...] = Field(
        ("json_adherence", "tool_call_correctness", "schema_validity"),
        description="Scores of exact-format output, which quantization hurts first: judged by structured_drop.",
    )
    structured_drop: float = Field(
        0.02,
        gt=0,
        description="Alert when a variant's mean of a structured score is at least this below the baseline's.",
    )
    any_drop: float = Field(
        0.05, gt=0, description="Alert when a variant's mean of any score is at least this below the baseline's."
    )
    latency_factor: float = Field(
        1.5, gt=1, description="Alert when a variant's e2e p99 is at least this multiple of the baseline's."
    )
    min_samples: int = Field(
        30, ge=1, description="Requests (and scores of a name) both the variant and the baseline need for a verdict."
    )


def inputs(config: Config, window: Window) -> dict[str, Read]:
    return {"requests": requests(window, REQUEST_COLUMNS), "scores": scores(window)}


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    # Hand-built or empty frames may carry Null dtypes; the figures table needs the real ones.
    reqs = (
        frames["requests"]
        .with_columns(
            *ids_as_strings(frames["requests"]),
            pl.col("model", "quantization").cast(pl.String),
            pl.col("e2e_ms").cast(pl.Float64),
        )
        .filter(pl.col("model").is_not_null() & pl.col("quantization").is_not_null())
    )
    score_frame = frames["scores"].with_columns(
        *ids_as_strings(frames["scores"]), pl.col("name").cast(pl.String), pl.col("score").cast(pl.Float64)
    )

    variants = _variants(reqs, config)
    means = score_means(reqs, score_frame, ["model", "quantization"]).select(
        "model",
        "quantization",
        "score_name",
        pl.col("score_value").alias("score_mean"),
        pl.col("score_n").cast(pl.Int64),
    )
    baseline_means = means.select(
        "model",
        pl.col("quantization").alias("baseline_quantization"),
        "score_name",
        pl.col("score_mean").alias("baseline_score_mean"),
        pl.col("score_n").alias("baseline_score_n"),
    )
    long = (
        variants.join(means, on=["model", "quantization"], how="left")
        .join(baseline_means, on=["model", "baseline_quantization", "score_name"], how="left")
        .with_columns(
            score_delta=pl.col("score_mean") - pl.col("baseline_score_mean"),
            window_start=pl.lit(window.start, pl.Datetime("us")),
            window_end=pl.lit(window.end, pl.Datetime("us")),
        )
        .sort(
            [
                pl.col("model"),
                pl.col("quantization") != pl.col("baseline_quantization"),
                pl.col("rank"),
                pl.col("quantization"),
                pl.col("score_name"),
            ],
            descending=[False, False, True, False, False],
            nulls_last=True,
        )
    )
    conditions = _latency_conditions(variants, config, window) + _score_conditions(long, config, window)
    conditions.sort(key=lambda c: (c.labels["model"], c.labels["quantization"], c.labels["signal"]))
    return Detection(figures=long.select(FIGURE_COLUMNS), conditions=conditions)


def _variants(reqs: pl.DataFrame, config: Config) -> pl.DataFrame:
    """Per (model, variant): n, latency_p99, its precision rank, and its model's baseline figures."""
    per_variant = reqs.group_by("model", "quantization").agg(
        pl.len().cast(pl.Int64).alias("n"), percentile("e2e_ms", 0.99, "latency_p99")
    )
    ranks = {name: precision(name) for name in per_variant["quantization"].unique().to_list()}
    per_variant = per_variant.with_columns(
        pl.col("quantization").replace_strict(ranks, default=_UNKNOWN, return_dtype=pl.Int64).alias("rank")
    )
    candidates = per_variant
    if config.baseline is not None:
        candidates = per_variant.filter(pl.col("quantization").str.to_lowercase() == config.baseline.lower())
    baselines = (
        candidates.sort(["model", "rank", "n", "quantization"], descending=[False, True, True, False])
        .group_by("model", maintain_order=True)
        .first()
        .select(
            "model",
            pl.col("quantization").alias("baseline_quantization"),
            pl.col("n").alias("baseline_n"),
            pl.col("latency_p99").alias("baseline_latency_p99"),
        )
    )
    return per_variant.join(baselines, on="model", how="left").with_columns(
        latency_delta=pl.col("latency_p99") - pl.col("baseline_latency_p99"),
        ratio=pl.when(pl.col("baseline_latency_p99") > 0).then(pl.col("latency_p99") / pl.col("baseline_latency_p99")),
    )


def _challengers(frame: pl.DataFrame, config: Config) -> pl.DataFrame:
    """Rows of a variant that is not its model's baseline, with enough requests on both sides."""
    return frame.filter(
        (pl.col("quantization") != pl.col("baseline_quantization"))
        & (pl.min_horizontal("n", "baseline_n") >= config.min_samples)
    )


def _latency_conditions(variants: pl.DataFrame, config: Config, window: Window) -> list[Condition]:
    breached = _challengers(variants, config).filter(breaches(pl.col("ratio"), config.latency_factor))
    return [_latency_condition(row, config, window) for row in breached.iter_rows(named=True)]


def _score_conditions(long: pl.DataFrame, config: Config, window: Window) -> list[Condition]:
    # "Or": a structured score breaches at either threshold, so the lower one decides.
    threshold = (
        pl.when(pl.col("score_name").is_in(list(config.structured_scores)))
        .then(pl.lit(min(config.structured_drop, config.any_drop)))
        .otherwise(pl.lit(config.any_drop))
    )
    breached = (
        _challengers(long, config)
        .with_columns(drop=-pl.col("score_delta"), threshold=threshold)
        .filter(
            (pl.min_horizontal("score_n", "baseline_score_n").fill_null(0) >= config.min_samples)
            & breaches(pl.col("drop"), pl.col("threshold"))
        )
    )
    return [_score_condition(row, config, window) for row in breached.iter_rows(named=True)]


def _describe(row: dict[str, Any]) -> str:
    return f"{row['quantization']} variant of {row['model']}"


def _labels(row: dict[str, Any], signal: str) -> dict[str, str]:
    return {"model": str(row["model"]), "quantization": str(row["quantization"]), "signal": signal}


def _score_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    name, drop = str(row["score_name"]), float(row["drop"])
    # Named, not "the higher-precision one": a configured baseline may be the lower-precision side.
    baseline = f"the {row['baseline_quantization']} variant"
    if name in config.structured_scores:
        advice = f"route structured outputs to {baseline}"
    else:
        advice = (
            f"route quality-sensitive traffic to {baseline} or re-quantize with calibration data closer to this traffic"
        )
    summary = (
        f"{_describe(row)}: {name} mean {row['score_mean']:.2f} vs {row['baseline_score_mean']:.2f} on "
        f"{row['baseline_quantization']} (−{drop:.2f}) over {window.label()}, n={row['score_n']} vs "
        f"{row['baseline_score_n']}; {advice}"
    )
    return Condition(labels=_labels(row, name), value=drop, threshold=float(row["threshold"]), summary=summary)


def _latency_condition(row: dict[str, Any], config: Config, window: Window) -> Condition:
    ratio = float(row["ratio"])
    summary = (
        f"{_describe(row)}: e2e p99 {format_duration(row['latency_p99'])} is {ratio:.1f}x "
        f"{row['baseline_quantization']}'s {format_duration(row['baseline_latency_p99'])} over {window.label()}, "
        f"n={row['n']} vs {row['baseline_n']}; check that its replicas run a kernel built for this format and "
        f"have the baseline's capacity, or route latency-sensitive traffic to the {row['baseline_quantization']} "
        "variant"
    )
    return Condition(labels=_labels(row, "latency_p99"), value=ratio, threshold=config.latency_factor, summary=summary)
