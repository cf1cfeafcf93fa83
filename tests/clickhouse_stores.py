"""ClickHouse stores for tests: chDB in-process always, and a real server when TAILWATCH_TEST_CLICKHOUSE_URL names one.

chDB holds one data directory per process, so every store of a test run is its own database in one
directory. A server run (`TAILWATCH_TEST_CLICKHOUSE_URL=http://user:password@host:8123`) gets a fresh
database per store too; those are dropped when the store closes.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from storage.clickhouse.backend import ClickHouseStorage

CHDB_DIR = Path(tempfile.mkdtemp(prefix="tw-chdb-"))
atexit.register(shutil.rmtree, CHDB_DIR, True)
SERVER_URL = os.environ.get("TAILWATCH_TEST_CLICKHOUSE_URL")
_numbers = itertools.count()


def database_name(label: str) -> str:
    return f"t{next(_numbers)}_{re.sub(r'[^a-z0-9_]', '_', label.lower())[:40]}"


def chdb_dsn(label: str = "store") -> str:
    return f"chdb://{CHDB_DIR}?database={database_name(label)}"


def server_dsn(label: str = "store") -> str:
    assert SERVER_URL, "TAILWATCH_TEST_CLICKHOUSE_URL is not set"
    return f"{SERVER_URL.rstrip('/')}/{database_name(label)}"


def open_chdb(label: str = "store", **options: Any) -> ClickHouseStorage:
    return ClickHouseStorage.open(chdb_dsn(label), **options)


# Backends for parametrized suites: chDB always, the server when one is named.
OPENERS: dict[str, Callable[[str], ClickHouseStorage]] = {"chdb": open_chdb}
if SERVER_URL:
    OPENERS["clickhouse"] = lambda label: ClickHouseStorage.open(server_dsn(label))
