"""slo_burn: how fast each SLO's error budget is burning, per tenant (or any grouping), with the
multiwindow, multi-burn-rate rule of the Google SRE workbook.

An SLO (configuration: `detectors.slo_burn.slos`) names the requests it covers (a selector on deployment,
model and tenant), how they are grouped (`group_by`, e.g. every tenant), what makes a request good (the
SLI: a conjunction of `ttft_ms_max`, `e2e_ms_max`, `tpot_ms_max`, `no_error` and score floors), an
objective (0.99) and a rolling window (30 days).

Definitions, per SLO and group:

- A request is judged when every value its SLI reads is present (a request with no TTFT says nothing of a
  TTFT objective); it is good when every condition holds. `total` and `good` count judged requests.
- With `budgeting: timeslices`, the unit is a minute with at least one judged request instead: a good
  minute is one whose share of good requests is at least `timeslice_target`.
- burn rate over a trailing window W = (bad / total over W) / (1 - objective): 1 spends the budget exactly
  over the SLO window, 14.4 spends 2 % of a 30-day budget in an hour.
- budget_remaining = 1 - the burn rate over the SLO window: the share of the window's error budget not
  yet spent (negative once overspent).

Incremental: each evaluation counts only its own window's requests, per minute, and stores them in
`slo_burn_minutes`; the trailing windows are those stored counts plus this window's, so a 30-day window
never rescans 30 days of spans. Windows end on a whole minute, so every stored minute is whole; a minute
counted again (windows longer than the interval, a replay, an evaluation off the schedule) replaces
the stored count, so no sum counts it twice. The window follows the
interval unless set (setting `interval_seconds` alone moves both) and may not be shorter, or minutes
would go uncounted. A window the scheduler never evaluated (the service was down) stays a gap until
`detect --once --at T` replays it.

A rule (`rules`) breaches when the burn rate exceeds its rate over both its long and its short window, and
the long window holds at least `min_events` units (low-traffic tenants get no verdict on a handful of
requests). The defaults are the workbook's: page (critical) at 14.4 over 1 h and 5 min or 6 over 6 h and
30 min; ticket (warning) at 1 over 3 days and 6 h. A group alerts once, at the severity of its most
severe breaching rule; it resolves when no rule breaches.

Figures are long: one row per (SLO, group, trailing window), `burn_window` naming the window.

Alert labels (LABELS): slo, tenant_id, deployment, model (the ones the SLO groups by).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, Literal

import polars as pl
from pydantic import BaseModel, ConfigDict, Field, model_validator

from detectors.base import Condition, Detection, DetectorConfig, Read, Severity, Window
from detectors.frames import request_key, requests, scores
from storage.ports import SloCounts

KEY = "slo_burn"
SUMMARY = "Per-tenant SLO error-budget burn rates with the multiwindow, multi-burn-rate alert rule."
GROUPS = ("tenant_id", "deployment", "model")
LABELS = ("slo", *GROUPS)
MINUTES_TABLE = "slo_burn_minutes"
REQUEST_COLUMNS = ("end_time", *GROUPS, "ttft_ms", "e2e_ms", "tpot_ms", "status_code")
FIGURE_COLUMNS = [
    "window_start",
    "window_end",
    "slo",
    *GROUPS,
    "burn_window",
    "window_seconds",
    "good",
    "total",
    "burn_rate",
    "objective",
    "budget_remaining",
    "breached",
    "severity",
]
MINUTE_COLUMNS = ["window_start", "window_end", "slo", *GROUPS, "minute", "good", "total", "good_slice"]
_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
_SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}
_MINUTE = 60


class Sli(BaseModel):
    """What makes a request good: every condition given holds (a conjunction)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms_max: float | None = Field(None, gt=0, description="Good when time to first token is at most this (ms).")
    e2e_ms_max: float | None = Field(None, gt=0, description="Good when end-to-end latency is at most this (ms).")
    tpot_ms_max: float | None = Field(
        None, gt=0, description="Good when the time per output token is at most this (ms)."
    )
    no_error: bool = Field(False, description="Good only when the request did not fail (status_code is not ERROR).")
    score_min: dict[str, float] = Field(
        default_factory=dict, description="Good when each named score is at least its floor (0..1)."
    )

    @model_validator(mode="after")
    def _some_condition(self) -> Sli:
        if not self.bounds() and not self.no_error and not self.score_min:
            raise ValueError("an SLI needs at least one condition: ttft_ms_max, e2e_ms_max, tpot_ms_max, "
                             "no_error or score_min")  # fmt: skip
        return self

    def bounds(self) -> dict[str, float]:
        """Latency column -> the most it may be for a good request."""
        limits = {"ttft_ms": self.ttft_ms_max, "e2e_ms": self.e2e_ms_max, "tpot_ms": self.tpot_ms_max}
        return {column: limit for column, limit in limits.items() if limit is not None}

    def describe(self) -> str:
        parts = [f"{column} <= {limit:g}" for column, limit in self.bounds().items()]
        parts += ["no error"] if self.no_error else []
        parts += [f"{name} >= {floor:g}" for name, floor in sorted(self.score_min.items())]
        return " and ".join(parts)


