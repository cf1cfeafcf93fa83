"""Shared figure helpers: durations as alert summaries print them, score means and low tails per group."""

from __future__ import annotations

import polars as pl
import pytest

from detectors.frames import breaches, format_duration, score_means


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (None, "n/a"),
        (0.4, "0 ms"),
        (850.0, "850 ms"),
        (999.4, "999 ms"),
        (1000.0, "1.0 s"),
        (3400.0, "3.4 s"),
        (120_000.0, "120.0 s"),
    ],
)
def test_durations_read_in_milliseconds_below_a_second_and_in_seconds_from_one_second(
    ms: float | None, text: str
) -> None:
    assert format_duration(ms) == text


def test_score_means_gives_each_groups_p10_with_how_p_low() -> None:
    """The low tail instead of the mean: p10 with linear interpolation, as DuckDB's quantile_cont, and the count."""
    ids = [f"t{i}" for i in range(12)]
    requests = pl.DataFrame({"trace_id": ids, "span_id": ["s"] * 12, "tenant_id": ["a"] * 10 + ["b"] * 2})
    scores = pl.DataFrame(
        {
            "trace_id": ids,
            "span_id": ["s"] * 12,
            "name": ["json_adherence"] * 12,
            "score": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0, 0.5, 0.7],
        }
    )
    low = score_means(requests, scores, ["tenant_id"], how="p_low").sort("tenant_id")
    assert low.columns == ["tenant_id", "score_name", "score_value", "score_n"]
    assert low["tenant_id"].to_list() == ["a", "b"]
    assert low["score_name"].to_list() == ["json_adherence"] * 2
    # a: 0.0 .. 0.9, position 0.1 x 9 = 0.9 between 0.0 and 0.1; b: 0.1 of the way from 0.5 to 0.7.
    assert low["score_value"].to_list() == pytest.approx([0.09, 0.52])
    assert low["score_n"].to_list() == [10, 2]
    means = score_means(requests, scores, ["tenant_id"]).sort("tenant_id")
    assert means["score_value"].to_list() == pytest.approx([0.45, 0.6])


def test_a_figure_a_rounding_error_under_its_threshold_breaches_and_one_clearly_under_does_not() -> None:
    """The one breach rule: at least the threshold, with 1e-9 for decimal means (0.90 - 0.80 < 0.10)."""
    assert 0.90 - 0.80 < 0.10
    assert breaches(0.90 - 0.80, 0.10)
    assert not breaches(0.10 - 2e-9, 0.10)
    values = pl.DataFrame({"drop": [0.90 - 0.80, 0.0999, None, 0.25]})
    assert values.select(breaches(pl.col("drop"), 0.10))["drop"].to_list() == [True, False, False, True]
