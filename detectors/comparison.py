"""Groups of a curve judged against its reference group: the two breaches the curve detectors share.

cache_curve (each bucket against high), saturation (scaling against idle) and traffic_pattern (burst
against steady) group a window's requests by one column (frames.curve) and judge groups of it against
one reference group of the same column, in the same two ways:

- latency: the group's e2e p99 is at least latency_factor x the reference's (a reference p99 of 0 gives
  no ratio, and no ratio never breaches);
- a score: the group's mean of a score name is at least score_drop below the reference's mean of that
  name (scores of a name the reference lacks are not judged).

Both sides need min_samples requests, and for a score as many scores of that name. A breaching row
comes back with the reference's figures beside its own, as `ref_<column>`, for the detector's summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import polars as pl

from detectors.frames import breaches


class Thresholds(Protocol):
    """The knobs of the comparison, as every curve detector's Config names them."""

    @property
    def latency_factor(self) -> float: ...
    @property
    def score_drop(self) -> float: ...
    @property
    def min_samples(self) -> int: ...


Row = dict[str, Any]


class Breaches(NamedTuple):
    latency: list[Row]
    scores: list[Row]


@dataclass(frozen=True)
class Comparison:
    """Groups of `by` judged against its `reference` group: the `judged` ones, or every other one (None)."""

    by: str
    reference: str
    judged: tuple[str, ...] | None = None

    def judge(self, groups: pl.DataFrame, figures: pl.DataFrame, thresholds: Thresholds) -> Breaches:
        """The breaching rows of `groups` (one per group) on latency and of the long `figures` on scores."""
        return Breaches(
            self.latency_breaches(groups, thresholds.latency_factor, thresholds.min_samples),
            self.score_breaches(figures, thresholds.score_drop, thresholds.min_samples),
        )

    def latency_breaches(self, groups: pl.DataFrame, latency_factor: float, min_samples: int) -> list[Row]:
        """Rows of `groups` (one per group: n, latency_p99) whose p99 is latency_factor x the reference's, with
        that `ratio`."""
        paired = (
            self._judged(groups)
            .join(self._reference(groups, "n", "latency_p99"), how="cross")
            .with_columns(
                ratio=pl.when(pl.col("ref_latency_p99") > 0).then(pl.col("latency_p99") / pl.col("ref_latency_p99"))
            )
        )
        enough = pl.min_horizontal("n", "ref_n") >= min_samples
        return list(paired.filter(enough & breaches(pl.col("ratio"), latency_factor)).iter_rows(named=True))

    def score_breaches(self, figures: pl.DataFrame, score_drop: float, min_samples: int) -> list[Row]:
        """Rows of the long `figures` (one per group and score_name: n, score_mean, score_n) whose mean is
        score_drop below the reference's mean of that name, with that `drop`; by score name."""
        reference = self._reference(figures, "score_name", "n", "score_mean", "score_n")
        paired = (
            self._judged(figures)
            .join(reference, left_on="score_name", right_on="ref_score_name")
            .with_columns(drop=pl.col("ref_score_mean") - pl.col("score_mean"))
        )
        enough = pl.min_horizontal("n", "ref_n", "score_n", "ref_score_n") >= min_samples
        breached = paired.filter(enough & breaches(pl.col("drop"), score_drop))
        return list(breached.sort("score_name", maintain_order=True).iter_rows(named=True))

    def _judged(self, frame: pl.DataFrame) -> pl.DataFrame:
        if self.judged is None:
            return frame.filter(pl.col(self.by) != self.reference)
        return frame.filter(pl.col(self.by).is_in(list(self.judged)))

    def _reference(self, frame: pl.DataFrame, *columns: str) -> pl.DataFrame:
        return frame.filter(pl.col(self.by) == self.reference).select(pl.col(c).alias(f"ref_{c}") for c in columns)
