"""The API port described as an OpenAPI 3.1 document, served at `GET /openapi.json`.

Built here rather than kept as a JSON file so it names the same constants the handlers use (formats,
datasets, the truncation header, the open paths) and describes the server it is served by: the SQL
routes only where they are registered, the bearer token only where one is configured.
tests/test_openapi.py fails when a route is served but not described, or described but not served.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from storage.export import DATASETS
from tailwatch import __version__
from tailwatch.results import ARROW_STREAM, FORMATS, TRUNCATED_HEADER

Json = dict[str, Any]

PATH = "/openapi.json"
LIMIT_CAP = 10_000  # /v1/alerts and /v1/clusters answer at most this many rows, whatever `limit` asks


def _ref(name: str) -> Json:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: Json, description: str, **extra: Any) -> Json:
    return {"description": description, "content": {"application/json": {"schema": schema}}, **extra}


def _error(description: str, **extra: Any) -> Json:
    return _json(_ref("Error"), description, **extra)


def _query(name: str, schema: Json, description: str, *, required: bool = False) -> Json:
    return {"name": name, "in": "query", "required": required, "description": description, "schema": schema}


def _limit(default: int) -> Json:
    return _query(
        "limit",
        {"type": "integer", "minimum": 0, "default": default},
        f"Rows to return; more than {LIMIT_CAP:,} is taken as {LIMIT_CAP:,}.",
    )


_TIME = {"type": "string", "format": "date-time", "description": "ISO 8601 in UTC, with `Z`."}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}
_TRUNCATED = {
    TRUNCATED_HEADER: {
        "description": "`true` when the statement had more rows than `sql.max_rows` and only those were sent.",
        "schema": {"type": "string", "enum": ["true", "false"]},
    }
}

SCHEMAS: Json = {
    "Error": {
        "type": "object",
        "description": "Every error the API answers itself: a stable `code` and a message for people.",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "examples": ["bad_request", "syntax_error", "unauthorized"]},
                    "message": {"type": "string"},
                },
            }
        },
    },
    "Status": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "enum": ["ok", "ready", "not ready"]}},
    },
    "Alert": {
        "type": "object",
        "description": "A row of the `alerts` table (docs/sql.md#alerts).",
        "required": ["alert_id", "detector", "fingerprint", "severity", "state", "labels", "summary"],
        "properties": {
            "alert_id": {"type": "string"},
            "detector": {"type": "string"},
            "fingerprint": {"type": "string"},
            "severity": {"type": "string", "enum": ["info", "warning", "critical"]},
            "state": {"type": "string", "enum": ["firing", "resolved"]},
            "labels": _LABELS,
            "summary": {"type": "string"},
            "value": {"type": ["number", "null"]},
            "threshold": {"type": ["number", "null"]},
            "window_start": _TIME,
            "window_end": _TIME,
            "started_at": _TIME,
            "resolved_at": {**_TIME, "type": ["string", "null"], "description": "null while firing."},
            "updated_at": _TIME,
            "explanation": {
                "type": ["string", "null"],
                "description": "For an alert naming a group: the cluster that explains it, or why none passed.",
            },
        },
    },
    "Cluster": {
        "type": "object",
        "description": "A row of the `clusters` table without `evaluated_at` (docs/sql.md#clusters).",
        "required": ["cluster_id", "detector", "window_start", "window_end", "signature", "rank"],
        "properties": {
            "cluster_id": {"type": "string"},
            "detector": {"type": "string"},
            "window_start": _TIME,
            "window_end": _TIME,
            "signature": {**_LABELS, "description": "One or two dimension → value entries."},
            "size": {"type": "integer"},
            "support": {"type": "number"},
            "risk_ratio": {"type": "number"},
            "score": {"type": "number"},
            "summary": {"type": "string"},
            "suggested_fix": {"type": ["string", "null"]},
            "example_trace_ids": {"type": "array", "items": {"type": "string"}},
            "rank": {"type": "integer", "description": "1 = the most bad requests beyond chance in its window."},
            "bad_reason": {"type": ["string", "null"]},
            "symptom": {"type": ["string", "null"], "description": "error, tpot_tail, latency_tail or score:<name>."},
            "p_value": {"type": ["number", "null"], "description": "The exact test's chance (docs/sql.md#clusters)."},
            "excess": {"type": ["number", "null"], "description": "Bad requests beyond chance."},
            "candidates": {"type": ["integer", "null"], "description": "Candidates tried in the window."},
        },
    },
    "DetectRequest": {
        "type": "object",
        "properties": {
            "at": {**_TIME, "description": "Evaluate as of this time (ISO 8601); default now."},
            "detectors": {
                "type": ["array", "null"],
                "items": {"type": "string"},
                "description": "Detector keys to run; default every enabled detector.",
            },
        },
    },
    "Detection": {
        "type": "object",
        "required": ["at", "results"],
        "properties": {
            "at": _TIME,
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["detector", "window_start", "window_end", "outcome", "seconds", "error", "firing"],
                    "properties": {
                        "detector": {"type": "string"},
                        "window_start": _TIME,
                        "window_end": _TIME,
                        "outcome": {"type": "string", "enum": ["ok", "error", "too_large"]},
                        "seconds": {"type": "number"},
                        "error": {"type": ["string", "null"]},
                        "firing": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["labels", "severity", "summary"],
                                "properties": {
                                    "labels": _LABELS,
                                    "severity": {"type": "string"},
                                    "summary": {"type": "string"},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "Figures": {
        "type": "object",
        "required": ["detector", "from", "to", "rows", "truncated"],
        "properties": {
            "detector": {"type": "string"},
            "from": _TIME,
            "to": _TIME,
            "config": {
                "type": ["object", "null"],
                "description": "The detector's configuration as it runs (thresholds, window); null for a table that "
                "is not a detector's own.",
            },
            "rows": {
                "type": "array",
                "items": {"type": "object"},
                "description": "Rows of the detector's table (docs/detectors.md) without `evaluated_at`, oldest first.",
            },
            "truncated": {"type": "boolean", "description": "`true` when `limit` cut the rows."},
        },
    },
    "ServiceStatus": {
        "type": "object",
        "required": ["now", "ready", "ingest", "detectors"],
        "properties": {
            "now": _TIME,
            "ready": {"type": "boolean"},
            "ingest": {
                "type": "object",
                "description": "Rates over the last minute (null until two samples, 5 s apart, exist); counts "
                "since start; `rejected` and `refused` by reason, only where non-zero.",
                "properties": {
                    "received_per_second": {"type": ["number", "null"]},
                    "stored_per_second": {"type": ["number", "null"]},
                    "received": {"type": "object", "additionalProperties": {"type": "number"}},
                    "stored": {"type": ["number", "null"]},
                    "rejected": {"type": "object", "additionalProperties": {"type": "number"}},
                    "refused": {"type": "object", "additionalProperties": {"type": "number"}},
                    "queued": {"type": ["number", "null"]},
                    "last_commit": {**_TIME, "type": ["string", "null"]},
                    "commit_failures": {"type": ["number", "null"]},
                },
            },
            "detectors": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["detector", "runs_24h"],
                    "properties": {
                        "detector": {"type": "string"},
                        "interval_seconds": {"type": ["integer", "null"]},
                        "last_run": {**_TIME, "type": ["string", "null"]},
                        "last_outcome": {"type": ["string", "null"], "enum": ["ok", "error", "too_large", None]},
                        "last_seconds": {"type": ["number", "null"]},
                        "last_error": {"type": ["string", "null"]},
                        "failures_24h": {"type": "integer"},
                        "runs_24h": {"type": "integer"},
                    },
                },
            },
        },
    },
    "Trace": {
        "type": "object",
        "required": ["trace_id", "spans"],
        "properties": {
            "trace_id": {"type": "string"},
            "spans": {"type": "array", "items": {"type": "object"}, "description": "`spans` rows, start order."},
            "requests": {"type": "array", "items": {"type": "object"}, "description": "Its `llm_requests` rows."},
            "scores": {"type": "array", "items": {"type": "object"}, "description": "Its `span_scores` rows."},
            "engine": {
                "type": "array",
                "items": {"type": "object"},
                "description": "`engine_metrics` points of its replicas from a minute before it to a minute after.",
            },
        },
    },
    "SqlRequest": {
        "type": "object",
        "required": ["sql"],
        "properties": {
            "sql": {"type": "string", "description": "One reading statement (SELECT, WITH, DESCRIBE, EXPLAIN, ...)."},
            "params": {
                "type": ["array", "object", "null"],
                "description": "Values for `?` placeholders (a list) or `$name` ones (an object).",
            },
            "format": {
                "type": "string",
                "enum": list(FORMATS),
                "description": "Overrides the Accept header.",
            },
        },
    },
    "SqlResult": {
        "type": "object",
        "required": ["columns", "rows", "truncated"],
        "properties": {
            "columns": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name", "type"],
                    "properties": {
                        "name": {"type": "string"},
                        "type": {"type": "string", "description": "The DuckDB type, e.g. BIGINT, TIMESTAMP."},
                    },
                },
            },
            "rows": {"type": "array", "items": {"type": "array"}, "description": "One array per row, in column order."},
            "truncated": {"type": "boolean"},
        },
    },
}


def _paths(sql: bool, console: bool) -> dict[str, Json]:
    bad_limit = _error("`limit` is not an integer (`bad_request`).")
    paths: dict[str, Json] = {
        PATH: {
            "get": {
                "operationId": "openapi",
                "summary": "This document.",
                "responses": {"200": _json({"type": "object"}, "The OpenAPI 3.1 description of this API port.")},
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness: the event loop answers.",
                "responses": {"200": _json(_ref("Status"), '`{"status": "ok"}`.')},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: started and taking traffic.",
                "responses": {
                    "200": _json(_ref("Status"), '`{"status": "ready"}`.'),
                    "503": _json(_ref("Status"), '`{"status": "not ready"}`.'),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (docs/ingest.md, docs/detectors.md).",
                "responses": {
                    "200": {
                        "description": f"The Prometheus text exposition (`{CONTENT_TYPE_LATEST}`).",
                        "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/v1/alerts": {
            "get": {
                "operationId": "alerts",
                "summary": "Alerts, newest first.",
                "parameters": [
                    _query("state", {"type": "string", "enum": ["firing", "resolved"]}, "Only alerts in this state."),
                    _query("detector", {"type": "string"}, "Only this detector's alerts."),
                    _limit(100),
                ],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["alerts"],
                            "properties": {"alerts": {"type": "array", "items": _ref("Alert")}},
                        },
                        "Alerts ordered by `updated_at` descending.",
                    ),
                    "400": bad_limit,
                },
            }
        },
        "/v1/clusters": {
            "get": {
                "operationId": "clusters",
                "summary": "Clusters of bad requests, newest window first, best first.",
                "parameters": [_query("detector", {"type": "string"}, "Only this detector's clusters."), _limit(50)],
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["clusters"],
                            "properties": {"clusters": {"type": "array", "items": _ref("Cluster")}},
                        },
                        "Clusters ordered by `window_end` descending, then `rank`.",
                    ),
                    "400": bad_limit,
                },
            }
        },
        "/v1/detect": {
            "post": {
                "operationId": "detect",
                "summary": "Evaluate detectors now, or as of `at`, exactly as the scheduler would.",
                "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("DetectRequest")}}},
                "responses": {
                    "200": _json(_ref("Detection"), "What each detector found."),
                    "400": _error("The body is not the expected JSON (`bad_request`) or names an `unknown_detector`."),
                    "503": _error("Detectors are not running (`unavailable`)."),
                },
            }
        },
    }
    if console:
        paths.update(_console_paths())
    if sql:
        busy = _error("Every SQL slot stayed busy for the statement time limit (`busy`).", headers=_RETRY_AFTER)
        arrow = {ARROW_STREAM: {"schema": {"type": "string", "contentMediaType": ARROW_STREAM}}}
        paths["/v1/sql"] = {
            "post": {
                "operationId": "sql",
                "summary": "Run one read-only statement (docs/sql.md).",
                "description": (
                    "Rows as JSON (default), CSV or an Arrow IPC stream, chosen by the body's `format` or else the "
                    "Accept header. At most `sql.max_rows` rows; cancelled after `sql.timeout_seconds`."
                ),
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("SqlRequest")}}},
                "responses": {
                    "200": {
                        "description": "The statement's rows.",
                        "headers": _TRUNCATED,
                        "content": {
                            FORMATS["json"]: {"schema": _ref("SqlResult")},
                            FORMATS["csv"]: {"schema": {"type": "string"}},
                            **arrow,
                        },
                    },
                    "400": _error(
                        "The statement cannot run: `bad_request`, `syntax_error`, `invalid_query`, `unknown_name`, "
                        "`invalid_value`, `invalid_input`, `timeout`, `multiple_statements`, `empty_query`, "
                        "`not_a_query`, `out_of_memory`, `query_failed`."
                    ),
                    "403": _error(
                        "Not a reading statement (`read_only`), or it reads files or the network (`forbidden`)."
                    ),
                    "406": _error("The Accept header names none of the formats (`not_acceptable`)."),
                    "500": _error("The query failed inside the service (`internal`); its log has the details."),
                    "503": busy,
                },
            }
        }
        paths["/v1/export"] = {
            "get": {
                "operationId": "export",
                "summary": "Every row of a dataset in [since, until) as one Arrow IPC stream, not capped.",
                "parameters": [
                    _query("dataset", {"type": "string", "enum": list(DATASETS)}, "What to export.", required=True),
                    _query("since", _TIME, "Start of the range (inclusive), by `end_time`.", required=True),
                    _query("until", _TIME, "End of the range (exclusive); after `since`.", required=True),
                ],
                "responses": {
                    "200": {
                        "description": "The rows; a stream that ends without its end-of-stream marker failed midway.",
                        "content": arrow,
                    },
                    "400": _error("A missing or malformed parameter, or an empty range (`bad_request`)."),
                    "500": _error("The export failed inside the service (`internal`)."),
                    "503": busy,
                },
            }
        }
    return paths


def _console_paths() -> dict[str, Json]:
    html = {"text/html": {"schema": {"type": "string"}}}
    range_ = [
        _query("from", _TIME, "Start of the range (exclusive), by `window_end`; default 24 hours before `to`."),
        _query("to", _TIME, "End of the range (inclusive); default now."),
    ]
    return {
        "/": {
            "get": {
                "operationId": "console",
                "summary": "The console (docs/console.md): pages drawn in the browser from this API.",
                "responses": {"200": {"description": "The console's page.", "content": html}},
            }
        },
        "/console/{name}": {
            "get": {
                "operationId": "console_asset",
                "summary": "The console's scripts and style, by file name.",
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "The file."}, "404": {"description": "No such file."}},
            }
        },
        "/login": {
            "post": {
                "operationId": "sign_in",
                "summary": "Trade the API token for the console's HttpOnly, same-site cookie.",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/x-www-form-urlencoded": {
                            "schema": {"type": "object", "properties": {"token": {"type": "string"}}}
                        }
                    },
                },
                "responses": {"204": {"description": "Signed in: the cookie is set (or no token is configured)."}},
            }
        },
        "/v1/figures/{detector}": {
            "get": {
                "operationId": "figures",
                "summary": "A detector's stored figures for the windows ending in (from, to].",
                "parameters": [
                    {"name": "detector", "in": "path", "required": True, "schema": {"type": "string"}},
                    *range_,
                    _query("limit", {"type": "integer", "minimum": 0, "default": 200_000}, "At most 200,000 rows."),
                    _query(
                        "columns",
                        {"type": "string"},
                        "Comma-separated columns to return, sorted by them in that order (default every one).",
                    ),
                    _query("distinct", {"type": "boolean", "default": False}, "Each returned row once."),
                ],
                "description": "Any other query parameter names a column of the table and keeps the rows whose "
                "value (as text) equals it: `?grouping=model&deployment=vllm-a`.",
                "responses": {
                    "200": _json(_ref("Figures"), "The rows, oldest window first."),
                    "400": _error(
                        "A malformed `from`, `to` or `limit`, `from` not before `to`, or a column the table does not "
                        "have (`bad_request`)."
                    ),
                    "404": _error("No detector table of that name (`unknown_detector`)."),
                },
            }
        },
        "/v1/status": {
            "get": {
                "operationId": "status",
                "summary": "Ingest and detector health: rates, rejects, the writer's queue and last commit, each "
                "detector's last pass and failures.",
                "responses": {"200": _json(_ref("ServiceStatus"), "The service's health now.")},
            }
        },
        "/v1/traces/{trace_id}": {
            "get": {
                "operationId": "trace",
                "summary": "One trace: spans, request rows, scores and its replicas' engine metrics around it.",
                "parameters": [
                    {"name": "trace_id", "in": "path", "required": True, "schema": {"type": "string"}},
                    _query("from", _TIME, "With `to`: only spans ending in [from, to), sparing a full scan."),
                    _query("to", _TIME, "End of that range; default now."),
                ],
                "responses": {
                    "200": _json(_ref("Trace"), "Everything stored of the trace."),
                    "400": _error("Not 32 hex digits, or a malformed range (`bad_request`)."),
                    "404": _error("No span of that trace (in that range) (`not_found`)."),
                },
            }
        },
    }


def document(*, sql: bool = True, auth: bool = False, open_paths: Collection[str] = (), console: bool = True) -> Json:
    """The description of an API port with (or without) the SQL routes, the console and a bearer token; with a
    token, `open_paths` are those that answer without it."""
    paths = _paths(sql, console)
    components: Json = {"schemas": SCHEMAS}
    doc: Json = {
        "openapi": "3.1.0",
        "info": {
            "title": "Tailwatch API",
            "version": __version__,
            "description": "Analyst SQL, exports, alerts, clusters, detector figures, the console, Prometheus "
            "metrics and health (port 4319).",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "paths": paths,
        "components": components,
    }
    if auth:
        components["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "The configured `api.token`."}
        }
        doc["security"] = [{"bearer": []}]
        unauthorized = _error(
            "No or a wrong `Authorization: Bearer` header (`unauthorized`).",
            headers={"WWW-Authenticate": {"schema": {"type": "string"}, "description": 'Bearer realm="tailwatch"'}},
        )
        for path, item in paths.items():
            for operation in item.values():
                if path in open_paths:
                    operation["security"] = []
                else:
                    operation["responses"]["401"] = unauthorized
    if auth and console:
        paths["/"]["get"]["responses"]["401"] = {
            "description": "Without the token (header or cookie): the sign-in page, in place of the console.",
            "content": {"text/html": {"schema": {"type": "string"}}},
        }
        paths["/login"]["post"]["responses"]["401"] = _error("Not this service's token (`unauthorized`).")
    return doc
