"""Settings: one YAML file, TAILWATCH_* env and flags, in that order of precedence; unknown keys named."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RunningService, service_settings
from waiting import HANG_GUARD

import collector.decode
from collector import native_walk
from collector.decode import DEFAULT_DECODER, Decoder
from tailwatch.settings import SettingsError, load_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tailwatch.yaml"
    path.write_text(text)
    return path


def test_flags_beat_env_which_beats_the_file(tmp_path: Path) -> None:
    cfg = write(tmp_path, "http_port: 5000\ngrpc_port: 5001\napi_port: 5002\ningest:\n  decode_workers: 3\n")
    env = {"TAILWATCH_HTTP_PORT": "6000", "TAILWATCH_GRPC_PORT": "6001", "TAILWATCH_INGEST__DECODE_WORKERS": "1"}
    s = load_settings(cfg, {"http_port": 7000}, environ=env)
    assert (s.http_port, s.grpc_port, s.api_port, s.ingest.decode_workers) == (7000, 6001, 5002, 1)


def test_decoding_is_in_threads_for_the_compiled_decoder_and_in_two_processes_for_python() -> None:
    if DEFAULT_DECODER is Decoder.NATIVE:
        assert load_settings(environ={}).ingest.decoder_processes() == 0
    python = load_settings(environ={"TAILWATCH_INGEST__DECODER": "python"}).ingest
    assert (python.decode_workers, python.decoder_processes()) == ("auto", 2)
    chosen = {"TAILWATCH_INGEST__DECODER": "python", "TAILWATCH_INGEST__DECODE_WORKERS": "0"}
    assert load_settings(environ=chosen).ingest.decoder_processes() == 0


@pytest.mark.parametrize("value", ["-1", "65", "2.5", "threads", "true"])
def test_decode_workers_other_than_a_count_or_auto_is_refused_with_what_it_takes(value: str) -> None:
    refused = r"'ingest\.decode_workers'.* from 0 to 64 decoder processes \(0: threads\), or auto"
    with pytest.raises(SettingsError, match=refused):
        load_settings(environ={"TAILWATCH_INGEST__DECODE_WORKERS": value})


def test_duckdb_threads_are_one_on_two_cores_and_two_above(monkeypatch: pytest.MonkeyPatch) -> None:
    storage = load_settings(environ={}).storage
    assert storage.threads == "auto"
    for cores, threads in [(1, 1), (2, 1), (3, 2), (64, 2)]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        assert storage.duckdb_threads() == threads
    assert load_settings(environ={"TAILWATCH_STORAGE__THREADS": "4"}).storage.duckdb_threads() == 4


def test_the_services_duckdb_runs_with_the_threads_the_setting_resolves_to(tmp_path: Path) -> None:
    for threads in ["auto", 3]:
        settings = service_settings(tmp_path / f"{threads}.duckdb", storage={"threads": threads})
        with RunningService(settings) as svc:
            assert svc.rows("SELECT current_setting('threads')") == [(settings.storage.duckdb_threads(),)]


@pytest.mark.parametrize("value", ["0", "257", "2.5", "many"])
def test_storage_threads_other_than_a_count_or_auto_is_refused_with_what_it_takes(value: str) -> None:
    with pytest.raises(SettingsError, match=r"'storage\.threads'.* from 1 to 256 DuckDB threads, or auto"):
        load_settings(environ={"TAILWATCH_STORAGE__THREADS": value})


def test_tailwatch_db_names_the_database_file() -> None:
    assert load_settings(environ={"TAILWATCH_DB": "/data/x.duckdb"}).db == Path("/data/x.duckdb")


def test_unknown_key_in_the_file_is_named(tmp_path: Path) -> None:
    cfg = write(tmp_path, "ingest:\n  decode_wrkers: 3\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'ingest\.decode_wrkers'"):
        load_settings(cfg, environ={})


def test_asking_for_the_compiled_decoder_where_it_is_not_installed_is_a_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native_walk, "AVAILABLE", False)
    monkeypatch.setattr(collector.decode, "DEFAULT_DECODER", Decoder.PYTHON)
    cfg = write(tmp_path, "ingest:\n  decoder: native\n")
    with pytest.raises(SettingsError, match=r"ingest\.decoder is 'native' but the compiled decoder is not installed"):
        load_settings(cfg, environ={})
    assert load_settings(write(tmp_path, "ingest:\n  decoder: auto\n"), environ={}).ingest.trace_decoder() == (
        Decoder.PYTHON
    )


def test_unknown_env_var_is_named_with_the_known_ones() -> None:
    with pytest.raises(SettingsError, match=r"unknown environment variable TAILWATCH_HTTTP_PORT.*TAILWATCH_HTTP_PORT"):
        load_settings(environ={"TAILWATCH_HTTTP_PORT": "1"})


def test_invalid_value_says_which_setting_and_what_was_given() -> None:
    with pytest.raises(SettingsError, match=r"setting 'grpc_port' is invalid.*'abc'"):
        load_settings(environ={"TAILWATCH_GRPC_PORT": "abc"})


def test_cli_reports_a_configuration_error_in_one_line_and_exits_2(tmp_path: Path) -> None:
    cfg = write(tmp_path, "htttp_port: 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tailwatch", "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
        timeout=HANG_GUARD,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == f"tailwatch: configuration error: unknown setting 'htttp_port' in {cfg} or the environment"
    )


@pytest.mark.parametrize("flag", ["--grpc-port", "--http-port", "--api-port"])
def test_serve_on_a_port_in_use_says_which_port_in_one_line_and_exits_3(tmp_path: Path, flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--grpc-port": "0", "--http-port": "0", "--api-port": "0", flag: str(port)}
        proc = subprocess.run(
            [sys.executable, "-m", "tailwatch", "serve", "--db", str(tmp_path / "t.duckdb"),
             *(arg for pair in ports.items() for arg in pair)],
            capture_output=True, text=True, check=False, timeout=HANG_GUARD,
        )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("tailwatch:")]
    assert line.startswith("tailwatch: cannot start: ") and str(port) in line
    assert "Traceback" not in proc.stderr


def test_every_command_documents_its_options_in_help() -> None:
    for args in ([], ["serve"], ["migrate"]):
        out = subprocess.run(
            [sys.executable, "-m", "tailwatch", *args, "--help"],
            capture_output=True,
            text=True,
            check=True,
            timeout=HANG_GUARD,
        ).stdout
        assert "--db" in out or args == []
