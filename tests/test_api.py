"""The API port: health, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from builders import request, span
from conftest import RunningService, service_settings
from prometheus_client import CollectorRegistry
from test_otlp_http import post

from collector.decode import DEFAULT_DECODER
from storage.duckdb.alert_queries import DuckDBAlertQueries
from storage.duckdb.analyst import AnalystQueries
from storage.duckdb.console_reads import DuckDBConsoleQueries
from storage.duckdb.window_source import DuckDBWindowSource
from tailwatch import openapi
from tailwatch.api import api_app
from tailwatch.routes import ROUTES
from tailwatch.routing import Routes, RowLimit


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


def test_healthz_and_readyz_answer_when_started(service: RunningService) -> None:
    assert get(f"{service.api_url}/healthz")[0] == 200
    decoder = DEFAULT_DECODER.value
    status, body = get(f"{service.api_url}/readyz")
    assert (status, json.loads(body)) == (200, {"status": "ready", "decoder": decoder, "decoder_processes": "0"})
    metrics = get(f"{service.api_url}/metrics")[1]
    assert f'tailwatch_trace_decoder_info{{decoder="{decoder}"}} 1.0' in metrics
    assert "tailwatch_decoder_processes 0.0" in metrics


def test_the_python_decoder_serves_when_chosen_in_two_processes_by_default(db_path: Path) -> None:
    # The Python walk holds the GIL: by default it gets processes, where the compiled one gets threads.
    settings = service_settings(db_path, ingest={"decoder": "python", "decode_workers": "auto"})
    with RunningService(settings) as running:
        assert '"decoder": "python", "decoder_processes": "2"' in get(f"{running.api_url}/readyz")[1]
        body = request([span(attributes={"gen_ai.usage.input_tokens": 5})]).SerializeToString()
        assert post(f"{running.http_url}/v1/traces", body, "application/x-protobuf")[0] == 200
        metrics = get(f"{running.api_url}/metrics")[1]
        assert 'tailwatch_trace_decoder_info{decoder="python"} 1.0' in metrics
        assert "tailwatch_decoder_processes 2.0" in metrics


def test_metrics_count_received_stored_and_rejected_spans(service: RunningService) -> None:
    body = request([span(), span(), span(span_id=bytes(8))]).SerializeToString()
    assert post(f"{service.http_url}/v1/traces", body, "application/x-protobuf")[0] == 200
    status, text = get(f"{service.api_url}/metrics")
    assert status == 200
    assert 'tailwatch_spans_received_total{transport="http"} 3.0' in text
    assert "tailwatch_spans_stored_total 2.0" in text
    assert 'tailwatch_spans_rejected_total{reason="invalid_span_id"} 1.0' in text
    assert 'tailwatch_export_requests_total{outcome="ok",signal="traces",transport="http"} 1.0' in text


# --- limits and defaults, declared once in tailwatch/routes.py -------------------------------------------------

WINDOW_END = datetime(2026, 11, 20, 12, 0)
DAY = "from=2026-11-20T00:00:00Z&to=2026-11-21T00:00:00Z"
# Where each route with a row limit lists its rows, and the path that reads them.
ROW_LIMITED = {
    "alerts": ("/v1/alerts", "alerts"),
    "clusters": ("/v1/clusters", "clusters"),
    "figures": (f"/v1/figures/token_latency?{DAY}", "rows"),
}


def seed_five_alerts_clusters_and_figures(con: duckdb.DuckDBPyConnection, ends: list[datetime]) -> None:
    for i, end in enumerate(ends):
        start = end - timedelta(minutes=5)
        con.execute(
            "INSERT INTO alerts (alert_id, detector, fingerprint, severity, state, labels, summary, window_start, "
            "window_end, started_at, updated_at) VALUES (?, 'token_latency', ?, 'warning', 'firing', '{}', 'x', "
            "?, ?, ?, ?)",
            [f"a{i}", f"f{i}", start, end, end, end],
        )
        con.execute(
            "INSERT INTO clusters (cluster_id, detector, window_start, window_end, evaluated_at, signature, size, "
            "support, risk_ratio, score, summary, suggested_fix, example_trace_ids, rank) VALUES "
            "(?, 'token_latency', ?, ?, ?, '{}', 1, 0.5, 2.0, 1.0, 'x', 'y', [], 1)",
            [f"c{i}", start, end, end],
        )
        con.execute(
            'INSERT INTO token_latency (window_start, window_end, evaluated_at, "grouping", n, breached) '
            "VALUES (?, ?, ?, 'model', 100, false)",
            [start, end, end],
        )


def with_limit(operation_id: str, limit: RowLimit) -> Routes:
    """The route table with one route's row limit replaced."""
    route = ROUTES[operation_id]
    changed = dataclasses.replace(route, params=tuple(limit if p.name == "limit" else p for p in route.params))
    return Routes(changed if r.operation_id == operation_id else r for r in ROUTES)


async def answers(app: web.Application, paths: list[str]) -> list[tuple[int, Any]]:
    async with TestClient(TestServer(app)) as client:
        out = []
        for path in paths:
            resp = await client.get(path)
            text = await resp.text()
            out.append((resp.status, json.loads(text) if resp.content_type == "application/json" else text))
        return out


