"""Reading and redefining the `spans` view, for the migrations that change it (0018 on).

DuckDB keeps a view as the SQL it writes back, not as it was given: a migration edits that text, so the
edits are checked against it before they are made.
"""

from alembic import op


def definition() -> str:
    """The `spans` view's CREATE statement as DuckDB holds it, without its closing semicolon."""
    rows = op.get_bind().exec_driver_sql("SELECT sql FROM duckdb_views() WHERE view_name = 'spans'").fetchall()
    if len(rows) != 1:
        raise RuntimeError("the spans view is missing")
    return str(rows[0][0]).rstrip().removesuffix(";")


def redefine(view: str) -> None:
    """Replace the view with `view`, a CREATE VIEW statement."""
    # Straight to DuckDB: SQLAlchemy would read the JSON text's `":` as the start of a bind parameter.
    op.get_bind().exec_driver_sql("CREATE OR REPLACE " + view.removeprefix("CREATE "))
