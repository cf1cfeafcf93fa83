"""How often clusters reports a cluster on clean traffic, how often it confirms an alert that names a group
where nothing differs, and how often it finds planted causes: the search's and the alert-directed test's.

    .venv/bin/python bench/clusters_evidence.py [--clean 200] [--planted 50] [--decoys 1000] [--weak 200]
                                                [--alarms 1000] [--only-alarms]

Exploratory (the search over every candidate). The windows are tests/test_clusters_evidence.py's: four
replicas, three tenants, a pass/fail json_adherence score failing 8% of the time everywhere, lognormal
latencies. Clean: 4,000 requests over five minutes, one window per seed. Planted, each over its own seeds: a
replica failing 13% (10,000 requests); the same with half the requests scored (16,000); one tenant's
requests a second slower one time in twelve over fifteen minutes (30,000); both causes at once (30,000),
found when each is a cluster on its own symptom.

Alert-directed (a firing alert's group, tested on its symptom over its episode, Holm over the pass's alert
hypotheses). Decoys: the same clean windows with one firing alert on a group chosen at random (a replica or a
tenant, on json_adherence or latency), as a detector's false alarm would name one: over the window alone,
and over a fifteen-minute episode (two clean windows before it). Chance alarms: replica_skew run on clean
windows of the fleet below, and every alert it raises there (on nothing) handed to clusters, as the pass does.
Weak effects, the issue's fleet: six replicas, 240 requests a minute, a pass/fail json_adherence failing 7%
of the time, for fifteen minutes (three windows, the alert firing since the first): one replica failing 14%;
one replica at 1.5x the latency of the rest (e2e and TTFT). Found: by the search in the last window alone;
by the alert's test over the last window alone; by the alert's test over the fifteen minutes.
Not a timing: the figures are rates, the same on any machine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_clusters_evidence import (
    FIFTEEN_MINUTES,
    FIVE_MINUTES,
    NO_ALERTS,
    START,
    both,
    clusters,
    decoy,
    fleet,
    slow_globex,
    worse_replica,
)

from detectors import replica_skew
from detectors.base import Window
from detectors.clusters import Config, detect

REPLICA = ({"replica_id": "r3"}, "score:json_adherence")
TENANT = ({"tenant_id": "globex"}, "latency_tail")
PLANTED: dict[str, tuple[dict[str, Any], Any, tuple[Any, ...]]] = {
    "replica 13% vs 8% on a pass/fail score": ({"n": 10_000, "traffic": worse_replica}, FIVE_MINUTES, (REPLICA,)),
    "the same, half the requests scored": (
        {"n": 16_000, "traffic": worse_replica, "scored": 0.5},
        FIVE_MINUTES,
        (REPLICA,),
    ),
    "a tenant 1/12 requests 1 s slower, 15 min": ({"n": 30_000, "traffic": slow_globex}, FIFTEEN_MINUTES, (TENANT,)),
    "both causes at once, 15 min": ({"n": 30_000, "traffic": both}, FIFTEEN_MINUTES, (REPLICA, TENANT)),
}

FIVE = timedelta(minutes=5)
# The last of three five-minute windows; its pass runs 30 s (the settle) after it ends.
LAST = Window(START + 2 * FIVE, START + 3 * FIVE)
FIRED_WITH_THE_FIRST = START + FIVE + timedelta(seconds=30)  # the pass that evaluated START..START+5 min


def explained(out: Any) -> bool:
    return any(e.startswith("explained by cluster") for e in out.explanations.values())


def with_end_times(frames: dict[str, pl.DataFrame], window: Window) -> dict[str, pl.DataFrame]:
    """A window's requests as an episode read returns them: each ending evenly inside `window`."""
    n = frames["requests"].height
    ends = [window.start + i * (window.end - window.start) / n for i in range(n)]
    return {
        "episode_requests": frames["requests"].with_columns(end_time=pl.Series(ends, dtype=pl.Datetime("us"))),
        "episode_scores": frames["scores"],
    }


