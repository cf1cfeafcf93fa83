"""Every registered detector, generated from the registry: valid defaults, schema round-trip,
silence on an empty window, determinism for a fixed time, and figures that fit its results table."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import ModuleType

import polars as pl
import pytest

from detectors.registry import MODULES, REGISTRY, get
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.duckdb.sql_reader import Reader
from storage.duckdb.window_source import DuckDBWindowSource
from tailwatch.settings import Settings

AT = datetime(2026, 11, 20, 12, 0)
DOCS = Path(__file__).resolve().parent.parent / "docs" / "detectors.md"


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    con = open_database(tmp_path_factory.mktemp("conformance") / "empty.duckdb")
    migrate.upgrade(con)
    yield Reader(con)
    con.close()


def empty_frames(reader: Reader, key: str) -> dict[str, pl.DataFrame]:
    spec = get(key)
    config = spec.config()
    frames = {}
    source = DuckDBWindowSource(reader.connection)
    for name, read in spec.inputs(config, config.window(AT)).items():
        frame = pl.from_arrow(read.fetch(source))
        assert isinstance(frame, pl.DataFrame)
        frames[name] = frame
    return frames


@pytest.mark.parametrize("key", REGISTRY)
def test_default_config_is_valid_and_its_schema_round_trips(key: str) -> None:
    config_cls = get(key).config
    config = config_cls()
    assert config_cls.model_validate_json(config.model_dump_json()) == config
    schema = config_cls.model_json_schema()
    for name, field in schema["properties"].items():
        assert field.get("description"), f"{key}.{name} has no description"


@pytest.mark.parametrize("key", REGISTRY)
def test_an_empty_window_gives_no_findings(reader: Reader, key: str) -> None:
    spec = get(key)
    config = spec.config()
    out = spec.detect(empty_frames(reader, key), config, config.window(AT))
    assert out.conditions == []
    assert out.figures.height == 0 or set(out.figures.columns) >= {"window_start", "window_end"}


@pytest.mark.parametrize("key", REGISTRY)
def test_output_is_deterministic_for_a_fixed_time(reader: Reader, key: str) -> None:
    spec = get(key)
    config = spec.config()
    window = config.window(AT)
    assert spec.inputs(config, window) == spec.inputs(config, window)
    first = spec.detect(empty_frames(reader, key), config, window)
    second = spec.detect(empty_frames(reader, key), config, window)
    assert first.conditions == second.conditions
    assert first.figures.equals(second.figures)


@pytest.mark.parametrize("key", REGISTRY)
def test_the_results_table_is_named_by_the_key(reader: Reader, key: str) -> None:
    columns = {row[0] for row in reader.rows(f"DESCRIBE {key}")}
    assert {"window_start", "window_end", "evaluated_at"} <= columns


def test_an_unknown_detector_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known detectors: token_latency"):
        get("token_latncy")


def test_the_key_is_the_config_key_the_table_and_the_docs_heading() -> None:

    text = DOCS.read_text()
    for key, spec in REGISTRY.items():
        assert spec.key == key
        assert key in Settings().detector_configs()
        assert f"\n## {key}\n" in text, f"docs/detectors.md has no '## {key}' heading"
        for name in spec.config.model_fields:
            assert f"`{name}`" in text, f"{key}.{name} is not documented"


def test_the_registry_is_the_modules_in_pass_order_with_clusters_last() -> None:
    assert list(REGISTRY) == [module.KEY for module in MODULES]
    assert list(REGISTRY)[-1] == "clusters"
    for module in MODULES:
        spec = REGISTRY[module.KEY]
        assert (spec.config, spec.inputs, spec.detect) == (module.Config, module.inputs, module.detect)
        assert spec.summary == module.SUMMARY and spec.summary.strip() and "\n" not in spec.summary


def label_vocabulary() -> dict[str, set[str]]:
    """docs/detectors.md's label vocabulary: each label with the detectors its row names."""
    section = DOCS.read_text().split("\n### Alert labels\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]*) \|", section, flags=re.MULTILINE)
    return {label: set(re.findall(r"\w+", detectors)) for label, detectors in rows}


@pytest.mark.parametrize("module", MODULES, ids=[module.KEY for module in MODULES])
def test_each_module_declares_its_alert_labels_and_the_docs_vocabulary_lists_exactly_those(
    module: ModuleType,
) -> None:
    labels = module.LABELS
    assert isinstance(labels, tuple) and all(isinstance(name, str) and name for name in labels)
    assert len(set(labels)) == len(labels)
    vocabulary = label_vocabulary()
    for name in labels:
        assert module.KEY in vocabulary.get(name, set()), (
            f"docs/detectors.md's label vocabulary has no `{name}` row naming {module.KEY}"
        )
    listed = {name for name, keys in vocabulary.items() if module.KEY in keys}
    assert listed == set(labels), f"docs/detectors.md lists labels {module.KEY} does not declare"
