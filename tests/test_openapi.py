"""GET /openapi.json: the API port's OpenAPI 3.1 description is well formed, describes exactly the routes
the app serves (a route added without a description fails here), and matches what the server answers."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from conftest import RunningService, service_settings
from prometheus_client import CollectorRegistry

from storage.duckdb.alert_queries import DuckDBAlertQueries
from storage.duckdb.analyst import AnalystQueries
from storage.duckdb.console_reads import DuckDBConsoleQueries
from storage.duckdb.window_source import DuckDBWindowSource
from tailwatch import openapi
from tailwatch.api import OPEN_PATHS, api_app

METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
PATH_ITEM_FIELDS = METHODS | {"$ref", "summary", "description", "servers", "parameters"}
TOKEN = "s3cret"
VARIANTS = [(sql, token) for sql in (True, False) for token in (None, TOKEN)]
IDS = [f"{'sql' if sql else 'no-sql'}-{'token' if token else 'open'}" for sql, token in VARIANTS]


def served_routes(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route, less the HEAD routes aiohttp adds beside each GET."""
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }


def described_routes(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in doc["paths"].items() for method in item if method in METHODS}


def fetch(url: str, token: str | None = None) -> tuple[int, dict[str, str], Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


# --- api_app as built in every configuration -----------------------------------------------------------------


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect(":memory:")
    yield connection
    connection.close()


def build(con: duckdb.DuckDBPyConnection, sql: bool, token: str | None) -> web.Application:
    analyst = AnalystQueries(con, timeout_seconds=1, max_rows=5) if sql else None
    source = DuckDBWindowSource(con)
    alerts, console = DuckDBAlertQueries(source), DuckDBConsoleQueries(source)
    return api_app(CollectorRegistry(), lambda: True, alerts, analyst=analyst, console=console, token=token)


async def served_document(app: web.Application, token: str | None) -> tuple[dict[str, Any], set[tuple[str, str]]]:
    async with TestClient(TestServer(app)) as client:
        resp = await client.get(openapi.PATH)  # no token: the description is open
        assert resp.status == 200, await resp.text()
        assert resp.content_type == "application/json"
        doc = await resp.json()
        if token:
            assert (await client.get("/v1/alerts")).status == 401
        return doc, served_routes(app)


@pytest.mark.parametrize(("sql", "token"), VARIANTS, ids=IDS)
def test_the_document_describes_exactly_the_routes_the_app_serves(
    con: duckdb.DuckDBPyConnection, sql: bool, token: str | None
) -> None:
    doc, routes = asyncio.run(served_document(build(con, sql, token), token))
    assert ("GET", openapi.PATH) in routes
    undescribed, unserved = routes - described_routes(doc), described_routes(doc) - routes
    assert not undescribed, f"served but not in tailwatch/openapi.py: {sorted(undescribed)}"
    assert not unserved, f"described but not served: {sorted(unserved)}"


@pytest.mark.parametrize(("sql", "token"), VARIANTS, ids=IDS)
def test_auth_is_described_as_the_middleware_applies_it(sql: bool, token: str | None) -> None:
    doc = openapi.document(sql=sql, auth=token is not None, open_paths=OPEN_PATHS)
    operations = [(path, op) for path, item in doc["paths"].items() for op in item.values()]
    if token is None:
        assert "security" not in doc and "securitySchemes" not in doc["components"]
        assert all("security" not in op and "401" not in op["responses"] for _path, op in operations)
        return
    assert doc["security"] == [{"bearer": []}]
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "The configured `api.token`.",
    }
    assert {path for path, op in operations if op.get("security") == []} == OPEN_PATHS
    assert all("401" in op["responses"] for path, op in operations if path not in OPEN_PATHS)


# --- the document is OpenAPI 3.1 -------------------------------------------------------------------------------


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