def episode_of(parts: list[dict[str, pl.DataFrame]]) -> dict[str, pl.DataFrame]:
    """Earlier windows (oldest first, each five minutes from START) as one episode read."""
    timed = [with_end_times(p, Window(START + k * FIVE, START + (k + 1) * FIVE)) for k, p in enumerate(parts)]
    return {key: pl.concat([t[key] for t in timed]) for key in ("episode_requests", "episode_scores")}


def decoys(count: int) -> dict[str, str]:
    """Alerts on random groups of clean traffic that the alert's test confirms, over the window and over 15 min."""
    window_only = over_episode = 0
    for seed in range(30_000, 30_000 + count):
        alert = decoy(seed).with_columns(pl.lit(FIRED_WITH_THE_FIRST).alias("started_at"))
        last = fleet(4000, seed)
        window_only += explained(detect({**last, "alerts": alert}, Config(), LAST))
        earlier = episode_of([fleet(4000, seed + 500_000), fleet(4000, seed + 900_000)])
        over_episode += explained(detect({**last, **earlier, "alerts": alert}, Config(), LAST))
    return {
        "decoy alert confirmed, window alone": f"{window_only}/{count} = {window_only / count:.1%}",
        "decoy alert confirmed, 15-min episode": f"{over_episode}/{count} = {over_episode / count:.1%}",
    }


def chance_alarms(count: int) -> dict[str, str]:
    """replica_skew on clean windows of the issue's fleet (six replicas, 1,200 requests, 7% failing everywhere),
    and what clusters says of the alerts it raises there on nothing: they were chosen by the same window's
    requests, so the window's own evidence is no independent check of them."""
    alarms = confirmed = 0
    for seed in range(50_000, 50_000 + count):
        frames = {**six_replicas(seed, 0, fails_7_percent), "alerts": NO_ALERTS}
        conditions = replica_skew.detect(frames, replica_skew.Config(), FIVE_MINUTES).conditions
        if not conditions:
            continue
        alerts = pl.DataFrame(
            [
                {"alert_id": f"a{k}", "detector": "replica_skew", "labels": json.dumps(dict(c.labels)),
                 "started_at": START}
                for k, c in enumerate(conditions)
            ]
        )  # fmt: skip
        out = detect({**frames, "alerts": alerts}, Config(), FIVE_MINUTES)
        alarms += len(conditions)
        confirmed += sum(e.startswith("explained by cluster") for e in out.explanations.values())
    return {
        "clean six-replica windows": str(count),
        "replica_skew alerts raised on clean traffic": str(alarms),
        "of them confirmed by their group's test": f"{confirmed}/{alarms}"
        + (f" = {confirmed / alarms:.0%}" if alarms else ""),
    }


Fault = Callable[[str, random.Random, dict[str, Any]], tuple[bool, dict[str, Any]]]


def six_replicas(seed: int, k: int, fault: Fault) -> dict[str, pl.DataFrame]:
    """Window k (0, 1, 2) of the issue's fleet: six replicas, 240 requests a minute (1,200 in five minutes), a
    pass/fail json_adherence on every request; `fault` says whether a request fails and may slow it."""
    rng = random.Random(seed * 10 + k)
    rows, scores = [], []
    for i in range(1200):
        replica = f"r{i % 6}"
        row = {
            "trace_id": f"{seed:08x}{k:04x}{i:020x}", "span_id": f"{i:016x}", "status_code": "OK",
            "tenant_id": rng.choice(["acme", "globex", "initech"]), "replica_id": replica, "deployment": "vllm",
            "model": "llama", "input_tokens": rng.randint(100, 6000), "tpot_ms": rng.gauss(12, 1),
            "e2e_ms": rng.lognormvariate(7.6, 0.25), "ttft_ms": rng.lognormvariate(5.2, 0.25),
            "cache_hit_ratio": rng.uniform(0.5, 0.99), "queue_depth": rng.randint(0, 20), "replica_count": 6,
            "quantization": "fp16", "finish_reason": "stop", "prefill_tokens_in_batch": rng.randint(200, 6000),
            "traffic_pattern": None, "kv_cache_usage": rng.uniform(0.3, 0.99), "preemptions": rng.randint(0, 1),
        }  # fmt: skip
        failed, row = fault(replica, rng, row)
        rows.append(row)
        scores.append({"trace_id": row["trace_id"], "span_id": row["span_id"], "name": "json_adherence",
                       "score": 0.0 if failed else 1.0})  # fmt: skip
    return {
        "requests": pl.DataFrame(rows).with_columns(pl.col("traffic_pattern").cast(pl.String)),
        "scores": pl.DataFrame(scores),
    }


