"""The simulator's request model and what its modules share: the fleet, a healthy request, and where the
Collector's scrapes fall."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEPLOYMENT = "vllm-llama8b"
REPLICAS = ("r0", "r1", "r2", "r3")
VERSION = "1.4.2"
TENANTS = {"acme": 0.5, "globex": 0.3, "initech": 0.2}
NS = 1_000_000_000
INTERVAL_NS = 5 * NS  # the Collector's scrape_interval for the engines' /metrics


def pod(replica: str) -> str:
    """The replica's pod name: what operators call it, and the key its spans and metrics share."""
    return f"{DEPLOYMENT}-{replica}"


@dataclass
class Request:
    """One LLM request as the serving engine saw it."""

    end: datetime
    tenant: str
    replica: str
    prompt_tokens: int
    output_tokens: int
    cache_hit_ratio: float
    queue_ms: float
    prefill_ms: float
    tpot_ms: float
    queue_depth: int
    replica_count: int
    prefill_in_batch: int
    quantization: str
    scores: dict[str, float] = field(default_factory=dict)
    # Engine state a scenario plants; only the vllm emitter sends it (in the replica's metrics).
    kv_cache_usage: float | None = None  # the replica's KV usage while this request ran
    preemptions: int = 0
    version: str = VERSION  # the service.version its replica's resource carries

    @property
    def e2e_ms(self) -> float:
        return self.queue_ms + self.prefill_ms + self.tpot_ms * (self.output_tokens - 1)

    def span_ns(self) -> tuple[int, int]:
        """Arrival and finish in Unix nanoseconds, as both emitters send them."""
        end_ns = unix_ns(self.end)
        return end_ns - int(self.e2e_ms * 1e6), end_ns


def healthy(
    rng: random.Random, end: datetime, tenants: dict[str, float] = TENANTS, replicas: tuple[str, ...] = REPLICAS
) -> Request:
    """A request from a cluster with headroom: warm cache, short queues, steady decode."""
    prompt = int(min(30_000, max(50, rng.lognormvariate(math.log(1200), 0.6))))
    output = rng.randint(60, 700)
    return Request(
        end=end,
        tenant=rng.choices(list(tenants), weights=list(tenants.values()))[0],
        replica=rng.choice(replicas),
        prompt_tokens=prompt,
        output_tokens=output,
        cache_hit_ratio=min(0.99, max(0.86, rng.gauss(0.93, 0.03))),
        queue_ms=rng.uniform(2, 20),
        prefill_ms=40 + prompt / 25,
        tpot_ms=max(6.0, rng.gauss(12.0, 1.2)),
        queue_depth=rng.randint(1, 5),
        replica_count=len(replicas),
        prefill_in_batch=rng.randint(200, 2500),
        quantization="fp16",
        scores={"json_adherence": draw_score(rng, 0.88), "groundedness": draw_score(rng, 0.90)},
    )


def draw_score(rng: random.Random, mean: float) -> float:
    """A quality score near `mean`, as a judge gives it, within [0, 1]."""
    return min(1.0, max(0.0, rng.gauss(mean, 0.03)))


def unix_ns(at: datetime) -> int:
    """A naive UTC time in Unix nanoseconds, as spans and metric points carry it."""
    return int(at.replace(tzinfo=UTC).timestamp() * NS)


def scrape_offset_ns(replica: str) -> int:
    """Where in each interval the Collector scrapes a replica: its targets are spread over the interval."""
    return REPLICAS.index(replica) * INTERVAL_NS // len(REPLICAS) if replica in REPLICAS else 0


def scrape_floor(replica: str, at_ns: int, anchor_ns: int = 0) -> int:
    """The replica's last scrape time at or before `at_ns`. Scrapes fall on `anchor_ns` (the fault window's
    end) plus the replica's offset, every interval: placed by the run, not the wall clock, so a seed
    repeats which requests a scrape sees."""
    return at_ns - (at_ns - anchor_ns - scrape_offset_ns(replica)) % INTERVAL_NS
