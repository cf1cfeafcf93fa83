"""Every route of the API port, declared once: the router is built from this table (tailwatch/api.py,
tailwatch/console.py) and `GET /openapi.json` is rendered from it (tailwatch/openapi.py). A route's parameters,
their limits and their defaults are stated here and nowhere else.
"""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import CONTENT_TYPE_LATEST

from storage.export import DATASETS
from tailwatch.result_formats import ARROW_STREAM, FORMATS, TRUNCATED_HEADER
from tailwatch.routing import (
    NOW,
    Before,
    Flag,
    Instant,
    Json,
    PathPart,
    Route,
    Routes,
    RowLimit,
    Text,
    answer,
    ref,
    refusal,
)

OPENAPI_PATH = "/openapi.json"
# /v1/alerts, /v1/clusters and /v1/incidents answer at most this many rows, whatever `limit` asks.
ROWS_CAP = 10_000
# The console's charts: a day unless the URL says otherwise.
CONSOLE_RANGE = timedelta(hours=24)

_HTML = {"text/html": {"schema": {"type": "string"}}}
_ARROW = {ARROW_STREAM: {"schema": {"type": "string", "contentMediaType": ARROW_STREAM}}}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}
_TRUNCATED = {
    TRUNCATED_HEADER: {
        "description": "`true` when the statement had more rows than `sql.max_rows` and only those were sent.",
        "schema": {"type": "string", "enum": ["true", "false"]},
    }
}
_BAD_LIMIT = refusal("`limit` is not a whole number, 0 or more (`bad_request`).")
_BUSY = refusal("Every SQL slot stayed busy for the statement time limit (`busy`).", headers=_RETRY_AFTER)


def _rows_of(schema: str, key: str, description: str) -> Json:
    """`{key: [schema, ...]}`."""
    listing = {"type": "object", "required": [key], "properties": {key: {"type": "array", "items": ref(schema)}}}
    return answer(listing, description)


