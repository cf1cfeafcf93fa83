"""`tailwatch simulate`'s run: a run's requests backfilled through one emitter, then live traffic."""

from __future__ import annotations

import hashlib
import random
import sys
import time
from datetime import UTC, datetime
from typing import Protocol

from simulator.attributes_emitter import AttributesSender
from simulator.engine_metrics import LIVE_LAG_NS
from simulator.model import Request, healthy, unix_ns
from simulator.scenarios import requests
from simulator.vllm_emitter import VllmSender

EMITTERS = ("attributes", "vllm")


def id_seed(seed: int, names: list[str], end: datetime, emitter: str = "attributes") -> int:
    """The ids' seed: the same run repeats its ids (a replay is deduplicated as a retry), while another
    scenario, end time or emitter with the same --seed gets ids of its own instead of being dropped as
    duplicates."""
    key = f"{seed}|{','.join(sorted(names))}|{end.isoformat()}".encode()
    if emitter != "attributes":
        key += f"|{emitter}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big")


class Emitter(Protocol):
    def send(self, r: Request) -> None: ...

    def tick(self, now_ns: int) -> None: ...

    def close(self) -> bool: ...


def progress(done: int, total: int, label: str) -> None:
    if sys.stderr.isatty() or done == total:
        width = 30
        filled = width * done // max(total, 1)
        print(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="", file=sys.stderr)
        if done == total:
            print(file=sys.stderr)


def run(
    names: list[str], *, endpoint: str, protocol: str, seed: int, end: datetime, history_hours: float,
    history_rate: float, rate: float, live_seconds: float = 0.0, emitter: str = "attributes",
) -> int:  # fmt: skip
    """Backfill history and the fault window ending at `end`, then stream live traffic; returns the requests
    sent (one span each with the attributes emitter; two spans, their scores and the engines' metrics with
    the vllm emitter)."""
    if emitter not in EMITTERS:
        raise ValueError(f"unknown emitter {emitter!r}; known: {', '.join(EMITTERS)}")
    batch = requests(
        names, seed=seed, end=end, history_hours=history_hours, history_rate=history_rate, rate=rate, emitter=emitter
    )
    ids = id_seed(seed, names, end, emitter)
    sender: Emitter = (
        AttributesSender(endpoint, protocol, ids)
        if emitter == "attributes"
        else VllmSender(endpoint, protocol, ids, seed, unix_ns(end))
    )
    for i, r in enumerate(batch, 1):
        sender.send(r)
        if i % 500 == 0 or i == len(batch):
            progress(i, len(batch), "backfill")
    sent = len(batch)
    if live_seconds > 0:
        sender.tick(unix_ns(end))
        rng = random.Random(seed + 1)
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < live_seconds:
            time.sleep(rng.expovariate(rate))
            sender.send(healthy(rng, datetime.now(UTC).replace(tzinfo=None)))
            sender.tick(time.time_ns() - LIVE_LAG_NS)
            sent += 1
            progress(int(elapsed), int(live_seconds), "live")
        progress(int(live_seconds), int(live_seconds), "live")
    if not sender.close():
        raise RuntimeError(
            "some spans, scores or metrics could not be exported; is Tailwatch listening at " + endpoint + "?"
        )
    return sent
