"""OTLP/HTTP receiver: POST /v1/traces, /v1/logs and /v1/metrics, protobuf or JSON, optionally gzip-compressed.

Status codes follow the OTLP/HTTP spec: 200 (full or partial success), 400 malformed, 413 too large,
415 unsupported media type, 503 with Retry-After when overloaded. Failure bodies are google.rpc.Status
in the request's encoding.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from collector.decode import Encoding, Signal
from collector.errors import (
    STATUS,
    BodyTimedOut,
    ExportError,
    MalformedPayload,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from collector.pipeline import IngestPipeline
from collector.reasons import RequestRefusal
from collector.responses import encode, error_status, export_response

MEDIA_TYPES = {"application/x-protobuf": Encoding.PROTOBUF, "application/json": Encoding.JSON}
_READ_CHUNK = 1 << 16


class HttpReceiver:
    """aiohttp routes for the OTLP/HTTP port; the caller runs the app."""

    def __init__(
        self, pipeline: IngestPipeline, *, max_body_bytes: int, retry_after_seconds: int, read_timeout_seconds: float
    ) -> None:
        self._pipeline = pipeline
        self._max_bytes = max_body_bytes
        self._retry_after = retry_after_seconds
        self._read_timeout = read_timeout_seconds

    def app(self) -> web.Application:
        # aiohttp would inflate gzip bodies itself, with no bound on the inflated size; `gunzip` has one.
        app = web.Application(client_max_size=self._max_bytes, handler_args={"auto_decompress": False})
        app.router.add_post("/v1/traces", self._handler(Signal.TRACES))
        app.router.add_post("/v1/logs", self._handler(Signal.LOGS))
        app.router.add_post("/v1/metrics", self._handler(Signal.METRICS))
        return app

    def _handler(self, signal: Signal) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            return await self._export(signal, request)

        return handle

    async def _export(self, signal: Signal, request: web.Request) -> web.Response:
        encoding = MEDIA_TYPES.get(request.content_type)
        try:
            if encoding is None:
                supported = ", ".join(MEDIA_TYPES)
                raise UnsupportedMediaType(
                    f"Content-Type {request.content_type!r} is not supported; use one of: {supported}"
                )
            body = await self._body(request)
        except ExportError as exc:
            self._pipeline.count_refusal(signal, "http", exc)
            return self._error(exc, encoding or Encoding.JSON)
        try:
            result = await asyncio.wrap_future(self._pipeline.submit(signal, body, encoding, "http"))
        except ExportError as exc:  # already counted by the pipeline
            return self._error(exc, encoding)
        payload, content_type = encode(export_response(signal, result), encoding)
        return web.Response(body=payload, content_type=content_type)

    async def _body(self, request: web.Request) -> bytes:
        limit = self._max_bytes
        if request.content_length is not None and request.content_length > limit:
            raise PayloadTooLarge(f"request body of {request.content_length} bytes exceeds the {limit}-byte limit")
        try:
            # A client that stops sending mid-body would otherwise hold its connection and buffer forever.
            async with asyncio.timeout(self._read_timeout):
                body = await self._read(request, limit)
        except TimeoutError:
            raise BodyTimedOut(f"the request body did not arrive within {self._read_timeout:g} s") from None
        content_encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if content_encoding == "gzip":
            return await asyncio.get_running_loop().run_in_executor(None, gunzip, body, limit)
        if content_encoding not in ("", "identity"):
            raise UnsupportedMediaType(f"Content-Encoding {content_encoding!r} is not supported; use gzip or none")
        return body

    @staticmethod
    async def _read(request: web.Request, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.read(_READ_CHUNK):
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
            chunks.append(chunk)
        return b"".join(chunks)

    def _error(self, exc: ExportError, encoding: Encoding) -> web.Response:
        mapping = STATUS[exc.refusal]
        payload, content_type = encode(error_status(exc, self._retry_after), encoding)
        headers = {"Retry-After": str(self._retry_after)} if mapping.retryable else {}
        response = web.Response(status=mapping.http_status, body=payload, content_type=content_type, headers=headers)
        if exc.refusal in (RequestRefusal.TOO_LARGE, RequestRefusal.TIMED_OUT):
            # The rest of the body is not read; close rather than leave it in the connection.
            response.force_close()
        return response


def gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body, refusing to inflate past `limit` bytes (a gzip bomb costs nothing)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise MalformedPayload(f"invalid gzip body: {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"gzip body inflates past the {limit}-byte limit")
    if not inflater.eof:
        raise MalformedPayload("truncated gzip body")
    return out