class Slo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The SLO's name: its `slo` label and figures' key.")
    objective: float = Field(gt=0, lt=1, description="Share of requests (or minutes) that must be good, e.g. 0.99.")
    sli: Sli
    deployment: str | None = Field(None, description="Only this deployment's requests (none: every deployment).")
    model: str | None = Field(None, description="Only this model's requests.")
    tenant_id: str | None = Field(None, description="Only this tenant's requests.")
    group_by: tuple[Literal["tenant_id", "deployment", "model"], ...] = Field(
        (), description="One budget per value of these columns, e.g. [tenant_id] for every tenant; none: one budget."
    )
    window_days: int = Field(30, ge=1, le=90, description="The rolling window the objective holds over.")
    budgeting: Literal["events", "timeslices"] = Field(
        "events", description="Count requests (events), or minutes judged good or bad as a whole (timeslices)."
    )
    timeslice_target: float = Field(
        0.99, gt=0, le=1, description="With timeslices: a minute is good when this share of its requests is good."
    )
    min_events: int = Field(
        20, ge=1, description="Requests (or minutes) a group needs in a rule's long window before that rule judges it."
    )

    @model_validator(mode="after")
    def _valid(self) -> Slo:
        if not _NAME.match(self.name):
            raise ValueError(f"SLO name {self.name!r} may hold only letters, digits and _ . : -")
        if len(set(self.group_by)) != len(self.group_by):
            raise ValueError(f"SLO {self.name!r} names a group_by column twice")
        return self

    def window_seconds(self) -> int:
        return self.window_days * 86_400


class BurnRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    severity: Severity = Field(description="The alert's severity when this rule breaches.")
    burn_rate: float = Field(gt=0, description="Breach when the burn rate exceeds this over both windows.")
    long_seconds: int = Field(ge=60, description="The long window: the budget really is burning.")
    short_seconds: int = Field(ge=60, description="The short window: it is still burning now (a fast reset).")

    @model_validator(mode="after")
    def _valid(self) -> BurnRule:
        if self.long_seconds % _MINUTE or self.short_seconds % _MINUTE:
            raise ValueError("a burn rule's windows must be whole minutes")
        if self.short_seconds >= self.long_seconds:
            raise ValueError("a burn rule's short window must be shorter than its long window")
        return self


# The workbook's fast burn: 2 % of a 30-day budget in an hour. Incidents burning this fast are critical too.
PAGE_BURN_RATE = 14.4
DEFAULT_RULES = (
    BurnRule(severity=Severity.CRITICAL, burn_rate=PAGE_BURN_RATE, long_seconds=3600, short_seconds=300),
    BurnRule(severity=Severity.CRITICAL, burn_rate=6.0, long_seconds=21_600, short_seconds=1800),
    BurnRule(severity=Severity.WARNING, burn_rate=1.0, long_seconds=259_200, short_seconds=21_600),
)