_CORE = [
    Route(
        "GET",
        OPENAPI_PATH,
        "openapi",
        "This document.",
        {"200": answer({"type": "object"}, "The OpenAPI 3.1 description of this API port.")},
        open=True,
    ),
    Route(
        "GET",
        "/healthz",
        "healthz",
        "Liveness: the event loop answers.",
        {"200": answer(ref("Status"), '`{"status": "ok"}`.')},
        open=True,
    ),
    Route(
        "GET",
        "/readyz",
        "readyz",
        "Readiness: started and taking traffic.",
        {
            "200": answer(ref("Status"), '`{"status": "ready"}`.'),
            "503": answer(ref("Status"), '`{"status": "not ready"}`.'),
        },
        open=True,
    ),
    Route(
        "GET",
        "/metrics",
        "metrics",
        "Prometheus metrics (docs/ingest.md, docs/detectors.md).",
        {
            "200": {
                "description": f"The Prometheus text exposition (`{CONTENT_TYPE_LATEST}`).",
                "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
            }
        },
    ),
    Route(
        "GET",
        "/v1/alerts",
        "alerts",
        "Alerts, newest first.",
        {"200": _rows_of("Alert", "alerts", "Alerts ordered by `updated_at` descending."), "400": _BAD_LIMIT},
        params=(
            Text("state", "Only alerts in this state.", enum=("firing", "resolved")),
            Text("detector", "Only this detector's alerts."),
            RowLimit(default=100, cap=ROWS_CAP),
        ),
    ),
    Route(
        "GET",
        "/v1/clusters",
        "clusters",
        "Clusters of bad requests, newest window first, best first.",
        {
            "200": _rows_of("Cluster", "clusters", "Clusters ordered by `window_end` descending, then `rank`."),
            "400": _BAD_LIMIT,
        },
        params=(Text("detector", "Only this detector's clusters."), RowLimit(default=50, cap=ROWS_CAP)),
    ),
    Route(
        "GET",
        "/v1/incidents",
        "incidents",
        "Incidents: each fault's alerts and clusters as one story, newest first.",
        {
            "200": _rows_of("Incident", "incidents", "Incidents ordered by `updated_at` descending."),
            "400": refusal("`limit` is not a whole number, 0 or more, or `since` is not ISO 8601 (`bad_request`)."),
        },
        params=(
            Text("state", "Only incidents in this state.", enum=("open", "resolved")),
            Instant("since", "Only incidents updated after this instant"),
            RowLimit(default=100, cap=ROWS_CAP),
        ),
    ),
    Route(
        "GET",
        "/v1/changes",
        "changes",
        "What changed in the fleet, found from its spans and engine metrics (docs/changes.md), newest first.",
        {
            "200": _rows_of("Change", "changes", "Changes ordered by `at` descending."),
            "400": refusal("`limit` is not a whole number, 0 or more, or `since` is not ISO 8601 (`bad_request`)."),
        },
        params=(Instant("since", "Only changes at or after this instant"), RowLimit(default=100, cap=ROWS_CAP)),
    ),
    Route(
        "GET",
        "/v1/compare",
        "compare",
        "Which values of every dimension one set of requests holds more of than another, with the evidence test "
        "clusters use (docs/changes.md#compare): an incident against the hour before it, a change's hour after "
        "against its hour before, or any two time ranges.",
        {
            "200": answer(ref("Comparison"), "The two sets and their differences, strongest first."),
            "400": refusal(
                "A time is not ISO 8601, a range is empty or reversed, or `limit` is not a whole number "
                "(`bad_request`)."
            ),
            "404": refusal("No incident or change has that id (`not_found`)."),
            "413": refusal("The two sets hold more than `storage.detection_memory_mb` (`too_large`)."),
        },
        params=(
            Text("incident", "Compare this incident's requests with the hour before it."),
            Text("change", "Compare the hour after this change with the hour before it."),
            Instant("since", "Start of the set in question (without `incident` or `change`)"),
            Instant("until", "Its end", default=NOW),
            Instant("baseline_since", "Start of the baseline; default as long before `since` as the set is long"),
            Instant("baseline_until", "End of the baseline; default `since`"),
            Text("deployment", "Only this deployment's requests."),
            RowLimit(default=50, cap=ROWS_CAP),
        ),
    ),
    Route(
        "POST",
        "/v1/detect",
        "detect",
        "Evaluate detectors now, or as of `at`, exactly as the scheduler would.",
        {
            "200": answer(ref("Detection"), "What each detector found."),
            "400": refusal("The body is not the expected JSON (`bad_request`) or names an `unknown_detector`."),
            "503": refusal("Detectors are not running (`unavailable`)."),
        },
        body={"required": False, "content": {"application/json": {"schema": ref("DetectRequest")}}},
    ),
]

