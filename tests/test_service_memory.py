"""What the service process leaves unloaded: Alembic and SQLAlchemy (the migration runs in a child),
pandas (installed for chDB; pyarrow would import it only to ask whether a value is a pandas object), and the
simulator with the OpenTelemetry SDK it sends through (the simulate extra, which a service may not have)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import duckdb
import grpc
from builders import request, span
from receivers import TEST_EXTRA, import_or_skip
from serverproc import ServerProcess

from storage.duckdb import migrate

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
NOT_IN_THE_SERVICE = ("/pandas/", "/sqlalchemy/")  # both load shared objects, so /proc/<pid>/maps shows them
# Pure Python, so only the interpreter's import log shows them.
SIMULATE_EXTRA = ("simulator", "opentelemetry.sdk", "opentelemetry.exporter")


def loaded_from(pid: int) -> set[str]:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "/" in line}


def post(port: int, path: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def run_python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_fresh_file_is_migrated_and_served_without_alembic_sqlalchemy_or_pandas_in_the_service(
    tmp_path: Path,
) -> None:
    db = tmp_path / "fresh.duckdb"
    spans = [span(attributes={"gen_ai.usage.output_tokens": 100, "gen_ai.usage.input_tokens": 40}) for _ in range(50)]
    with ServerProcess(db, tmp_path / "serve.log") as server:
        server.start()
        with grpc.insecure_channel(server.grpc_target) as ch:
            ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)(
                request(spans).SerializeToString(), timeout=60
            )
        # Ingest, a detection pass and analyst SQL: the paths that convert Python values with pyarrow.
        assert post(server.api_port, "/v1/detect", {})["results"]
        counted = post(server.api_port, "/v1/sql", {"sql": "SELECT count(*) FROM spans"})
        assert counted["rows"] == [[50]]
        assert server.proc is not None
        held = [path for path in loaded_from(server.proc.pid) if any(lib in path for lib in NOT_IN_THE_SERVICE)]
        assert server.terminate() == 0
    assert held == []
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert migrate.current_revision(con) == migrate.HEAD
    finally:
        con.close()


def imported(log: str) -> set[str]:
    """Every module `-X importtime` logged, from the service and each process it started."""
    return {line.rsplit("|", 1)[1].strip() for line in log.splitlines() if line.startswith("import time:")}


def test_the_service_imports_neither_the_simulator_nor_the_opentelemetry_sdk(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with ServerProcess(tmp_path / "lean.duckdb", log, PYTHONPROFILEIMPORTTIME="1") as server:
        server.start()
        with grpc.insecure_channel(server.grpc_target) as ch:
            ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)(
                request([span()]).SerializeToString(), timeout=60
            )
        assert post(server.api_port, "/v1/detect", {})["results"]
        assert server.terminate() == 0
    modules = imported(log.read_text())
    assert "tailwatch.service" in modules  # the log is the service's
    assert sorted(m for m in modules if m.startswith(SIMULATE_EXTRA)) == []


def test_head_is_the_newest_revision_alembic_finds() -> None:
    assert migrate.head_revision() == migrate.HEAD


def test_a_file_at_the_newest_schema_opens_without_importing_alembic(tmp_path: Path) -> None:
    db = tmp_path / "current.duckdb"
    con = duckdb.connect(str(db))
    migrate.upgrade(con)
    con.close()
    out = run_python(
        "import sys, duckdb\n"
        "from storage.duckdb import migrate\n"
        f"con = duckdb.connect({str(db)!r})\n"
        "migrate.upgrade(con)\n"
        "print(migrate.current_revision(con), sorted(m for m in ('alembic', 'sqlalchemy') if m in sys.modules))\n"
    )
    assert out.split(maxsplit=1) == [migrate.HEAD, "[]\n"]


def test_the_migration_child_brings_a_fresh_file_to_the_newest_schema(tmp_path: Path) -> None:
    db = tmp_path / "child.duckdb"
    migrating = [sys.executable, "-m", "storage.duckdb.migrate", str(db)]
    done = subprocess.run(migrating, capture_output=True, text=True, check=False, timeout=120)
    assert (done.returncode, done.stderr) == (0, f"{db}: schema empty -> {migrate.HEAD}\n")
    again = subprocess.run(migrating, capture_output=True, text=True, check=False, timeout=120)
    assert (again.returncode, again.stderr) == (0, "")
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert migrate.current_revision(con) == migrate.HEAD
    finally:
        con.close()


def test_the_migration_child_leaves_a_file_it_cannot_open_to_the_service(tmp_path: Path) -> None:
    db = tmp_path / "held.duckdb"
    holder = duckdb.connect(str(db))  # this process holds the file, as another service would
    try:
        done = subprocess.run(
            [sys.executable, "-m", "storage.duckdb.migrate", str(db)], capture_output=True, check=False, timeout=120
        )
    finally:
        holder.close()
    assert done.returncode == 1
    assert done.stderr == b""  # the service says what is wrong, once


def test_pandas_kept_out_is_refused_with_a_sentence_and_pyarrow_goes_on_without_it() -> None:
    out = run_python(
        "from collector.kept_out_libraries import keep_out\n"
        "keep_out()\n"
        "import pyarrow as pa\n"
        "print(pa.array([1.5, None]).null_count)\n"
        "try:\n"
        "    import pandas\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    assert out.splitlines() == [
        "1",
        "pandas is not loaded in Tailwatch's service and decoder processes (collector/kept_out_libraries.py)",
    ]


def test_keeping_pandas_out_after_it_was_imported_is_an_error_not_a_silent_no_op() -> None:
    import_or_skip("pandas", TEST_EXTRA)  # chDB's dependency, so installed with it
    out = run_python(
        "import pandas\n"
        "from collector.kept_out_libraries import keep_out\n"
        "try:\n"
        "    keep_out()\n"
        "except RuntimeError as exc:\n"
        "    print(exc)\n"
    )
    assert out.strip() == "already imported, too late to keep out: pandas"
