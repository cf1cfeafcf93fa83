"""The Tailwatch API port: analyst SQL, exports, alerts, clusters, Prometheus metrics and health endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, disable_created_metrics, generate_latest

from detectors.compare import Comparing, Sets
from detectors.detection import DetectionPass
from model.thread_names import name_this_thread
from storage import export
from storage.ports import (
    AlertQueries,
    AnalystSQL,
    Change,
    ChangeStore,
    ConsoleQueries,
    FrameTooLarge,
    Incident,
    IncidentStore,
    QueryError,
    Window,
)
from tailwatch import console as console_pages
from tailwatch import openapi, result_formats
from tailwatch.error_body import error as _error
from tailwatch.routes import ROUTES
from tailwatch.routing import Args, Handler, Routes, groups

log = logging.getLogger("tailwatch.api")
# Probes must answer without credentials: an orchestrator has none. The API's description holds no data and
# is what a client reads before it has a token. tailwatch/routes.py marks them `open`.
OPEN_PATHS = ROUTES.open_paths()
ANALYST_NICE = 10
# The clusters columns stored as JSON text, served as JSON.
_JSON_COLUMNS = ("signature", "same_requests")

# The *_created series double the exposition for no use on a long-running service.
disable_created_metrics()  # type: ignore[no-untyped-call]


def _json_value(value: Any) -> Any:
    return value.isoformat() + "Z" if isinstance(value, datetime) else value


def _sets(args: Args, incidents: IncidentStore, changes: ChangeStore) -> Sets:
    """What `GET /v1/compare` compares: an incident's, a change's, or the two ranges given."""
    now = datetime.now(UTC).replace(tzinfo=None)
    if args["incident"] is not None:
        incident = incidents.incident(args["incident"])
        if incident is None:
            raise QueryError("not_found", f"no incident {args['incident']!r}")
        sets = Sets.of_incident(incident, now)
    elif args["change"] is not None:
        change = changes.change(args["change"])
        if change is None:
            raise QueryError("not_found", f"no change {args['change']!r}")
        sets = Sets.of_change(change, now)
    else:
        since, until = args["since"], args["until"]
        if since is None or since >= until:
            raise QueryError("bad_request", "give incident, change, or since before until (ISO 8601)")
        b_until = args["baseline_until"] or since
        b_since = args["baseline_since"] or b_until - (until - since)
        if b_since >= b_until:
            raise QueryError("bad_request", "baseline_since must be before baseline_until")
        sets = Sets(Window(since, until), Window(b_since, b_until))
    return sets if args["deployment"] is None else replace(sets, deployment=args["deployment"])


def api_app(
    registry: CollectorRegistry,
    is_ready: Callable[[], bool],
    alert_queries: AlertQueries,
    detection: DetectionPass | None = None,
    *,
    analyst: AnalystSQL | None = None,
    console: ConsoleQueries | None = None,
    incidents: IncidentStore | None = None,
    changes: ChangeStore | None = None,
    comparing: Comparing | None = None,
    token: str | None = None,
    sql_slots: int = 2,
    tls: bool = False,
    facts: Mapping[str, str] | None = None,
    routes: Routes = ROUTES,
) -> web.Application:
    """The API port's app: every route of `routes` whose part of the service is given, each bound to its
    declaration, and the document that describes them."""
    sql = _SqlHandlers(analyst, sql_slots) if analyst is not None else None

    async def metrics(_: web.Request, __: Args) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request, __: Args) -> web.Response:
        # Alive: the event loop answers. Whether it should take traffic is /readyz.
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request, __: Args) -> web.Response:
        # `facts` (e.g. the trace decoder in use) ride along, so a probe's log tells what is serving.
        if is_ready():
            return web.json_response({"status": "ready", **(facts or {})})
        return web.json_response({"status": "not ready", **(facts or {})}, status=503)

    async def alerts(_: web.Request, args: Args) -> web.Response:
        """Alerts, newest first; `?state=firing|resolved`, `?detector=KEY`, `?limit=N`."""
        table = alert_queries.alerts(state=args["state"], detector=args["detector"], limit=args["limit"])
        rows = [
            {k: (json.loads(v) if k == "labels" else _json_value(v)) for k, v in row.items()}
            for row in table.to_pylist()
        ]
        return web.json_response({"alerts": rows})

    async def clusters(_: web.Request, args: Args) -> web.Response:
        """Clusters of bad requests, newest window first, best first; `?detector=KEY`, `?limit=N`."""
        table = alert_queries.clusters(detector=args["detector"], limit=args["limit"])
        rows = [
            {k: (json.loads(v) if k in _JSON_COLUMNS and v is not None else _json_value(v)) for k, v in row.items()}
            for row in table.to_pylist()
        ]
        return web.json_response({"clusters": rows})

    async def incident_rows(_: web.Request, args: Args) -> web.Response:
        """Incidents, newest first; `?state=open|resolved`, `?since=ISO8601`, `?limit=N`."""
        if incidents is None:
            return _error(503, "unavailable", "incidents are not kept here")
        table = incidents.incidents(state=args["state"], since=args["since"], limit=args["limit"])
        rows = [
            {k: (json.loads(v) if k in Incident.JSON_COLUMNS else _json_value(v)) for k, v in row.items()}
            for row in table.to_pylist()
        ]
        return web.json_response({"incidents": rows})

    async def change_rows(_: web.Request, args: Args) -> web.Response:
        """Changes, newest first; `?since=ISO8601`, `?limit=N`."""
        if changes is None:
            return _error(503, "unavailable", "changes are not kept here")
        table = changes.changes(since=args["since"], limit=args["limit"])
        rows = [
            {k: (json.loads(v) if k in Change.JSON_COLUMNS else _json_value(v)) for k, v in row.items()}
            for row in table.to_pylist()
        ]
        return web.json_response({"changes": rows})

    async def compare(_: web.Request, args: Args) -> web.Response:
        """Two sets of requests' differences over every dimension: an incident's, a change's, or two ranges'."""
        if comparing is None or changes is None or incidents is None:
            return _error(503, "unavailable", "requests are not compared here")
        try:
            sets = _sets(args, incidents, changes)
            found = await asyncio.get_running_loop().run_in_executor(None, comparing, sets, args["limit"])
        except QueryError as exc:
            return _error(404 if exc.code == "not_found" else 400, exc.code, exc.message)
        except FrameTooLarge as exc:
            return _error(413, "too_large", f"the two sets are more than a pass may hold: {exc}; compare less time")

        def described(window: Window, n: int) -> dict[str, Any]:
            return {"since": _json_value(window.start), "until": _json_value(window.end),
                    "deployment": sets.deployment, "symptom": sets.symptom, "requests": n}  # fmt: skip

        return web.json_response({
            "a": described(sets.a, found.a_requests), "b": described(sets.b, found.b_requests),
            "differences": [d.as_json() for d in found.differences],
        })  # fmt: skip

    async def detect(request: web.Request, _: Args) -> web.Response:
        """Evaluate detectors now, or as of `at`, exactly as the scheduler would; returns what they found."""
        if detection is None:
            return _error(503, "unavailable", "detectors are not running")
        try:
            body = await request.json() if request.can_read_body else {}
            at = body.get("at")
            when = (
                datetime.fromisoformat(at.replace("Z", "+00:00")).astimezone(UTC).replace(tzinfo=None)
                if at
                else datetime.now(UTC).replace(tzinfo=None)
            )
            keys = body.get("detectors")
            detection.keys(keys)  # validates the names
        except (ValueError, AttributeError, TypeError) as exc:
            return _error(400, "bad_request", f'expected {{"at": ISO 8601, "detectors": [...]}}: {exc}')
        except KeyError as exc:
            return _error(400, "unknown_detector", str(exc.args[0]))
        results = await asyncio.get_running_loop().run_in_executor(None, detection.run, when, keys)
        return web.json_response(
            {
                "at": when.isoformat() + "Z",
                "results": [
                    {
                        "detector": r.detector,
                        "window_start": r.window.start.isoformat() + "Z",
                        "window_end": r.window.end.isoformat() + "Z",
                        "outcome": r.outcome,
                        "seconds": round(r.seconds, 3),
                        "error": r.error,
                        "firing": [
                            {"labels": a.labels, "severity": a.severity, "summary": a.summary} for a in r.firing
                        ],
                    }
                    for r in results
                ],
            }
        )

    open_paths = routes.open_paths()
    app = web.Application(middlewares=[_bearer(token, open_paths)] if token else [])
    handlers: dict[str, Handler] = {
        "metrics": metrics, "healthz": healthz, "readyz": readyz, "alerts": alerts, "clusters": clusters,
        "incidents": incident_rows, "changes": change_rows, "compare": compare, "detect": detect,
    }  # fmt: skip
    if sql is not None:
        handlers.update(sql=sql.query, export=sql.export)
        app.on_cleanup.append(sql.close)
    if console is not None:
        handlers.update(
            console_pages.add_console(
                app, registry=registry, queries=console, detection=detection, is_ready=is_ready, token=token,
                secure_cookie=tls,
            )
        )  # fmt: skip
    served = groups(sql=sql is not None, console=console is not None)
    # This server's own routes and auth, encoded once.
    description = json.dumps(
        openapi.document(
            sql=sql is not None, auth=bool(token), open_paths=open_paths, console=console is not None, routes=routes
        )
    ).encode()

    async def openapi_json(_: web.Request, __: Args) -> web.Response:
        return web.Response(body=description, content_type="application/json")

    handlers["openapi"] = openapi_json
    routes.serve(app, handlers, served)
    return app


def _bearer(token: str, open_paths: frozenset[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):  # type: ignore[no-untyped-def]
        if request.path in open_paths or request.path in console_pages.SIGN_IN_PATHS:
            return await handler(request)
        given = request.headers.get("Authorization", "").encode()
        # Constant-time: the comparison must not tell an attacker how much of a guess was right. A browser
        # carries the token in the console's cookie instead of a header.
        if not (hmac.compare_digest(given, expected) or console_pages.cookie_matches(request, token)):
            if request.path == "/" and request.method == "GET":
                # The sign-in page in place of the console: the URL, and the view and range in its fragment,
                # stay as they are for the reload that follows signing in.
                return console_pages.sign_in_page()
            response = _error(401, "unauthorized", "this API needs an Authorization: Bearer <token> header")
            response.headers["WWW-Authenticate"] = 'Bearer realm="tailwatch"'
            return response
        return await handler(request)

    return check


def _format(request: web.Request, body: dict[str, Any]) -> str:
    """json, csv or arrow: the body's `format` field, else the Accept header, else json."""
    if "format" in body:
        fmt = body["format"]
        if fmt not in result_formats.FORMATS:
            raise QueryError("bad_request", f"format must be one of {', '.join(result_formats.FORMATS)} (got {fmt!r})")
        return str(fmt)
    accept = request.headers.get("Accept", "")
    for media in (m.split(";")[0].strip().lower() for m in accept.split(",")):
        for fmt, mime in result_formats.FORMATS.items():
            if media == mime:
                return fmt
        if media in ("*/*", "application/*", ""):
            return "json"
    raise QueryError(
        "not_acceptable", f"cannot answer in {accept!r}; ask for {', '.join(result_formats.FORMATS.values())}"
    )


