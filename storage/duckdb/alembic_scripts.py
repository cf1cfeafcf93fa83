"""The migrations run by Alembic on an open DuckDB connection. Imported only when there is one to run."""

from __future__ import annotations

from importlib import resources
from typing import Any

import duckdb
import duckdb_engine
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.ddl.impl import DefaultImpl
from alembic.script import ScriptDirectory


class AlembicDuckDBImpl(DefaultImpl):
    # duckdb-engine registers no Alembic implementation; without one Alembic fails with KeyError 'duckdb'.
    # Defining the subclass registers it.
    __dialect__ = "duckdb"
    transactional_ddl = True


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:
        raise RuntimeError("migrations/versions holds no revision")
    return head


def upgrade(con: duckdb.DuckDBPyConnection, revision: str) -> None:
    _run(con, lambda cfg: command.upgrade(cfg, revision))


def downgrade(con: duckdb.DuckDBPyConnection, revision: str) -> None:
    _run(con, lambda cfg: command.downgrade(cfg, revision))


def _engine(con: duckdb.DuckDBPyConnection) -> sa.Engine:
    # duckdb-engine's own connect() adds options, and DuckDB refuses a second connection to one file
    # with different options; wrapping a cursor of the service's connection avoids that.
    def creator() -> Any:
        return duckdb_engine.ConnectionWrapper(con.cursor())

    return sa.create_engine("duckdb://", creator=creator, poolclass=sa.pool.StaticPool)


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("migrations")))
    return cfg


def _run(con: duckdb.DuckDBPyConnection, action: Any) -> None:
    engine = _engine(con)
    try:
        with engine.begin() as conn:
            cfg = _config()
            cfg.attributes["connection"] = conn
            action(cfg)
    finally:
        engine.dispose()
