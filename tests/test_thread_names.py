"""The service's threads carry their names into the kernel, where `top -H` and `ps -L` read them."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import grpc
from builders import request, span
from serverproc import ServerProcess
from waiting import join

from model.thread_names import kernel_name, name_this_thread

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def kernel_names(pid: int) -> list[str]:
    return [comm.read_text().strip() for comm in Path(f"/proc/{pid}/task").glob("*/comm")]


def test_kernel_names_shorten_the_service_prefix_and_fit_the_kernels_fifteen_bytes() -> None:
    assert kernel_name("tailwatch-writer") == "tw-writer"
    assert kernel_name("tailwatch-decode_1") == "tw-decode_1"
    assert kernel_name("tailwatch-clickhouse-writer") == "tw-clickhouse-w"
    assert kernel_name("asyncio_0") == "asyncio_0"
    assert kernel_name("a-very-long-thread-name") == "a-very-long-thr"
    assert kernel_name("tailwatch-dé" + "x" * 9) == "tw-dé" + "x" * 9  # cut on a character, not inside one


def test_a_thread_that_names_itself_is_seen_under_that_name_by_the_kernel() -> None:
    seen: list[str] = []

    def run() -> None:
        name_this_thread()
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    thread = threading.Thread(target=run, name="tailwatch-probe")
    thread.start()
    join(thread, "the probe thread")
    assert seen == ["tw-probe"]


def test_the_writer_decoders_and_sql_threads_of_a_running_service_carry_their_names(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "names.duckdb", tmp_path / "serve.log") as server:
        server.start()
        with grpc.insecure_channel(server.grpc_target) as ch:
            export = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for _ in range(4):  # enough requests for both decoder threads to start
                export(request([span() for _ in range(10)]).SerializeToString(), timeout=60)
        sql = urllib.request.Request(
            f"http://127.0.0.1:{server.api_port}/v1/sql", data=json.dumps({"sql": "SELECT 1"}).encode(), method="POST"
        )
        urllib.request.urlopen(sql, timeout=60).close()
        assert server.proc is not None
        names = kernel_names(server.proc.pid)
        assert server.terminate() == 0
    assert {"tw-writer", "tw-decode_0", "tw-sql_0"} <= set(names), names
