"""`tailwatch sql` and `tailwatch export`: against a running service found through the configured file,
or on the file itself when no service holds it; exports read back by DuckDB and Polars."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import polars as pl
import pytest
from conftest import RunningService, service_settings
from serverproc import ServerProcess

from simulator import simulate
from tailwatch import cli
from tailwatch.client import Target

END = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=5)
SEED = {"seed": 11, "end": END, "history_hours": 1.0, "history_rate": 1.0, "rate": 3.0}


def seeded(db: Path) -> int:
    """A database with simulated requests from several tenants (and their scores); returns how many requests."""
    with RunningService(service_settings(db)) as svc:
        simulate.run(["noisy_neighbor"], endpoint=svc.grpc_target, protocol="grpc", **SEED)  # type: ignore[arg-type]
        svc.wait_committed()
        return int(svc.rows("SELECT count(*) FROM llm_requests")[0][0])


@pytest.fixture(scope="module")
def seeded_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    db = tmp_path_factory.mktemp("seeded") / "tailwatch.duckdb"
    return db, seeded(db)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_sql_on_the_file_prints_a_table_csv_or_json(
    seeded_db: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    db, n = seeded_db
    statement = "SELECT count(*) AS requests FROM llm_requests"
    code, out, _ = run_cli(capsys, "sql", statement, "--db", str(db))
    assert code == 0
    assert "requests" in out.splitlines()[1] and str(n) in out
    code, out, _ = run_cli(capsys, "sql", statement, "--db", str(db), "--format", "csv")
    assert out.splitlines() == ['"requests"', str(n)]
    code, out, _ = run_cli(capsys, "sql", statement, "--db", str(db), "--format", "json")
    assert json.loads(out)["rows"] == [[n]]


def test_sql_on_the_file_is_read_only_and_says_why_it_refused(
    seeded_db: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    db, n = seeded_db
    code, _out, err = run_cli(capsys, "sql", "DELETE FROM spans", "--db", str(db))
    assert code == 1 and "read_only" in err and "DELETE" in err
    code, _out, err = run_cli(capsys, "sql", "SELECT * FROM read_text('/etc/hostname')", "--db", str(db))
    assert code == 1 and "forbidden" in err
    assert run_cli(capsys, "sql", "SELECT count(*) FROM llm_requests", "--db", str(db), "--format", "csv")[1].split()[
        1
    ] == str(n)


def test_sql_reaches_the_running_service_that_holds_the_configured_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "held.duckdb"
    server = ServerProcess(db, tmp_path / "serve.log").start()
    try:
        # The configured file is held, so the configured API is used: nothing but the settings name it.
        monkeypatch.setenv("TAILWATCH_DB", str(db))
        monkeypatch.setenv("TAILWATCH_API_PORT", str(server.api_port))
        code, out, err = run_cli(capsys, "sql", "SELECT 40 + 2 AS answer")
        assert code == 0, err
        assert "answer" in out and "42" in out
        code, out, _ = run_cli(capsys, "sql", "SELECT * FROM range(3)", "--format", "csv")
        assert out.split() == ['"range"', "0", "1", "2"]
        code, _out, err = run_cli(capsys, "sql", "DROP TABLE spans")
        assert code == 1 and "read_only" in err
        # Naming the held file explicitly explains the one-process rule instead.
        code, _out, err = run_cli(capsys, "sql", "SELECT 1", "--db", str(db))
        assert code == 3 and "held by another process" in err
    finally:
        assert server.terminate() == 0


def read_back(directory: Path) -> pl.DataFrame:
    return pl.scan_parquet(directory / "**/*.parquet", hive_partitioning=True).collect()


def test_export_writes_parquet_partitioned_by_date_and_tenant(
    seeded_db: tuple[Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, n = seeded_db
    since, until = (END - timedelta(hours=2)).isoformat(), (END + timedelta(hours=1)).isoformat()
    code, out, err = run_cli(
        capsys, "export", "--since", since, "--until", until, "--to", str(tmp_path), "--db", str(db)
    )
    assert code == 0, err
    assert f"requests: {n} rows" in out
    requests = read_back(tmp_path / "requests")
    assert requests.height == n
    partitions = {p.relative_to(tmp_path / "requests").parts[:2] for p in (tmp_path / "requests").rglob("*.parquet")}
    tenants = set(requests["tenant_id"].drop_nulls().unique().to_list())
    assert {t.removeprefix("tenant_id=") for _d, t in partitions} >= tenants and len(tenants) >= 2
    assert all(d.startswith("date=") for d, _t in partitions)
    # DuckDB reads the same files, the partition columns restored from the paths.
    con = duckdb.connect()
    glob = str(tmp_path / "requests" / "**" / "*.parquet")
    [(rows, distinct)] = con.execute(
        "SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM read_parquet(?, hive_partitioning = true)", [glob]
    ).fetchall()
    assert rows == distinct == n
    scores = read_back(tmp_path / "scores")
    assert scores.height > 0 and {"name", "score", "tenant_id", "date"} <= set(scores.columns)
    assert read_back(tmp_path / "spans").height >= n


def test_export_through_the_service_matches_the_file_export(seeded_db: tuple[Path, int], tmp_path: Path) -> None:
    db, n = seeded_db
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(db.read_bytes())
    since, until = END - timedelta(hours=2), END + timedelta(hours=1)
    with RunningService(service_settings(copy)) as svc:
        target = Target.resolve(svc.settings, svc.api_url, None, None)
        assert target.export("requests", since, until, tmp_path / "via-api") == n
    assert read_back(tmp_path / "via-api" / "requests").height == n
