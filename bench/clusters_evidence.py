"""How often clusters reports a cluster on clean traffic, and how often it finds planted causes.

    .venv/bin/python bench/clusters_evidence.py [--clean 200] [--planted 50]

The windows are tests/test_clusters_evidence.py's: four replicas, three tenants, a pass/fail
json_adherence score failing 8% of the time everywhere, lognormal latencies. Clean: 4,000 requests over
five minutes, one window per seed. Planted, each over its own seeds: a replica failing 13% (10,000
requests); the same with half the requests scored (16,000); one tenant's requests a second slower one
time in twelve over fifteen minutes (30,000); both causes at once (30,000), found when each is a
cluster on its own symptom. Not a timing: the figures are rates, the same on any machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_clusters_evidence import (
    FIFTEEN_MINUTES,
    FIVE_MINUTES,
    both,
    clusters,
    fleet,
    slow_globex,
    worse_replica,
)

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clean", type=int, default=200, help="clean windows (seeds)")
    parser.add_argument("--planted", type=int, default=50, help="windows (seeds) per planted cause")
    args = parser.parse_args()
    noisy = [seed for seed in range(10_000, 10_000 + args.clean) if clusters(fleet(4000, seed))]
    rates: dict[str, Any] = {
        "clean_windows": args.clean,
        "clean_windows_with_any_cluster": len(noisy),
        "clean_false_cluster_rate": len(noisy) / args.clean,
    }
    for name, (build, window, wanted) in PLANTED.items():
        found = 0
        for seed in range(20_000, 20_000 + args.planted):
            got = clusters(fleet(seed=seed, **build), window)
            found += all(w in got for w in wanted)
        rates[name] = f"{found}/{args.planted} = {found / args.planted:.0%}"
        print(name, rates[name], flush=True)
    print(json.dumps(rates, indent=2))


if __name__ == "__main__":
    main()
