"""Alembic environment, driven by storage.duckdb.migrate: runs on the connection passed in `config.attributes`.

Revisions write DuckDB DDL with `op.execute` and never import application models, so an old revision
keeps meaning what it meant when it was written.
"""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
