"""Shared figure helpers: durations as alert summaries print them."""

from __future__ import annotations

import pytest

from detectors.frames import format_duration


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
