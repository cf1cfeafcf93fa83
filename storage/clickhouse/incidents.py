"""The `IncidentStore` port on ClickHouse: incidents are replaced rows keyed by id, read with `final`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa

from storage.clickhouse.client import ClickHouse
from storage.clickhouse.schema import Column, versioned
from storage.clickhouse.stores import fit
from storage.ports import Alert, Incident


class ClickHouseIncidentStore:
    def __init__(self, client: ClickHouse, tables: dict[str, list[Column]]) -> None:
        self._client = client
        self._tables = tables

    def _names(self, table: str) -> str:
        return ", ".join(f"`{c.name}`" for c in self._tables[table] if c.name != "evaluated_at")

    def incident_evidence(self, since: datetime) -> tuple[list[Alert], pa.Table]:
        # As on DuckDB (storage/duckdb/incidents.py): firing, resolved since, or in an incident still open.
        rows = self._client.arrow(
            f"SELECT {self._names('alerts')} FROM alerts WHERE state = 'firing' OR resolved_at >= {{s:DateTime64(6)}} "
            "OR alert_id IN (SELECT arrayJoin(alert_ids) FROM incidents WHERE state = 'open') "
            "ORDER BY started_at, alert_id",
            {"s": since},
        )
        clusters = self._client.arrow(
            f"SELECT {self._names('clusters')} FROM clusters WHERE window_end > {{s:DateTime64(6)}} "
            "ORDER BY window_end, rank",
            {"s": since},
        )
        return [Alert.from_row(r) for r in rows.to_pylist()], clusters

    def keep_incidents(self, incidents: Sequence[Incident]) -> None:
        if incidents:
            rows = pa.Table.from_pylist([i.as_row() for i in incidents])
            self._client.insert(
                "incidents", versioned(fit(rows, self._tables["incidents"], "incidents")), replacing=True
            )

    def incidents(self, *, state: str | None = None, since: datetime | None = None, limit: int = 100) -> pa.Table:
        clauses: list[str] = []
        params: dict[str, object] = {"limit": int(limit)}
        if state is not None:
            clauses.append("state = {state:String}")
            params["state"] = state
        if since is not None:
            clauses.append("updated_at > {since:DateTime64(6)}")
            params["since"] = since
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        return self._client.arrow(
            f"SELECT {self._names('incidents')} FROM incidents {where} ORDER BY updated_at DESC, incident_id "
            "LIMIT {limit:UInt64}",
            params,
        )

    def incident(self, incident_id: str) -> Incident | None:
        rows = self._client.arrow(
            f"SELECT {self._names('incidents')} FROM incidents WHERE incident_id = {{i:String}}", {"i": incident_id}
        ).to_pylist()
        return Incident.from_row(rows[0]) if rows else None
