"""`tailwatch serve` as a real child process, for tests that kill or signal it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    def __init__(self, db: Path, log: Path, **env: str) -> None:
        self.db = db
        self.log = log
        self.grpc_port, self.http_port, self.api_port = free_port(), free_port(), free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TAILWATCH_")} | env
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = 60) -> ServerProcess:
        cmd = [
            sys.executable, "-m", "tailwatch", "serve", "--db", str(self.db),
            "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port), "--api-port", str(self.api_port),
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tailwatch serve exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"tailwatch serve not ready after {timeout}s:\n{self.log.read_text()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def descendants(self) -> set[int]:
        """The pids of every process the server started, and theirs (decoder processes, fork server)."""
        assert self.proc is not None
        found: set[int] = set()
        parents = [self.proc.pid]
        while parents:
            pid = parents.pop()
            for children in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    kids = {int(k) for k in children.read_text().split()}
                except OSError:  # the thread or the process ended meanwhile
                    continue
                parents.extend(kids - found)
                found |= kids
        return found

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code; fails the test (and kills the process) if it has not exited in time."""
        self.send_sigterm()
        return self.wait(timeout)

    def send_sigterm(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60) -> int:
        """The exit code; fails the test (and kills the process) if it has not exited within `timeout` s."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"tailwatch serve had not exited after {timeout:g} s:\n{self.log.read_text()}")

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        """A test that failed half-way leaves no server behind."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
