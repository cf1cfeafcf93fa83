"""Acknowledged spans survive a crash, retries never double-count, SIGTERM flushes and exits 0."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import grpc
import pytest
from builders import request, span
from conftest import RunningService, service_settings
from prometheus_client import CollectorRegistry
from receivers import NATIVE_INSTALL, require_or_skip
from serverproc import ServerProcess
from waiting import HANG_GUARD, WriterHold, wait_until

from collector import native_walk
from collector.decode import DEFAULT_DECODER, Decoder, Encoding, Signal
from collector.errors import STATUS, Unavailable
from collector.metrics import IngestMetrics
from collector.pipeline import ExportResult, IngestPipeline
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.writer import Writer

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def make_requests(n: int, spans_each: int, *, scored: bool = False) -> list[tuple[set[str], bytes]]:
    """`n` requests of `spans_each` spans (each scored by an `eval.*` attribute when `scored`), with their span ids."""
    attributes: dict[str, object] = {"gen_ai.usage.output_tokens": 100}
    if scored:
        attributes |= {"gen_ai.operation.name": "chat", "eval.json_adherence": 0.91}
    out = []
    for _ in range(n):
        spans = [span(attributes=attributes) for _ in range(spans_each)]
        out.append(({s.span_id.hex() for s in spans}, request(spans).SerializeToString()))
    return out


def stored_span_ids(db: Path, table: str = "spans") -> list[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [r[0] for r in con.execute(f"SELECT span_id FROM {table}").fetchall()]
    finally:
        con.close()


def test_same_request_twice_is_stored_once(service: RunningService) -> None:
    payload = request([span() for _ in range(10)]).SerializeToString()
    with grpc.insecure_channel(service.grpc_target) as ch:
        call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        call(payload, timeout=10)
        call(payload, timeout=10)
    assert service.rows("SELECT count(*), count(DISTINCT (trace_id, span_id)) FROM spans") == [(10, 10)]
    assert service.metric("tailwatch_spans_duplicate_total") == 10


def test_a_span_repeated_inside_one_request_is_stored_once(service: RunningService) -> None:
    s = span()
    with grpc.insecure_channel(service.grpc_target) as ch:
        call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
        call(request([s, s, span()]).SerializeToString(), timeout=10)
    assert service.rows("SELECT count(*) FROM spans") == [(2,)]


def test_a_retry_after_restart_is_still_recognised(db_path: Path) -> None:
    payload = request([span() for _ in range(7)]).SerializeToString()
    for _ in range(2):
        with RunningService(service_settings(db_path)) as svc, grpc.insecure_channel(svc.grpc_target) as ch:
            ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)(payload, timeout=10)
    con = duckdb.connect(str(db_path), read_only=True)
    assert con.execute("SELECT count(*) FROM spans").fetchall() == [(7,)]
    con.close()


@pytest.mark.parametrize(
    ("spool", "scored"),
    [
        pytest.param({"TAILWATCH_INGEST__SPOOL": "false"}, False, id="acknowledged-at-commit"),
        # Every request spooled: those acknowledged before their commit are replayed at the restart.
        pytest.param({"TAILWATCH_INGEST__SPOOL_BACKLOG_SPANS": "0"}, False, id="acknowledged-from-the-spool"),
        # ... with the scores they carry.
        pytest.param({"TAILWATCH_INGEST__SPOOL_BACKLOG_SPANS": "0"}, True, id="scored-acknowledged-from-the-spool"),
    ],
)
def test_kill_9_while_sending_loses_no_acknowledged_span_and_retries_do_not_duplicate(
    tmp_path: Path, spool: dict[str, str], scored: bool
) -> None:
    db = tmp_path / "crash.duckdb"
    batches = make_requests(400, 200, scored=scored)
    with ServerProcess(db, tmp_path / "serve.log", TAILWATCH_INGEST__DECODE_WORKERS="1", **spool) as server:
        server.start()
        acked_before_crash = send_and_kill_mid_stream(server, batches)
    assert 60 <= len(acked_before_crash) < len(batches)

    if spool.get("TAILWATCH_INGEST__SPOOL") == "false":  # every acknowledged span is in the database itself
        stored = stored_span_ids(db)
        for i in acked_before_crash:
            assert batches[i][0] <= set(stored)
    # Every acknowledged span is stored once the service is back (replayed from the spool), before any retry.
    with ServerProcess(db, tmp_path / "serve.log", **spool) as replaying:
        replaying.start()
        assert replaying.terminate() == 0
    stored = stored_span_ids(db)
    for i in acked_before_crash:
        assert batches[i][0] <= set(stored)
    if scored:  # and the scores of every acknowledged span, once each
        scores = stored_span_ids(db, "span_scores")
        assert len(scores) == len(set(scores)) and {s for i in acked_before_crash for s in batches[i][0]} <= set(scores)

    # The exporter retries everything it had no answer for, and (lost responses) some it had.
    with ServerProcess(db, tmp_path / "serve.log", TAILWATCH_INGEST__DECODE_WORKERS="1") as restarted:
        restarted.start()
        with grpc.insecure_channel(restarted.grpc_target) as ch:
            call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for i in range(len(batches)):
                if i not in acked_before_crash or i % 10 == 0:
                    call(batches[i][1], timeout=30)
        assert restarted.terminate() == 0

    stored = stored_span_ids(db)
    assert len(stored) == len(set(stored)) == 400 * 200
    if scored:
        scores = stored_span_ids(db, "span_scores")
        assert len(scores) == len(set(scores)) == 400 * 200


def test_decoder_processes_and_their_fork_server_end_when_the_service_is_killed_9(tmp_path: Path) -> None:
    db, log = tmp_path / "orphans.duckdb", tmp_path / "serve.log"
    with ServerProcess(db, log, TAILWATCH_INGEST__DECODE_WORKERS="2") as server:
        server.start()
        # The resource tracker, the fork server and its two decoder processes.
        wait_until(lambda: len(server.descendants()) >= 4, "the decoder processes to start")
        started = server.descendants()
        server.kill()
    wait_until(lambda: not any(map(running, started)), "no process of the killed service left")


def test_where_there_is_no_pidfd_a_decoder_process_still_exits_once_the_service_is_gone() -> None:
    service = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    watch = f"from collector.decode_job import _exit_when_gone; _exit_when_gone({service.pid}); raise SystemExit(3)"
    watcher = subprocess.Popen([sys.executable, "-c", watch], cwd=Path(__file__).parents[1])
    try:
        assert watcher.poll() is None
        service.kill()
        service.wait(HANG_GUARD)
        assert watcher.wait(HANG_GUARD) == 0
    finally:
        service.kill()
        watcher.kill()


def running(pid: int) -> bool:
    """Not ended: a zombie waiting for its new parent to reap it counts as ended."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def send_and_kill_mid_stream(server: ServerProcess, batches: list[tuple[set[str], bytes]]) -> set[int]:
    """Send every batch, 4 in flight; SIGKILL the server once 60 are acknowledged. Returns the acknowledged."""
    acked: set[int] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def send(i: int) -> None:
        if stop.is_set():
            return
        try:
            with grpc.insecure_channel(server.grpc_target) as ch:
                ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)(batches[i][1], timeout=20)
        except grpc.RpcError:
            return
        with lock:
            acked.add(i)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(send, i) for i in range(len(batches))]
        try:
            wait_until(lambda: len(acked) >= 60, "60 acknowledged requests before the crash", timeout=120)
            server.kill()  # mid-stream: other requests are being decoded and committed right now
        finally:
            stop.set()  # the sends not yet started return at once, also when the wait failed
        for f in futures:
            f.result(timeout=HANG_GUARD)  # each send has its own 20 s deadline
    return set(acked)


