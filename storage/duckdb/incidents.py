"""The `IncidentStore` port on DuckDB: evidence read on a cursor, incidents written through the writer."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa

from storage.duckdb.detector_store import WriteJobs
from storage.duckdb.replaced_rows import replace_rows
from storage.duckdb.window_source import DuckDBWindowSource
from storage.ports import Alert, Incident

# The alerts an incident may hold: firing, resolved since the lookback began, or in an incident still open (an
# incident is rebuilt from all of its alerts, however long it has been open).
EVIDENCE_ALERTS = """
    SELECT * FROM alerts
    WHERE state = 'firing' OR resolved_at >= ?
       OR alert_id IN (SELECT unnest(alert_ids) FROM incidents WHERE state = 'open')
    ORDER BY started_at, alert_id
"""


class DuckDBIncidentStore:
    def __init__(self, source: DuckDBWindowSource, writer: WriteJobs) -> None:
        self._source = source
        self._writer = writer

    def incident_evidence(self, since: datetime) -> tuple[list[Alert], pa.Table]:
        alerts = [Alert.from_row(r) for r in self._source.arrow(EVIDENCE_ALERTS, [since]).to_pylist()]
        clusters = self._source.arrow(
            "SELECT * EXCLUDE (evaluated_at) FROM clusters WHERE window_end > ? ORDER BY window_end, rank", [since]
        )
        return alerts, clusters

    def keep_incidents(self, incidents: Sequence[Incident]) -> None:
        rows = [i.as_row() for i in incidents]
        if rows:
            self._writer.submit(lambda con: replace_rows(con, "incidents", "incident_id", rows)).result()

    def incidents(self, *, state: str | None = None, since: datetime | None = None, limit: int = 100) -> pa.Table:
        clauses = [(c, v) for c, v in (("state = ?", state), ("updated_at > ?", since)) if v is not None]
        where = f"WHERE {' AND '.join(c for c, _ in clauses)}" if clauses else ""
        return self._source.arrow(
            f"SELECT * FROM incidents {where} ORDER BY updated_at DESC, incident_id LIMIT ?",
            [*(v for _, v in clauses), int(limit)],
        )

    def incident(self, incident_id: str) -> Incident | None:
        rows = self._source.arrow("SELECT * FROM incidents WHERE incident_id = ?", [incident_id]).to_pylist()
        return Incident.from_row(rows[0]) if rows else None
