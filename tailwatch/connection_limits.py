"""Bounds on the HTTP ports' connections: a connection holds the service only while a request is in it.

aiohttp keeps a connection open for as long as its client keeps it, and waits for a request's headers
without a deadline: a client that trickles its headers a byte at a time (slowloris), or thousands that
connect and send nothing, hold a file descriptor each until the process runs out and nobody else can
connect. As the OpenTelemetry Collector's `idle_timeout` and `read_header_timeout` do, a connection
with no request being handled (before its first, between two, or halfway through a request's headers)
is closed after `idle_seconds`; the OTLP receiver bounds a request's body itself (its read timeout).
Past `max_connections` open at once, a new connection is closed as soon as it is accepted, so the
descriptors stay bounded however fast clients connect; the ones already open are served.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry, Counter

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConnectionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.closed = Counter(
            "tailwatch_http_connections_closed",
            "HTTP connections the service closed: `idle` (no request within the idle timeout, or headers not "
            "finished in it) or `over_limit` (accepted past max_connections).",
            ["port", "reason"],
            registry=registry,
        )
        self.malformed = Counter(
            "tailwatch_http_malformed_requests",
            "HTTP requests refused (400) before reaching a handler because their framing was broken: a request line "
            "or header over 8190 bytes, too many headers, a bad method or version. By aiohttp's error class.",
            ["reason"],
            registry=registry,
        )


class MalformedRequestFilter(logging.Filter):
    """aiohttp logs a traceback at ERROR for every request whose framing it cannot parse (a header over its
    limit, a bad request line): that is a client's bad input, answered 400, so it is counted, not logged."""

    def __init__(self, metrics: ConnectionMetrics) -> None:
        super().__init__()
        self._metrics = metrics

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            self._metrics.malformed.labels(type(exc).__name__).inc()
            return False
        return True


class ConnectionGuard:
    """One HTTP port's connections: who is in a request, who has been idle since when; closes the idle."""

    def __init__(
        self,
        port: str,
        *,
        idle_seconds: float,
        max_connections: int,
        metrics: ConnectionMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._port = port
        self._idle = idle_seconds
        self._max = max_connections
        self._metrics = metrics
        self._clock = clock
        # Per open connection: when it last became idle (opened, or a response finished); absent while busy.
        self._idle_since: dict[RequestHandler, float] = {}
        self._busy: dict[RequestHandler, int] = {}
        self._task: asyncio.Task[None] | None = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = request.protocol
        self._busy[connection] = self._busy.get(connection, 0) + 1
        self._idle_since.pop(connection, None)
        try:
            return await handler(request)
        finally:
            # Absent when the client hung up while it was handled (connection_lost forgot it already).
            left = self._busy.pop(connection, 1) - 1
            if left:
                self._busy[connection] = left
            elif connection.transport is not None:
                self._idle_since[connection] = self._clock()

    def watch(self, server: web.Server) -> None:
        """Hook the server's connection events (aiohttp calls them on its manager for each connection)."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            if len(self._idle_since) + len(self._busy) >= self._max:
                self._count("over_limit")
                transport.close()
                return
            self._idle_since[handler] = self._clock()

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            self._idle_since.pop(handler, None)
            self._busy.pop(handler, None)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    def sweep(self) -> int:
        """Close every connection idle for longer than the timeout; returns how many."""
        deadline = self._clock() - self._idle
        stale = [handler for handler, since in self._idle_since.items() if since <= deadline]
        for handler in stale:
            del self._idle_since[handler]
            if handler.transport is not None:
                handler.transport.close()
            self._count("idle")
        return len(stale)

    @property
    def open_connections(self) -> int:
        return len(self._idle_since) + len(self._busy)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        # A connection outlives its timeout by at most one period.
        period = min(1.0, self._idle / 4)
        while True:
            await asyncio.sleep(period)
            self.sweep()

    def _count(self, reason: str) -> None:
        if self._metrics is not None:
            self._metrics.closed.labels(self._port, reason).inc()
