"""Schema migrations of a DuckDB file, the revision it is at, and the request model over its tables.

The migrations (migrations/versions) hold the tables and the data moves. The views and table macros that
read them, the request model, are SQL files (storage/request_model/duckdb) applied after the migrations
whenever a file is brought to the newest revision, and dropped before a migration runs: a file below the
newest revision holds tables only, and the version of Tailwatch whose head it is applies its own model when
it opens the file.

Alembic and SQLAlchemy take ~50 MiB of a process's memory once imported, and a file already at the
newest schema needs neither: its revision is one query away, and whether it holds this model one more.
They are imported only when a migration runs, and `tailwatch serve` runs that in a child process
(`main`), so the service never holds them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from types import ModuleType

import duckdb

from storage.duckdb.database import DamagedDatabase, open_database
from storage.request_model import duckdb_files as request_model

# The newest revision in migrations/versions. A test holds it equal to Alembic's head, so a new migration
# that forgets to move it fails there.
HEAD = "0025"


def _alembic() -> ModuleType:
    from storage.duckdb import alembic_scripts  # noqa: PLC0415 - the ~50 MiB import only a migration needs

    return alembic_scripts


def head_revision() -> str:
    """The newest revision shipped with this version of Tailwatch, as Alembic reads the scripts."""
    return str(_alembic().head_revision())


def current_revision(con: duckdb.DuckDBPyConnection) -> str | None:
    """The revision the database is at, or None before the first migration."""
    try:
        rows = con.execute("SELECT version_num FROM main.alembic_version").fetchall()
    except duckdb.CatalogException:  # never migrated
        return None
    # One row in a linear history; Alembic empties the table on a downgrade to base.
    return str(rows[0][0]) if rows else None


def upgrade(con: duckdb.DuckDBPyConnection, revision: str = "head") -> None:
    """Bring the schema up to `revision` (default: the newest), with the request model at the newest."""
    if revision in ("head", HEAD) and current_revision(con) == HEAD:
        request_model.ensure(con)  # a changed model is applied at the next start, with no migration
        return
    _migrate(con, lambda alembic: alembic.upgrade(con, revision))


def downgrade(con: duckdb.DuckDBPyConnection, revision: str) -> None:
    """Take the schema back down to `revision` ('base' removes everything); below the newest, tables only."""
    _migrate(con, lambda alembic: alembic.downgrade(con, revision))


def _migrate(con: duckdb.DuckDBPyConnection, run: Callable[[ModuleType], None]) -> None:
    # The model goes first: it reads tables the migrations change, and is written for the newest ones only.
    request_model.drop(con, request_model.read(con))
    run(_alembic())
    if current_revision(con) == HEAD:
        request_model.ensure(con)


def migrated(path: object, before: str | None, after: str | None) -> str:
    """What a migration did, as `tailwatch migrate` and the migration `tailwatch serve` runs both say it."""
    return f"{path}: schema {before or 'empty'} -> {after}"


def main(argv: list[str] | None = None) -> int:
    """Migrate a file to the newest schema and exit: what `tailwatch serve` runs before it opens the file."""
    parser = argparse.ArgumentParser(prog="python -m storage.duckdb.migrate", description=main.__doc__)
    parser.add_argument("path")
    parser.add_argument("--memory-limit", default="512MB")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        con = open_database(args.path, memory_limit=args.memory_limit, threads=args.threads)
    except (duckdb.Error, DamagedDatabase):
        return 1  # the service opens the file next, and says what is wrong in its own words
    try:
        before = current_revision(con)
        upgrade(con)
        after = current_revision(con)
    finally:
        con.close()
    if before != after:  # so that a start that migrated shows in the log
        print(migrated(args.path, before, after), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
