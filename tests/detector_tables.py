"""The check every detector's tests share: its figures fit its migrated results table, and its
`inputs`, run against a migrated database, return exactly the frames the hand-built tests use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from detectors.base import Detection, Window
from detectors.frames import IDS
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.window_source import DuckDBWindowSource


def assert_fits_migrated_table(
    tmp_path: Path,
    table: str,
    figures: pl.DataFrame,
    *,
    rows: int,
    inputs: Callable[[Any, Window], Mapping[str, Any]],
    detect: Callable[[dict[str, pl.DataFrame], Any, Window], Detection],
    config: Any,
    window: Window,
    schemas: Mapping[str, Mapping[str, Any]],
) -> None:
    con = open_database(tmp_path / "x.duckdb")
    try:
        migrate.upgrade(con)
        columns = {row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()}
        assert set(figures.columns) == columns - {"evaluated_at"}
        # The pass's insert must accept the frame's types and NOT NULL columns as they are.
        con.register("figures_frame", figures.to_arrow())
        con.execute(
            f"INSERT INTO {table} BY NAME SELECT *, TIMESTAMP '2026-11-20 12:06' AS evaluated_at FROM figures_frame"
        )
        assert con.execute(f"SELECT count(*) FROM {table}").fetchall() == [(rows,)]

        fetched: dict[str, pl.DataFrame] = {}
        source = DuckDBWindowSource(con)
        for key, read in inputs(config, window).items():
            frame = pl.from_arrow(read.fetch(source))
            assert isinstance(frame, pl.DataFrame)
            fetched[key] = frame
        for key, schema in schemas.items():
            # A fetched frame names its requests by storage's request_key, and carries an id only where
            # the detector quotes it; hand-built frames name them by their ids. The rest is the same.
            expected = {c: t for c, t in schema.items() if c in fetched[key].columns or c not in IDS}
            assert fetched[key].drop("request_key").schema == pl.Schema(expected), key
        empty = detect(fetched, config, window)
        assert empty.conditions == []
        assert set(empty.figures.columns) == columns - {"evaluated_at"}
    finally:
        con.close()
