"""The console: static pages at `/` drawn in the browser from the JSON API, and the three reads it adds to it
(detector figures over time, service status, one trace).

Nothing here reads the store except through `ConsoleQueries`; the pages fetch the same JSON any client can.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from detectors.detection import DetectionPass
from storage.ports import ConsoleQueries, QueryError, Window
from tailwatch import result_formats
from tailwatch.error_body import error
from tailwatch.routing import Args, Handler

STATIC = Path(__file__).parent / "static"
# Served to a browser without the token: what the sign-in page needs, none of it data.
SIGN_IN_PATHS = frozenset({"/login", "/console/login.js", "/console/style.css"})
COOKIE = "tailwatch_token"
# The browser may load nothing from anywhere but this server: no CDN, no font service, no beacon.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
RATE_SAMPLE_SECONDS = 5.0
RATE_SAMPLES = 13  # a minute of samples


def _now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def _static(name: str) -> web.Response:
    path = STATIC / name
    return web.Response(body=path.read_bytes(), content_type=_TYPES[path.suffix], headers=SECURITY_HEADERS)


def sign_in_page() -> web.Response:
    """What `/` answers without the token: a form that asks for it."""
    response = _static("login.html")
    response.set_status(401)
    response.headers["WWW-Authenticate"] = 'Bearer realm="tailwatch"'
    return response


def cookie_matches(request: web.Request, expected: str) -> bool:
    """The console's session: the token itself in an HttpOnly, same-site cookie, compared in constant time."""
    given = request.cookies.get(COOKIE)
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class IngestRate:
    """Spans stored per second over the last minute, from samples of the writer's counter every few seconds."""

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self._clock = clock
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=RATE_SAMPLES)

    def sample(self) -> None:
        received = sum(_samples(self._registry, "tailwatch_spans_received_total").values())
        stored = _value(self._registry, "tailwatch_spans_stored_total") or 0.0
        self._samples.append((self._clock(), received, stored))

    def per_second(self) -> tuple[float | None, float | None]:
        """(received, stored) spans per second; None until two samples exist."""
        if len(self._samples) < 2:
            return None, None
        (t0, r0, s0), (t1, r1, s1) = self._samples[0], self._samples[-1]
        return (r1 - r0) / (t1 - t0), (s1 - s0) / (t1 - t0)

    async def run(self, app: web.Application) -> Any:
        async def loop() -> None:
            while True:
                self.sample()
                await asyncio.sleep(RATE_SAMPLE_SECONDS)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _samples(registry: CollectorRegistry, name: str) -> dict[str, float]:
    """A metric's samples by their labels' values joined with '/' (e.g. 'grpc', 'traces/overloaded'; '' when
    it has none). Only that metric's collector is asked: the whole registry holds every figure gauge."""
    out: dict[str, float] = {}
    for family in registry.restricted_registry([name]).collect():
        for sample in family.samples:
            if sample.name == name:
                out["/".join(sample.labels.values())] = sample.value
    return out


def _value(registry: CollectorRegistry, name: str) -> float | None:
    """An unlabelled metric's value."""
    return _samples(registry, name).get("")


def _range(args: Args) -> tuple[datetime, datetime]:
    until, since = args["to"], args["from"]
    if since >= until:
        raise QueryError("bad_request", "from must be before to")
    return since, until


def _json(body: Any) -> web.Response:
    return web.Response(body=result_formats.dumps(body), content_type="application/json")


