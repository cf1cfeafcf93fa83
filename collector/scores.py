"""Quality scores from the three places emitters put them: span attributes, span events, log records.

Every score is keyed by the (trace_id, span_id) of the span it judges, so it joins to that span
whether it arrives before, with or after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from collector.normalize import parse_number
from model.columns import SCORE_BATCH_SCHEMA

EVALUATION_EVENT = "gen_ai.evaluation.result"

# A cheap pre-check on the serialized attributes: most spans carry no scores, and one regex search
# over their JSON is far cheaper than testing every key for every prefix.
SCORE_HINT = re.compile(rb'"(?:eval\.|gen_ai\.evaluation\.|evaluations\.|annotations\.)')
# OpenInference flattened annotations: evaluations.<i>.evaluation.<field> / annotations.<i>.annotation.<field>
_OI_KEY = re.compile(r"^(evaluations|annotations)\.(\d+)\.(?:evaluation|annotation)\.(name|score|label|explanation)$")
_PLAIN_KEY = re.compile(r"^eval\.(.+?)(?:\.(score|label|explanation))?$")


@dataclass(frozen=True)
class Score:
    trace_id: str
    span_id: str
    name: str
    score: float | None
    label: str | None
    explanation: str | None
    source: str  # attribute | event | log
    observed_ns: int


def _number(value: Any) -> float | None:
    # A pass/fail evaluator may send a boolean: it scores 1 or 0.
    return float(value) if isinstance(value, bool) else parse_number(value)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def from_evaluation(attrs: dict[str, Any], trace_id: str, span_id: str, source: str, observed_ns: int) -> Score | None:
    """A GenAI `gen_ai.evaluation.*` attribute set (semconv event, traceAI span, log record)."""
    name = attrs.get("gen_ai.evaluation.name")
    if not isinstance(name, str) or not name:
        return None
    target = attrs.get("gen_ai.evaluation.target_span_id")
    if isinstance(target, str) and len(target) == 16:
        span_id = target.lower()
    return Score(
        trace_id,
        span_id,
        name,
        _number(attrs.get("gen_ai.evaluation.score.value")),
        _text(attrs.get("gen_ai.evaluation.score.label")),
        _text(attrs.get("gen_ai.evaluation.explanation")),
        source,
        observed_ns,
    )


def from_span_attributes(
    attrs: dict[str, Any], attrs_json: bytes, trace_id: str, span_id: str, observed_ns: int
) -> list[Score]:
    """Scores carried as span attributes: traceAI, OpenInference flattened, and plain `eval.<name>`."""
    if not SCORE_HINT.search(attrs_json):
        return []
    scores = []
    evaluation = from_evaluation(attrs, trace_id, span_id, "attribute", observed_ns)
    if evaluation is not None:
        scores.append(evaluation)
    indexed: dict[tuple[str, str], dict[str, Any]] = {}
    plain: dict[str, dict[str, Any]] = {}
    for key, value in attrs.items():
        if key.startswith(("evaluations.", "annotations.")):
            m = _OI_KEY.match(key)
            if m:
                indexed.setdefault((m[1], m[2]), {})[m[3]] = value
        elif key.startswith("eval."):
            m = _PLAIN_KEY.match(key)
            if m:
                plain.setdefault(m[1], {})[m[2] or "value"] = value
    for fields in indexed.values():
        name = fields.get("name")
        if isinstance(name, str) and name:
            score = _number(fields.get("score"))
            label = _text(fields.get("label"))
            if score is not None or label is not None:
                scores.append(
                    Score(
                        trace_id,
                        span_id,
                        name,
                        score,
                        label,
                        _text(fields.get("explanation")),
                        "attribute",
                        observed_ns,
                    )
                )
    for name, fields in plain.items():
        # `eval.input` and similar strings (traceAI 0.1.x) are inputs, not scores: a score must be numeric.
        raw = fields.get("score", fields.get("value"))
        score = None if isinstance(raw, str) and _number(raw) is None else _number(raw)
        label = _text(fields.get("label"))
        if score is not None or label is not None:
            scores.append(
                Score(trace_id, span_id, name, score, label, _text(fields.get("explanation")), "attribute", observed_ns)
            )
    return scores


def score_table(scores: list[Score]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array([s.trace_id for s in scores], pa.string()),
            pa.array([s.span_id for s in scores], pa.string()),
            pa.array([s.name for s in scores], pa.string()),
            pa.array([s.score for s in scores], pa.float64()),
            pa.array([s.label for s in scores], pa.string()),
            pa.array([s.explanation for s in scores], pa.string()),
            pa.array([s.source for s in scores], pa.string()),
            pa.array([s.observed_ns for s in scores], pa.int64()).cast(pa.timestamp("ns")),
        ],
        schema=SCORE_BATCH_SCHEMA,
    )
