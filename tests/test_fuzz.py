"""Every decoder entry point under coverage-guided fuzzing (atheris), a short run each from the committed corpus
of real exporters' payloads: no input crashes, hangs or runs away with memory; each is answered with a defined
status. The long runs (a million inputs each) are bench/fuzz.py, their figures in docs/reliability.md."""

from __future__ import annotations

import dataclasses
import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
from builders import T0, gauge, metrics_request, request, span
from receivers import TEST_EXTRA, import_or_skip
from targets import CORPUS, TARGETS, answer, items_sent

from collector.reasons import Rejections

FUZZ = Path(__file__).parent / "fuzz"
SHORT_RUNS = 20_000
# Under mutation testing the fuzzing child imports mutmut's rewritten copy of the decoders, which atheris then
# instruments line by line: a short run takes many minutes there. The corpus test still runs on every mutant.
under_mutation = pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ, reason="fuzzing runs are too slow on mutmut's rewritten code"
)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_every_corpus_input_is_answered_with_a_defined_status(target: str) -> None:
    seeds = sorted((FUZZ / "corpus" / CORPUS[target]).iterdir())
    assert len(seeds) >= 8, "the corpus is written by tests/fuzz/seed.py"
    # The seeds are real exporters' requests: every one decodes.
    assert {answer(target, seed.read_bytes()) for seed in seeds} == {"ok"}


@under_mutation
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_short_fuzzing_run_finds_nothing(target: str, tmp_path: Path) -> None:
    import_or_skip("atheris", TEST_EXTRA)
    done = subprocess.run(
        [sys.executable, str(FUZZ / "run.py"), target, f"-runs={SHORT_RUNS}", "-seed=1"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Done {SHORT_RUNS} runs" in done.stderr


@under_mutation
def test_a_target_that_raises_is_reported_as_a_crash(tmp_path: Path) -> None:
    """The harness itself: an input the decoder cannot answer fails the run (planted through a broken inflate
    limit that makes every gzip body raise an undefined error)."""
    import_or_skip("atheris", TEST_EXTRA)
    script = tmp_path / "broken.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(FUZZ)!r})\n"
        "import targets\n"
        "targets.TARGETS['logs_gzip'] = lambda data: 1 / 0\n"
        f"run = {str(FUZZ / 'run.py')!r}\n"
        f"sys.argv = [run, 'logs_gzip', '-runs=100', '-artifact_prefix={tmp_path}/']\n"
        "exec(compile(open(run).read(), run, 'exec'), {'__name__': '__main__', '__file__': run})\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0 and "ZeroDivisionError" in done.stdout + done.stderr


def test_every_item_sent_is_accepted_or_rejected_by_reason() -> None:
    """One valid span, one with an all-zero trace id: answered, and the harness's count agrees with the decoder's."""
    payload = request([span(), span(trace_id=bytes(16))]).SerializeToString()
    assert items_sent("traces_protobuf", payload) == 2
    for target in ("traces_protobuf", "traces_reference", "traces_gzip"):
        data = gzip.compress(payload) if target == "traces_gzip" else payload
        assert answer(target, data) == "ok"
    points = metrics_request([gauge("vllm:num_requests_waiting", [(T0, 2.0), (0, 3.0)])]).SerializeToString()
    assert items_sent("metrics_protobuf", points) == 2
    assert answer("metrics_protobuf", points) == "ok"


def test_a_decoder_that_drops_an_item_without_counting_it_fails_the_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: a planted decoder that loses the rejected span without a reason is caught."""
    payload = request([span(), span(trace_id=bytes(16))]).SerializeToString()
    decoded = TARGETS["traces_protobuf"](payload)
    uncounted = dataclasses.replace(decoded, rejections=Rejections())
    monkeypatch.setitem(TARGETS, "traces_protobuf", lambda data: uncounted)
    with pytest.raises(AssertionError, match="2 items sent, 1 accounted for"):
        answer("traces_protobuf", payload)
