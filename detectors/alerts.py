"""Alert state: one firing alert per fingerprint, resolved when its condition clears.

Pure: given the conditions of one evaluation and the state before it, `evaluate` returns the state
after it. The detection pass persists the result and hands the transitions to the notifier.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from detectors.base import Condition, Severity, Window
from storage.ports import Alert

__all__ = ["Alert", "Evaluation", "evaluate", "fingerprint"]


def fingerprint(detector: str, labels: Mapping[str, str]) -> str:
    """Stable identity of an alert: the detector and its labels, nothing that changes between evaluations."""
    canonical = json.dumps({"detector": detector, "labels": dict(sorted(labels.items()))}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass
class Evaluation:
    """The outcome of one evaluation for one detector."""

    fired: list[Alert] = field(default_factory=list)  # newly firing
    updated: list[Alert] = field(default_factory=list)  # still firing, figures refreshed
    resolved: list[Alert] = field(default_factory=list)  # condition cleared
    breaches: dict[str, int] = field(default_factory=dict)  # consecutive breaches per fingerprint, after

    @property
    def firing(self) -> list[Alert]:
        return self.fired + self.updated


def evaluate(
    detector: str,
    conditions: list[Condition],
    firing: Mapping[str, Alert],
    breaches: Mapping[str, int],
    *,
    for_evaluations: int,
    default_severity: Severity,
    window: Window,
    at: datetime,
) -> Evaluation:
    """Apply one evaluation's conditions to the firing alerts and hold-down counters of a detector."""
    out = Evaluation()
    seen: set[str] = set()
    for condition in conditions:
        fp = fingerprint(detector, condition.labels)
        if fp in seen:
            continue  # a detector may report one group twice; the first condition speaks for it
        seen.add(fp)
        count = breaches.get(fp, 0) + 1
        out.breaches[fp] = count
        severity = str(condition.severity or default_severity)
        if fp in firing:
            out.updated.append(
                replace(
                    firing[fp],
                    severity=severity,
                    summary=condition.summary,
                    value=condition.value,
                    threshold=condition.threshold,
                    window_start=window.start,
                    window_end=window.end,
                    updated_at=at,
                )
            )
        elif count >= for_evaluations:
            out.fired.append(
                Alert(
                    alert_id=hashlib.sha256(f"{fp}@{at.isoformat()}".encode()).hexdigest()[:20],
                    detector=detector,
                    fingerprint=fp,
                    severity=severity,
                    state="firing",
                    labels=dict(condition.labels),
                    summary=condition.summary,
                    value=condition.value,
                    threshold=condition.threshold,
                    window_start=window.start,
                    window_end=window.end,
                    started_at=at,
                    resolved_at=None,
                    updated_at=at,
                )
            )
    for fp, alert in firing.items():
        if fp not in seen:
            out.resolved.append(replace(alert, state="resolved", resolved_at=at, updated_at=at))
    return out