@pytest.mark.parametrize(("sql", "token"), VARIANTS, ids=IDS)
def test_the_document_is_structurally_valid_openapi_3_1(sql: bool, token: str | None) -> None:
    """openapi-spec-validator is not a dependency: the rules a client generator relies on, checked here."""
    doc = json.loads(json.dumps(openapi.document(sql=sql, auth=token is not None, open_paths=OPEN_PATHS)))
    assert re.fullmatch(r"3\.1\.\d+", doc["openapi"])
    assert set(doc) <= {"openapi", "info", "jsonSchemaDialect", "servers", "paths", "webhooks", "components",
                        "security", "tags", "externalDocs"}  # fmt: skip
    assert isinstance(doc["info"]["title"], str) and isinstance(doc["info"]["version"], str)
    schemes = doc["components"].get("securitySchemes", {})
    for requirement in doc.get("security", []):
        assert set(requirement) <= set(schemes)
    operation_ids = []
    for path, item in doc["paths"].items():
        assert path.startswith("/"), path
        assert set(item) <= PATH_ITEM_FIELDS, path
        operations = {m: op for m, op in item.items() if m in METHODS}
        assert operations, f"{path} has no operation"
        for method, op in operations.items():
            where = f"{method.upper()} {path}"
            operation_ids.append(op["operationId"])
            assert op["responses"], where
            for status, response in op["responses"].items():
                assert re.fullmatch(r"[1-5](\d\d|XX)|default", status), (where, status)
                assert isinstance(response["description"], str), (where, status)
                for media in response.get("content", {}).values():
                    assert isinstance(media, dict), (where, status)
            for param in op.get("parameters", []):
                assert param["in"] in {"query", "header", "path", "cookie"}, where
                assert isinstance(param["name"], str) and "schema" in param, where
                assert param["in"] != "path" or param["required"] is True, where
            if "requestBody" in op:
                assert op["requestBody"]["content"], where
            for requirement in op.get("security", []):
                assert set(requirement) <= set(schemes), where
    assert len(operation_ids) == len(set(operation_ids)), "operationId must be unique"
    for ref in refs(doc):
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in doc["components"]["schemas"], ref


# --- a real service ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    db: Path = tmp_path_factory.mktemp("openapi") / "t.duckdb"
    with RunningService(service_settings(db, api={"token": TOKEN})) as svc:
        yield svc


JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
    "integer": int,
    "number": (int, float),
}


def conforms(value: Any, schema: dict[str, Any], doc: dict[str, Any], where: str = "$") -> None:
    """The subset of JSON Schema the document uses: $ref, type, enum, required, properties, items."""
    if "$ref" in schema:
        conforms(value, doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]], doc, where)
        return
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    # A bool is an int to Python, never a number to JSON Schema.
    matches = [isinstance(value, JSON_TYPES[k]) and (k == "boolean" or not isinstance(value, bool)) for k in kinds]
    assert not kinds or any(matches), (where, value, kinds)
    if "enum" in schema:
        assert value in schema["enum"], (where, value)
    if isinstance(value, dict):
        assert set(schema.get("required", [])) <= set(value), (where, sorted(value))
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                conforms(value[key], sub, doc, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            conforms(item, schema["items"], doc, f"{where}[{i}]")


def test_a_running_service_serves_the_document_without_its_token(guarded: RunningService) -> None:
    status, headers, body = fetch(f"{guarded.api_url}{openapi.PATH}")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    doc = json.loads(body)
    assert doc == json.loads(json.dumps(openapi.document(sql=True, auth=True, open_paths=OPEN_PATHS)))
    # The service's own app, as tailwatch.service wires it, serves what the document describes.
    app = guarded.service._api_runner.app if guarded.service._api_runner else None
    assert app is not None
    assert served_routes(app) == described_routes(doc)


def test_the_running_service_answers_as_described(guarded: RunningService) -> None:
    doc = json.loads(fetch(f"{guarded.api_url}{openapi.PATH}")[2])
    for path, item in doc["paths"].items():
        for method, op in item.items():
            req = urllib.request.Request(f"{guarded.api_url}{path}", method=method.upper())
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    status = resp.status
            except urllib.error.HTTPError as err:
                status = err.code
            if path in OPEN_PATHS:
                assert op["security"] == [] and status == 200, (method, path, status)
            else:
                assert status == 401 and "401" in op["responses"], (method, path, status)

    def check(method: str, path: str, status: int, body: bytes) -> None:
        response = doc["paths"][path.partition("?")[0]][method]["responses"][str(status)]
        conforms(
            json.loads(body),
            response["content"]["application/json"]["schema"],
            doc,
            f"{method.upper()} {path} {status}",
        )

    for path in ("/healthz", "/readyz", "/v1/alerts", "/v1/clusters", "/v1/alerts?limit=x", "/v1/export?dataset=x"):
        status, _headers, body = fetch(f"{guarded.api_url}{path}", TOKEN)
        check("get", path, status, body)
    status, _headers, body = fetch(f"{guarded.api_url}/v1/alerts")
    check("get", "/v1/alerts", status, body)  # the 401
    for path, payload in (("/v1/sql", {"sql": "SELECT 1 AS one"}), ("/v1/sql", {"sql": "SELEC 1"}), ("/v1/detect", {})):
        req = urllib.request.Request(
            f"{guarded.api_url}{path}",
            data=json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, body = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, body = err.code, err.read()
        check("post", path, status, body)