# What a retrying exporter does with a refusal: these it sends again later (gRPC reports a refused or
# dropped connection as UNAVAILABLE too), so refusing with them loses nothing.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


def test_sigterm_acknowledges_or_retryably_refuses_every_request_stores_the_acknowledged_and_exits_zero(
    tmp_path: Path,
) -> None:
    """SIGTERM lands while most of 40 requests are still queued. Every request must end either
    acknowledged, with all its spans stored exactly once, or refused with a status a retrying exporter
    retries; nothing else (a cancelled, failed or never-answered request would be lost data). And some
    request must be acknowledged after the server has begun stopping: a server that refused or cut off
    its whole queue on SIGTERM would lose nothing, but it would not flush either."""
    db, log = tmp_path / "term.duckdb", tmp_path / "serve.log"
    batches = make_requests(40, 1000)
    with ServerProcess(db, log) as server:
        server.start()
        with grpc.insecure_channel(server.grpc_target) as ch:
            call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            pending = [call.future(payload, timeout=120) for _, payload in batches]
            wait_until(lambda: any(p.done() for p in pending), "the first answer before SIGTERM", timeout=120)
            server.send_sigterm()
            # Answers sent before the server noticed the signal prove nothing about the shutdown path.
            wait_until(lambda: "stopping: no new requests" in log.read_text(), "the server to log that it is stopping")
            acked_before = {i for i, p in enumerate(pending) if p.done() and p.exception(HANG_GUARD) is None}
            code = server.wait(timeout=120)
            errors = [answer(p) for p in pending]

    acked = [i for i, err in enumerate(errors) if err is None]
    refused = [i for i, err in enumerate(errors) if isinstance(err, grpc.RpcError) and err.code() in RETRYABLE]
    other = {i: describe(errors[i]) for i in range(len(batches)) if i not in acked and i not in refused}
    assert not other, f"requests neither acknowledged nor retryably refused: {other}"
    assert code == 0, log.read_text()
    assert "tailwatch stopped" in log.read_text()
    assert len(acked_before) < len(batches), "all acknowledged before the server began stopping: nothing to flush"
    assert set(acked) - acked_before, (
        f"no request was acknowledged after the server began stopping ({len(acked_before)} were before it, "
        f"{len(refused)} refused): the queue was refused or cut off, not flushed"
    )

    stored = Counter(stored_span_ids(db))
    missing = {i: len(batches[i][0] - stored.keys()) for i in acked if not batches[i][0] <= stored.keys()}
    assert not missing, f"acknowledged requests with spans missing after exit (request: spans missing): {missing}"
    twice = {span_id: n for span_id, n in stored.items() if n > 1}
    assert not twice, f"{len(twice)} spans stored more than once"
    sent = set().union(*(ids for ids, _ in batches))
    assert stored.keys() <= sent


