"""The API port described as an OpenAPI 3.1 document, served at `GET /openapi.json`.

Rendered from the route table the router is built from (tailwatch/routes.py), with the shapes of the bodies
the handlers answer, and describing the server it is served by: the SQL routes only where they are
registered, the console's only where it is served, the bearer token only where one is configured.
tests/test_openapi.py fails when a route is served but not described, or described but not served.
"""

from __future__ import annotations

from collections.abc import Collection

from tailwatch import __version__
from tailwatch.result_formats import FORMATS
from tailwatch.routes import OPENAPI_PATH, ROUTES
from tailwatch.routing import TIME, Json, Routes, groups, refusal

PATH = OPENAPI_PATH

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}

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
            "window_start": TIME,
            "window_end": TIME,
            "started_at": TIME,
            "resolved_at": {**TIME, "type": ["string", "null"], "description": "null while firing."},
            "updated_at": TIME,
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
            "window_start": TIME,
            "window_end": TIME,
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
            "same_requests": {
                "type": ["array", "null"],
                "items": {"type": "object"},
                "description": "Clusters that are the same bad requests seen another way: signature and symptom.",
            },
        },
    },
    "Incident": {
        "type": "object",
        "description": "A row of the `incidents` table (docs/incidents.md).",
        "required": ["incident_id", "state", "started_at", "updated_at", "severity", "title", "summary"],
        "properties": {
            "incident_id": {"type": "string"},
            "state": {"type": "string", "enum": ["open", "resolved"]},
            "started_at": TIME,
            "updated_at": TIME,
            "resolved_at": {**TIME, "type": ["string", "null"], "description": "null while open."},
            "severity": {"type": "string", "enum": ["info", "warning", "critical"]},
            "title": {"type": "string", "description": "One line naming the cause."},
            "summary": {"type": "string"},
            "cause": {"type": "object", "description": "The signature and symptom of the strongest evidence."},
            "scope": {"type": "object", "description": "tenants, replicas, deployments and models touched."},
            "impact": {"type": "object", "description": "requests, bad_requests, tenants, replicas, slo_burn_rate."},
            "engine": {
                "type": "object",
                "description": "Its replicas' queue depth, KV-cache usage, preempted share and cache hit ratio in its "
                "first hour against the hour before (`during`, `before`), and the queue by replica.",
            },
            "alert_ids": {"type": "array", "items": {"type": "string"}},
            "cluster_ids": {"type": "array", "items": {"type": "string"}},
            "change_ids": {"type": "array", "items": {"type": "string"}},
            "suggested_fix": {"type": ["string", "null"]},
            "example_trace_ids": {"type": "array", "items": {"type": "string"}},
        },
    },
    "Change": {
        "type": "object",
        "description": "A row of the `changes` table (docs/changes.md).",
        "required": ["change_id", "at", "kind", "scope", "before", "after", "summary"],
        "properties": {
            "change_id": {"type": "string"},
            "at": {**TIME, "description": "When the new state was first seen."},
            "kind": {"type": "string", "enum": ["rollout", "version", "config", "scale"]},
            "scope": {
                "type": "object",
                "description": "deployment, model, replicas; added and removed (rollout, scale) or changed.",
            },
            "before": {"type": "object", "description": "The attributes that differ, as they were."},
            "after": {"type": "object", "description": "And as they became."},
            "summary": {"type": "string"},
            "found_at": {**TIME, "description": "The pass that first found it."},
        },
    },
    "Comparison": {
        "type": "object",
        "required": ["a", "b", "differences"],
        "properties": {
            "a": {"type": "object", "description": "The set in question: since, until, deployment, requests."},
            "b": {"type": "object", "description": "The baseline: since, until, deployment, requests."},
            "differences": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["dimension", "value", "a_count", "b_count", "p_value", "passes"],
                    "properties": {
                        "dimension": {"type": "string"},
                        "value": {"type": "string"},
                        "a_count": {"type": "integer"},
                        "b_count": {"type": "integer"},
                        "a_share": {"type": "number"},
                        "b_share": {"type": "number"},
                        "excess": {"type": "number", "description": "Requests of `a` beyond `b`'s share."},
                        "p_value": {"type": "number", "description": "The exact test's chance (docs/changes.md)."},
                        "passes": {"type": "boolean", "description": "Under the Bonferroni bar over every value."},
                    },
                },
            },
        },
    },
    "DetectRequest": {
        "type": "object",
        "properties": {
            "at": {**TIME, "description": "Evaluate as of this time (ISO 8601); default now."},
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
            "at": TIME,
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["detector", "window_start", "window_end", "outcome", "seconds", "error", "firing"],
                    "properties": {
                        "detector": {"type": "string"},
                        "window_start": TIME,
                        "window_end": TIME,
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
        "required": ["detector", "from", "to", "rows", "stride", "truncated"],
        "properties": {
            "detector": {"type": "string"},
            "from": TIME,
            "to": TIME,
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
            "stride": {
                "type": "integer",
                "minimum": 1,
                "description": "Past `limit`, every how many windows were kept, counting back from the newest (which "
                "is always in): the whole range at a coarser grain. 1: every window.",
            },
            "truncated": {
                "type": "boolean",
                "description": "`true` when rows of the range are missing: a stride above 1, or the oldest rows cut "
                "by `limit`.",
            },
        },
    },
    "ServiceStatus": {
        "type": "object",
        "required": ["now", "ready", "ingest", "detectors"],
        "properties": {
            "now": TIME,
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
                    "last_commit": {**TIME, "type": ["string", "null"]},
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
                        "last_run": {**TIME, "type": ["string", "null"]},
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


def document(
    *,
    sql: bool = True,
    auth: bool = False,
    open_paths: Collection[str] = (),
    console: bool = True,
    routes: Routes = ROUTES,
) -> Json:
    """The description of an API port with (or without) the SQL routes, the console and a bearer token; with a
    token, `open_paths` are those that answer without it."""
    served = routes.serving(groups(sql=sql, console=console))
    paths: dict[str, Json] = {}
    for route in served:
        paths.setdefault(route.path, {})[route.method.lower()] = route.operation()
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
        unauthorized = refusal(
            "No or a wrong `Authorization: Bearer` header (`unauthorized`).",
            headers={"WWW-Authenticate": {"schema": {"type": "string"}, "description": 'Bearer realm="tailwatch"'}},
        )
        for route in served:
            operation = paths[route.path][route.method.lower()]
            if route.path in open_paths:
                operation["security"] = []
            else:
                operation["responses"]["401"] = route.unauthorized or unauthorized
    return doc