def add_console(
    app: web.Application,
    *,
    registry: CollectorRegistry,
    queries: ConsoleQueries,
    detection: DetectionPass | None,
    is_ready: Callable[[], bool],
    token: str | None,
    secure_cookie: bool,
) -> dict[str, Handler]:
    """The console's handlers by operation id (tailwatch/routes.py declares their routes)."""
    rate = IngestRate(registry)
    app.cleanup_ctx.append(rate.run)

    async def index(_: web.Request, __: Args) -> web.Response:
        return _static("index.html")

    async def asset(_: web.Request, args: Args) -> web.Response:
        name = args["name"]
        # Only the files shipped in the static directory, by exact name: no path reaches elsewhere.
        if name not in {p.name for p in STATIC.iterdir()}:
            raise web.HTTPNotFound()
        return _static(name)

    async def sign_in(request: web.Request, _: Args) -> web.Response:
        """Trade the token for the console's cookie (form field `token`)."""
        if token is None:
            return web.Response(status=204)
        form = await request.post()
        given = str(form.get("token", ""))
        if not hmac.compare_digest(given.encode(), token.encode()):
            return error(401, "unauthorized", "that is not this service's API token")
        response = web.Response(status=204)
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", secure=secure_cookie, path="/")
        return response

    async def figures(_: web.Request, args: Args) -> web.Response:
        """A detector's stored figures for the windows ending in (from, to] (default: the last day);
        `columns=a,b` only those, `distinct=true` each row once, any other parameter a column to match."""
        detector = args["detector"]
        limit = args["limit"]
        columns = [c for c in (args["columns"] or "").split(",") if c]
        where = args.undeclared()
        distinct = args["distinct"]
        try:
            since, until = _range(args)
            shaped = await asyncio.to_thread(
                queries.figures, detector, since, until, limit=limit, columns=columns, where=where, distinct=distinct
            )
        except QueryError as exc:
            return error(400, exc.code, exc.message)
        except KeyError as exc:
            return error(404, "unknown_detector", str(exc.args[0]))
        except ValueError as exc:
            return error(400, "bad_request", str(exc))
        config = None
        with contextlib.suppress(KeyError):  # a table that is not a detector's own (traffic_pattern_labels)
            config = detection.config(detector).model_dump(mode="json") if detection is not None else None
        return _json(
            {
                "detector": detector,
                "from": since,
                "to": until,
                "config": config,
                "rows": result_formats.records(shaped.table),
                # Past the limit, every stride-th window from the newest; truncated: rows of the range are missing.
                "stride": shaped.stride,
                "truncated": shaped.truncated,
            }
        )

    async def status(_: web.Request, __: Args) -> web.Response:
        """Ingest and detector health: what an operator checks first."""
        received, stored = rate.per_second()
        last_commit = _value(registry, "tailwatch_writer_last_commit_timestamp_seconds") or None
        ran = {h.detector: h for h in await asyncio.to_thread(queries.detector_health, _now())}
        detectors = []
        for key in detection.keys() if detection is not None else sorted(ran):
            h = ran.get(key)
            detectors.append(
                {
                    "detector": key,
                    "interval_seconds": detection.config(key).interval_seconds if detection is not None else None,
                    **({k: v for k, v in h.__dict__.items() if k != "detector"} if h else {"runs_24h": 0}),
                }
            )
        return _json(
            {
                "now": _now(),
                "ready": is_ready(),
                "ingest": {
                    "received_per_second": received,
                    "stored_per_second": stored,
                    "received": _samples(registry, "tailwatch_spans_received_total"),
                    "stored": _value(registry, "tailwatch_spans_stored_total"),
                    "rejected": {k: v for k, v in _samples(registry, "tailwatch_spans_rejected_total").items() if v},
                    "refused": {k: v for k, v in _samples(registry, "tailwatch_items_refused_total").items() if v},
                    "queued": _value(registry, "tailwatch_writer_queued_spans"),
                    "last_commit": datetime.fromtimestamp(last_commit, UTC).replace(tzinfo=None)
                    if last_commit
                    else None,
                    "commit_failures": _value(registry, "tailwatch_writer_commit_failures_total"),
                },
                "detectors": detectors,
            }
        )

    async def trace(request: web.Request, args: Args) -> web.Response:
        """One trace: its spans, its requests as the request model has them, its scores, and its replica's engine
        metrics around it. `from`/`to` bound the search to spans ending between them."""
        trace_id = args["trace_id"].lower()
        if len(trace_id) != 32 or any(c not in "0123456789abcdef" for c in trace_id):
            return error(400, "bad_request", "a trace id is 32 hex digits")
        try:
            around = Window(*_range(args)) if "from" in request.query else None
        except QueryError as exc:
            return error(400, exc.code, exc.message)
        found = await asyncio.to_thread(queries.trace, trace_id, around)
        if found["spans"].num_rows == 0:
            return error(404, "not_found", f"no spans of trace {trace_id}" + (" in that range" if around else ""))
        return _json({"trace_id": trace_id, **{name: result_formats.records(t) for name, t in found.items()}})

    return {
        "console": index, "console_asset": asset, "sign_in": sign_in, "figures": figures, "status": status,
        "trace": trace,
    }  # fmt: skip
