"""`tailwatch serve` on a damaged database file: one clear error naming the file and what to do, exit code 4,
and the file left exactly as it was (never a silent new empty store in its place)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

from storage.duckdb.backend import DuckDBStorage


def healthy(db: Path) -> None:
    DuckDBStorage.open(db).close()


def garbage_header(db: Path) -> None:
    healthy(db)
    with db.open("r+b") as f:
        f.write(b"\x00garbage" * 64)


def truncated(db: Path) -> None:
    healthy(db)
    with db.open("r+b") as f:
        f.truncate(5000)


def flipped_block(db: Path) -> None:
    healthy(db)
    with db.open("r+b") as f:
        f.seek(20_000)
        f.write(bytes(b ^ 0xFF for b in f.read(4096)))


def not_a_database(db: Path) -> None:
    db.write_bytes(b"spans,and,more\n" * 100)


def empty(db: Path) -> None:
    db.write_bytes(b"")


def damaged_wal(db: Path) -> None:
    """A crash left committed rows in the WAL, and the WAL was then damaged."""
    healthy(db)
    con = duckdb.connect(str(db), config={"checkpoint_threshold": "1GB"})
    con.execute("CREATE TABLE scratch AS SELECT range AS i FROM range(1000)")
    wal = Path(f"{db}.wal")
    kept = wal.read_bytes()  # as a crash leaves it: written, not yet checkpointed
    con.close()
    wal.write_bytes(kept[:40] + bytes(b ^ 0xFF for b in kept[40:120]) + kept[120:])


@pytest.mark.parametrize(
    "damage", [garbage_header, truncated, flipped_block, not_a_database, empty, damaged_wal], ids=lambda f: f.__name__
)
def test_serve_refuses_a_damaged_file_with_what_to_do_and_leaves_it_as_it_was(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    db = tmp_path / "tailwatch.duckdb"
    damage(db)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILWATCH_")}
    done = subprocess.run(
        [sys.executable, "-m", "tailwatch", "serve", "--db", str(db), "--grpc-port", "0", "--http-port", "0",
         "--api-port", "0"],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 4, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"tailwatch: {db} exists but cannot be opened"), done.stderr
    assert "Restore it from a backup" in last and "will not replace it with an empty store" in last
    assert "Traceback" not in done.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing replaced, nothing added


def test_a_missing_file_is_still_a_new_store(tmp_path: Path) -> None:
    db = tmp_path / "new" / "tailwatch.duckdb"
    storage = DuckDBStorage.open(db)
    storage.close()
    assert db.exists()
