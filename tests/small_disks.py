"""A small filesystem a test can fill: a tmpfs mounted under the test's directory (needs root; skipped
without it, or failed where the real components are required)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from receivers import require_or_skip
from waiting import HANG_GUARD


@contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """`mount` (created) as a tmpfs of `size` (e.g. "24m") for the duration."""
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
        timeout=HANG_GUARD,
    )
    if done.returncode != 0:
        require_or_skip(f"cannot mount a tmpfs (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, timeout=HANG_GUARD)


def resize(mount: Path, size: str) -> None:
    """Grow (or shrink) a mounted tmpfs: space returning to a full disk."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount)], check=True, timeout=HANG_GUARD)
