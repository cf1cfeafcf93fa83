"""Detector figures on /metrics: each gauge is a figure stored for the evaluated window, an evaluation
replaces its detector's series, and a detector shows at most `max_figure_series` groups."""

from __future__ import annotations

import dataclasses
import re
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import RunningService, service_settings
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from detectors.base import Detection, Window
from detectors.figure_gauges import FigureGauges, figure_help
from detectors.registry import REGISTRY
from simulator import simulate

# Every detector's figures shown as gauges, with the columns that name a row's group. Written out here
# rather than taken from the code under test, so a change of the label rule fails this test.
LABELS: dict[str, tuple[str, ...]] = {
    "token_latency": ("model", "deployment", "tenant_id", "grouping"),
    "cache_curve": ("bucket", "score_name"),
    "traffic_pattern": ("pattern", "score_name"),
    "tenant_fairness": ("tenant_id", "score_name"),
    "replica_skew": ("replica_id", "score_name"),
    "saturation": ("bucket", "score_name"),
    "quantization_delta": ("model", "quantization", "score_name"),
    "context_length": ("prompt_bucket", "output_bucket", "score_name"),
    "slo_burn": ("slo", "tenant_id", "deployment", "model", "burn_window"),
}
# String columns that are findings, not groups: never labels.
FINDINGS = {"token_latency": {"reason"}, "quantization_delta": {"baseline_quantization"}, "slo_burn": {"severity"}}
NUMBERS = {"BIGINT", "INTEGER", "HUGEINT", "DOUBLE", "FLOAT", "BOOLEAN"}
SCENARIOS = ["noisy_neighbor", "replica_drift", "quantization_regression", "long_context"]
DOCS = Path(__file__).resolve().parent.parent / "docs"

Series = dict[str, dict[frozenset[tuple[str, str]], float]]


def daily(**extra: Any) -> dict[str, Any]:
    """Detector settings with a daily interval: the service's own scheduler stays out of the test's passes."""
    slo = {"name": "ttft-2s", "objective": 0.99, "sli": {"ttft_ms_max": 2000}, "group_by": ["tenant_id"]}
    defaults = {"slo_burn": {"slos": [slo]}}
    return {key: {"interval_seconds": 86400, **defaults.get(key, {}), **extra.get(key, {})} for key in REGISTRY}


def send(svc: RunningService, names: list[str], end: datetime, seed: int, history_hours: float) -> None:
    simulate.run(
        names, endpoint=svc.grpc_target, protocol="grpc", seed=seed, end=end, history_hours=history_hours,
        history_rate=0.1, rate=3.0,
    )  # fmt: skip
    svc.wait_committed()


