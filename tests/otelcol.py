"""A real OpenTelemetry Collector for tests: built once by scripts/otelcol, one process per test.

The binary is an ocb build of deploy/otelcol/builder-config.yaml (receivers otlp and prometheus,
processors batch and resource, exporters otlp_grpc and otlp_http), pinned by deploy/otelcol/go.mod
and go.sum and cached outside the repository. Without Go the tests that need it skip on a developer's
machine and fail in CI (tests/receivers.require_or_skip); with Go a failed build fails them.

    with running_collector(config_yaml, tmp_path) as collector:
        ...  # the collector has logged "Everything is ready"; its log is collector.log
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from receivers import require_or_skip
from serverproc import free_port
from waiting import HANG_GUARD, wait_until

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "otelcol"
NO_GO = "no Go toolchain: the real OpenTelemetry Collector cannot be built (scripts/otelcol)"
GO_INSTALL = "apt-get install golang-go (Debian/Ubuntu), or Go from https://go.dev/dl/, then run scripts/otelcol"
# A hang guard for the first build on a cold module cache (it downloads and compiles a few hundred
# modules: minutes on two cores); a cached binary returns at once.
BUILD_TIMEOUT = 45 * 60.0
# The collector logs this (level info) once every pipeline has started, so its receivers are listening.
READY = "Everything is ready"
STOP_GRACE = 10.0
LOG_TAIL_LINES = 80

# The collector's own metrics on a port of our choosing instead of the default localhost:8888, so that
# tests can run side by side. The caller's config is merged over this one and may replace it.
TELEMETRY_CONFIG = """\
service:
  telemetry:
    metrics:
      readers:
        - pull:
            exporter:
              prometheus:
                host: 127.0.0.1
                port: {port}
                without_scope_info: true
                without_units: true
                without_type_suffix: true
"""


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


@functools.cache
def _build() -> Path | str:
    """Run scripts/otelcol once per session: the binary's path, or why the build failed."""
    proc = subprocess.Popen(
        ["bash", str(SCRIPT)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # so a timeout can stop the go processes under it too
    )
    try:
        out, err = proc.communicate(timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=HANG_GUARD)
        return f"scripts/otelcol had not finished after {BUILD_TIMEOUT:g} s:\n{tail(err)}"
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return f"scripts/otelcol failed with exit status {proc.returncode}:\n{tail(err)}"
    return Path(lines[-1])


def collector_binary() -> Path:
    """The pinned collector binary, built on first use; skips without Go, fails if the build fails."""
    if shutil.which("go") is None:
        require_or_skip(NO_GO, GO_INSTALL)
    built = _build()
    if isinstance(built, str):
        pytest.fail(built, pytrace=False)
    return built


@dataclass(frozen=True)
class RunningCollector:
    process: subprocess.Popen[bytes]
    config: Path
    log: Path
    telemetry_port: int

    @property
    def metrics_url(self) -> str:
        """The collector's own metrics (Prometheus text), e.g. otelcol_exporter_sent_metric_points."""
        return f"http://127.0.0.1:{self.telemetry_port}/metrics"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"the collector exited with {self.process.returncode} before it was ready", pytrace=False)
        return READY in self.log_text()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(STOP_GRACE)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_GRACE)


@contextmanager
def running_collector(config_yaml: str, tmp_path: Path) -> Iterator[RunningCollector]:
    """Run the collector with `config_yaml` until the block ends; its log is shown if the block fails.

    Entering waits (at most 60 s) until the collector logs that it is ready, so keep
    service.telemetry.logs.level at info or below. On exit it gets SIGTERM, and SIGKILL 10 s later.
    The collector dying before the block ends fails the test.
    """
    binary = collector_binary()
    config = tmp_path / "otelcol.yaml"
    config.write_text(config_yaml)
    telemetry = tmp_path / "otelcol-telemetry.yaml"
    port = free_port()
    telemetry.write_text(TELEMETRY_CONFIG.format(port=port))
    log = tmp_path / "otelcol.log"
    with log.open("wb") as sink:
        # Later --config sources are merged over earlier ones: the test's config wins.
        process = subprocess.Popen(
            [str(binary), "--config", f"file:{telemetry}", "--config", f"file:{config}"],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    collector = RunningCollector(process, config, log, port)
    try:
        wait_until(collector._ready, f"the collector to log {READY!r} ({log})")
        yield collector
        if process.poll() is not None:
            pytest.fail(f"the collector exited with {process.returncode} during the test", pytrace=False)
    except pytest.skip.Exception:
        _stop(process)
        raise
    except BaseException:
        _stop(process)
        print(f"collector log ({log}), last {LOG_TAIL_LINES} lines:\n{tail(collector.log_text())}")
        raise
    _stop(process)
