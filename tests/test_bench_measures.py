"""The benchmarks' own measures, on a real store: what they record must be what they name."""

from __future__ import annotations

import sys
from pathlib import Path

from builders import request, span
from conftest import RunningService, service_settings
from test_disk_full import post

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from ingest import bytes_on_disk

from storage.duckdb.space import reserve_path


def test_a_stores_bytes_on_disk_count_the_database_and_its_wal_not_the_disk_space_reserve(tmp_path: Path) -> None:
    db = tmp_path / "tailwatch.duckdb"
    with RunningService(service_settings(db, storage={"reserve_mb": 64})) as svc:
        body = request([span(attributes={"gen_ai.request.model": "m"}) for _ in range(200)]).SerializeToString()
        assert post(svc, body)[0] == 200
    assert reserve_path(db).stat().st_size == 64 << 20  # the reserve is there, and would dwarf the store
    # The database and, when the stop left one, its write-ahead log: the files that hold the spans.
    stored = sum(p.stat().st_size for p in (db, tmp_path / "tailwatch.duckdb.wal") if p.exists())
    assert 0 < bytes_on_disk(db) == stored < 64 << 20