class Config(DetectorConfig):
    settle_seconds: int = Field(
        120, ge=0, description="The window ends this long before the evaluation time (then back to a whole minute); "
        "spans later than this are counted only if a later evaluation's window still holds their minute."
    )  # fmt: skip
    slos: tuple[Slo, ...] = Field((), description="The SLOs to evaluate (none: the detector has nothing to do).")
    rules: tuple[BurnRule, ...] = Field(DEFAULT_RULES, min_length=1, description="The burn-rate alert rules.")

    @model_validator(mode="before")
    @classmethod
    def _window_is_the_interval(cls, data: Any) -> Any:
        # Setting only the interval is enough: the window follows it.
        if isinstance(data, dict) and "interval_seconds" in data and "window_seconds" not in data:
            return {**data, "window_seconds": data["interval_seconds"]}
        return data

    @model_validator(mode="after")
    def _every_minute_counted(self) -> Config:
        if self.window_seconds < self.interval_seconds:
            raise ValueError("slo_burn would skip minutes: window_seconds must be at least interval_seconds")
        if self.window_seconds % _MINUTE:
            raise ValueError("slo_burn counts whole minutes: window_seconds must be a multiple of 60")
        names = [slo.name for slo in self.slos]
        if len(set(names)) != len(names):
            raise ValueError("two SLOs share a name; each needs its own")
        return self

    def window(self, at: datetime) -> Window:
        """As every detector's, but ending on a whole minute, so that each minute it counts is whole."""
        end = at - timedelta(seconds=self.settle_seconds)
        end = end.replace(second=0, microsecond=0)
        return Window(end - timedelta(seconds=self.window_seconds), end)

    def trailing_windows(self) -> tuple[int, ...]:
        """Every trailing window some rule or SLO needs, in seconds, shortest first."""
        seconds = {s for rule in self.rules for s in (rule.long_seconds, rule.short_seconds)}
        return tuple(sorted(seconds | {slo.window_seconds() for slo in self.slos}))


def inputs(config: Config, window: Window) -> dict[str, Read]:
    if not config.slos:
        return {}
    reads: dict[str, Read] = {
        "requests": requests(window, REQUEST_COLUMNS),
        "stored": SloCounts(end=window.end, before=window.start, windows=config.trailing_windows()),
    }
    if any(slo.sli.score_min for slo in config.slos):
        reads["scores"] = scores(window)
    return reads


def detect(frames: dict[str, pl.DataFrame], config: Config, window: Window) -> Detection:
    if not config.slos:
        return Detection(figures=_empty(FIGURE_COLUMNS), extra_tables={MINUTES_TABLE: _empty(MINUTE_COLUMNS)})
    reqs = _typed_requests(frames["requests"])
    floors = _score_floors(frames.get("scores"), reqs, config)
    minutes = pl.concat([_minutes(reqs, floors, slo) for slo in config.slos], how="vertical")
    minutes = minutes.with_columns(
        window_start=pl.lit(window.start, pl.Datetime("us")), window_end=pl.lit(window.end, pl.Datetime("us"))
    ).select(MINUTE_COLUMNS)
    counts = _trailing_counts(frames["stored"], minutes, config, window)
    figures, conditions = _burn(counts, config, window)
    return Detection(figures=figures, conditions=conditions, extra_tables={MINUTES_TABLE: minutes})


