"""OTLP/gRPC receiver: the Trace, Logs and Metrics services' Export on a sync gRPC server, raw bytes in and out.

Requests are not deserialized by gRPC: the bytes go to the shared decoder (possibly in another
process), so the receiver thread only waits for the durable write.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import grpc

from collector.decode import Encoding, Signal
from collector.errors import STATUS, ExportError
from collector.pipeline import IngestPipeline
from collector.responses import error_status, export_response

SERVICES = {
    Signal.TRACES: "opentelemetry.proto.collector.trace.v1.TraceService",
    Signal.LOGS: "opentelemetry.proto.collector.logs.v1.LogsService",
    Signal.METRICS: "opentelemetry.proto.collector.metrics.v1.MetricsService",
}


class GrpcReceiver:
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
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_concurrent_requests, thread_name_prefix="tailwatch-grpc"),
            # Beyond this gRPC itself answers RESOURCE_EXHAUSTED; it bounds the request bytes held in memory.
            maximum_concurrent_rpcs=max_concurrent_requests * 2,
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

    def start(self) -> None:
        self._server.start()

    def stop(self, grace: float) -> None:
        """Stop taking RPCs and wait up to `grace` seconds for the running ones to answer."""
        self._server.stop(grace).wait()

    def _exporter(self, signal: Signal) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def export(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                result = self._pipeline.submit(signal, request, Encoding.PROTOBUF, "grpc").result()
            except ExportError as exc:
                status = error_status(exc, self._retry_after)
                context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
                context.abort(STATUS[exc.refusal].grpc_code, exc.message)
            response: bytes = export_response(signal, result).SerializeToString()
            return response

        return export
