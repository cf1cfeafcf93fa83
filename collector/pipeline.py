"""From request bytes to a durable write: admission, decoding (in threads or in worker processes), hand-off.

Both receivers call `IngestPipeline.submit` and get a future that resolves when what the request
carries is committed. Memory is bounded twice: bytes admitted but not yet written
(`max_inflight_bytes`) and what is queued at the writer (the writer's own bounds, in rows and in
decoded bytes); past either, the request is refused as retryable instead of buffered.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from concurrent.futures import Executor, Future, InvalidStateError, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from collector.decode import DEFAULT_DECODER, Decoded, Decoder, Encoding, Signal
from collector.decode_job import decode_request, start_worker
from collector.engine_names import EngineNames
from collector.errors import ExportError, Overloaded, Unavailable
from collector.metrics import IngestMetrics
from collector.normalize import NormalizeConfig
from model.thread_names import name_this_thread
from storage.ports import SpanSink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportResult:
    """What the receiver reports back: OTLP success, possibly partial."""

    accepted: int
    rejected: int
    message: str  # empty unless something was rejected


class IngestPipeline:
    def __init__(
        self,
        sink: SpanSink,
        metrics: IngestMetrics,
        *,
        decode_workers: int,
        max_inflight_bytes: int,
        normalize: NormalizeConfig | None = None,
        engine_names: EngineNames | None = None,
        decoder: Decoder = DEFAULT_DECODER,
        split_attributes: bool = False,
    ) -> None:
        self._sink = sink
        self._metrics = metrics
        self.processes = max(decode_workers, 0)  # 0: decoding in threads
        self._max_inflight = max_inflight_bytes
        self._normalize = normalize or NormalizeConfig()
        self._names = engine_names or EngineNames()
        self.decoder = decoder
        # Whether spans are decoded in the form the sink stores (model/attribute_split.py).
        self._split = split_attributes
        metrics.decoder_in_use(decoder, self.processes)
        self._inflight = 0
        self._lock = threading.Lock()
        self._closing = False
        self._idle = threading.Condition(self._lock)
        self._executor = self._new_executor()

    def _new_executor(self) -> Executor:
        if not self.processes:
            # Threads keep the receivers' event loop free. The compiled walk releases the GIL, so two use both
            # cores; the Python walk's share one.
            return ThreadPoolExecutor(
                max_workers=2, thread_name_prefix="tailwatch-decode", initializer=name_this_thread
            )
        # forkserver: forking a process that runs gRPC threads is unsafe, and spawn re-imports slowly.
        ctx = multiprocessing.get_context("forkserver")
        # The fork server imports the decoder once and its workers share those pages; its default would
        # import the service's __main__ instead.
        ctx.set_forkserver_preload(["collector.decode_job"])
        # Workers end with the service, a kill -9 included (decode_job.exit_with says why they must be told),
        # and never load pandas (decode_job.start_worker).
        return ProcessPoolExecutor(
            max_workers=self.processes, mp_context=ctx, initializer=start_worker, initargs=(os.getpid(),)
        )

    def warm_up(self) -> None:
        """Start the decoder processes (and build their plans) now rather than on the first request."""
        futures = [
            self._executor.submit(
                decode_request,
                Signal.TRACES,
                b"",
                Encoding.PROTOBUF,
                self._normalize,
                self._names,
                decoder=self.decoder,
            )
            for _ in range(max(1, self.processes))
        ]
        for f in futures:
            f.result()

    def submit(self, signal: Signal, payload: bytes, encoding: Encoding, transport: str) -> Future[ExportResult]:
        """Decode, validate and store one export request; the future resolves once it is durable."""
        result: Future[ExportResult] = _Answer()
        size = len(payload)
        with self._lock:
            if self._closing:
                return _failed(
                    result, self.count_refusal(signal, transport, Unavailable("the service is shutting down"))
                )
            if self._inflight + size > self._max_inflight and self._inflight > 0:
                exc = Overloaded("ingest is at capacity; retry after the hinted delay")
                return _failed(result, self.count_refusal(signal, transport, exc))
            self._inflight += size
        executor = self._executor
        try:
            decoding = executor.submit(
                decode_request,
                signal,
                payload,
                encoding,
                self._normalize,
                self._names,
                decoder=self.decoder,
                split_attributes=self._split,
            )
        except BrokenProcessPool:
            # A decoder died while idle: the pool is broken for good until it is replaced.
            self._release(size)
            self._restart_executor(executor)
            return _failed(result, self.count_refusal(signal, transport, Unavailable("a decoder process died; retry")))
        except RuntimeError:  # shut down: replaced by a restart a moment ago, or closing
            self._release(size)
            return _failed(result, self.count_refusal(signal, transport, Unavailable("the decoder is restarting")))
        decoding.add_done_callback(
            lambda f: self._decoded(f, result, size, signal=signal, transport=transport, executor=executor)
        )
        return result

    def _decoded(
        self,
        decoding: Future[Decoded],
        result: Future[ExportResult],
        size: int,
        *,
        signal: Signal,
        transport: str,
        executor: Executor,
    ) -> None:
        try:
            decoded = decoding.result()
        except ExportError as exc:
            self._release(size)
            result.set_exception(self.count_refusal(signal, transport, exc))
            return
        except BrokenProcessPool:
            self._release(size)
            self._restart_executor(executor)
            result.set_exception(self.count_refusal(signal, transport, Unavailable("a decoder process died; retry")))
            return
        except Exception as exc:  # never let one request's surprise reach the receiver thread
            log.exception("unexpected decoder failure")
            self._release(size)
            failure = Unavailable(f"decoder failure: {type(exc).__name__}")
            result.set_exception(self.count_refusal(signal, transport, failure))
            return

        self._metrics.count_decoded(decoded, transport)
        rejected = decoded.rejections.total
        message = decoded.rejections.message(decoded.noun) if rejected else ""
        accepted = decoded.items
        spans = decoded.spans if decoded.spans is not None and decoded.spans.num_rows else None
        scores = decoded.scores if decoded.scores.num_rows else None
        points = decoded.metrics if decoded.metrics is not None and decoded.metrics.num_rows else None
        if spans is None and scores is None and points is None:
            self._release(size)
            self._metrics.requests.labels(transport, signal.value, "ok").inc()
            result.set_result(ExportResult(accepted, rejected, message))
            return
        writing = self._sink.try_submit(spans, scores, points)
        if writing is None:
            self._release(size)
            full = Overloaded("the storage queue is full; retry after the hinted delay", items=accepted)
            result.set_exception(self.count_refusal(signal, transport, full))
            return

        def written(w: Future[Any]) -> None:
            self._release(size)
            try:
                w.result()
            except Exception:  # noqa: BLE001 - the writer logged it; the client retries the whole request
                failure = Unavailable("storing failed; retry", items=accepted)
                result.set_exception(self.count_refusal(signal, transport, failure))
                return
            self._metrics.requests.labels(transport, signal.value, "ok").inc()
            result.set_result(ExportResult(accepted, rejected, message))

        writing.add_done_callback(written)

    def count_refusal(self, signal: Signal, transport: str, exc: ExportError) -> ExportError:
        """Count a refused request (and its items, when known); receivers call it for their own refusals."""
        self._metrics.count_refusal(signal.value, transport, exc)
        return exc

    def _release(self, size: int) -> None:
        with self._lock:
            self._inflight -= size
            if self._inflight == 0:
                self._idle.notify_all()

    def _restart_executor(self, broken: Executor) -> None:
        # Every request in flight on a broken pool fails at once; only the first replaces it, so the
        # others do not shut down (and cancel the work on) the pool that replaced it.
        with self._lock:
            if self._executor is not broken:
                return
            self._executor = self._new_executor()
        broken.shutdown(wait=False, cancel_futures=True)

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, wait until every admitted one has been written, stop the decoders."""
        with self._lock:
            self._closing = True
            self._idle.wait_for(lambda: self._inflight == 0, timeout)
        self._executor.shutdown(wait=True, cancel_futures=False)


class _Answer(Future[ExportResult]):
    """A request's answer. The receiver cancels it when its client goes away (a deadline, a closed stream)
    while the request is decoded or stored; the work goes on (what is stored stays stored, and a retry is
    deduplicated) and its outcome is dropped, instead of raising InvalidStateError in a writer's callback."""

    def set_result(self, result: ExportResult) -> None:
        try:
            super().set_result(result)
        except InvalidStateError:
            if not self.cancelled():
                raise

    def set_exception(self, exception: BaseException | None) -> None:
        try:
            super().set_exception(exception)
        except InvalidStateError:
            if not self.cancelled():
                raise


def _failed(result: Future[ExportResult], exc: Exception) -> Future[ExportResult]:
    result.set_exception(exc)
    return result