def fails_7_percent(replica: str, rng: random.Random, row: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    return rng.random() < 0.07, row


def fails_14_percent(replica: str, rng: random.Random, row: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    return rng.random() < (0.14 if replica == "r3" else 0.07), row


def slower_by_half(replica: str, rng: random.Random, row: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    if replica == "r3":
        row = {**row, "e2e_ms": row["e2e_ms"] * 1.5, "ttft_ms": row["ttft_ms"] * 1.5}
    return rng.random() < 0.07, row


WEAK: dict[str, tuple[Fault, str]] = {
    "a replica failing json_adherence 14% vs 7%, six replicas, 240 req/min": (fails_14_percent, "json_adherence"),
    "a replica at 1.5x latency, six replicas, 240 req/min": (slower_by_half, "latency_p99"),
}


def weak_effects(count: int) -> dict[str, str]:
    rates = {}
    for name, (fault, signal) in WEAK.items():
        symptom = "latency_tail" if signal == "latency_p99" else f"score:{signal}"
        alert = pl.DataFrame(
            {"alert_id": ["a1"], "detector": ["replica_skew"],
             "labels": [json.dumps({"replica_id": "r3", "signal": signal})], "started_at": [FIRED_WITH_THE_FIRST]}
        )  # fmt: skip
        searched = window_only = over_episode = 0
        for seed in range(40_000, 40_000 + count):
            first, second, last = (six_replicas(seed, k, fault) for k in range(3))
            found = clusters({**last, "alerts": alert.clear()}, LAST)
            searched += ({"replica_id": "r3"}, symptom) in found
            window_only += explained(detect({**last, "alerts": alert}, Config(), LAST))
            over_episode += explained(detect({**last, **episode_of([first, second]), "alerts": alert}, Config(), LAST))
        for how, hits in (("search, last 5 min", searched), ("alert's test, last 5 min", window_only),
                          ("alert's test, 15-min episode", over_episode)):  # fmt: skip
            rates[f"{name}: {how}"] = f"{hits}/{count} = {hits / count:.0%}"
            print(f"{name}: {how}", rates[f"{name}: {how}"], flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clean", type=int, default=200, help="clean windows (seeds)")
    parser.add_argument("--planted", type=int, default=50, help="windows (seeds) per planted cause")
    parser.add_argument("--decoys", type=int, default=1000, help="clean windows with a decoy alert")
    parser.add_argument("--weak", type=int, default=200, help="fifteen-minute runs per weak effect")
    parser.add_argument("--alarms", type=int, default=1000, help="clean six-replica windows for chance alarms")
    parser.add_argument("--only-alarms", action="store_true", help="measure the chance alarms alone")
    args = parser.parse_args()
    started = datetime.now()
    if args.only_alarms:
        print(json.dumps(chance_alarms(args.alarms), indent=2))
        return
    noisy = [seed for seed in range(10_000, 10_000 + args.clean) if clusters(fleet(4000, seed))]
    rates: dict[str, Any] = {
        "clean_windows": args.clean,
        "clean_windows_with_any_cluster": len(noisy),
        "clean_false_cluster_rate": len(noisy) / args.clean,
    }
    print(json.dumps(rates), flush=True)
    for name, (build, window, wanted) in PLANTED.items():
        found = 0
        for seed in range(20_000, 20_000 + args.planted):
            got = clusters(fleet(seed=seed, **build), window)
            found += all(w in got for w in wanted)
        rates[name] = f"{found}/{args.planted} = {found / args.planted:.0%}"
        print(name, rates[name], flush=True)
    for measure in (lambda: chance_alarms(args.alarms), lambda: decoys(args.decoys), lambda: weak_effects(args.weak)):
        part = measure()
        print(json.dumps(part, indent=2), flush=True)
        rates.update(part)
    rates["minutes"] = round((datetime.now() - started).total_seconds() / 60, 1)
    print(json.dumps(rates, indent=2))


if __name__ == "__main__":
    main()
