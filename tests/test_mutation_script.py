"""scripts/mutation.py: the sample is the same everywhere and nests, and scores are grouped by the right module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "scripts" / "mutation.py"
_spec = importlib.util.spec_from_file_location("mutation_script", _PATH)
assert _spec is not None and _spec.loader is not None
mutation = importlib.util.module_from_spec(_spec)
sys.modules["mutation_script"] = mutation
_spec.loader.exec_module(mutation)

NAMES = [f"detectors.token_latency.x__figures__mutmut_{i}" for i in range(1, 4001)]


@pytest.mark.parametrize(
    ("mutant", "module"),
    [
        ("detectors.token_latency.x__figures__mutmut_12", "detectors.token_latency"),
        ("storage.duckdb.writer.xǁWriterǁ_commit__mutmut_3", "storage.duckdb.writer"),
        ("collector.normalize.x_first_token_ms__mutmut_1", "collector.normalize"),
    ],
)
def test_a_mutant_belongs_to_the_module_its_name_starts_with(mutant: str, module: str) -> None:
    assert mutation.module_of(mutant) == module


def test_paths_become_module_prefixes_and_select_only_their_own_mutants() -> None:
    prefixes = mutation.targets(["detectors/token_latency.py", "storage/"])
    assert prefixes == ["detectors.token_latency", "storage"]
    assert mutation.selected("storage.duckdb.writer.xǁWriterǁ_commit__mutmut_3", prefixes)
    assert not mutation.selected("detectors.token_latency_extra.x_f__mutmut_1", prefixes)
    assert not mutation.selected("collector.normalize.x_f__mutmut_1", prefixes)


def test_the_sample_is_seeded_its_size_is_about_what_was_asked_and_a_smaller_one_nests_in_a_larger() -> None:
    small = {n for n in NAMES if mutation.in_sample(n, 400, len(NAMES), "tailwatch")}
    large = {n for n in NAMES if mutation.in_sample(n, 1200, len(NAMES), "tailwatch")}
    again = {n for n in NAMES if mutation.in_sample(n, 400, len(NAMES), "tailwatch")}
    other_seed = {n for n in NAMES if mutation.in_sample(n, 400, len(NAMES), "other")}
    assert small == again and small != other_seed
    assert small < large
    assert 300 < len(small) < 500 and 1050 < len(large) < 1350


def test_the_interval_of_a_sampled_score_holds_the_score_and_narrows_with_more_mutants() -> None:
    low, high = mutation.wilson(85, 100)
    assert low < 0.85 < high
    wide, narrow = mutation.wilson(17, 20), mutation.wilson(850, 1000)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert mutation.wilson(0, 0) == (0.0, 1.0)
    assert mutation.wilson(10, 10)[1] == 1.0
