"""docs/sql.md cannot rot: every cookbook query, and the notebook helper, run through POST /v1/sql against a
service seeded with simulated faults and evaluated by the detectors, and each returns rows."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import RunningService, service_settings

from simulator import simulate

DOC = (Path(__file__).parent.parent / "docs" / "sql.md").read_text()
SCENARIOS = ["morning_burst", "noisy_neighbor", "replica_drift", "kv_eviction"]


def blocks(section: str, language: str) -> list[str]:
    body = DOC.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.DOTALL)


COOKBOOK = blocks("Cookbook", "sql")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    """Four faults, twenty minutes apart, each evaluated as the scheduler would at its end."""
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    db = tmp_path_factory.mktemp("cookbook") / "tailwatch.duckdb"
    with RunningService(service_settings(db)) as svc:
        assert svc.service.detection is not None
        for i, name in enumerate(SCENARIOS):
            at = end - timedelta(minutes=20 * (len(SCENARIOS) - 1 - i))
            simulate.run(
                [name], endpoint=svc.grpc_target, protocol="grpc", seed=5, end=at, history_hours=0.25,
                history_rate=0.2, rate=3.0,
            )  # fmt: skip
            svc.wait_committed()
            svc.service.detection.run(at + timedelta(seconds=30))
        yield svc


def post(svc: RunningService, statement: str) -> dict[str, Any]:
    body = json.dumps({"sql": statement}).encode()
    req = urllib.request.Request(f"{svc.api_url}/v1/sql", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as response:
        doc: dict[str, Any] = json.loads(response.read())
        return doc


def test_the_cookbook_has_a_query_for_each_analysis_the_views_serve() -> None:
    used = " ".join(COOKBOOK)
    for view in ("token_latency_5m", "cache_curve_hourly", "tenant_latency_5m", "traffic_pattern_hourly"):
        assert f"{view}_between(" in used, view
    assert "replica_comparison_hourly_between(" in used and len(COOKBOOK) >= 10


@pytest.mark.parametrize("statement", COOKBOOK, ids=[f"query{i}" for i in range(len(COOKBOOK))])
def test_every_cookbook_query_runs_and_returns_rows(seeded: RunningService, statement: str) -> None:
    doc = post(seeded, statement)
    assert doc["rows"], f"no rows from:\n{statement}"
    assert doc["truncated"] is False


def test_the_notebook_helper_returns_a_polars_frame(seeded: RunningService) -> None:
    [helper] = [b for b in blocks("Running queries", "python") if "def sql(" in b]
    namespace: dict[str, Any] = {}
    exec(helper.replace("http://127.0.0.1:4319", seeded.api_url), namespace)
    frame = namespace["p99"]
    assert frame.height > 0 and "tpot_p99_ms" in frame.columns
