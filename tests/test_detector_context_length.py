"""context_length on hand-built frames: a long-prompt cell scoring below the best cell fires, the edges hold."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pydantic
import pytest
from detector_tables import assert_fits_migrated_table
from request_frames import SCORE_SCHEMA, WINDOW, alternating_scores, detector_frames, spread

from detectors.base import Detection
from detectors.buckets import output_buckets, prompt_buckets
from detectors.context_length import LABELS, Config, detect, inputs

REQUEST_SCHEMA = {
    "trace_id": pl.String,
    "span_id": pl.String,
    "input_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "e2e_ms": pl.Float64,
    "tpot_ms": pl.Float64,
}
# A representative token count inside each default bucket.
PROMPT = {"0-8k": 2000, "8k-32k": 16000, "32k-64k": 48000, "64k+": 100000}
OUTPUT = {"<500": 200, "500-2000": 1000, "2000+": 3000}


def cell(prompt: str, output: str, n: int) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "trace_id": [f"{prompt}/{output}-{i}" for i in range(n)],
            "span_id": ["s"] * n,
            "input_tokens": [PROMPT[prompt]] * n,
            "output_tokens": [OUTPUT[output]] * n,
            "e2e_ms": spread(800, 1200, n),
            "tpot_ms": spread(15, 25, n),
        },
        schema=REQUEST_SCHEMA,
    )


def run(
    requests: list[pl.DataFrame], scores: list[pl.DataFrame] | None = None, config: Config | None = None
) -> Detection:
    return detect(detector_frames(requests, scores, REQUEST_SCHEMA), config or Config(), WINDOW)


def cells(out: Detection) -> dict[tuple[str, str], int]:
    return {(p, o): n for p, o, n in out.figures.select("prompt_bucket", "output_bucket", "n").unique().rows()}


def groundedness_by_length() -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
    """groundedness 0.90 for short prompts, 0.86 at 8k-32k, 0.82 (−0.08) at 32k-64k, 0.76 (−0.14) at 64k+."""
    means = {("0-8k", "<500"): 0.90, ("8k-32k", "<500"): 0.86, ("32k-64k", "<500"): 0.82, ("64k+", "<500"): 0.76}
    requests = [cell(p, o, 100 if p == "0-8k" else 60) for p, o in means]
    return requests, [
        alternating_scores(frame, "groundedness", mean) for frame, mean in zip(requests, means.values(), strict=True)
    ]


def test_a_long_prompt_cell_fourteen_points_below_the_best_fires_for_that_cell_only() -> None:
    out = run(*groundedness_by_length())

    [condition] = out.conditions
    assert condition.labels == {"prompt_bucket": "64k+", "output_bucket": "<500", "signal": "groundedness"}
    assert tuple(condition.labels) == LABELS
    assert condition.value == pytest.approx(0.14)
    assert condition.threshold == 0.10
    assert condition.severity is None
    assert condition.summary == (
        "prompts 64k+ with outputs <500: groundedness mean 0.76 vs 0.90 in the best cell (0-8k, <500) (−0.14) over "
        "2026-11-20 12:00–12:05 UTC, n=60 vs 100; route long contexts to a dedicated deployment or raise "
        "gpu_memory_utilization"
    )
    assert out.figures.select("prompt_bucket", "output_bucket", "n", "score_n").rows() == [
        ("0-8k", "<500", 100, 100),
        ("8k-32k", "<500", 60, 60),
        ("32k-64k", "<500", 60, 60),
        ("64k+", "<500", 60, 60),
    ]
    assert out.figures["score_mean"].to_list() == pytest.approx([0.90, 0.86, 0.82, 0.76])


def test_an_eight_point_drop_stays_below_the_threshold_until_the_threshold_is_lowered() -> None:
    out = run(*groundedness_by_length(), config=Config(score_drop=0.08))
    assert [c.labels["prompt_bucket"] for c in out.conditions] == ["32k-64k", "64k+"]
    assert out.conditions[0].value == pytest.approx(0.08)


def test_a_drop_of_exactly_the_threshold_fires() -> None:
    short, long = cell("0-8k", "<500", 100), cell("64k+", "<500", 100)
    out = run(
        [short, long], [alternating_scores(short, "groundedness", 0.90), alternating_scores(long, "groundedness", 0.80)]
    )
    assert [c.labels["prompt_bucket"] for c in out.conditions] == ["64k+"]


def test_an_output_length_cliff_at_the_best_cells_prompt_length_points_at_the_outputs() -> None:
    short, long = cell("0-8k", "<500", 100), cell("0-8k", "2000+", 40)
    out = run(
        [short, long], [alternating_scores(short, "helpfulness", 0.80), alternating_scores(long, "helpfulness", 0.60)]
    )
    [condition] = out.conditions
    assert condition.labels == {"prompt_bucket": "0-8k", "output_bucket": "2000+", "signal": "helpfulness"}
    assert condition.summary.endswith(
        "check whether these generations hit max_tokens and split long outputs into shorter requests"
    )


def test_bucket_edges_belong_to_the_bucket_they_open_and_null_tokens_are_left_out() -> None:
    pairs = [
        (8191, 499),  # 0-8k, <500
        (8192, 500),  # 8k-32k, 500-2000
        (32767, 1999),  # 8k-32k, 500-2000
        (32768, 2000),  # 32k-64k, 2000+
        (65535, 0),  # 32k-64k, <500
        (65536, 2000),  # 64k+, 2000+
        (0, 499),  # 0-8k, <500
        (None, 100),
        (100, None),
        (None, None),
    ]
    requests = pl.DataFrame(
        {
            "trace_id": [f"t{i}" for i in range(len(pairs))],
            "span_id": ["s"] * len(pairs),
            "input_tokens": [p for p, _ in pairs],
            "output_tokens": [o for _, o in pairs],
            "e2e_ms": [1000.0] * len(pairs),
            "tpot_ms": [20.0] * len(pairs),
        },
        schema=REQUEST_SCHEMA,
    )
    out = run([requests])
    assert cells(out) == {
        ("0-8k", "<500"): 2,
        ("8k-32k", "500-2000"): 2,
        ("32k-64k", "2000+"): 1,
        ("32k-64k", "<500"): 1,
        ("64k+", "2000+"): 1,
    }
    assert out.figures["n"].sum() == 7

    moved = run([requests], config=Config(prompt_edges=(4096, 10000), output_edges=(1000,)))
    assert cells(moved) == {
        ("0-4k", "<1000"): 1,
        ("4k-10000", "<1000"): 2,
        ("10000+", "<1000"): 1,
        ("10000+", "1000+"): 3,
    }


def test_bucket_names_follow_the_edges_and_edges_must_ascend() -> None:
    assert prompt_buckets((8192, 32768, 65536)) == ["0-8k", "8k-32k", "32k-64k", "64k+"]
    assert output_buckets((500, 2000)) == ["<500", "500-2000", "2000+"]
    assert prompt_buckets((4096, 10000)) == ["0-4k", "4k-10000", "10000+"]
    for bad in [{"prompt_edges": (32768, 8192)}, {"output_edges": (500, 500)}, {"output_edges": (0, 10)}]:
        with pytest.raises(pydantic.ValidationError):
            Config.model_validate(bad)


def test_a_clean_window_fires_nothing() -> None:
    requests, scores = [], []
    for i, (prompt, output) in enumerate((p, o) for p in PROMPT for o in OUTPUT):
        frame = cell(prompt, output, 40)
        requests.append(frame)
        # Within 0.06 of each other everywhere, in both scores.
        scores += [
            alternating_scores(frame, "groundedness", 0.84 + 0.005 * i),
            alternating_scores(frame, "json_adherence", 0.95 - 0.005 * i),
        ]
    out = run(requests, scores)
    assert out.conditions == []
    assert out.figures.height == 24


def test_min_samples_gates_both_the_judged_cell_and_the_best_cell() -> None:
    short = cell("0-8k", "<500", 100)
    short_scores = alternating_scores(short, "groundedness", 0.90)
    for n, fires in [(29, False), (30, True)]:
        long = cell("64k+", "<500", n)
        out = run([short, long], [short_scores, alternating_scores(long, "groundedness", 0.50)])
        assert bool(out.conditions) is fires, n

    # A handful of perfect scores does not become the best cell that everything else is measured against.
    lucky = cell("8k-32k", "500-2000", 10)
    out = run([short, lucky], [short_scores, alternating_scores(lucky, "groundedness", 0.98)])
    assert out.conditions == []

    # Enough requests but a handful of scores: no mean to judge by.
    long = cell("64k+", "<500", 100)
    assert run([short, long], [short_scores, alternating_scores(long.head(10), "groundedness", 0.3)]).conditions == []


def test_figures_are_long_with_one_bare_row_for_an_unscored_cell() -> None:
    short, mid, bare = cell("0-8k", "<500", 100), cell("8k-32k", "500-2000", 80), cell("64k+", "2000+", 30)
    long_output = cell("0-8k", "2000+", 30)
    scores = [
        alternating_scores(long_output, "coherence", 0.8),
        alternating_scores(short, "json_adherence", 0.9),
        alternating_scores(short, "helpfulness", 0.7),
        alternating_scores(mid, "json_adherence", 0.9),
        alternating_scores(mid.head(40), "helpfulness", 0.7),
    ]
    out = run([bare, mid, long_output, short], scores)
    assert out.conditions == []
    # Shorter prompts first, then shorter outputs, whatever the score names.
    assert out.figures.select("prompt_bucket", "output_bucket", "score_name", "score_n").rows() == [
        ("0-8k", "<500", "helpfulness", 100),
        ("0-8k", "<500", "json_adherence", 100),
        ("0-8k", "2000+", "coherence", 30),
        ("8k-32k", "500-2000", "helpfulness", 40),
        ("8k-32k", "500-2000", "json_adherence", 80),
        ("64k+", "2000+", None, None),
    ]
    row = out.figures.filter(pl.col("prompt_bucket") == "0-8k").row(0, named=True)
    assert row["latency_p50"] == pytest.approx(1000.0)
    assert row["latency_p99"] == pytest.approx(1196.0)
    assert row["tpot_p99"] == pytest.approx(24.9)


def test_empty_frames_give_no_conditions_and_typed_empty_figures() -> None:
    out = run([])
    assert out.conditions == []
    assert out.figures.height == 0
    assert out.figures.schema["window_start"] == pl.Datetime("us")
    assert out.figures.schema["prompt_bucket"] == pl.String
    assert out.figures.schema["n"] == pl.Int64

    # One cell only: it is its own best, nothing to fire.
    short = cell("0-8k", "<500", 100)
    assert run([short], [alternating_scores(short, "groundedness", 0.2)]).conditions == []


def test_figures_match_the_migrated_table_and_inputs_match_the_hand_built_frames(tmp_path: Path) -> None:
    assert_fits_migrated_table(
        tmp_path,
        "context_length",
        run(*groundedness_by_length()).figures,
        rows=4,
        inputs=inputs,
        detect=detect,
        config=Config(),
        window=WINDOW,
        schemas={"requests": REQUEST_SCHEMA, "scores": SCORE_SCHEMA},
    )
