"""What the reliability runs hold the service to: every acknowledged span stored exactly once, by its id.

The runs (bench/crash_cycles.py, bench/soak.py and their short versions in tests/test_reliability_proofs.py)
send copies of one export request numbered 1, 2, 3, …: each copy's span ids follow from its number, so the
sender keeps only the numbers it had acknowledged and the database is checked span by span against them.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families


class NumberedRequests:
    """Copies of one serialized export request, rewritten in place for each request number: span `i` of
    request `n` has trace id (n, i + 1) and span id n × spans + i + 1, as 64-bit big-endian halves, and
    every time moves so the request's last span ends when the copy is made (detectors window by end time)."""

    def __init__(self, payload: bytes, clock: Callable[[], int] = time.time_ns) -> None:
        self._payload = payload
        self._clock = clock
        spans = ExportTraceServiceRequest.FromString(payload).resource_spans[0].scope_spans[0].spans
        self.spans = len(spans)
        self._last_end = max(s.end_time_unix_nano for s in spans)
        self._times = [(s.start_time_unix_nano, s.end_time_unix_nano) for s in spans]
        self._offsets = []
        for s in spans:
            trace_at = payload.index(s.trace_id)
            span_at = payload.index(s.span_id, trace_at)
            # fixed64 fields 7 and 8: a tag byte, then the value; searched from this span's ids on.
            start_at = payload.index(b"\x39" + s.start_time_unix_nano.to_bytes(8, "little"), span_at) + 1
            end_at = payload.index(b"\x41" + s.end_time_unix_nano.to_bytes(8, "little"), start_at) + 1
            self._offsets.append((trace_at, span_at, start_at, end_at))
        self._check()

    def request(self, number: int) -> bytes:
        out = bytearray(self._payload)
        shift = self._clock() - self._last_end
        for i, ((trace_at, span_at, start_at, end_at), (start, end)) in enumerate(
            zip(self._offsets, self._times, strict=True)
        ):
            out[trace_at : trace_at + 16] = number.to_bytes(8, "big") + (i + 1).to_bytes(8, "big")
            out[span_at : span_at + 8] = (number * self.spans + i + 1).to_bytes(8, "big")
            out[start_at : start_at + 8] = (start + shift).to_bytes(8, "little")
            out[end_at : end_at + 8] = (end + shift).to_bytes(8, "little")
        return bytes(out)

    def _check(self) -> None:
        """The offsets found are the fields meant: a wrong one would send ids the tally never looks for."""
        spans = ExportTraceServiceRequest.FromString(self.request(7)).resource_spans[0].scope_spans[0].spans
        for i, s in enumerate(spans):
            assert (s.trace_id.hex(), s.span_id.hex()) == ids(7, i, self.spans), f"span {i}: ids not rewritten"
            assert s.end_time_unix_nano - s.start_time_unix_nano == self._times[i][1] - self._times[i][0]


def ids(number: int, index: int, spans: int) -> tuple[str, str]:
    """The (trace_id, span_id) span `index` of request `number` is stored under."""
    return f"{number:016x}{index + 1:016x}", f"{number * spans + index + 1:016x}"


@dataclass(frozen=True)
class Tally:
    acknowledged_spans: int
    stored_spans: int
    lost: int  # acknowledged spans with no stored row
    stored_twice: int  # rows beyond the first of one (trace_id, span_id)
    stored_unacknowledged: int  # distinct stored spans of requests the sender never saw acknowledged

    @property
    def exactly_once(self) -> bool:
        return self.lost == 0 and self.stored_twice == 0


# The expected ids are made where the rows are, so tens of millions of them never become Python objects.
_TALLY = """
WITH stored AS (SELECT trace_id, span_id, count(*) AS copies FROM spans GROUP BY ALL),
expected AS (
    SELECT printf('%016x%016x', n, i + 1) AS trace_id, printf('%016x', n * $spans + i + 1) AS span_id
    FROM acknowledged_numbers, range($spans) AS r(i)
)
SELECT
    (SELECT count(*) FROM expected),
    (SELECT coalesce(sum(copies), 0) FROM stored),
    (SELECT count(*) FROM expected ANTI JOIN stored USING (trace_id, span_id)),
    (SELECT coalesce(sum(copies - 1), 0) FROM stored),
    (SELECT count(*) FROM stored ANTI JOIN expected USING (trace_id, span_id))
"""


def tally(db: Path, acknowledged: Iterable[int], spans: int) -> Tally:
    """Check a stopped service's database span by span against the requests acknowledged to the sender."""
    numbers = pa.table({"n": pa.array(sorted(set(acknowledged)), pa.uint64())})
    con = duckdb.connect(str(db), read_only=True)
    try:
        con.register("acknowledged_numbers", numbers)
        row = con.execute(_TALLY, {"spans": spans}).fetchone()
    finally:
        con.close()
    assert row is not None
    return Tally(*(int(v) for v in row))


def metrics(api_port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample a running service's /metrics shows, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{api_port}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for (n, have), value in samples.items() if n == name and wanted <= have)
