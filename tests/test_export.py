"""`tailwatch export` and `GET /v1/export`: exactly the rows whose end_time is in [since, until), and the
service's export is the file's export value for value, not just row for row."""

from __future__ import annotations

import logging
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import RunningService, service_settings

from simulator import simulate
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from tailwatch import cli
from tailwatch.client import Target

DATASETS = ("requests", "scores", "spans")
US = timedelta(microseconds=1)

# Yesterday (UTC), so the service's retention pass at start keeps every row.
SINCE = datetime.now(UTC).replace(tzinfo=None, hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
UNTIL = SINCE + timedelta(hours=12)

# (trace_id, span_id, tenant_id, end_time, is_llm, llm_role): one span each.
SPANS: list[tuple[str, str, str | None, datetime, bool, str | None]] = [
    ("tb", "before", "acme", SINCE - US, True, "server"),  # a microsecond before since: out
    ("ts", "at-since", "acme", SINCE, True, "server"),  # exactly since: in
    ("tm", "mid-client", "beta", SINCE + timedelta(hours=1, milliseconds=500), True, "client"),
    ("tm", "mid-server", None, SINCE + timedelta(hours=1), True, "server"),  # one request with mid-client
    ("tn", "plain", None, SINCE + timedelta(hours=2), False, None),  # not LLM: a span, not a request
    ("tl", "last", "beta", UNTIL - US, True, "server"),  # a microsecond before until: in
    ("tu", "at-until", "acme", UNTIL, True, "server"),  # exactly until: out
]
SCORED = ["before", "at-since", "mid-client", "last", "at-until"]

IN_RANGE = {
    "spans": {
        ("ts", "at-since", "acme"),
        ("tm", "mid-client", "beta"),
        ("tm", "mid-server", None),
        ("tn", "plain", None),
        ("tl", "last", "beta"),
    },
    # The client and server span of tm are one request, under the client's id and tenant.
    "requests": {("ts", "at-since", "acme"), ("tm", "mid-client", "beta"), ("tl", "last", "beta")},
    "scores": {("ts", "at-since", "acme"), ("tm", "mid-client", "beta"), ("tl", "last", "beta")},
}


def build(db: Path) -> None:
    con = open_database(db)
    try:
        migrate.upgrade(con)
        for n, (trace_id, span_id, tenant, end, is_llm, role) in enumerate(SPANS):
            start = end - timedelta(seconds=2, microseconds=n)
            con.execute(
                """INSERT INTO span_rows (trace_id, span_id, name, kind, start_time, end_time, duration_ms, status_code,
                       tenant_id, is_llm, llm_role, model, replica_id, e2e_ms, ttft_ms, input_tokens,
                       cache_hit_ratio, attributes_rest, resource, ingested_at)
                   VALUES (?, ?, 'llm_request', ?, ?, ?, ?, 'OK', ?, ?, ?, 'm1', ?, ?, ?, ?, ?, ?, ?, ?)""",
                [
                    trace_id, span_id, "CLIENT" if role == "client" else "SERVER", start, end,
                    (end - start).total_seconds() * 1000, tenant, is_llm, role,
                    None if role == "client" else f"r{n}", 1000.0 + n / 7, 12.5 * n, 100 + n,
                    None if n % 2 else n / 10, f'{{"n": {n}, "tags": ["a", "b"], "nested": {{"k": "v{n}"}}}}',
                    '{"service.name": "svc"}', end,
                ],
            )  # fmt: skip
        for n, span_id in enumerate(SCORED):
            trace_id = next(t for t, s, *_ in SPANS if s == span_id)
            con.execute(
                """INSERT INTO span_scores (trace_id, span_id, name, score, label, source, observed_at, ingested_at)
                   VALUES (?, ?, 'json_adherence', ?, 'pass', 'evaluator', ?, ?)""",
                [trace_id, span_id, n / 4, UNTIL + timedelta(minutes=n), UNTIL],
            )
    finally:
        con.close()


@pytest.fixture(scope="module")
def bounds_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("bounds") / "tailwatch.duckdb"
    build(db)
    return db


# Simulated traffic from several tenants, every column as the decoder fills it.
END = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=5)
SEED = {"seed": 11, "end": END, "history_hours": 1.0, "history_rate": 1.0, "rate": 3.0}


@pytest.fixture(scope="module")
def simulated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("simulated") / "tailwatch.duckdb"
    with RunningService(service_settings(db)) as svc:
        simulate.run(["noisy_neighbor"], endpoint=svc.grpc_target, protocol="grpc", **SEED)  # type: ignore[arg-type]
    return db