class _SqlHandlers:
    """POST /v1/sql and GET /v1/export: analysts' statements on their own threads, a few at a time."""

    def __init__(self, analyst: AnalystSQL, slots: int) -> None:
        self._analyst = analyst
        # Their own threads, so a slow query never takes a thread that /v1/detect waits for; and at a lower
        # CPU priority, so on a busy machine ingest goes first.
        self._pool = ThreadPoolExecutor(
            max_workers=slots, thread_name_prefix="tailwatch-sql", initializer=_start_sql_thread
        )
        self._slots = asyncio.Semaphore(slots)

    async def close(self, _app: web.Application) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _turn(self) -> None:
        # Waiting for a turn counts against the same limit a running statement has.
        try:
            await asyncio.wait_for(self._slots.acquire(), self._analyst.timeout_seconds)
        except TimeoutError:
            raise QueryError("busy", "every SQL slot stayed busy for the statement time limit; retry later") from None

    async def query(self, request: web.Request, _: Args) -> web.Response:
        """Run one read-only statement; rows as JSON (default), CSV or an Arrow IPC stream."""
        try:
            body = await _json_body(request)
            statement, params = body.get("sql"), body.get("params")
            if not isinstance(statement, str):
                raise QueryError("bad_request", 'expected {"sql": "SELECT ...", "params": [...]}')
            if params is not None and not isinstance(params, list | dict):
                raise QueryError("bad_request", "params must be a list (for ?) or an object (for $name)")
            fmt = _format(request, body)
            await self._turn()
            try:
                loop = asyncio.get_running_loop()
                # Encoding ten thousand rows is work too: it stays off the event loop with the query.
                answer = await loop.run_in_executor(self._pool, self._answer, statement, params, fmt)
            finally:
                self._slots.release()
        except QueryError as exc:
            return _query_error(exc)
        except Exception:
            log.exception("analyst query failed inside the service")
            return _error(500, "internal", "the query failed inside the service; its log has the details")
        payload, content_type, truncated = answer
        return web.Response(
            body=payload,
            headers={"Content-Type": content_type, result_formats.TRUNCATED_HEADER: str(truncated).lower()},
        )

    def _answer(self, statement: str, params: Any, fmt: str) -> tuple[bytes, str, bool]:
        result = self._analyst.run(statement, params)
        if fmt == "csv":
            return result_formats.to_csv(result.table), "text/csv; charset=utf-8", result.truncated
        if fmt == "arrow":
            return (
                result_formats.to_arrow_stream(result.table, result.truncated),
                result_formats.ARROW_STREAM,
                result.truncated,
            )
        return (
            result_formats.to_json(result.table, result.types, result.truncated),
            "application/json",
            result.truncated,
        )

    async def export(self, request: web.Request, args: Args) -> web.StreamResponse:
        """Every row of a dataset in [since, until) as one Arrow IPC stream, sent as DuckDB produces it."""
        try:
            dataset = args["dataset"] or ""  # absent, it is an unknown dataset to check_export
            since, until = args["since"], args["until"]
            export.check_export(dataset, since, until)
        except (export.ExportError, QueryError) as exc:
            code = exc.code if isinstance(exc, QueryError) else "bad_request"
            return _error(400, code, str(exc))
        try:
            await self._turn()
        except QueryError as exc:
            return _query_error(exc)
        try:
            return await self._stream(request, dataset, since, until)
        finally:
            self._slots.release()

    async def _stream(self, request: web.Request, dataset: str, since: datetime, until: datetime) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        # A few batches in flight at most: a slow reader holds DuckDB back instead of filling memory.
        chunks: asyncio.Queue[bytes | QueryError | None] = asyncio.Queue(maxsize=4)
        stop = False

        def put(item: bytes | QueryError | None) -> None:
            asyncio.run_coroutine_threadsafe(chunks.put(item), loop).result()

        def produce() -> None:
            try:
                with self._analyst.export(dataset, since, until) as reader:
                    sink = _Chunks()
                    with pa.ipc.new_stream(sink, reader.schema) as writer:
                        for batch in reader:
                            writer.write_batch(batch)
                            put(sink.take())
                            if stop:
                                return
                    put(sink.take())  # the end-of-stream marker
                put(None)
            except QueryError as exc:
                put(exc)
            except Exception:
                log.exception("export failed inside the service")
                put(QueryError("internal", "the export failed inside the service; its log has the details"))

        producer = loop.run_in_executor(self._pool, produce)
        first = await chunks.get()
        if isinstance(first, QueryError):
            await producer
            return _query_error(first)
        response = web.StreamResponse(headers={"Content-Type": result_formats.ARROW_STREAM})
        await response.prepare(request)
        try:
            item: bytes | QueryError | None = first
            while isinstance(item, bytes):
                await response.write(item)
                item = await chunks.get()
            if isinstance(item, QueryError):
                # Headers are gone: end the stream unfinished, so a reader fails instead of trusting a prefix.
                log.warning("export failed mid-stream: %s", item.message)
                if request.transport is not None:
                    request.transport.close()
                return response
            try:
                await response.write_eof()
            except ConnectionResetError:
                # Every batch and the end-of-stream marker went out; a reader that hangs up once it has
                # the marker has all the data, so this is not an export failure.
                log.debug("export reader closed before the final chunk")
            return response
        finally:
            stop = True
            while not producer.done():
                # Unblock a producer waiting to put, so it sees `stop` and closes its cursor.
                while not chunks.empty():
                    chunks.get_nowait()
                await asyncio.sleep(0.01)


def _start_sql_thread() -> None:
    """Each SQL thread, as it starts: its name in the kernel, and a lower CPU priority."""
    name_this_thread()
    # Linux applies nice per thread. It covers the thread that drives each analyst query, not DuckDB's
    # shared workers, which is why it only partly protects ingest (docs/benchmarks.md).
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), ANALYST_NICE)


class _Chunks:
    """A file for pyarrow's IPC writer that hands over what was written since the last take."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise QueryError("bad_request", 'the body must be JSON: {"sql": "SELECT ...", "params": [...]}') from None
    if not isinstance(body, dict):
        raise QueryError("bad_request", 'the body must be a JSON object: {"sql": "SELECT ..."}')
    return body


# A statement that hit its time limit will hit it again: a client error, not a retryable 5xx.
_STATUS = {"busy": 503, "internal": 500, "read_only": 403, "forbidden": 403, "not_acceptable": 406}


def _query_error(exc: QueryError) -> web.Response:
    response = _error(_STATUS.get(exc.code, 400), exc.code, exc.message)
    if exc.code == "busy":
        response.headers["Retry-After"] = "1"
    return response
