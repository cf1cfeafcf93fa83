"""What a decoder worker process runs. Its own module so that a worker imports the decoder alone, not the
pipeline's storage port (Polars): 121 MiB a worker instead of 218 (docs/benchmarks.md)."""

from __future__ import annotations

import os
import select
import threading
import time
from functools import cache, partial

from collector.decode import Decoded, Decoder, Encoding, Signal, decode
from collector.engine_names import EngineNames
from collector.kept_out_libraries import keep_out
from collector.normalize import NormalizeConfig, Plan, build_plan


@cache
def _plan(config: NormalizeConfig) -> Plan:
    # Built once per process (decoder workers included): the config is sent, the plan is not.
    return build_plan(config)


def decode_request(
    signal: Signal,
    payload: bytes,
    encoding: Encoding,
    config: NormalizeConfig,
    names: EngineNames,
    *,
    decoder: Decoder,
    split_attributes: bool = False,
) -> Decoded:
    """The decoder entry point run in the worker processes."""
    return decode(signal, payload, encoding, _plan(config), names, decoder=decoder, split_attributes=split_attributes)


def start_worker(service_pid: int) -> None:
    """Worker initializer: never load pandas (collector/kept_out_libraries.py), and end with the service."""
    keep_out()
    exit_with(service_pid)


def exit_with(service_pid: int) -> None:
    """End this process when the service process ends, however it ends.

    A worker holds both ends of its call queue and the fork server's liveness pipe, so after a kill -9 of
    the service nothing it waits on reaches EOF: without this the worker, and the fork server waiting for
    it, would live on as orphans holding their memory.
    """
    try:
        watch = partial(_exit_when_readable, os.pidfd_open(service_pid))
    except ProcessLookupError:  # the service ended before this worker started
        os._exit(0)
    except (AttributeError, OSError):  # no pidfd (not Linux, or a kernel before 5.3): ask once a second
        watch = partial(_exit_when_gone, service_pid)
    threading.Thread(target=watch, name="tailwatch-service-watch", daemon=True).start()


def _exit_when_readable(pidfd: int) -> None:
    select.select([pidfd], [], [])  # a process's pidfd becomes readable when it exits
    os._exit(0)


def _exit_when_gone(pid: int) -> None:
    while True:
        try:
            os.kill(pid, 0)  # signal 0 only asks whether the process exists
        except ProcessLookupError:
            os._exit(0)
        time.sleep(1)