def console_app(con: duckdb.DuckDBPyConnection, routes: Routes = ROUTES) -> web.Application:
    source = DuckDBWindowSource(con)
    return api_app(
        CollectorRegistry(), lambda: True, DuckDBAlertQueries(source), console=DuckDBConsoleQueries(source),
        routes=routes,
    )  # fmt: skip


@pytest.mark.parametrize("operation_id", list(ROW_LIMITED))
def test_a_row_limit_changed_in_the_route_table_is_the_one_the_router_applies_and_the_document_states(
    con: duckdb.DuckDBPyConnection, operation_id: str
) -> None:
    seed_five_alerts_clusters_and_figures(con, [WINDOW_END - timedelta(minutes=5 * i) for i in range(5)])
    path, key = ROW_LIMITED[operation_id]
    sep = "&" if "?" in path else "?"
    app = console_app(con, with_limit(operation_id, RowLimit(default=2, cap=3)))
    paths = [path, f"{path}{sep}limit=1", f"{path}{sep}limit=50", f"{path}{sep}limit=-1", openapi.PATH]
    default, one, capped, negative, (_, doc) = asyncio.run(answers(app, paths))
    # Five rows stored: the default is 2, 1 asked is 1, 50 asked is the cap, 3.
    assert [(status, len(body[key])) for status, body in (default, one, capped)] == [(200, 2), (200, 1), (200, 3)]
    assert negative == (
        400,
        {"error": {"code": "bad_request", "message": "limit must be a whole number, 0 or more (got '-1')"}},
    )
    [operation] = [op for item in doc["paths"].values() for op in item.values() if op["operationId"] == operation_id]
    assert [p for p in operation["parameters"] if p["name"] == "limit"] == [
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": "Rows to return; more than 3 is taken as 3.",
            "schema": {"type": "integer", "minimum": 0, "default": 2},
        }
    ]


def test_a_negative_alert_or_cluster_limit_is_refused_as_a_bad_request_not_a_server_error(
    con: duckdb.DuckDBPyConnection,
) -> None:
    # The store would be asked for LIMIT -1, which DuckDB refuses: a 500 without the error body.
    got = asyncio.run(answers(console_app(con), ["/v1/alerts?limit=-1", "/v1/clusters?limit=-7"]))
    assert got == [
        (400, {"error": {"code": "bad_request", "message": f"limit must be a whole number, 0 or more (got '{n}')"}})
        for n in ("-1", "-7")
    ]


def test_figures_without_a_range_cover_the_day_before_now_as_the_document_says(
    con: duckdb.DuckDBPyConnection,
) -> None:
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    # An hour either side of the day's edge, so the test holds however long it takes to run.
    seed_five_alerts_clusters_and_figures(con, [now - timedelta(hours=23), now - timedelta(hours=25)])
    [(status, body), (_, doc)] = asyncio.run(answers(console_app(con), ["/v1/figures/token_latency", openapi.PATH]))
    assert status == 200
    assert [r["window_end"] for r in body["rows"]] == [f"{now - timedelta(hours=23):%Y-%m-%dT%H:%M:%S}Z"]
    params = {p["name"]: p.get("description") for p in doc["paths"]["/v1/figures/{detector}"]["get"]["parameters"]}
    assert params["from"] == "Start of the range (exclusive), by `window_end`; default 24 hours before `to`."
    assert params["to"] == "End of the range (inclusive); default now."


def test_an_instant_is_read_as_utc_whatever_its_offset_and_a_missing_or_malformed_one_is_a_bad_request(
    con: duckdb.DuckDBPyConnection,
) -> None:
    seed_five_alerts_clusters_and_figures(con, [WINDOW_END - timedelta(minutes=5 * i) for i in range(5)])
    source = DuckDBWindowSource(con)
    app = api_app(
        CollectorRegistry(), lambda: True, DuckDBAlertQueries(source), console=DuckDBConsoleQueries(source),
        analyst=AnalystQueries(con, timeout_seconds=30, max_rows=100),
    )  # fmt: skip
    figures = "/v1/figures/token_latency?from={}&to={}"
    got = asyncio.run(
        answers(
            app,
            [
                # 13:47 and 13:57 at +02:00 are 11:47 and 11:57 UTC; an instant without an offset is UTC already.
                figures.format("2026-11-20T13:47:00%2B02:00", "2026-11-20T13:57:00%2B02:00"),
                figures.format("2026-11-20T11:47:00", "2026-11-20T11:57:00Z"),
                "/v1/export?dataset=spans&until=2026-11-21T00:00:00Z",
                figures.format("yesterday", "2026-11-20T11:57:00Z"),
            ],
        )
    )
    ends = ["2026-11-20T11:50:00Z", "2026-11-20T11:55:00Z"]  # the windows ending in (11:47, 11:57]
    assert [(status, [r["window_end"] for r in body["rows"]]) for status, body in got[:2]] == [(200, ends)] * 2
    assert got[2:] == [
        (400, {"error": {"code": "bad_request", "message": "since is required (ISO 8601, e.g. 2026-11-20T00:00:00Z)"}}),
        (400, {"error": {"code": "bad_request", "message": "from must be ISO 8601 (got 'yesterday')"}}),
    ]
