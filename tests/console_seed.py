"""A service seeded for the console: several planted faults at once, and the detectors evaluated every five minutes
over the history, so every page has curves over time to draw.

`python tests/console_seed.py DB` writes such a database for a look at the console by hand
(then `tailwatch serve --db DB`)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from conftest import RunningService, service_settings

from simulator import simulate

# Two fault windows, so one cause does not drown the others: per-token tails half an hour before the end, then
# a cache cliff, a tenant behind another's burst, a drifting replica, long contexts and a worse quantized variant
# in the last five minutes.
EARLY = ["decode_jitter"]
LATE = ["kv_eviction", "noisy_neighbor", "replica_drift", "long_context", "quantization_regression"]
SEED = 11
HISTORY_HOURS = 3.0
EARLY_BEFORE = timedelta(minutes=30)
STEP = timedelta(minutes=5)
RATES: dict[str, Any] = {"history_rate": 1.0, "rate": 3.0}


def fault_end() -> datetime:
    """The end of the last fault window: the last five-minute mark at least a minute ago, so passes align."""
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=1)
    return now.replace(second=0) - timedelta(minutes=now.minute % 5)


def seed(svc: RunningService, end: datetime) -> None:
    """Send the scenarios through the OTel SDK exporter and evaluate the detectors at every five-minute mark of
    the history, as the scheduler would have.

    The early window's spans carry everything as attributes (vLLM's span has no batch composition, so the
    per-token tail would have no reason); the late ones arrive as a real fleet sends them: vLLM's spans under
    a gateway's, scores as log records, and the replicas' engine metrics, which the request view shows."""
    early = end - EARLY_BEFORE
    simulate.run(
        EARLY, endpoint=svc.grpc_target, protocol="grpc", seed=SEED, end=early, history_hours=HISTORY_HOURS, **RATES
    )
    # The late history starts where the early fault window ended: one continuous stream of traffic.
    late_history = (EARLY_BEFORE - STEP).total_seconds() / 3600
    simulate.run(
        LATE, endpoint=svc.grpc_target, protocol="grpc", emitter="vllm", seed=SEED + 1, end=end,
        history_hours=late_history, **RATES,
    )  # fmt: skip
    svc.wait_committed()
    detection = svc.service.detection
    assert detection is not None
    at = early - timedelta(hours=HISTORY_HOURS) + STEP
    while at <= end:
        # Each detector's window ends its settle time before the pass: a pass that late puts the fault in it.
        detection.run(at + timedelta(seconds=30))
        at += STEP


def main(db: str) -> None:
    end = fault_end()
    with RunningService(service_settings(Path(db))) as svc:
        seed(svc, end)
    print(f"seeded {db}; fault window ends {end:%Y-%m-%d %H:%M} UTC")


if __name__ == "__main__":
    main(sys.argv[1])
