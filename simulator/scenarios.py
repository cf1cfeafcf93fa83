"""`tailwatch simulate`'s scenarios, each planting one cause in the requests of its fault window, and the
requests of a run: healthy history, then the fault window with every named scenario applied."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from simulator.model import INTERVAL_NS, REPLICAS, Request, draw_score, healthy, pod, scrape_floor, unix_ns

# --- scenarios: each changes requests in the fault window ------------------------------------------

Fault = Callable[[random.Random, Request], Request]


def _decode_jitter(rng: random.Random, r: Request) -> Request:
    # Long prefills land in the decode batches: some requests decode 4x slower beside them.
    if rng.random() < 0.15:
        return replace(r, tpot_ms=r.tpot_ms * 4, prefill_in_batch=rng.randint(6000, 9000))
    return r


def _kv_eviction(rng: random.Random, r: Request) -> Request:
    # Memory pressure evicts prefixes: cache hits fall for half the traffic, and with them quality.
    roll = rng.random()
    if roll < 0.30:
        ratio, quality = rng.uniform(0.05, 0.50), 0.68
    elif roll < 0.50:
        ratio, quality = rng.uniform(0.56, 0.84), 0.81
    else:
        return r
    scores = {"json_adherence": draw_score(rng, quality), "groundedness": draw_score(rng, quality + 0.02)}
    return replace(r, cache_hit_ratio=ratio, prefill_ms=r.prefill_ms * (2 - ratio), scores=scores)


def _replica_drift(rng: random.Random, r: Request) -> Request:
    # One replica loses points on structured output (a bad weight reload, a stale LoRA).
    if r.replica == "r3":
        return replace(r, scores={**r.scores, "json_adherence": draw_score(rng, 0.82)})
    return r


def _quantization_regression(rng: random.Random, r: Request) -> Request:
    # Half the fleet serves an int4 build that calls tools less correctly.
    if r.replica in ("r2", "r3"):
        return replace(r, quantization="int4", scores={**r.scores, "tool_call_correctness": draw_score(rng, 0.80)})
    return replace(r, scores={**r.scores, "tool_call_correctness": draw_score(rng, 0.90)})


def _long_context(rng: random.Random, r: Request) -> Request:
    # Prompts beyond 64k tokens lose grounding.
    if rng.random() < 0.15:
        prompt = rng.randint(66_000, 120_000)
        return replace(
            r,
            prompt_tokens=prompt,
            prefill_ms=40 + prompt / 25,
            scores={**r.scores, "groundedness": draw_score(rng, 0.76)},
        )
    return r


def _tool_flake(rng: random.Random, r: Request) -> Request:
    # 60% of requests call tools, judged pass/fail; calls fail now and then everywhere (8%), and on one
    # replica (a stale adapter) 30% of the time. Measured on the scored requests only, not diluted by the rest.
    if rng.random() >= 0.6:
        return r
    failed = rng.random() < (0.30 if r.replica == "r1" else 0.08)
    return replace(r, scores={**r.scores, "tool_call_success": 0.0 if failed else 1.0})


def _weak_drift(rng: random.Random, r: Request) -> Request:
    # json_adherence is judged pass/fail; it fails 7% of the time fleet-wide and 14% on one replica (a slowly
    # corrupting adapter): seven points, too weak for one five-minute window's exploratory search to call.
    failed = rng.random() < (0.14 if r.replica == "r3" else 0.07)
    return replace(r, scores={**r.scores, "json_adherence": 0.0 if failed else 1.0})


# Three causes at once (three_causes), each on a symptom of its own so none hides another: the noisy
# neighbour's stream (smallco queues behind bigco: latency), two pods out of KV cache (groundedness) and a
# drifting replica (json_adherence).
EVICTING = ("r0", "r1")


def _two_pods_evict_and_one_drifts(rng: random.Random, r: Request) -> Request:
    # Every request on the two pods finds its prefix evicted: hits 0.05-0.45, a KV cache 95%+ full with
    # preemptions (which only the vllm emitter sends, as the pods' metrics), prefill slower, groundedness 0.74
    # against 0.90. r3 loses 0.06 on json_adherence as in replica_drift.
    if r.replica in EVICTING:
        ratio = rng.uniform(0.05, 0.45)
        return replace(
            r,
            cache_hit_ratio=ratio,
            prefill_ms=r.prefill_ms * (2 - ratio),
            kv_cache_usage=rng.uniform(0.95, 0.99),
            preemptions=rng.randint(1, 3),
            scores={**r.scores, "groundedness": draw_score(rng, 0.74)},
        )
    return _replica_drift(rng, r)


# A fault that must agree with the engines' metrics, built per run from the fault window (start, end).
EngineFault = Callable[[random.Random, datetime, datetime], Fault]


def _kv_eviction_episodes(rng: random.Random, start: datetime, end: datetime) -> Fault:
    # kv_eviction as the engine shows it (vllm emitter): memory pressure comes in episodes of whole scrape
    # intervals on one replica (20-50 s), and while one lasts every request the replica serves misses the
    # cache and answers worse. About the shares of attributes mode, in time rather than per request: 30%
    # evicting (hits 0.05-0.45, KV 0.95+, preemptions, scores 0.68), 20% under pressure (hits 0.60-0.80,
    # KV ~0.9, scores 0.81). The joined ratio is the replica's over the request's lifetime, so a request
    # inside an episode gets the episode's ratio, and one at its edge a mix of two.
    start_ns, end_ns = unix_ns(start), unix_ns(end)
    episodes: dict[str, list[tuple[int, int, str, float, float]]] = {}
    for replica in REPLICAS:
        at = scrape_floor(replica, start_ns, end_ns) + INTERVAL_NS
        rows = episodes.setdefault(replica, [])
        while at < end_ns:
            length = rng.randint(4, 10) * INTERVAL_NS
            roll = rng.random()
            if roll < 0.30:
                rows.append((at, at + length, "low", rng.uniform(0.05, 0.45), rng.uniform(0.95, 0.99)))
            elif roll < 0.50:
                rows.append((at, at + length, "medium", rng.uniform(0.60, 0.80), rng.uniform(0.86, 0.93)))
            at += length

    def fault(rng: random.Random, r: Request) -> Request:
        arrival = r.span_ns()[0]
        episode = next((e for e in episodes.get(r.replica, ()) if e[0] <= arrival < e[1]), None)
        if episode is None:
            return r
        _, _, bucket, mean, kv = episode
        ratio = min(0.99, max(0.01, rng.gauss(mean, 0.02)))
        quality = 0.68 if bucket == "low" else 0.81
        scores = {"json_adherence": draw_score(rng, quality), "groundedness": draw_score(rng, quality + 0.02)}
        return replace(
            r,
            cache_hit_ratio=ratio,
            prefill_ms=r.prefill_ms * (2 - ratio),
            scores=scores,
            kv_cache_usage=kv,
            preemptions=rng.randint(0, 2) if bucket == "low" else 0,
        )

    return fault


@dataclass(frozen=True)
class Scenario:
    name: str
    truth: str  # the planted cause and the alert that should catch it
    fault: Fault | None = None
    stream: Callable[[random.Random, datetime, datetime, float], Iterable[Request]] | None = None
    engine_fault: EngineFault | None = None  # replaces `fault` for the vllm emitter
    minutes: float = 5.0  # the fault window's length, at least (the run's window_minutes may be longer)
    history_replicas: tuple[str, ...] = REPLICAS  # the pods serving before the fault window


def _poisson(rng: random.Random, start: datetime, end: datetime, rate: float) -> Iterable[datetime]:
    at = start
    while True:
        at += timedelta(seconds=rng.expovariate(rate))
        if at >= end:
            return
        yield at


def _noisy_neighbor(rng: random.Random, start: datetime, end: datetime, rate: float) -> Iterable[Request]:
    # bigco bursts at ~500 requests a minute with long prefills; smallco's 5 a minute wait behind it.
    for at in _poisson(rng, start, end, rate):
        yield healthy(rng, at)
    for at in _poisson(rng, start, end, 500 / 60):
        r = healthy(rng, at, {"bigco": 1.0})
        yield replace(r, prompt_tokens=r.prompt_tokens * 3, queue_depth=rng.randint(20, 40))
    for at in _poisson(rng, start, end, 5 / 60):
        r = healthy(rng, at, {"smallco": 1.0})
        yield replace(r, queue_ms=r.queue_ms + rng.uniform(8_000, 12_000), queue_depth=rng.randint(20, 40))


def _morning_burst(rng: random.Random, start: datetime, end: datetime, rate: float) -> Iterable[Request]:
    # Traffic jumps 10x for 15 seconds; the autoscaler has not added replicas, queues grow, quality drops.
    burst_start = start + (end - start) / 2
    burst_end = burst_start + timedelta(seconds=15)
    for at in _poisson(rng, start, end, rate):
        yield healthy(rng, at)
    for at in _poisson(rng, burst_start, burst_end, rate * 10):
        r = healthy(rng, at)
        yield replace(
            r,
            queue_depth=rng.randint(60, 90),
            queue_ms=r.queue_ms + rng.uniform(1_000, 4_000),
            scores={"json_adherence": draw_score(rng, 0.70), "groundedness": draw_score(rng, 0.74)},
        )


# A rollout: six pods of 1.4.2 on fp16; at the fault window's start two of them (r4, r5) are replaced by two pods
# of 1.5.0 built on int4 (r6, r7) that answer in JSON less reliably.
BEFORE_ROLLOUT = ("r0", "r1", "r2", "r3", "r4", "r5")
AFTER_ROLLOUT = ("r0", "r1", "r2", "r3", "r6", "r7")
ROLLED_OUT = ("r6", "r7")


def _rollout(rng: random.Random, start: datetime, end: datetime, rate: float) -> Iterable[Request]:
    for at in _poisson(rng, start, end, rate):
        r = healthy(rng, at, replicas=AFTER_ROLLOUT)
        if r.replica in ROLLED_OUT:
            r = replace(r, version="1.5.0", quantization="int4",
                        scores={**r.scores, "json_adherence": draw_score(rng, 0.74)})  # fmt: skip
        yield r


# A scale-up: four pods, then two more of the same build at the fault window's start; quality unchanged.
SCALED_UP = ("r0", "r1", "r2", "r3", "r4", "r5")


def _scale_up(rng: random.Random, start: datetime, end: datetime, rate: float) -> Iterable[Request]:
    for at in _poisson(rng, start, end, rate):
        yield healthy(rng, at, replicas=SCALED_UP)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("steady", "healthy traffic: no detector fires"),
        Scenario(
            "decode_jitter",
            "15% of requests decode 4x slower beside >6000-token prefills: token_latency fires (prefill_burst)",
            _decode_jitter,
        ),
        Scenario(
            "kv_eviction",
            "cache hits fall for half the traffic and quality with them (0.88 / 0.81 / 0.68 by bucket): "
            "cache_curve fires for the low bucket",
            _kv_eviction,
            engine_fault=_kv_eviction_episodes,
        ),
        Scenario(
            "noisy_neighbor",
            "smallco (5 rpm) queues ~10 s behind bigco's 500 rpm burst: tenant_fairness fires for smallco only",
            stream=_noisy_neighbor,
        ),
        Scenario(
            "morning_burst",
            "a 15-second 10x arrival burst, no new replicas; burst requests score 0.70 vs 0.88: traffic_pattern fires",
            stream=_morning_burst,
        ),
        Scenario(
            "replica_drift",
            f"replica {pod('r3')} scores 0.06 lower on json_adherence (replica_skew, part 5)",
            _replica_drift,
        ),
        Scenario(
            "quantization_regression",
            f"int4 replicas {pod('r2')}/{pod('r3')} score 0.10 lower on tool_call_correctness "
            "(quantization_delta, part 5)",
            _quantization_regression,
        ),
        Scenario(
            "long_context", "prompts over 64k tokens lose 0.14 groundedness (context_length, part 5)", _long_context
        ),
        Scenario(
            "tool_flake",
            f"60% of requests make tool calls, judged pass/fail: 8% fail fleet-wide, 30% on {pod('r1')}; "
            "replica_skew fires and a cluster on score:tool_call_success explains it (part 9)",
            _tool_flake,
        ),
        Scenario(
            "weak_drift",
            f"for 15 minutes {pod('r3')} fails a pass/fail json_adherence 14% of the time against 7% on the rest: "
            "replica_skew fires, and its group, tested over the alert's episode, is the cluster that explains it",
            _weak_drift,
            minutes=15.0,
        ),
        Scenario(
            "three_causes",
            f"at once: smallco queues behind bigco's burst (noisy_neighbor), {pod('r0')} and {pod('r1')} run out "
            f"of KV cache (groundedness 0.74), {pod('r3')} drifts on json_adherence (-0.06); the top three "
            "clusters name the three causes",
            _two_pods_evict_and_one_drifts,
            stream=_noisy_neighbor,
        ),
        Scenario(
            "rollout",
            f"six pods of 1.4.2 on fp16; {pod('r4')}/{pod('r5')} are replaced by {pod('r6')}/{pod('r7')} of 1.5.0 on "
            "int4 scoring 0.74 against 0.88 on json_adherence: the rollout is a change, replica_skew and "
            "quantization_delta fire and the incident names the rollout",
            stream=_rollout,
            minutes=15.0,
            history_replicas=BEFORE_ROLLOUT,
        ),
        Scenario(
            "scale_up",
            f"four pods, then {pod('r4')}/{pod('r5')} of the same build: a scale change, no detector fires",
            stream=_scale_up,
            minutes=17.0,
        ),
    )
}


def requests(
    names: list[str], *, seed: int, end: datetime, history_hours: float, history_rate: float, rate: float,
    window_minutes: float = 5.0, emitter: str = "attributes",
) -> list[Request]:  # fmt: skip
    """History (healthy) then the fault window with every named scenario applied, sorted by end time.
    For the vllm emitter a scenario's `engine_fault`, when it has one, replaces its per-request fault."""
    rng = random.Random(seed)
    scenarios = [SCENARIOS[n] for n in names]
    window_start = end - timedelta(minutes=max([window_minutes, *(s.minutes for s in scenarios)]))
    before = next((s.history_replicas for s in scenarios if s.history_replicas != REPLICAS), REPLICAS)
    history = [
        healthy(rng, at, replicas=before)
        for at in _poisson(rng, window_start - timedelta(hours=history_hours), window_start, history_rate)
    ]
    stream = next((s.stream for s in scenarios if s.stream), None)
    window = list(
        stream(rng, window_start, end, rate)
        if stream
        else (healthy(rng, at) for at in _poisson(rng, window_start, end, rate))
    )
    for scenario in scenarios:
        fault = scenario.fault
        if emitter == "vllm" and scenario.engine_fault is not None:
            fault = scenario.engine_fault(rng, window_start, end)
        if fault is not None:
            window = [fault(rng, r) for r in window]
    return sorted(history + window, key=lambda r: r.end)  # fmt: skip
