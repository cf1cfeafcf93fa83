"""The request model over ClickHouse: the same SQL as the DuckDB backend's, run on the rows a read needs.

The request model (client and server spans of one request counted once, attempts, engine facts joined by
replica and time) is a set of DuckDB views and table macros (storage/request_model/duckdb). Rather than a
second copy of those rules in ClickHouse's dialect, a read on ClickHouse copies the rows it needs into an
in-memory DuckDB migrated to the same schema and asks the DuckDB window source there: the same answers by
construction (the conformance suite holds both backends to it). ClickHouse does the selective part, the
window's spans by the sorting key and the other spans of the same traces; the pairing runs on those alone.

What a read needs: the LLM spans of the traces with a span ending in the window, from up to an hour
either side (the request model's pairing reach); their scores; engine points from two hours before the
first to two hours after the last (the engine join's reach), only when the read asks for an engine column
and a span of the window is not settled yet; and the traffic labels stored for the window.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

import pyarrow as pa

from model.columns import ENGINE_JOINED
from storage.clickhouse.client import ClickHouse
from storage.clickhouse.schema import SPAN_JSON_COLUMNS, Column, clickhouse_type, tables_of
from storage.ports import Window
from storage.request_evaluator import Evaluation, RequestEvaluator
from storage.request_model.clickhouse import span_level_columns
from storage.span_layout import SPAN_ROWS, STORED_ONLY

PAIRING_REACH = timedelta(hours=1)
ENGINE_REACH = timedelta(hours=2)


@dataclass(frozen=True)
class Needs:
    """What one read needs loaded besides the window's spans."""

    window: Window
    engine: bool = False
    scores: bool = False
    labels: bool = False
    trace_id: str | None = None  # only this trace's spans (the console's trace view)
    # The request-model columns the read asks for; None: all of them. Every other column of `spans` is loaded
    # as NULL: each output column of the request model depends on its own span column and the pairing keys.
    columns: frozenset[str] | None = None


# What pairing, the engine join and the NOT NULL columns read, whatever the read asks for.
_ALWAYS = frozenset(
    {"trace_id", "span_id", "llm_role", "is_llm", "name", "kind", "start_time", "end_time", "duration_ms",
     "status_code", "ingested_at", "engine_settled", "replica_id", "deployment"}
)  # fmt: skip


def needs_engine(columns: tuple[str | None, ...] | list[str | None]) -> bool:
    return any(c in ENGINE_JOINED for c in columns)


def span_columns(asked: Iterable[str | None]) -> frozenset[str]:
    """The `spans` columns a read of these request-model columns depends on."""
    wanted = [c for c in asked if c is not None]
    return _ALWAYS | set(wanted) | set(span_level_columns(wanted))


class Evaluator:
    """The request evaluator (storage/request_evaluator.py) with what ClickHouse loads into it for a read, one
    read at a time, and the ClickHouse tables of its schema."""

    def __init__(self) -> None:
        self._engine = RequestEvaluator()
        self.tables = tables_of(self._engine.table_columns())

    def close(self) -> None:
        self._engine.close()

    def span_columns_with_json(self) -> list[Column]:
        """Every column of `spans`, the JSON ones too (what the ingest table takes), but how DuckDB stores
        `attributes`: ClickHouse is sent the attributes whole."""
        return [
            Column(name, clickhouse_type(typ, nullable))
            for name, typ, nullable in self._engine.view_columns("spans")
            if name not in STORED_ONLY
        ]

    def _select(self, table: str) -> str:
        return ", ".join(f"`{c.name}`" for c in self.tables[table])

    @contextmanager
    def loaded(self, client: ClickHouse, needs: Needs) -> Iterator[Evaluation]:
        with self._engine.emptied() as evaluation:
            self._load(client, needs, evaluation)
            yield evaluation

    def _load(self, client: ClickHouse, needs: Needs, evaluation: Evaluation) -> None:
        w = needs.window
        in_window = "is_llm AND end_time >= {s:DateTime64(6)} AND end_time < {e:DateTime64(6)}"
        if needs.trace_id is not None:
            in_window += " AND trace_id = {t:String}"
        params = {"s": w.start, "e": w.end, "lo": w.start - PAIRING_REACH, "hi": w.end + PAIRING_REACH,
                  "t": needs.trace_id}  # fmt: skip
        traces = f"SELECT trace_id FROM spans WHERE {in_window}"
        # A short window's requests pair with spans up to an hour away: only those of its traces are loaded. A
        # long window (a day's baseline) holds most of that reach already, and the set of its traces would cost
        # more than the few extra spans.
        of_traces = needs.trace_id is not None or w.end - w.start < 2 * PAIRING_REACH
        columns = [c for c in self.tables["spans"] if needs.columns is None or c.name in needs.columns]
        spans = client.arrow(
            f"SELECT {', '.join(f'`{c.name}`' for c in columns)} FROM spans "
            "WHERE is_llm AND end_time >= {lo:DateTime64(6)} AND end_time < {hi:DateTime64(6)}"
            + (f" AND trace_id IN ({traces})" if of_traces else ""),
            params,
        )
        evaluation.insert(SPAN_ROWS, spans.drop_columns([c for c in SPAN_JSON_COLUMNS if c in spans.column_names]))
        if spans.num_rows == 0:
            return
        if needs.scores:
            evaluation.insert(
                "span_scores",
                client.arrow(f"SELECT {self._select('span_scores')} FROM span_scores WHERE trace_id IN ({traces})",
                             params),
            )  # fmt: skip
        if needs.labels:
            evaluation.insert(
                "traffic_pattern_labels",
                client.arrow(
                    f"SELECT {self._select('traffic_pattern_labels')} FROM traffic_pattern_labels "
                    "WHERE window_start = {s:DateTime64(6)} AND window_end = {e:DateTime64(6)}",
                    params,
                ),
            )
        if needs.engine and evaluation.unsettled(w):
            self._load_engine(client, evaluation)

    def _load_engine(self, client: ClickHouse, evaluation: Evaluation) -> None:
        """The engine points the join can reach from the loaded spans."""
        lo, hi = evaluation.span_times()
        reach = ENGINE_REACH + PAIRING_REACH
        evaluation.insert(
            "engine_metrics",
            client.arrow(
                f"SELECT {self._select('engine_metrics')} FROM engine_metrics "
                "WHERE time >= {lo:DateTime64(6)} AND time < {hi:DateTime64(6)}",
                {"lo": _minus(lo, reach), "hi": _plus(hi, reach)},
            ),
        )

    def settle(self, client: ClickHouse, window: Window) -> pa.Table:
        """The unsettled LLM spans that ended in `window` as `spans` rows with their engine facts stored."""
        with self._engine.emptied() as evaluation:
            params = {"s": window.start, "e": window.end}
            spans = client.arrow(
                f"SELECT {self._select('spans')} FROM spans WHERE is_llm AND engine_settled IS NULL "
                "AND end_time >= {s:DateTime64(6)} AND end_time < {e:DateTime64(6)}",
                params,
            )
            evaluation.insert(SPAN_ROWS, spans)
            self._load_engine(client, evaluation)
            return evaluation.settled(window, [c.name for c in self.tables["spans"]])


def _minus(t: datetime | None, d: timedelta) -> datetime:
    return (t or datetime(1970, 1, 1)) - d


def _plus(t: datetime | None, d: timedelta) -> datetime:
    return (t or datetime(1970, 1, 1)) + d
