"""The reliability proofs of docs/reliability.md in short: kill -9 cycles with the ingest spool answering, and a
soak with the detectors running on their schedule. Each runs the benchmark's own code (bench/crash_cycles.py,
bench/soak.py) against a real `tailwatch serve` and checks every acknowledged span by its id."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from acknowledged import metrics, total
from serverproc import ServerProcess
from waiting import wait_until

from detectors.registry import REGISTRY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import crash_cycles
import soak

pytestmark = pytest.mark.slow

REQUESTS_BEFORE_A_KILL = 30


def spool_acknowledged(server: ServerProcess) -> float:
    return total(metrics(server.api_port), "tailwatch_spool_acknowledged_spans_total")


def under_load_with_spool_answers(exporter: crash_cycles.Exporter, server: ServerProcess) -> None:
    """Let the senders get more requests acknowledged, some of them from this process's spool, then return."""
    wanted = len(exporter.acked) + REQUESTS_BEFORE_A_KILL
    wait_until(
        lambda: len(exporter.acked) >= wanted and spool_acknowledged(server) > 0,
        f"{REQUESTS_BEFORE_A_KILL} more acknowledged requests, some answered from the spool",
        timeout=120,
    )


@pytest.mark.parametrize("in_flight", [4, 128])
def test_kill_9_cycles_with_the_spool_answering_store_every_acknowledged_span_exactly_once(
    tmp_path: Path, in_flight: int
) -> None:
    # Every trace request spooled (a backlog of 0), so a kill always finds answers given before their commit.
    results = crash_cycles.run(
        tmp_path,
        cycles=2,
        in_flight=in_flight,
        before_kill=under_load_with_spool_answers,
        settings={"TAILWATCH_INGEST__SPOOL_BACKLOG_SPANS": "0"},
        say=lambda _: None,
    )

    assert not results["failures"], "; ".join(results["failures"])
    acknowledged = results["requests_acknowledged"]
    assert acknowledged >= 3 * REQUESTS_BEFORE_A_KILL
    assert results["acknowledged_spans"] == acknowledged * crash_cycles.SPANS_PER_REQUEST
    assert (results["lost"], results["stored_twice"]) == (0, 0)
    assert results["stored_spans"] == results["acknowledged_spans"] + results["stored_unacknowledged"]
    assert [cycle["spool_acknowledged_spans"] > 0 for cycle in results["per_cycle"]] == [True, True]
    assert results["exit_code"] == 0


def test_a_short_soak_evaluates_every_scheduled_pass_and_stores_every_acknowledged_span_exactly_once(
    tmp_path: Path,
) -> None:
    # Every detector each minute, so two minutes hold a scheduled pass; the rate is the hour-long soak's.
    results = soak.run(tmp_path, minutes=2, rate=3000, detect_every=60, say=lambda _: None)

    assert not results["failures"], "; ".join(results["failures"])
    # Nothing dropped at the exporter: every request offered was acknowledged, and stored, once.
    offered = results["requests_offered"]
    assert offered >= 100
    assert results["requests_acknowledged"] == offered
    assert results["acknowledged_spans"] == results["stored_spans"] == offered * soak.SPANS
    assert (results["lost"], results["stored_twice"], results["stored_unacknowledged"]) == (0, 0, 0)
    passes = [p for p in results["passes"] if not p["caught_up"]]
    assert passes, "no scheduled detection pass ran"
    assert [(p["ok"], p["too_large"], p["error"]) for p in passes] == [(len(REGISTRY), 0, 0)] * len(passes)
    # The first requests' spans may end before the window of a grid time before the first tick does: a later tick
    # catches that window up, as history, for the detectors whose window (settle times differ) holds them, never
    # for clusters, which explain the alerts firing now.
    for p in results["passes"]:
        if p["caught_up"]:
            assert p["detectors"] and "clusters" not in p["detectors"]
            assert set(p["detectors"]) <= set(REGISTRY)
            assert (p["ok"], p["too_large"], p["error"]) == (len(p["detectors"]), 0, 0)
    # A pass in the first half-minute finds its window (which ends 30 s before it) empty; a later one may not.
    assert any(p["window_requests"] > 0 for p in passes)
    assert results["exit_code"] == 0
