"""The export datasets in DuckDB's SQL (their meaning is in `storage.export`)."""

from __future__ import annotations

from storage.duckdb.stored_attributes import STORED_ONLY

DATASET_SQL = {
    # `attributes` and the derived columns as read, not how they are stored (storage/duckdb/stored_attributes.py).
    "spans": f"SELECT * EXCLUDE ({', '.join(STORED_ONLY)}), end_time::DATE AS date FROM spans "
    "WHERE end_time >= $since AND end_time < $until",
    "requests": "SELECT *, end_time::DATE AS date FROM llm_requests_between($since, $until)",
    "scores": """
        SELECT s.*, r.end_time::DATE AS date, r.tenant_id
        FROM llm_request_scores_between($since, $until) AS s
        JOIN llm_requests_between($since, $until) AS r USING (trace_id, span_id)""",
}
