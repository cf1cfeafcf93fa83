"""The `ScrapeHealth` port: each round's target rows go to `scrape_targets` through the writer."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

import duckdb

from storage.duckdb.writer import Writer
from storage.ports import TargetHealth

# INSERT OR REPLACE would overwrite last_success with NULL on a failed scrape; the upsert keeps it.
_UPSERT = """
    INSERT INTO scrape_targets (url, replica_id, deployment, up, last_scrape, last_success, last_error, points, seconds)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (url) DO UPDATE SET
        replica_id = excluded.replica_id,
        deployment = excluded.deployment,
        up = excluded.up,
        last_scrape = excluded.last_scrape,
        last_success = coalesce(excluded.last_success, scrape_targets.last_success),
        last_error = excluded.last_error,
        points = excluded.points,
        seconds = excluded.seconds
"""


class DuckDBScrapeHealth:
    def __init__(self, writer: Writer) -> None:
        self._writer = writer

    def record(self, rows: Sequence[TargetHealth]) -> Future[None]:
        params = [
            [
                r.url, r.replica_id, r.deployment, r.up, r.scraped_at, r.scraped_at if r.error is None else None,
                r.error, r.points, r.seconds,
            ]
            for r in rows
        ]  # fmt: skip

        def upsert(con: duckdb.DuckDBPyConnection) -> None:
            for row in params:
                con.execute(_UPSERT, row)

        return self._writer.submit(upsert)
