"""Real receivers for alert delivery tests: a local webhook endpoint and a Prometheus Alertmanager."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest
from serverproc import free_port
from waiting import wait_until


class WebhookReceiver:
    """Collects JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()


def in_ci() -> bool:
    """CI sets CI=true. There a missing real component fails its test instead of skipping it."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_or_skip(missing: str, how_to_install: str) -> NoReturn:
    """A real component a test needs is not here: skip on a developer's machine, fail in CI."""
    message = f"{missing}; install it with: {how_to_install}"
    if in_ci():
        pytest.fail(f"{message} (in CI this is a failure, not a skip)", pytrace=False)
    pytest.skip(message)


def import_or_skip(module: str, how_to_install: str) -> ModuleType:
    """pytest.importorskip that fails in CI: a test library the suite relies on must be installed there."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        require_or_skip(f"the Python module {module} cannot be imported ({exc})", how_to_install)


TEST_EXTRA = "scripts/setup test (installs the project's [test] extra into .venv)"

NATIVE_INSTALL = "scripts/setup test, with cargo (Rust) on PATH: it builds native/ into .venv"

ALERTMANAGER_INSTALL = (
    "apt-get install prometheus-alertmanager (Debian/Ubuntu; .ci/run does this in CI), "
    "or put the alertmanager binary from https://prometheus.io/download/ on PATH"
)


def alertmanager_binary() -> str | None:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


class Alertmanager:
    """A real Alertmanager on loopback, with a config that routes everything nowhere (or `config`, YAML)."""

    def __init__(
        self, workdir: Path, config_text: str = "route:\n  receiver: blackhole\nreceivers:\n  - name: blackhole\n"
    ) -> None:
        binary = alertmanager_binary()
        if binary is None:
            require_or_skip(
                "Prometheus Alertmanager (prometheus-alertmanager or alertmanager) is not on PATH",
                ALERTMANAGER_INSTALL,
            )
        config = workdir / "alertmanager.yml"
        config.write_text(config_text)
        self._log = workdir / "alertmanager.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.path={workdir / 'am-data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        try:
            wait_until(self._ready, f"alertmanager ({binary}) to answer {self.url}/-/ready")
        except BaseException:
            self.close()
            print(f"alertmanager log:\n{self._log.read_text(errors='replace')}")  # shown with the failure
            raise

    def _ready(self) -> bool:
        if self._proc.poll() is not None:
            pytest.fail(f"alertmanager exited with {self._proc.returncode} before it was ready (its log is below)")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1):
                return True
        except OSError:
            return False

    def alerts(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as resp:
            result: list[dict[str, Any]] = json.loads(resp.read())
            return result

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
