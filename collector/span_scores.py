"""A walked span's quality scores and its first-token time from its events: the Python reference.

It reads them from the JSON the walk wrote (attributes, left-out pairs, events, links). The compiled walk
reads the same off the parsed request (native/src/scores.rs) and hands back to `read` here the few spans
whose texts only Python's own rules decide; tests/test_native_decoder.py holds the two equal.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from collector.normalize import first_token_ms
from collector.scores import EVALUATION_EVENT, SCORE_HINT, Score, from_evaluation, from_span_attributes, score_table
from model.columns import MAX_TIME_NS

# Serialized attributes that may carry scores (collector.scores pre-checks each span's the same way).
_SCORE_HINT = SCORE_HINT.pattern.decode()


def candidates(spans: pa.RecordBatch) -> list[int]:
    """The rows that may hold a score or a first-token event: most spans hold neither."""
    visit = pc.or_(pc.is_valid(spans["events"]), pc.match_substring_regex(spans["attributes"], _SCORE_HINT))
    return list(pc.indices_nonzero(visit).to_pylist())


def read(spans: pa.RecordBatch, rows: list[int]) -> tuple[dict[int, float], list[tuple[int, Score]]]:
    """For the walked `spans` (collector.span_walk.WALK_SCHEMA), the first-token times from the events of
    `rows` that have one, and their scores with each one's row, in row order."""
    first: dict[int, float] = {}
    found: list[tuple[int, Score]] = []
    if not rows:
        return first, found
    attributes, left_out, events, links = spans["attributes"], spans["left_out"], spans["events"], spans["links"]
    starts, ends = spans["start_time"].cast(pa.int64()), spans["end_time"].cast(pa.int64())
    trace_ids, span_ids = spans["trace_id"], spans["span_id"]
    for i in rows:
        row_events = orjson.loads(events[i].as_py()) if events[i].is_valid else None
        ms = first_token_ms(row_events, None, starts[i].as_py())
        if ms is not None:
            first[i] = ms
        scores = span_scores(
            attributes[i].as_py(),
            left_out[i].as_py(),
            row_events,
            links[i].as_py(),
            trace=trace_ids[i].as_py(),
            span=span_ids[i].as_py(),
            end=ends[i].as_py(),
        )
        found.extend((i, s) for s in scores)
    return first, found


def span_scores(
    attrs_json: str,
    left_out_json: str | None,
    events: list[dict[str, Any]] | None,
    links_json: str | None,
    *,
    trace: str,
    span: str,
    end: int,
) -> list[Score]:
    """A span's scores: from its attributes (on the span it judges, for a linked evaluator span) and events.
    No score key is ever left out of `attrs_json` (tests/test_stored_attributes.py), so the hint reads it alone."""
    raw = attrs_json.encode()
    found: list[Score] = []
    if SCORE_HINT.search(raw):
        attrs = orjson.loads(raw)
        if left_out_json is not None:
            attrs.update(orjson.loads(left_out_json))
        links = orjson.loads(links_json) if links_json is not None else None
        score_trace, score_span = trace, span
        if links is not None and len(links) == 1 and attrs.get("openinference.span.kind") == "EVALUATOR":
            # OpenInference feedback arrives on a carrier span linked to the span it judges.
            score_trace, score_span = links[0]["trace_id"], links[0]["span_id"]
        found.extend(from_span_attributes(attrs, raw, score_trace, score_span, end))
    for event in events or ():
        if event["name"] == EVALUATION_EVENT:
            # An event time storage cannot hold is as good as none: the score is the span's.
            event_time = event["time_unix_nano"]
            at = event_time if 0 < event_time <= MAX_TIME_NS else end
            score = from_evaluation(event["attributes"], trace, span, "event", at)
            if score is not None:
                found.append(score)
    return found


def of_spans(spans: pa.RecordBatch) -> tuple[pa.Table, pa.Array]:
    """All of `spans`' scores (SCORE_BATCH_SCHEMA, in row order) and first-token times from events."""
    first, found = read(spans, candidates(spans))
    times = pa.array([first.get(i) for i in range(spans.num_rows)], pa.float64())
    return score_table([score for _, score in found]), times
