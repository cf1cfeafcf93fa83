"""quantization_delta on hand-built frames: a quantized variant losing structured accuracy fires, its baseline holds."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from detector_tables import assert_fits_migrated_table
from request_frames import SCORE_SCHEMA, WINDOW, alternating_scores, detector_frames, spread

from detectors.base import Detection
from detectors.quantization_delta import LABELS, Config, detect, inputs, precision

REQUEST_SCHEMA = {
    "trace_id": pl.String,
    "span_id": pl.String,
    "model": pl.String,
    "quantization": pl.String,
    "e2e_ms": pl.Float64,
}
LLAMA = "llama-3.1-8b"


def variant(
    quantization: str | None, n: int, e2e: list[float] | None = None, model: str | None = LLAMA
) -> pl.DataFrame:
    prefix = f"{model}-{quantization}"
    return pl.DataFrame(
        {
            "trace_id": [f"{prefix}-{i}" for i in range(n)],
            "span_id": ["s"] * n,
            "model": [model] * n,
            "quantization": [quantization] * n,
            "e2e_ms": spread(800, 1200, n) if e2e is None else e2e,
        },
        schema=REQUEST_SCHEMA,
    )


def run(
    requests: list[pl.DataFrame], scores: list[pl.DataFrame] | None = None, config: Config | None = None
) -> Detection:
    return detect(detector_frames(requests, scores, REQUEST_SCHEMA), config or Config(), WINDOW)


def rows(out: Detection, *columns: str) -> list[tuple[object, ...]]:
    return out.figures.select(columns).rows()


def three_variants() -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """fp16 / fp8 / int4 of one model: tool_call_correctness 0.90 / 0.89 / 0.80, equal latency."""
    fp16, fp8, int4 = variant("fp16", 200), variant("fp8", 160), variant("int4", 120)
    scores = [
        alternating_scores(fp16, "tool_call_correctness", 0.90),
        alternating_scores(fp8, "tool_call_correctness", 0.89),
        alternating_scores(int4, "tool_call_correctness", 0.80),
    ]
    return [int4, fp8, fp16], scores


def test_an_int4_variant_losing_a_tenth_on_tool_calls_fires_for_that_variant_only() -> None:
    out = run(*three_variants())

    [condition] = out.conditions
    assert condition.labels == {"model": LLAMA, "quantization": "int4", "signal": "tool_call_correctness"}
    assert tuple(condition.labels) == LABELS
    assert condition.value == pytest.approx(0.10)
    assert condition.threshold == 0.02
    assert condition.severity is None
    assert condition.summary == (
        "int4 variant of llama-3.1-8b: tool_call_correctness mean 0.80 vs 0.90 on fp16 (−0.10) over "
        "2026-11-20 12:00–12:05 UTC, n=120 vs 200; route structured outputs to the fp16 variant"
    )

    # The baseline first, then by precision; its own row carries zero deltas.
    assert rows(out, "quantization", "baseline_quantization", "n", "baseline_n", "score_n") == [
        ("fp16", "fp16", 200, 200, 200),
        ("fp8", "fp16", 160, 200, 160),
        ("int4", "fp16", 120, 200, 120),
    ]
    assert out.figures["score_delta"].to_list() == pytest.approx([0.0, -0.01, -0.10])
    assert out.figures["baseline_score_mean"].to_list() == pytest.approx([0.90] * 3)
    assert out.figures["latency_delta"].to_list() == [0.0, 0.0, 0.0]


def test_a_003_loss_fires_on_a_structured_score_but_not_on_groundedness() -> None:
    fp16, int8 = variant("fp16", 100), variant("int8", 100)
    scores = [
        alternating_scores(fp16, "json_adherence", 0.95),
        alternating_scores(int8, "json_adherence", 0.92),
        alternating_scores(fp16, "groundedness", 0.90),
        alternating_scores(int8, "groundedness", 0.87),
    ]
    out = run([fp16, int8], scores)
    assert [(c.labels["signal"], c.threshold) for c in out.conditions] == [("json_adherence", 0.02)]
    assert out.conditions[0].value == pytest.approx(0.03)

    # Past any_drop an unstructured score fires too, with its own advice.
    scores[-1] = alternating_scores(int8, "groundedness", 0.84)
    out = run([fp16, int8], scores)
    assert [(c.labels["signal"], c.threshold) for c in out.conditions] == [
        ("groundedness", 0.05),
        ("json_adherence", 0.02),
    ]
    assert out.conditions[0].summary.endswith(
        "route quality-sensitive traffic to the fp16 variant or re-quantize with calibration data closer to this "
        "traffic"
    )

    # Which scores count as structured is configuration.
    scores[-1] = alternating_scores(int8, "groundedness", 0.87)
    out = run([fp16, int8], scores, Config(structured_scores=("groundedness",)))
    assert [c.labels["signal"] for c in out.conditions] == ["groundedness"]

    # A structured score is also "any score": a structured_drop above any_drop does not shield it.
    out = run([fp16, int8], scores, Config(structured_drop=0.10, any_drop=0.03))
    assert [(c.labels["signal"], c.threshold) for c in out.conditions] == [
        ("groundedness", 0.03),
        ("json_adherence", 0.03),
    ]


def test_a_drop_of_exactly_the_threshold_fires() -> None:
    fp16, int4 = variant("fp16", 100), variant("int4", 100)
    # Computed, both pairs of means sit a hair under their threshold apart (0.0499999..., 0.0199999...).
    scores = [alternating_scores(fp16, "helpfulness", 0.85), alternating_scores(int4, "helpfulness", 0.80)]
    scores += [alternating_scores(fp16, "json_adherence", 0.95), alternating_scores(int4, "json_adherence", 0.93)]
    out = run([fp16, int4], scores)
    assert [(c.labels["signal"], c.threshold) for c in out.conditions] == [
        ("helpfulness", 0.05),
        ("json_adherence", 0.02),
    ]


def test_the_default_baseline_is_the_most_precise_variant_and_a_configured_one_overrides_it() -> None:
    # fp16 has the fewest requests and is still the baseline: precision first, volume only breaks ties.
    requests = [variant("int4", 300), variant("fp8", 500), variant("fp16", 100)]
    out = run(requests)
    assert rows(out, "quantization", "baseline_quantization") == [
        ("fp16", "fp16"),
        ("fp8", "fp16"),
        ("int4", "fp16"),
    ]

    configured = run(requests, config=Config(baseline="fp8"))
    assert rows(configured, "quantization", "baseline_quantization", "baseline_n") == [
        ("fp8", "fp8", 500),
        ("fp16", "fp8", 500),
        ("int4", "fp8", 500),
    ]
    assert run(requests, config=Config(baseline="FP8")).figures.equals(configured.figures)

    # A model without the configured variant has nothing to be compared with.
    absent = run(requests, config=Config(baseline="int8"))
    assert absent.figures["baseline_quantization"].to_list() == [None, None, None]
    assert absent.conditions == []


def test_bf16_and_fp16_tie_on_precision_and_each_model_has_its_own_baseline() -> None:
    requests = [
        variant("fp16", 100),
        variant("bf16", 120),
        variant("int4", 100),
        variant("awq", 50, model="qwen-2.5-7b"),
        variant("w8a8", 40, model="qwen-2.5-7b"),
        variant("mystery-format", 60, model="qwen-2.5-7b"),
    ]
    out = run(requests)
    assert rows(out, "model", "quantization", "baseline_quantization") == [
        (LLAMA, "bf16", "bf16"),
        (LLAMA, "fp16", "bf16"),
        (LLAMA, "int4", "bf16"),
        ("qwen-2.5-7b", "w8a8", "w8a8"),
        ("qwen-2.5-7b", "awq", "w8a8"),
        ("qwen-2.5-7b", "mystery-format", "w8a8"),
    ]


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("fp32", 5),
        ("BF16", 4),
        ("fp16", 4),
        ("fp8_e4m3", 3),
        ("fp8_dynamic", 3),
        ("int8", 2),
        ("w8a8", 2),
        ("int4", 1),
        ("awq", 1),
        ("gptq_marlin", 1),
        # Kernel or layout suffixes the table does not list still rank by their format.
        ("awq_gemm", 1),
        ("gptq_exllama", 1),
        ("fp8_block", 3),
        ("mystery-format", 0),
    ],
)
def test_precision_order(name: str, rank: int) -> None:
    assert precision(name) == rank


def test_a_variant_at_one_and_a_half_times_the_baseline_p99_fires_and_just_below_does_not() -> None:
    fp16 = variant("fp16", 100, e2e=[1000.0] * 100)
    below = run([fp16, variant("int4", 100, e2e=[1490.0] * 100)])
    assert below.conditions == []

    out = run([fp16, variant("int4", 100, e2e=[1500.0] * 100)])
    [condition] = out.conditions
    assert condition.labels == {"model": LLAMA, "quantization": "int4", "signal": "latency_p99"}
    assert condition.value == pytest.approx(1.5)
    assert condition.threshold == 1.5
    assert condition.summary == (
        "int4 variant of llama-3.1-8b: e2e p99 1.5 s is 1.5x fp16's 1.0 s over 2026-11-20 12:00–12:05 UTC, "
        "n=100 vs 100; check that its replicas run a kernel built for this format and have the baseline's "
        "capacity, or route latency-sensitive traffic to the fp16 variant"
    )
    assert out.figures.filter(pl.col("quantization") == "int4")["latency_delta"].to_list() == [500.0]


def test_a_clean_window_fires_nothing() -> None:
    requests, scores = [], []
    for model, variants in ((LLAMA, ("fp16", "fp8", "int4")), ("qwen-2.5-7b", ("bf16", "awq"))):
        for i, quantization in enumerate(variants):
            # Quantized variants faster, as they should be; scores within 0.01 of the baseline.
            frame = variant(quantization, 100, e2e=spread(600 - 100 * i, 1000 - 100 * i, 100), model=model)
            requests.append(frame)
            scores += [
                alternating_scores(frame, "json_adherence", 0.95 - 0.005 * i),
                alternating_scores(frame, "groundedness", 0.88 + 0.01 * i),
            ]
    out = run(requests, scores)
    assert out.conditions == []
    assert out.figures.height == 10


def test_min_samples_gates_the_variant_the_baseline_and_the_scores() -> None:
    fp16 = variant("fp16", 100, e2e=[1000.0] * 100)
    fp16_scores = alternating_scores(fp16, "json_adherence", 0.95)
    for n, fires in [(29, False), (30, True)]:
        int4 = variant("int4", n, e2e=[5000.0] * n)
        out = run([fp16, int4], [fp16_scores, alternating_scores(int4, "json_adherence", 0.50)])
        assert {c.labels["signal"] for c in out.conditions} == ({"json_adherence", "latency_p99"} if fires else set())

    thin_fp16 = variant("fp16", 29, e2e=[1000.0] * 29)
    int4 = variant("int4", 100, e2e=[5000.0] * 100)
    out = run(
        [thin_fp16, int4],
        [alternating_scores(thin_fp16, "json_adherence", 0.95), alternating_scores(int4, "json_adherence", 0.50)],
    )
    assert out.conditions == []

    # Enough requests on both sides but a handful of scores: no mean to judge by.
    int4 = variant("int4", 100)
    assert run([fp16, int4], [fp16_scores, alternating_scores(int4.head(10), "json_adherence", 0.50)]).conditions == []
    assert run([fp16, int4], [fp16_scores.head(10), alternating_scores(int4, "json_adherence", 0.50)]).conditions == []
    assert (
        run(
            [fp16, int4], [fp16_scores, alternating_scores(int4, "json_adherence", 0.50)], Config(min_samples=200)
        ).conditions
        == []
    )


def test_figures_are_long_and_requests_without_a_model_or_a_quantization_are_left_out() -> None:
    fp16, int4, bare = variant("fp16", 100), variant("int4", 60), variant("fp8", 40)
    scores = [
        alternating_scores(fp16, "json_adherence", 0.9),
        alternating_scores(fp16, "helpfulness", 0.7),
        alternating_scores(int4, "json_adherence", 0.9),
        # A score the baseline lacks has no delta and cannot fire.
        alternating_scores(int4, "toxicity_free", 0.1),
    ]
    untagged = [variant(None, 50), variant("int4", 50, model=None)]
    out = run([fp16, int4, bare, *untagged], [*scores, alternating_scores(untagged[0], "json_adherence", 0.1)])
    assert out.conditions == []
    assert rows(out, "model", "quantization", "score_name", "score_n", "score_delta") == [
        (LLAMA, "fp16", "helpfulness", 100, 0.0),
        (LLAMA, "fp16", "json_adherence", 100, 0.0),
        (LLAMA, "fp8", None, None, None),
        (LLAMA, "int4", "json_adherence", 60, 0.0),
        (LLAMA, "int4", "toxicity_free", 60, None),
    ]
    assert out.figures.filter(pl.col("quantization") == "int4")["latency_p99"].n_unique() == 1


def test_empty_frames_give_no_conditions_and_typed_empty_figures() -> None:
    out = run([])
    assert out.conditions == []
    assert out.figures.height == 0
    assert out.figures.schema["window_start"] == pl.Datetime("us")
    assert out.figures.schema["n"] == pl.Int64
    assert out.figures.schema["baseline_n"] == pl.Int64

    # A single variant is its own baseline: nothing to compare, nothing to fire.
    assert run([variant("int4", 100)]).conditions == []


def test_figures_match_the_migrated_table_and_inputs_match_the_hand_built_frames(tmp_path: Path) -> None:
    assert_fits_migrated_table(
        tmp_path,
        "quantization_delta",
        run(*three_variants()).figures,
        rows=3,
        inputs=inputs,
        detect=detect,
        config=Config(),
        window=WINDOW,
        schemas={"requests": REQUEST_SCHEMA, "scores": SCORE_SCHEMA},
    )
