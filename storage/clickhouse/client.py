"""One ClickHouse client for a Tailwatch process: a server over HTTP, or chDB in-process (`chdb://`).

clickhouse-connect gives the same client class for both. Every statement runs in UTC with naive UTC
times coming back, like the DuckDB backend's, and with `final = 1`: the tables whose rows are replaced
(ReplacingMergeTree) read as their newest version without each query saying FINAL (on a cluster, each shard
applies it to its own rows).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import clickhouse_connect
import pyarrow as pa
import pyarrow.compute as pc
from clickhouse_connect.driver.exceptions import ClickHouseError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# insert_distributed_sync: an insert reaching a cluster's Distributed table (its sharded `spans`) is answered
# once every shard stored its rows, not once this node queued them, so an acknowledged span is stored.
_SESSION: dict[str, Any] = {"session_timezone": "UTC", "final": 1, "insert_distributed_sync": 1}


def _connect(dsn: str, extra: dict[str, Any]) -> Any:
    """A client of the DSN's database, created first when it does not exist yet."""
    try:
        return clickhouse_connect.get_client(dsn=dsn, settings=dict(_SESSION), **extra)
    except ClickHouseError as exc:
        if "UNKNOWN_DATABASE" not in str(exc) and "Code: 81" not in str(exc):
            raise
    parsed = urlsplit(dsn)
    query = dict(parse_qsl(parsed.query))
    named = query.pop("database", None)  # chdb:///path?database=x; a server's DSN names it as its path
    database = named or parsed.path.lstrip("/").split("/")[0]
    if not database or not _NAME.fullmatch(database):
        raise ValueError(f"{database!r} is not a database name Tailwatch creates")
    bare = urlunsplit(parsed._replace(query=urlencode(query)) if named else parsed._replace(path=""))
    admin = clickhouse_connect.get_client(dsn=bare, settings=dict(_SESSION), **extra)
    try:
        admin.command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    finally:
        if not dsn.startswith("chdb:"):
            admin.close()
    return clickhouse_connect.get_client(dsn=dsn, settings=dict(_SESSION), **extra)


def with_settings(sql: str, settings: Mapping[str, Any] | None) -> str:
    """The statement with a SETTINGS clause of its own: chDB keeps a client's per-query settings for the rest of
    the session, so limits meant for one statement are written into it. On a line of its own, after a
    trailing comment."""
    if not settings:
        return sql
    values = ", ".join(f"{k} = {v!r}" for k, v in settings.items())
    return f"{sql.rstrip().rstrip(';')}\nSETTINGS {values}"


def naive(table: pa.Table) -> pa.Table:
    """The table with every timestamp as naive UTC, as the ports promise."""
    fields = []
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        zoned = pa.types.is_timestamp(field.type) and field.type.tz is not None
        plain = pa.timestamp(field.type.unit) if zoned else field.type
        fields.append(field.with_type(plain))
        columns.append(pc.cast(column, plain) if zoned else column)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


class ClickHouse:
    """The client, shared by every part of the backend. chDB runs one query at a time in a process; a server
    takes concurrent queries, so only chDB's are serialized."""

    def __init__(self, dsn: str, *, connect_timeout: float = 10, send_receive_timeout: float = 300) -> None:
        self.dsn = dsn
        self.embedded = dsn.startswith("chdb:")
        extra: dict[str, Any] = (
            {}
            if self.embedded
            else {
                "connect_timeout": connect_timeout,
                "send_receive_timeout": send_receive_timeout,
                # One session per client would refuse concurrent queries ("session is locked").
                "autogenerate_session_id": False,
            }
        )
        self._client = _connect(dsn, extra)
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if self.embedded else contextlib.nullcontext()
        )

    def arrow(
        self, sql: str, params: Mapping[str, Any] | None = None, settings: Mapping[str, Any] | None = None
    ) -> pa.Table:
        with self._lock:
            table = self._client.query_arrow(with_settings(sql, settings), parameters=dict(params or {}))
        return naive(table)

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """Rows as tuples: for statements whose result is not a table Arrow can carry (EXPLAIN)."""
        with self._lock:
            return list(self._client.query(sql, parameters=dict(params or {})).result_rows)

    @contextlib.contextmanager
    def stream(
        self, sql: str, params: Mapping[str, Any] | None = None, settings: Mapping[str, Any] | None = None
    ) -> Iterator[pa.RecordBatchReader]:
        """The result block by block as the server sends it, so an export's memory is a block's, not the result's.
        chDB runs one query at a time: its lock is held until the caller has read the stream."""
        statement = with_settings(sql, settings)
        with self._lock, self._client.query_arrow_stream(statement, parameters=dict(params or {})) as blocks:
            tables = (naive(t) for t in blocks)
            first = next(tables, None)
            if first is None:  # no block at all: the schema comes from the same statement's empty answer
                first = naive(self._client.query_arrow(statement, parameters=dict(params or {})))
            rest = (batch for table in tables for batch in table.to_batches())
            yield pa.RecordBatchReader.from_batches(first.schema, itertools.chain(first.to_batches(), rest))

    def command(
        self, sql: str, params: Mapping[str, Any] | None = None, settings: Mapping[str, Any] | None = None
    ) -> Any:
        with self._lock:
            return self._client.command(with_settings(sql, settings), parameters=dict(params or {}))

    def insert(self, table: str, data: pa.Table, *, token: str | None = None, replacing: bool = False) -> None:
        """Insert an Arrow table; a second insert with the same `token` is dropped by the server as a retry.

        `replacing`: the rows replace what a DELETE just removed (a window's figures evaluated again, an alert's
        new state), so the same rows inserted again are meant: the server's deduplication of identical blocks,
        which Tailwatch's tables keep for retried span batches, would drop them as a retry."""
        settings: dict[str, Any] = {"insert_deduplication_token": token} if token else {}
        if replacing:
            settings["insert_deduplicate"] = 0
        with self._lock:
            self._client.insert_arrow(table, data, settings=settings)

    def close(self) -> None:
        with self._lock:
            self._client.close()
