"""The service's threads under their own names in `top -H`, `ps -L` and `/proc/PID/task/*/comm`.

Python 3.11 names a thread for Python only: the kernel shows every thread under the process's name, so an
operator watching a busy service, or a benchmark reading each thread's CPU, cannot tell the writer from a
decoder. The kernel keeps at most 15 bytes of a thread's name.
"""

from __future__ import annotations

import contextlib
import threading

PREFIX = "tailwatch-"
_KERNEL_NAME_BYTES = 15


def kernel_name(name: str) -> str:
    """The kernel's name for a thread Python calls `name`: `tailwatch-writer` is `tw-writer`."""
    short = "tw-" + name.removeprefix(PREFIX) if name.startswith(PREFIX) else name
    return short.encode()[:_KERNEL_NAME_BYTES].decode(errors="ignore")


def name_this_thread() -> None:
    """Give the calling thread its Python name in the kernel too; where there is no /proc, nothing."""
    with (
        contextlib.suppress(OSError),
        open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm,
    ):
        comm.write(kernel_name(threading.current_thread().name))