def answer(pending: grpc.Future) -> BaseException | None:
    """The request's error, or None when it was acknowledged; fails the test if it never finished."""
    try:
        return pending.exception(timeout=HANG_GUARD)
    except grpc.FutureTimeoutError:
        pytest.fail(f"a request was still unanswered {HANG_GUARD:g} s after the server exited")


def describe(error: BaseException | None) -> str:
    if isinstance(error, grpc.RpcError):
        return f"{error.code().name}: {error.details()}"
    return repr(error)


# --- the ingest pipeline on its own: a dying decoder, and requests after close ---------------------------


@contextmanager
def pipeline_on(
    db: Path, registry: CollectorRegistry, decode_workers: int, decoder: Decoder = DEFAULT_DECODER
) -> Iterator[IngestPipeline]:
    """An ingest pipeline storing through a real writer into a migrated database file; all closed on exit."""
    with pipeline_and_writer_on(db, registry, decode_workers, decoder) as (pipeline, _):
        yield pipeline


@contextmanager
def pipeline_and_writer_on(
    db: Path, registry: CollectorRegistry, decode_workers: int, decoder: Decoder = DEFAULT_DECODER
) -> Iterator[tuple[IngestPipeline, Writer]]:
    con = open_database(db)
    migrate.upgrade(con)
    writer = Writer(con, max_queued_spans=10_000, dedup_window_seconds=300, dedup_max_spans=100_000)
    writer.start()
    pipeline = IngestPipeline(
        writer, IngestMetrics(registry), decode_workers=decode_workers, max_inflight_bytes=2**20, decoder=decoder
    )
    try:
        yield pipeline, writer
    finally:
        pipeline.close(HANG_GUARD)
        writer.close(HANG_GUARD)
        con.close()