def scraped(svc: RunningService) -> Series:
    """Every sample of the service's /metrics, by sample name and label set."""
    with urllib.request.urlopen(f"{svc.api_url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def figures_of(scrape: Series, key: str) -> Series:
    return {name: series for name, series in scrape.items() if name.startswith(f"tailwatch_{key}_")}


def stored(svc: RunningService, key: str, window: Window) -> Series:
    """The figures stored in `key`'s table for the window, as the gauges they should be."""
    described = svc.rows(f"DESCRIBE {key}")
    names = [row[0] for row in described]
    types = {row[0]: row[1] for row in described}
    strings = {c for c in names if types[c] == "VARCHAR"}
    assert strings == set(LABELS[key]) | FINDINGS.get(key, set()), f"{key} has new string columns: {strings}"
    rows = svc.rows(f"SELECT * FROM {key} WHERE window_end = ?", [window.end])
    out: Series = {}
    label_sets = set()
    for row in rows:
        record = dict(zip(names, row, strict=True))
        labels = frozenset((c, "" if record[c] is None else str(record[c])) for c in LABELS[key])
        label_sets.add(labels)
        for column in names:
            figure = types[column] in NUMBERS and column not in {"window_start", "window_end", "evaluated_at"}
            if figure and record[column] is not None:
                out.setdefault(f"tailwatch_{key}_{column}", {})[labels] = float(record[column])
    assert len(label_sets) == len(rows), f"{key}: two rows of one window share a label set"
    return out


def assert_shows(scrape: Series, svc: RunningService, key: str, window: Window) -> None:
    expected = stored(svc, key, window)
    shown = figures_of(scrape, key)
    assert set(shown) == set(expected), key
    for name, series in expected.items():
        assert set(shown[name]) == set(series), name
        for labels, value in series.items():
            assert shown[name][labels] == pytest.approx(value, rel=1e-12, nan_ok=True), (name, labels)


def label_values(scrape: Series, key: str, label: str) -> set[str]:
    return {
        value
        for series in figures_of(scrape, key).values()
        for labels in series
        for name, value in labels
        if name == label
    }


def test_the_gauges_are_the_stored_figures_of_the_latest_window_and_each_evaluation_replaces_them(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=15)
    second_end = first_end + timedelta(minutes=5)
    first_at, second_at = first_end + timedelta(seconds=30), second_end + timedelta(seconds=30)
    with RunningService(service_settings(db_path, detectors=daily())) as svc:
        detection = svc.service.detection
        assert detection is not None
        send(svc, SCENARIOS, first_end, seed=7, history_hours=2.0)
        results = detection.run(first_at)
        assert all(r.outcome == "ok" for r in results), results
        first = {r.detector: r.window for r in results}
        earlier = scraped(svc)
        for key in LABELS:
            assert stored(svc, key, first[key]), f"the seeded window gives {key} no figures"
            assert_shows(earlier, svc, key, first[key])
        assert not [name for name in earlier if name.startswith("tailwatch_clusters_")]
        assert label_values(earlier, "quantization_delta", "quantization") == {"fp16", "int4"}
        assert label_values(earlier, "token_latency", "grouping") == {"model", "tenant"}
        # A model-level row has no tenant: its NULL tenant_id is the empty label value.
        assert "" in label_values(earlier, "token_latency", "tenant_id")

        # The next window has steady traffic only: no int4 variant, and every figure changes.
        send(svc, ["steady"], second_end, seed=8, history_hours=0.0)
        results = detection.run(second_at)
        assert all(r.outcome == "ok" for r in results), results
        second = {r.detector: r.window for r in results}
        scrape = scraped(svc)
        for key in LABELS:
            assert_shows(scrape, svc, key, second[key])
        assert label_values(scrape, "quantization_delta", "quantization") == {"fp16"}
        assert scrape["tailwatch_tenant_fairness_n"] != earlier["tailwatch_tenant_fairness_n"]

        # Replaying the older window stores its figures again but leaves the newer ones on /metrics.
        assert all(r.outcome == "ok" for r in detection.run(first_at))
        replayed = scraped(svc)
        for key in LABELS:
            assert_shows(replayed, svc, key, second[key])

        # A failed evaluation clears its detector's gauges; the others keep theirs.
        def broken(frames: dict[str, pl.DataFrame], config: Any, window: Window) -> Detection:
            raise RuntimeError("planted failure")

        monkeypatch.setitem(REGISTRY, "replica_skew", dataclasses.replace(REGISTRY["replica_skew"], detect=broken))
        [failed] = detection.run(second_at, ["replica_skew"])
        assert failed.outcome == "error"
        scrape = scraped(svc)
        assert figures_of(scrape, "replica_skew") == {}
        assert figures_of(scrape, "tenant_fairness") == figures_of(replayed, "tenant_fairness")


def test_a_detector_shows_at_most_max_figure_series_groups_the_busiest_first_and_counts_the_rest(
    db_path: Path,
) -> None:
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(minutes=10)
    at = end + timedelta(seconds=30)
    cap = 3  # one tenant's rows: one per score name
    settings = service_settings(db_path, detectors=daily(tenant_fairness={"max_figure_series": cap}))
    with RunningService(settings) as svc:
        detection = svc.service.detection
        assert detection is not None
        send(svc, SCENARIOS, end, seed=7, history_hours=2.0)
        results = {r.detector: r for r in detection.run(at)}
        window = results["tenant_fairness"].window
        rows = svc.rows(
            "SELECT tenant_id, score_name, n FROM tenant_fairness WHERE window_end = ? ORDER BY n DESC", [window.end]
        )
        busiest = rows[0][0]
        kept = {(t, s) for t, s, _n in rows if t == busiest}
        assert len(kept) == cap and len(rows) > cap, rows
        scrape = scraped(svc)
        for name, series in figures_of(scrape, "tenant_fairness").items():
            assert {(dict(labels)["tenant_id"], dict(labels)["score_name"]) for labels in series} == kept, name
        dropped = "tailwatch_figure_series_dropped_total"
        assert svc.metric(dropped, detector="tenant_fairness") == len(rows) - cap
        # The other detectors are under their cap: every group is shown, none counted.
        for key in LABELS.keys() - {"tenant_fairness"}:
            assert svc.metric(dropped, detector=key) == 0.0
            assert_shows(scrape, svc, key, results[key].window)
        # Counted per evaluation: re-evaluating the window drops the same groups again.
        detection.run(at, ["tenant_fairness"])
        assert svc.metric(dropped, detector="tenant_fairness") == 2 * (len(rows) - cap)


def test_breaching_groups_come_first_then_the_busiest_and_a_label_set_shows_once() -> None:
    registry = CollectorRegistry()
    gauges = FigureGauges(registry)
    window = Window(datetime(2026, 11, 20, 12, 0), datetime(2026, 11, 20, 12, 5))
    figures = pl.DataFrame(
        {
            "model": ["quiet", "busy", "breaching", None, "", "middle"],
            "n": [5, 100, 10, 40, 30, 50],
            "tpot_p99": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            "breached": [False, False, True, False, False, False],
            "reason": [None, None, "prefill_burst", None, None, None],
            "window_start": [window.start] * 6,
            "window_end": [window.end] * 6,
        }
    )
    gauges.replace("token_latency", window, figures, 4)

    def shown(column: str) -> dict[str, float]:
        return {
            s.labels["model"]: s.value
            for m in registry.collect()
            if m.name == f"tailwatch_token_latency_{column}"
            for s in m.samples
        }

    # breaching first, then by n: busy (100), middle (50), the NULL model (40) as ""; the "" model (30)
    # repeats that label set and quiet (5) is beyond the cap.
    assert shown("tpot_p99") == {"breaching": 3.0, "busy": 2.0, "middle": 6.0, "": 4.0}
    assert shown("breached") == {"breaching": 1.0, "busy": 0.0, "middle": 0.0, "": 0.0}
    assert not shown("window_start") and not shown("reason")
    assert registry.get_sample_value("tailwatch_figure_series_dropped_total", {"detector": "token_latency"}) == 2
    # clusters' figures are not shown at all.
    gauges.replace("clusters", window, pl.DataFrame({"detector": ["x"], "size": [3]}), 10)
    assert not [m for m in registry.collect() if m.name.startswith("tailwatch_clusters_")]


def test_a_small_breaching_group_is_shown_before_busier_groups_that_do_not_breach() -> None:
    """Under a cap of two, the one model that breaches serves a tenth of either busy one's requests: it
    is what a dashboard must show, so the quieter of the busy two is the group left out."""
    registry = CollectorRegistry()
    gauges = FigureGauges(registry)
    window = Window(datetime(2026, 11, 20, 12, 0), datetime(2026, 11, 20, 12, 5))
    figures = pl.DataFrame(
        {
            "model": ["busiest", "busy", "breaching"],
            "n": [500, 400, 40],
            "tpot_p99": [20.0, 21.0, 95.0],
            "breached": [False, False, True],
            "window_start": [window.start] * 3,
            "window_end": [window.end] * 3,
        }
    )
    gauges.replace("token_latency", window, figures, 2)
    [family] = [m for m in registry.collect() if m.name == "tailwatch_token_latency_tpot_p99"]
    assert {s.labels["model"]: s.value for s in family.samples} == {"breaching": 95.0, "busiest": 20.0}
    assert registry.get_sample_value("tailwatch_figure_series_dropped_total", {"detector": "token_latency"}) == 1


def sql_units() -> dict[tuple[str, str], str]:
    """Each figures column's unit, from its table's reference in docs/sql.md."""
    text = (DOCS / "sql.md").read_text()
    units = {}
    for key in LABELS:
        section = text.split(f"\n### `{key}`\n", 1)[1].split("\n### ", 1)[0]
        for column, kind, unit in re.findall(r"^\| `(\w+)` \| (\w+) \| ([^|]+) \|", section, flags=re.MULTILINE):
            if kind in NUMBERS and column not in {"window_start", "window_end", "evaluated_at"}:
                units[key, column] = unit.strip()
    return units


def test_every_figure_gauge_says_what_it_is_in_the_unit_its_table_documents() -> None:
    units = sql_units()
    assert len(units) > 60
    for (key, column), unit in units.items():
        text = figure_help(key, column)
        assert not text.startswith(f"{column} ("), f"{key}.{column} has no description"
        if unit != "—":
            assert f"Unit: {unit}." in text, f"{key}.{column}: {text!r} does not give its unit {unit}"


def test_the_docs_list_each_detectors_gauge_labels() -> None:
    section = (DOCS / "detectors.md").read_text().split("\n### Figures as Prometheus gauges\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \| ((?:`\w+`(?:, )?)+) \|$", section, flags=re.MULTILINE)
    assert {key: tuple(re.findall(r"`(\w+)`", labels)) for key, labels in rows} == LABELS
