"""Run mutmut on modules or packages, or a seeded sample of them, and report scores per package and module.

Called by scripts/mutate; docs/testing.md says how to read the results. mutmut keeps its state in mutants/
(not committed): which tests cover which function, and every mutant's last verdict.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

MUTMUT = str(Path(sys.executable).with_name("mutmut"))
PACKAGES = ("model", "collector", "storage", "detectors")
# A mutant is detected when a test fails on it, or it runs away past mutmut's time limit.
DETECTED = {"killed", "timeout", "caught by type check"}
NOT_RUN = {"not checked", "skipped", "outside the sample"}
GENERATING_MODULE = "model.columns"
_MODULE = re.compile(r"^(.*?)\.x(?:_|ǁ)")


def module_of(mutant: str) -> str:
    match = _MODULE.match(mutant)
    return match.group(1) if match else mutant.rsplit(".", 1)[0]


def targets(paths: list[str]) -> list[str]:
    """Dotted module prefixes for `detectors/token_latency.py`, `detectors/` or `detectors`."""
    out = []
    for raw in paths or list(PACKAGES):
        path = Path(raw)
        dotted = ".".join(path.with_suffix("").parts) if path.suffix == ".py" else ".".join(path.parts)
        if dotted.split(".")[0] not in PACKAGES:
            sys.exit(f"mutate: {raw} is not under {', '.join(PACKAGES)}")
        out.append(dotted)
    return out


def selected(mutant: str, prefixes: list[str]) -> bool:
    module = module_of(mutant)
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def results() -> dict[str, str]:
    """Every generated mutant with its last verdict ('not checked' until it has run)."""
    proc = subprocess.run([MUTMUT, "results", "--all", "true"], capture_output=True, text=True, check=False)
    verdicts = {}
    for line in proc.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            verdicts[name] = status
    return verdicts


def in_sample(mutant: str, size: int, total: int, seed: str) -> bool:
    # A hash, not random(): the same mutant is in the sample on every machine and every run.
    digest = hashlib.sha256(f"{seed}:{mutant}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < size / total


def run(names: list[str], *, generating: bool = False) -> None:
    if not names:
        print("mutate: nothing to run")
        return
    # Two workers: one per core. Each forks from a warmed-up server and runs only the tests that
    # cover the mutated function, fastest first, stopping at the first failure.
    done = subprocess.run([MUTMUT, "run", "--max-children", "2", *names], check=False)
    # The generating run may exit non-zero for its own few mutants: what counts is that the mutants are there.
    if generating and results():
        return
    if done.returncode:
        sys.exit(f"mutate: mutmut stopped with exit code {done.returncode}; its output above says why")


def wilson(detected: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% interval for a score measured on a sample (Wilson score interval)."""
    if n == 0:
        return (0.0, 1.0)
    p = detected / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def report(verdicts: dict[str, str], prefixes: list[str], sampled: set[str] | None) -> None:
    """Scores over the sample when there is one (`sampled`), else over every mutant run so far."""
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    by_package: dict[str, Counter[str]] = defaultdict(Counter)
    survivors = []
    for name, status in verdicts.items():
        if not selected(name, prefixes):
            continue
        module = module_of(name)
        # Mutants outside the sample count toward the module's size only.
        counted = status if sampled is None or name in sampled else "outside the sample"
        for bucket in (by_module[module], by_package[module.split(".")[0]]):
            bucket[counted] += 1
        if counted != status:
            continue
        if status not in DETECTED | NOT_RUN:
            survivors.append((name, status))

    def row(label: str, c: Counter[str]) -> str:
        ran = sum(v for k, v in c.items() if k not in NOT_RUN)
        detected = sum(c[k] for k in DETECTED)
        total = ran + sum(c[k] for k in NOT_RUN)
        low, high = wilson(detected, ran)
        score = f"{detected / ran:.1%}" if ran else "-"
        interval = "all run" if ran == total else f"{low:.0%}–{high:.0%}"
        return (
            f"| {label} | {total} | {ran} | {c['killed']} | {c['timeout'] + c['caught by type check']} "
            f"| {c['survived']} | {c['no tests']} | {ran - detected - c['survived'] - c['no tests']} | {score} "
            f"| {interval} |"
        )

    header = "| | mutants | run | killed | timeout | survived | no tests | other | score | 95% interval |"
    print(header)
    print("|---" * 10 + "|")
    for package in sorted(by_package):
        print(row(f"**{package}/**", by_package[package]))
    for module in sorted(by_module):
        print(row(module, by_module[module]))
    if survivors:
        print(f"\n{len(survivors)} not detected (`mutmut show NAME` prints the change):")
        for name, status in sorted(survivors):
            print(f"  {status:9} {name}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/mutate", description=__doc__)
    parser.add_argument("paths", nargs="*", help="modules or packages (default: model collector storage detectors)")
    parser.add_argument("--sample", type=int, metavar="N", help="run about N mutants, chosen by a seeded hash")
    parser.add_argument("--seed", default="tailwatch", help="the sample's seed (default: %(default)s)")
    parser.add_argument("--survivors", action="store_true", help="run again only what was not detected last time")
    parser.add_argument("--report", action="store_true", help="print scores and survivors; run nothing")
    parser.add_argument("--again", action="store_true", help="with --sample: run again what already has a verdict")
    args = parser.parse_args()
    prefixes = targets(args.paths)

    def sample(verdicts: dict[str, str]) -> list[str]:
        pool = [n for n in verdicts if selected(n, prefixes)]
        if args.sample:
            pool = [n for n in pool if in_sample(n, args.sample, len(pool), args.seed)]
        return pool

    if not args.report:
        verdicts = results()
        if args.sample or args.survivors:
            if not verdicts:  # first run on this machine: generate the mutants and the coverage map only
                # mutmut learns the mutants' names only by generating them in a run: this one runs the two
                # mutants of the smallest module. A name that matches nothing made mutmut 3.8 run every mutant.
                run([f"{GENERATING_MODULE}.*"], generating=True)
                verdicts = results()
            pool = sample(verdicts)
            if args.survivors:
                pool = [n for n in pool if verdicts[n] not in DETECTED | NOT_RUN]
            elif not args.again:  # a sample grows or resumes: what already has a verdict keeps it
                pool = [n for n in pool if verdicts[n] in NOT_RUN]
            run(sorted(pool))
        else:
            run([f"{p}.*" for p in prefixes])
    verdicts = results()
    report(verdicts, prefixes, set(sample(verdicts)) if args.sample else None)


if __name__ == "__main__":
    main()