def window_name(seconds: int) -> str:
    """A trailing window as its `burn_window` label: 5m, 1h, 3d."""
    for unit, size in (("d", 86_400), ("h", 3600)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds // _MINUTE}m"


def _empty(columns: list[str]) -> pl.DataFrame:
    return pl.DataFrame({c: [] for c in columns})


def _typed_requests(frame: pl.DataFrame) -> pl.DataFrame:
    # Hand-built or empty frames may carry Null dtypes.
    return frame.with_columns(
        pl.col("end_time").cast(pl.Datetime("us")),
        *(pl.col(c).cast(pl.String) for c in (*GROUPS, "status_code")),
        *(pl.col(c).cast(pl.Float64) for c in ("ttft_ms", "e2e_ms", "tpot_ms")),
    )


def _score_floors(score_frame: pl.DataFrame | None, reqs: pl.DataFrame, config: Config) -> pl.DataFrame:
    """Per request, the lowest score of each name an SLI has a floor for (`score:<name>` columns)."""
    names = sorted({name for slo in config.slos for name in slo.sli.score_min})
    key = request_key(reqs)
    if not names or score_frame is None:
        return reqs.select(key)
    lowest = (
        score_frame.with_columns(pl.col("name").cast(pl.String), pl.col("score").cast(pl.Float64))
        .filter(pl.col("name").is_in(names))
        .select(request_key(score_frame), "name", "score")
        .group_by("_request", "name")
        .agg(pl.col("score").min())
    )
    wide = reqs.select(key)
    for name in names:
        one = lowest.filter(pl.col("name") == name).select("_request", pl.col("score").alias(f"score:{name}"))
        wide = wide.join(one, on="_request", how="left")
    return wide


def _minutes(reqs: pl.DataFrame, floors: pl.DataFrame, slo: Slo) -> pl.DataFrame:
    """This window's judged and good requests of one SLO, per group and minute of end_time."""
    selected = reqs.with_columns(request_key(reqs)).join(floors, on="_request", how="left")
    for column in ("deployment", "model", "tenant_id"):
        if (value := getattr(slo, column)) is not None:
            selected = selected.filter(pl.col(column) == value)
    sli = slo.sli
    judged = [pl.col(c).is_not_null() for c in sli.bounds()]
    judged += [pl.col(f"score:{n}").is_not_null() for n in sli.score_min]
    good = [pl.col(c) <= limit for c, limit in sli.bounds().items()]
    good += [pl.col(f"score:{n}") >= floor for n, floor in sli.score_min.items()]
    good += [pl.col("status_code").fill_null("") != "ERROR"] if sli.no_error else []
    grouped = [pl.col(c) if c in slo.group_by else pl.lit(None, pl.String).alias(c) for c in GROUPS]
    return (
        selected.filter(pl.all_horizontal(judged) if judged else pl.lit(True))
        .select(
            *grouped,
            pl.col("end_time").dt.truncate("1m").alias("minute"),
            pl.all_horizontal(good).alias("_good"),
        )
        .group_by(*GROUPS, "minute")
        .agg(good=pl.col("_good").sum().cast(pl.Int64), total=pl.len().cast(pl.Int64))
        .with_columns(
            slo=pl.lit(slo.name),
            good_slice=pl.col("good") >= pl.col("total") * slo.timeslice_target,
        )
    )


def _trailing_counts(stored: pl.DataFrame, minutes: pl.DataFrame, config: Config, window: Window) -> pl.DataFrame:
    """Per (slo, group, trailing window): good and total requests, and good and judged minutes, stored
    counts of earlier evaluations plus this window's."""
    frames = []
    for seconds in config.trailing_windows():
        since = window.end - timedelta(seconds=seconds)
        frames.append(
            minutes.filter(pl.col("minute") >= since)
            .group_by("slo", *GROUPS)
            .agg(
                good=pl.col("good").sum(),
                total=pl.col("total").sum(),
                good_slices=pl.col("good_slice").sum().cast(pl.Int64),
                slices=pl.len().cast(pl.Int64),
            )
            .with_columns(window_seconds=pl.lit(seconds, pl.Int64))
        )
    fresh = pl.concat(frames, how="vertical")
    earlier = stored.select(
        pl.col("slo").cast(pl.String),
        *(pl.col(c).cast(pl.String) for c in GROUPS),
        pl.col("window_seconds").cast(pl.Int64),
        *(pl.col(c).cast(pl.Int64) for c in ("good", "total", "good_slices", "slices")),
    )
    return (
        pl.concat([fresh.select(earlier.columns), earlier], how="vertical")
        .group_by("slo", *GROUPS, "window_seconds")
        .agg(pl.col("good", "total", "good_slices", "slices").sum())
    )


def _burn(counts: pl.DataFrame, config: Config, window: Window) -> tuple[pl.DataFrame, list[Condition]]:
    rows: list[dict[str, Any]] = []
    conditions: list[Condition] = []
    by_group: dict[tuple[Any, ...], dict[int, dict[str, Any]]] = {}
    for row in counts.iter_rows(named=True):
        by_group.setdefault((row["slo"], *(row[c] for c in GROUPS)), {})[row["window_seconds"]] = row
    slos = {slo.name: slo for slo in config.slos}
    for (name, *group), windows in sorted(by_group.items(), key=lambda kv: tuple(str(v) for v in kv[0])):
        slo = slos.get(name)
        if slo is None:  # counts stored under an SLO since removed from the configuration
            continue
        units = {s: _units(w, slo) for s, w in windows.items()}
        budget = units.get(slo.window_seconds(), (0, 0))
        remaining = None if budget[1] == 0 else 1 - _rate(budget, slo)
        breaching = [rule for rule in config.rules if _breaches(rule, units, slo)]
        worst = min(breaching, key=lambda r: (_SEVERITY_ORDER[r.severity], -r.burn_rate), default=None)
        labels = {"slo": name} | {c: v for c, v in zip(GROUPS, group, strict=True) if c in slo.group_by}
        for seconds, (good, total) in sorted(units.items()):
            rows.append(
                {
                    "slo": name,
                    **dict(zip(GROUPS, group, strict=True)),
                    "burn_window": window_name(seconds),
                    "window_seconds": seconds,
                    "good": good,
                    "total": total,
                    "burn_rate": None if total == 0 else _rate((good, total), slo),
                    "objective": slo.objective,
                    "budget_remaining": remaining,
                    "breached": worst is not None,
                    "severity": None if worst is None else worst.severity.value,
                }
            )
        if worst is not None:
            conditions.append(_condition(labels, worst, units, slo, remaining=remaining, window=window))
    figures = pl.DataFrame(
        rows,
        schema={
            "slo": pl.String, "tenant_id": pl.String, "deployment": pl.String, "model": pl.String,
            "burn_window": pl.String, "window_seconds": pl.Int64, "good": pl.Int64, "total": pl.Int64,
            "burn_rate": pl.Float64, "objective": pl.Float64, "budget_remaining": pl.Float64,
            "breached": pl.Boolean, "severity": pl.String,
        },
    ).with_columns(
        window_start=pl.lit(window.start, pl.Datetime("us")), window_end=pl.lit(window.end, pl.Datetime("us"))
    )  # fmt: skip
    return figures.select(FIGURE_COLUMNS), conditions


def _units(counts: dict[str, Any], slo: Slo) -> tuple[int, int]:
    """(good, total) in the SLO's unit: requests, or minutes judged as a whole."""
    if slo.budgeting == "timeslices":
        return int(counts["good_slices"]), int(counts["slices"])
    return int(counts["good"]), int(counts["total"])


def _rate(units: tuple[int, int], slo: Slo) -> float:
    good, total = units
    return ((total - good) / total) / (1 - slo.objective)


def _breaches(rule: BurnRule, units: dict[int, tuple[int, int]], slo: Slo) -> bool:
    long, short = units.get(rule.long_seconds, (0, 0)), units.get(rule.short_seconds, (0, 0))
    if long[1] < slo.min_events or short[1] == 0:
        return False
    return _rate(long, slo) > rule.burn_rate and _rate(short, slo) > rule.burn_rate


def _condition(
    labels: dict[str, str],
    rule: BurnRule,
    units: dict[int, tuple[int, int]],
    slo: Slo,
    *,
    remaining: float | None,
    window: Window,
) -> Condition:
    long_rate = _rate(units[rule.long_seconds], slo)
    short_rate = _rate(units[rule.short_seconds], slo)
    who = ", ".join(f"{k} {v}" for k, v in labels.items() if k != "slo") or "all requests"
    left = "" if remaining is None else f"; {remaining:.0%} of its {slo.window_days}-day budget left"
    summary = (
        f"SLO {slo.name} ({slo.sli.describe()}, objective {slo.objective:g}) for {who}: error budget burning "
        f"{long_rate:.1f}x over {window_name(rule.long_seconds)} and {short_rate:.1f}x over "
        f"{window_name(rule.short_seconds)} (rule: above {rule.burn_rate:g}x on both){left}; {window.label()}"
    )
    return Condition(labels, long_rate, rule.burn_rate, summary, severity=rule.severity)