_CONSOLE = [
    Route(
        "GET",
        "/",
        "console",
        "The console (docs/console.md): pages drawn in the browser from this API.",
        {"200": {"description": "The console's page.", "content": _HTML}},
        group="console",
        unauthorized={
            "description": "Without the token (header or cookie): the sign-in page, in place of the console.",
            "content": _HTML,
        },
    ),
    Route(
        "GET",
        "/console/{name}",
        "console_asset",
        "The console's scripts and style, by file name.",
        {"200": {"description": "The file."}, "404": {"description": "No such file."}},
        group="console",
        params=(PathPart("name"),),
    ),
    Route(
        "POST",
        "/login",
        "sign_in",
        "Trade the API token for the console's HttpOnly, same-site cookie.",
        {"204": {"description": "Signed in: the cookie is set (or no token is configured)."}},
        group="console",
        body={
            "required": True,
            "content": {
                "application/x-www-form-urlencoded": {
                    "schema": {"type": "object", "properties": {"token": {"type": "string"}}}
                }
            },
        },
        unauthorized=refusal("Not this service's token (`unauthorized`)."),
    ),
    Route(
        "GET",
        "/v1/figures/{detector}",
        "figures",
        "A detector's stored figures for the windows ending in (from, to].",
        {
            "200": answer(ref("Figures"), "The rows, oldest window first."),
            "400": refusal(
                "A malformed `from`, `to` or `limit`, `from` not before `to`, or a column the table does not "
                "have (`bad_request`)."
            ),
            "404": refusal("No detector table of that name (`unknown_detector`)."),
        },
        group="console",
        params=(
            PathPart("detector"),
            Instant("from", "Start of the range (exclusive), by `window_end`", default=Before("to", CONSOLE_RANGE)),
            Instant("to", "End of the range (inclusive)", default=NOW),
            RowLimit(default=200_000, cap=200_000),
            Text("columns", "Comma-separated columns to return, sorted by them in that order (default every one)."),
            Flag("distinct", "Each returned row once."),
        ),
        description="Any other query parameter names a column of the table and keeps the rows whose "
        "value (as text) equals it: `?grouping=model&deployment=vllm-a`.",
    ),
    Route(
        "GET",
        "/v1/status",
        "status",
        "Ingest and detector health: rates, rejects, the writer's queue and last commit, each "
        "detector's last pass and failures.",
        {"200": answer(ref("ServiceStatus"), "The service's health now.")},
        group="console",
    ),
    Route(
        "GET",
        "/v1/traces/{trace_id}",
        "trace",
        "One trace: spans, request rows, scores and its replicas' engine metrics around it.",
        {
            "200": answer(ref("Trace"), "Everything stored of the trace."),
            "400": refusal("Not 32 hex digits, or a malformed range (`bad_request`)."),
            "404": refusal("No span of that trace (in that range) (`not_found`)."),
        },
        group="console",
        params=(
            PathPart("trace_id"),
            Instant("from", "With `to`: only spans ending in [from, to), sparing a full scan."),
            Instant("to", "End of that range", default=NOW),
        ),
    ),
]

_SQL = [
    Route(
        "POST",
        "/v1/sql",
        "sql",
        "Run one read-only statement (docs/sql.md).",
        {
            "200": {
                "description": "The statement's rows.",
                "headers": _TRUNCATED,
                "content": {
                    FORMATS["json"]: {"schema": ref("SqlResult")},
                    FORMATS["csv"]: {"schema": {"type": "string"}},
                    **_ARROW,
                },
            },
            "400": refusal(
                "The statement cannot run: `bad_request`, `syntax_error`, `invalid_query`, `unknown_name`, "
                "`invalid_value`, `invalid_input`, `timeout`, `multiple_statements`, `empty_query`, "
                "`not_a_query`, `out_of_memory`, `query_failed`."
            ),
            "403": refusal("Not a reading statement (`read_only`), or it reads files or the network (`forbidden`)."),
            "406": refusal("The Accept header names none of the formats (`not_acceptable`)."),
            "500": refusal("The query failed inside the service (`internal`); its log has the details."),
            "503": _BUSY,
        },
        group="sql",
        description=(
            "Rows as JSON (default), CSV or an Arrow IPC stream, chosen by the body's `format` or else the "
            "Accept header. At most `sql.max_rows` rows; cancelled after `sql.timeout_seconds`."
        ),
        body={"required": True, "content": {"application/json": {"schema": ref("SqlRequest")}}},
    ),
    Route(
        "GET",
        "/v1/export",
        "export",
        "Every row of a dataset in [since, until) as one Arrow IPC stream, not capped.",
        {
            "200": {
                "description": "The rows; a stream that ends without its end-of-stream marker failed midway.",
                "content": _ARROW,
            },
            "400": refusal("A missing or malformed parameter, or an empty range (`bad_request`)."),
            "500": refusal("The export failed inside the service (`internal`)."),
            "503": _BUSY,
        },
        group="sql",
        params=(
            Text("dataset", "What to export.", enum=DATASETS, required=True),
            Instant("since", "Start of the range (inclusive), by `end_time`.", required=True),
            Instant("until", "End of the range (exclusive); after `since`.", required=True),
        ),
    ),
]

# The document lists them in this order.
ROUTES = Routes([*_CORE, *_CONSOLE, *_SQL])
