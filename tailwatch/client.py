"""What `tailwatch sql` and `tailwatch export` talk to: a running service by URL, or the file itself.

DuckDB lets one process hold a database file. When no service holds it, the file is opened read-only
in this process under the same rules as the API (one reading statement, read-only transaction, no
file access, the row cap); when a service holds it, the same request goes to the service's API.
"""

from __future__ import annotations

import ipaddress
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from storage import export
from storage.ports import AnalystSQL, QueryError
from tailwatch import result_formats
from tailwatch.compose import database_held, open_clickhouse_analyst, open_file_analyst
from tailwatch.settings import Settings


class ClientError(Exception):
    """A request that failed; the message is for the person at the terminal."""


@dataclass(frozen=True)
class Answer:
    body: bytes | str  # already in the asked format, except "table", rendered here
    truncated: bool


@dataclass(frozen=True)
class Target:
    url: str | None
    db: Path | None
    token: str | None
    settings: Settings

    @staticmethod
    def resolve(settings: Settings, url: str | None, db: str | None, token: str | None) -> Target:
        """--url, else --db, else the configured file if no process holds it, else the configured API."""
        secret = token or (settings.api.token.get_secret_value() if settings.api.token else None)
        if url:
            if not url.startswith(("http://", "https://")):
                raise ClientError(f"--url must be an http:// or https:// URL (got {url!r})")
            return Target(url.rstrip("/"), None, secret, settings)
        if settings.storage.backend == "clickhouse" and not db:
            # A shared store: analysts read it directly, under the same walls as the API's.
            return Target(None, None, secret, settings)
        path = Path(db) if db else settings.db
        if db or not database_held(path):
            return Target(None, path, secret, settings)
        scheme = "https" if settings.api.tls_cert_file else "http"
        # A service bound to every interface is reached on loopback.
        host = "127.0.0.1" if _unspecified(settings.host) else settings.host
        return Target(f"{scheme}://{host}:{settings.api_port}", None, secret, settings)

    def sql(self, statement: str, fmt: str) -> Answer:
        if self.url is not None:
            wire = "arrow" if fmt == "table" else fmt
            response = self._request("/v1/sql", {"sql": statement, "format": wire})
            truncated = response.headers.get(result_formats.TRUNCATED_HEADER) == "true"
            body = response.read()
            if fmt == "table":
                return Answer(result_formats.to_text(pa.ipc.open_stream(body).read_all()), truncated)
            return Answer(body, truncated)
        with self._file() as analyst:
            try:
                result = analyst.run(statement)
            except QueryError as exc:
                raise ClientError(f"{exc.code}: {exc.message}") from None
        if fmt == "table":
            return Answer(result_formats.to_text(result.table), result.truncated)
        if fmt == "csv":
            return Answer(result_formats.to_csv(result.table), result.truncated)
        return Answer(result_formats.to_json(result.table, result.types, result.truncated), result.truncated)

    def export(self, dataset: str, since: datetime, until: datetime, directory: Path) -> int:
        """Write one dataset's rows in [since, until) under directory/dataset; returns the rows written."""
        export.check_export(dataset, since, until)
        if self.url is not None:
            query = urllib.parse.urlencode({"dataset": dataset, "since": since.isoformat(), "until": until.isoformat()})
            with self._request(f"/v1/export?{query}") as response:
                return export.write_partitioned(pa.ipc.open_stream(response), directory / dataset)
        with self._file() as analyst, analyst.export(dataset, since, until) as batches:
            return export.write_partitioned(batches, directory / dataset)

    @contextmanager
    def _file(self) -> Iterator[AnalystSQL]:
        if self.db is None:  # the ClickHouse backend
            with open_clickhouse_analyst(self.settings) as analyst:
                yield analyst
            return
        if not self.db.exists():
            raise ClientError(f"no database at {self.db}: pass --db PATH, or --url of a running service")
        with open_file_analyst(self.settings, self.db) as analyst:
            yield analyst

    def _request(self, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        # The scheme is http(s): checked in resolve, or built there from the settings.
        req = urllib.request.Request(f"{self.url}{path}", data=data, headers=headers)  # noqa: S310
        context = ssl.create_default_context() if self.url and self.url.startswith("https") else None
        try:
            return urllib.request.urlopen(req, timeout=self.settings.sql.timeout_seconds + 30, context=context)  # noqa: S310
        except urllib.error.HTTPError as err:
            raise ClientError(_error_text(err)) from None
        except urllib.error.URLError as err:
            raise ClientError(f"cannot reach {self.url}: {err.reason}") from None


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a name, not an address
        return False


def _error_text(err: urllib.error.HTTPError) -> str:
    try:
        error = json.loads(err.read())["error"]
        return f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {err.code} {err.reason}"
