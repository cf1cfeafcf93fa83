"""OTLP/gRPC receiver: the Trace, Logs and Metrics services' Export on an asyncio gRPC server, raw bytes in and out.

Requests are not deserialized by gRPC: the bytes go to the shared decoder (possibly in another
process), and the call awaits the durable write without holding a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from collector.decode import Encoding, Signal
from collector.errors import STATUS, ExportError, Overloaded, Unavailable
from collector.pipeline import IngestPipeline
from collector.responses import error_status, export_response

# Stopping waits until this many looks, this far apart, have seen no call handed over (counted in looks,
# not time, so one long stall of a loaded event loop does not pass for quiet), or at most the last figure.
QUIET_LOOKS = 5
LOOK_SECONDS = 0.01
HANDOVER_WAIT_SECONDS = 2.0

SERVICES = {
    Signal.TRACES: "opentelemetry.proto.collector.trace.v1.TraceService",
    Signal.LOGS: "opentelemetry.proto.collector.logs.v1.LogsService",
    Signal.METRICS: "opentelemetry.proto.collector.metrics.v1.MetricsService",
}


class GrpcReceiver:
    """Runs on the service's event loop (grpc.aio): a call is handled as soon as its request has arrived."""

    def __init__(
        self,
        pipeline: IngestPipeline,
        *,
        host: str,
        port: int,
        max_message_bytes: int,
        max_concurrent_requests: int,
        retry_after_seconds: int,
    ) -> None:
        self._pipeline = pipeline
        self._retry_after = retry_after_seconds
        # Counted here rather than by gRPC's own `maximum_concurrent_rpcs`: past that, gRPC answers
        # RESOURCE_EXHAUSTED without RetryInfo, which the OTLP spec tells exporters not to retry (the
        # Collector's drops the batch). Past this, the call is refused as overloaded, with the retry hint.
        self._limit = max_concurrent_requests * 2
        self._active = 0
        self._stopping = False
        self._handed_over = 0
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                # gRPC enables SO_REUSEPORT by default on Linux, which would let a second Tailwatch bind
                # the same port and silently take half the traffic into another database.
                ("grpc.so_reuseport", 0),
            ],
        )
        self._server.add_generic_rpc_handlers(
            tuple(
                grpc.method_handlers_generic_handler(
                    service, {"Export": grpc.unary_unary_rpc_method_handler(self._exporter(signal))}
                )
                for signal, service in SERVICES.items()
            )
        )
        try:
            self.port = self._server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:  # grpcio's only signal that the bind failed (a port in use, a bad host)
            raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}: {exc}") from None

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float) -> None:
        """Refuse new RPCs as retryable, then stop gRPC and wait up to `grace` seconds for the running ones.

        gRPC core answers CANCELLED to every call it has received but not yet handed to a handler
        when the server stops, and under load the event loop lags behind the calls arriving. So
        first, calls handed over are refused with UNAVAILABLE and a retry hint, until none has been
        handed over for a moment: that empties gRPC's backlog into answers every exporter retries.
        A call that arrives in the last instant is still cancelled; OTLP exporters retry those too.
        """
        self._stopping = True
        loop = asyncio.get_running_loop()
        until = loop.time() + min(grace, HANDOVER_WAIT_SECONDS)
        quiet, seen = 0, self._handed_over
        while quiet < QUIET_LOOKS and loop.time() < until:
            await asyncio.sleep(LOOK_SECONDS)
            if self._handed_over == seen:
                quiet += 1
            else:
                quiet, seen = 0, self._handed_over
        await self._server.stop(grace)

    def _exporter(self, signal: Signal) -> Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]:
        async def export(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            try:
                if self._stopping:
                    self._handed_over += 1
                    raise self._pipeline.count_refusal(
                        signal, "grpc", Unavailable("Tailwatch is stopping; retry later")
                    )
                if self._active >= self._limit:
                    raise self._pipeline.count_refusal(
                        signal, "grpc", Overloaded(f"more than {self._limit} OTLP/gRPC requests at once; retry later")
                    )
                self._active += 1
                try:
                    result = await asyncio.wrap_future(
                        self._pipeline.submit(signal, request, Encoding.PROTOBUF, "grpc")
                    )
                finally:
                    self._active -= 1
            except ExportError as exc:
                status = error_status(exc, self._retry_after)
                await context.abort(
                    STATUS[exc.refusal].grpc_code,
                    exc.message,
                    trailing_metadata=(("grpc-status-details-bin", status.SerializeToString()),),
                )
            response: bytes = export_response(signal, result).SerializeToString()
            return response

        return export
