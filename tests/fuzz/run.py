"""Coverage-guided fuzzing of one decoder entry point with atheris (libFuzzer), from its committed corpus.

    .venv/bin/python tests/fuzz/run.py TARGET [libFuzzer flags...]
    .venv/bin/python tests/fuzz/run.py traces_protobuf -runs=1000000

TARGET is one of tests/fuzz/targets.py's TARGETS. The corpus is tests/fuzz/corpus/TARGET (real exporters'
payloads, see tests/fuzz/seed.py); new inputs that reach new code go to build/fuzz/TARGET, not into the
repository. A crash is an exception other than the defined refusals, a hang past -timeout, or memory past
-rss_limit_mb: libFuzzer writes the input to build/fuzz/crash-* and exits non-zero.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

with atheris.instrument_imports(include=["model", "collector", "targets"]):
    from targets import CORPUS, TARGETS, answer


def main() -> None:
    target, flags = sys.argv[1], sys.argv[2:]
    if target not in TARGETS:
        raise SystemExit(f"unknown target {target!r}; known: {', '.join(TARGETS)}")
    found = ROOT / "build" / "fuzz" / target
    found.mkdir(parents=True, exist_ok=True)
    corpus = HERE / "corpus" / CORPUS[target]
    defaults = ["-timeout=10", "-rss_limit_mb=2048", f"-artifact_prefix={found.parent}/crash-{target}-"]
    argv = [sys.argv[0], *defaults, *flags, str(found), str(corpus)]

    def one_input(data: bytes) -> None:
        answer(target, data)

    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
