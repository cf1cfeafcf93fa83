"""What every detector shares: its config base, the window it evaluates, and what it returns.

A detector module holds its `KEY`, a one-line `SUMMARY`, the `LABELS` its alerts carry (the names,
docs/detectors.md's label vocabulary), a frozen pydantic `Config`, a pure `inputs(config, window)`
declaring what it reads (storage's `Read` values: which requests, which columns, which window), and a
pure `detect(frames, config, window)`: no I/O, no clock, no environment, no SQL. The registry lists the
modules; the detection pass owns fetching, timing, persistence, failure isolation and metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from storage.ports import Read, Window

__all__ = ["Condition", "Detection", "DetectorConfig", "DetectorSpec", "Read", "Severity", "Window"]


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class DetectorConfig(BaseModel):
    """Knobs every detector has; each detector's Config adds its thresholds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Run this detector on the schedule.")
    interval_seconds: int = Field(300, ge=10, description="How often the scheduler evaluates it.")
    window_seconds: int = Field(300, ge=10, description="Length of the evaluated event-time window.")
    settle_seconds: int = Field(
        30, ge=0, description="The window ends this long before the evaluation time, so late spans are in it."
    )
    for_evaluations: int = Field(
        1, ge=1, description="Consecutive breaching evaluations before an alert fires (1: the first one)."
    )
    severity: Severity = Field(Severity.WARNING, description="Severity of this detector's alerts.")
    max_figure_series: int = Field(
        1000,
        ge=0,
        description="Groups of the latest figures shown as Prometheus gauges on /metrics, at most: each is one "
        "series in every one of the detector's gauges; the rest are dropped and counted.",
    )

    def window(self, at: datetime) -> Window:
        """The event-time window an evaluation at wall-clock `at` covers: [end - window, end)."""
        end = at - timedelta(seconds=self.settle_seconds)
        return Window(end - timedelta(seconds=self.window_seconds), end)


@dataclass(frozen=True)
class Condition:
    """A breaching group in the evaluated window: becomes (or keeps) a firing alert."""

    labels: Mapping[str, str]
    value: float
    threshold: float
    summary: str
    severity: Severity | None = None  # None: the detector's configured severity


@dataclass
class Detection:
    """What `detect` returns: figures for the detector's table, and the conditions that breach."""

    figures: pl.DataFrame
    conditions: list[Condition] = field(default_factory=list)
    extra_tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    # By alert_id: what this evaluation says of another detector's firing alert (clusters' explanations).
    explanations: dict[str, str] = field(default_factory=dict)


Inputs = Callable[[Any, Window], dict[str, Read]]
Detect = Callable[[dict[str, pl.DataFrame], Any, Window], Detection]


@dataclass(frozen=True)
class DetectorSpec:
    """A registry entry: key (= config key = table = metric label = docs heading), config class, functions."""

    key: str
    config: type[DetectorConfig]
    inputs: Inputs
    detect: Detect
    summary: str