def requests_counted(registry: CollectorRegistry, transport: str, signal_: str, outcome: str) -> float:
    value = registry.get_sample_value(
        "tailwatch_export_requests_total", {"transport": transport, "signal": signal_, "outcome": outcome}
    )
    return 0.0 if value is None else value


def only_decoder(pipeline: IngestPipeline) -> Any:
    """The one decoder process a pipeline with decode_workers=1 starts, started."""
    before = {p.pid for p in multiprocessing.active_children()}
    pipeline.warm_up()
    [worker] = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert worker.pid is not None
    return worker


def test_a_request_whose_client_went_away_is_still_stored_and_its_answer_dropped_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "cancelled.duckdb"
    registry = CollectorRegistry()
    payload = request([span() for _ in range(3)]).SerializeToString()
    with pipeline_and_writer_on(db, registry, decode_workers=0) as (pipeline, writer):
        with WriterHold(writer):  # the request waits behind a job on the writer, as behind a long commit
            answer = pipeline.submit(Signal.TRACES, payload, Encoding.PROTOBUF, "grpc")
            assert answer.cancel()  # the receiver's client hit its deadline
        wait_until(lambda: writer.queued_spans == 0, "the request's spans to be stored")
        # A request whose client stayed is answered as ever, with what was stored and refused.
        kept = pipeline.submit(Signal.TRACES, request([span()]).SerializeToString(), Encoding.PROTOBUF, "grpc")
        assert kept.result(HANG_GUARD) == ExportResult(1, 0, "")
        refused = pipeline.submit(Signal.TRACES, b"\xff not protobuf", Encoding.PROTOBUF, "grpc")
        assert refused.exception(HANG_GUARD) is not None
    assert [r.getMessage() for r in caplog.records if r.name == "concurrent.futures"] == []
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM spans").fetchone() == (4,)


def test_a_decoder_process_dying_mid_request_is_a_retryable_refusal_and_the_retry_is_stored(tmp_path: Path) -> None:
    db = tmp_path / "decoder.duckdb"
    registry = CollectorRegistry()
    payload = request([span() for _ in range(3)]).SerializeToString()
    with pipeline_on(db, registry, decode_workers=1) as pipeline:
        worker = only_decoder(pipeline)
        # Stopped, the worker cannot take the request; killed, it dies with the request handed to it.
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            answer = pipeline.submit(Signal.TRACES, payload, Encoding.PROTOBUF, "grpc")
        finally:
            os.kill(worker.pid, signal.SIGKILL)  # never leave a stopped worker behind: closing would wait for it
        wait_until(answer.done, "the request to be answered after its decoder process died")
        error = answer.exception(HANG_GUARD)
        assert isinstance(error, Unavailable), error
        assert error.message == "a decoder process died; retry"
        assert STATUS[error.refusal].retryable
        assert requests_counted(registry, "grpc", "traces", "unavailable") == 1
        # The decoders were restarted: the client's retry goes through and is stored.
        retry = pipeline.submit(Signal.TRACES, payload, Encoding.PROTOBUF, "grpc")
        wait_until(retry.done, "the retried request to be answered")
        assert retry.result(HANG_GUARD) == ExportResult(accepted=3, rejected=0, message="")
    assert len(stored_span_ids(db)) == 3