def copy_of(db: Path, directory: Path) -> Path:
    """A private copy of a module's database, for a test that starts a service on it."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in db.parent.glob(db.name + "*"):  # the file and, if present, its WAL and its ingest spool
        if path.is_dir():
            shutil.copytree(path, directory / path.name)
        else:
            shutil.copyfile(path, directory / path.name)
    return directory / db.name


def glob(directory: Path) -> str:
    return str(directory / "**" / "*.parquet")


def read(directory: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        return con.execute(
            sql.replace("{data}", "read_parquet(?, hive_partitioning = true)"), [glob(directory)]
        ).fetchall()
    finally:
        con.close()


def exported_ids(directory: Path) -> set[tuple[str, str, str | None]]:
    return {(t, s, tenant) for t, s, tenant in read(directory, "SELECT trace_id, span_id, tenant_id FROM {data}")}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the bounds -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", DATASETS)
def test_export_takes_rows_from_since_inclusive_to_until_exclusive(
    bounds_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str
) -> None:
    code, out, err = run_cli(
        capsys, "export", "--since", SINCE.isoformat() + "Z", "--until", UNTIL.isoformat() + "Z",
        "--dataset", dataset, "--to", str(tmp_path), "--db", str(bounds_db),
    )  # fmt: skip
    assert code == 0, err
    expected = IN_RANGE[dataset]
    assert out.splitlines() == [f"{dataset}: {len(expected)} rows -> {tmp_path / dataset}"]
    assert exported_ids(tmp_path / dataset) == expected
    assert read(tmp_path / dataset, "SELECT count(*) FROM {data}") == [(len(expected),)]
    # The row a microsecond before since ended the day before: no partition of that day was written.
    assert {p.name for p in (tmp_path / dataset).iterdir()} == {f"date={SINCE.date().isoformat()}"}
    assert read(tmp_path / dataset, "SELECT DISTINCT date FROM {data}") == [(SINCE.date(),)]


def test_a_range_that_holds_only_the_boundary_rows(
    bounds_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # [since - 1 µs, since): only the row one microsecond before since; [until, until + 1 µs): only until's.
    for since, until, span_id in [(SINCE - US, SINCE, "before"), (UNTIL, UNTIL + US, "at-until")]:
        target = tmp_path / span_id
        code, out, err = run_cli(
            capsys, "export", "--since", since.isoformat(), "--until", until.isoformat(), "--to", str(target),
            "--db", str(bounds_db),
        )  # fmt: skip
        assert code == 0, err
        assert out.splitlines() == [f"{d}: 1 rows -> {target / d}" for d in DATASETS]
        for dataset in DATASETS:
            assert {s for _t, s, _tenant in exported_ids(target / dataset)} == {span_id}, dataset


def test_an_empty_or_inverted_range_is_refused(
    bounds_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for since, until in [(SINCE, SINCE), (UNTIL, SINCE)]:
        code, _out, err = run_cli(
            capsys, "export", "--since", since.isoformat(), "--until", until.isoformat(), "--to", str(tmp_path),
            "--db", str(bounds_db),
        )  # fmt: skip
        assert code == 1 and "must be after since" in err
    assert list(tmp_path.iterdir()) == []


# --- the service's export against the file's --------------------------------------------------------------


def assert_same_content(file_export: Path, api_export: Path) -> int:
    """Both trees hold the same rows with the same values in every column; returns how many rows."""
    schema = "SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM {data})"
    assert read(file_export, schema) == read(api_export, schema)
    # Sorted by every column, ids first (every dataset's first two columns are trace_id, span_id).
    ordered = "SELECT * FROM {data} ORDER BY ALL"
    from_file, from_api = read(file_export, ordered), read(api_export, ordered)
    assert len(from_file) == len(from_api)
    for a, b in zip(from_file, from_api, strict=True):
        assert a == b
    return len(from_file)


@pytest.mark.parametrize("source", ["hand-built", "simulated"])
def test_export_through_the_service_equals_the_file_export_value_for_value(
    request: pytest.FixtureRequest, tmp_path: Path, source: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    shared = request.getfixturevalue("bounds_db" if source == "hand-built" else "simulated_db")
    db = copy_of(shared, tmp_path / "db")
    since, until = (SINCE, UNTIL) if source == "hand-built" else (END - timedelta(hours=2), END + timedelta(hours=1))
    file_target = Target(None, db, None, service_settings(db))
    written = {d: file_target.export(d, since, until, tmp_path / "via-file") for d in DATASETS}
    with RunningService(service_settings(db)) as svc:
        api_target = Target.resolve(svc.settings, svc.api_url, None, None)
        assert api_target.url == svc.api_url
        via_api = {d: api_target.export(d, since, until, tmp_path / "via-api") for d in DATASETS}
    assert via_api == written
    # A reader that hangs up once it has the end-of-stream marker got everything: no error in the log.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    for dataset in DATASETS:
        rows = assert_same_content(tmp_path / "via-file" / dataset, tmp_path / "via-api" / dataset)
        assert rows == written[dataset] > 0, dataset
        # The same files, partition for partition.
        assert sorted(p.relative_to(tmp_path / "via-file") for p in (tmp_path / "via-file" / dataset).rglob("*")) == (
            sorted(p.relative_to(tmp_path / "via-api") for p in (tmp_path / "via-api" / dataset).rglob("*"))
        )
        if source == "hand-built":
            assert exported_ids(tmp_path / "via-api" / dataset) == IN_RANGE[dataset]
