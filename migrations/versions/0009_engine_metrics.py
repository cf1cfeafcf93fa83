"""Engine metrics: the `engine_metrics` table, and `scrape_targets`, one row per scraped target.

The request model joined to the engine metrics (the engines' states, and `llm_requests_between` filling
`queue_depth`, `replica_count`, `cache_hit_ratio` and the engine-only columns from them), which this
revision once defined, is the request model's (storage/request_model/duckdb/10_engine_states.sql and
40_requests.sql), applied over the newest tables.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_TABLE = """
    CREATE TABLE engine_metrics (
        time TIMESTAMP NOT NULL,
        start_time TIMESTAMP,
        name VARCHAR NOT NULL,
        metric VARCHAR,
        kind VARCHAR NOT NULL,
        value DOUBLE NOT NULL,
        replica_id VARCHAR,
        deployment VARCHAR,
        model VARCHAR,
        engine VARCHAR,
        source VARCHAR NOT NULL,
        interval_s DOUBLE NOT NULL,
        attributes JSON,
        resource JSON,
        ingested_at TIMESTAMP NOT NULL
    )
"""

# One row per scraped target (metrics.scrape.targets), replaced after every scrape.
_SCRAPE_TARGETS = """
    CREATE TABLE scrape_targets (
        url VARCHAR PRIMARY KEY,
        replica_id VARCHAR,
        deployment VARCHAR,
        up BOOLEAN NOT NULL,
        last_scrape TIMESTAMP NOT NULL,
        last_success TIMESTAMP,
        last_error VARCHAR,
        points BIGINT NOT NULL,
        seconds DOUBLE NOT NULL
    )
"""


def upgrade() -> None:
    op.execute(_TABLE)
    op.execute(_SCRAPE_TARGETS)


def downgrade() -> None:
    op.execute("DROP TABLE scrape_targets")
    op.execute("DROP TABLE engine_metrics")