def test_a_decoder_process_that_died_while_idle_is_replaced_and_the_next_request_is_stored(tmp_path: Path) -> None:
    db = tmp_path / "idle.duckdb"
    registry = CollectorRegistry()
    payload = request([span() for _ in range(3)]).SerializeToString()
    with pipeline_on(db, registry, decode_workers=1) as pipeline:
        worker = only_decoder(pipeline)
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(HANG_GUARD)
        # Wait for the pool to mark itself broken, so submitting is what fails (not a decode in flight).
        wait_until(lambda: pipeline._executor._broken, "the decoder pool to notice its worker died")  # type: ignore[attr-defined]
        first = pipeline.submit(Signal.TRACES, payload, Encoding.PROTOBUF, "grpc")
        wait_until(first.done, "the first request after the death to be answered")
        error = first.exception(HANG_GUARD)
        assert isinstance(error, Unavailable), error
        assert STATUS[error.refusal].retryable
        retry = pipeline.submit(Signal.TRACES, payload, Encoding.PROTOBUF, "grpc")
        wait_until(retry.done, "the retried request to be answered")
        assert retry.result(HANG_GUARD) == ExportResult(accepted=3, rejected=0, message="")
    assert len(stored_span_ids(db)) == 3


def test_a_decoder_process_holds_the_decoder_but_not_storage_polars_pandas_or_the_command_line(tmp_path: Path) -> None:
    with pipeline_on(tmp_path / "lean.duckdb", CollectorRegistry(), decode_workers=1) as pipeline:
        # A builtin runs in the worker as it is: asking imports nothing of ours there. Converting a Python
        # list is what makes pyarrow try pandas, as the decoder's finish does.
        ask = "(__import__('pyarrow').array([1.5]), sorted(__import__('sys').modules))[1]"
        held = pipeline._executor.submit(eval, ask).result(HANG_GUARD)  # type: ignore[attr-defined]
    assert "collector.decode_job" in held
    assert not [m for m in held if m.split(".")[0] in ("polars", "storage", "tailwatch", "duckdb", "pandas")]


def test_decoder_processes_decode_with_the_decoder_the_pipeline_was_given(tmp_path: Path) -> None:
    if not native_walk.AVAILABLE:  # needs both decoders to tell them apart
        require_or_skip("the compiled decoder (tailwatch_native) is not installed", NATIVE_INSTALL)
    # A resource_spans field sent as a varint: the reference skips it as upb does, the compiled decoder
    # refuses the request (docs/decoder.md, known differences). Which answer comes back says which ran.
    payload = request([span() for _ in range(3)]).SerializeToString() + b"\x08\x01"
    with pipeline_on(tmp_path / "python.duckdb", CollectorRegistry(), 1, Decoder.PYTHON) as pipeline:
        answer = pipeline.submit(Signal.TRACES, payload, Encoding.PROTOBUF, "grpc")
        wait_until(answer.done, "the request to be answered")
        assert answer.result(HANG_GUARD) == ExportResult(accepted=3, rejected=0, message="")
    with pipeline_on(tmp_path / "native.duckdb", CollectorRegistry(), 1, Decoder.NATIVE) as pipeline:
        answer = pipeline.submit(Signal.TRACES, payload, Encoding.PROTOBUF, "grpc")
        wait_until(answer.done, "the request to be answered")
        assert "invalid wire type" in str(answer.exception(HANG_GUARD))


@pytest.mark.parametrize("signal_", [Signal.TRACES, Signal.LOGS])
def test_a_request_after_the_pipeline_closed_is_refused_as_retryable_and_counted(
    tmp_path: Path, signal_: Signal
) -> None:
    registry = CollectorRegistry()
    payload = request([span()]).SerializeToString() if signal_ is Signal.TRACES else b""
    with pipeline_on(tmp_path / "closed.duckdb", registry, decode_workers=0) as pipeline:
        pipeline.close(HANG_GUARD)
        answer = pipeline.submit(signal_, payload, Encoding.PROTOBUF, "http")
        assert answer.done()
        error = answer.exception(HANG_GUARD)
        assert isinstance(error, Unavailable), error
        assert error.message == "the service is shutting down"
        assert STATUS[error.refusal].retryable
        assert requests_counted(registry, "http", signal_.value, "unavailable") == 1
    assert stored_span_ids(tmp_path / "closed.duckdb") == []
