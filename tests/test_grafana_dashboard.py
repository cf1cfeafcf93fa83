"""The Grafana dashboard queries only metrics that exist: Tailwatch's, as a running service exports them
after a detection pass, and vLLM's, as the engine-names table says vLLM exports them."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import RunningService, service_settings
from prometheus_client.parser import text_string_to_metric_families

from collector.engine_names import ENGINE_METRICS, VLLM_METRICS, Kind
from simulator import simulate

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "tailwatch.json"
SCENARIOS = ["noisy_neighbor", "replica_drift", "quantization_regression", "long_context"]

# PromQL words that are not metric names: aggregations, binary operators and modifiers, literals.
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                "quantile", "limitk", "limit_ratio"}  # fmt: skip
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
            "atan2", "inf", "nan"}  # fmt: skip
GRAFANA_VARIABLES = {"__rate_interval", "__interval", "__range", "__interval_ms", "__range_s"}
# Strings, label matchers, ranges and subqueries, label lists of by/without/on/ignoring/group_*,
# offset durations and dashboard variables: none of them holds a metric name.
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[\w$]+")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_NAME_MATCHER = re.compile(r"__name__\s*=\s*\"([^\"]+)\"")
_IDENTIFIER = re.compile(r"(?<![\w:.])[A-Za-z_:][\w:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    names = set(_NAME_MATCHER.findall(expr))
    text = _STRING.sub(" ", expr)
    for pattern in (_MATCHERS, _RANGE, _LABEL_LIST, _OFFSET, _VARIABLE):
        text = pattern.sub(" ", text)
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation: rate(...), sum by (le) (...)
        if word.lower() in KEYWORDS or word in AGGREGATIONS:
            continue
        names.add(word)
    return names


def expressions(dashboard: dict[str, Any]) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets (rows' panels too) and variable queries."""

    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            yield from (target["expr"] for target in panel.get("targets", []) if target.get("expr"))
            yield from walk(panel.get("panels", []))

    yield from walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"] if isinstance(variable["query"], str) else variable["query"]["query"]
        if found := re.fullmatch(r"\s*(?:label_values\((.+),\s*\w+\s*\)|query_result\((.+)\))\s*", query):
            yield found.group(1) or found.group(2)


def vllm_exposition() -> set[str]:
    """Every sample name vLLM's /metrics shows, by the engine-names table."""
    suffixes = {Kind.GAUGE: ("",), Kind.COUNTER: ("_total",), Kind.HISTOGRAM: ("_bucket", "_sum", "_count")}
    return {name + suffix for name, kind in VLLM_METRICS.items() for suffix in suffixes[kind]}


def unexported(dashboard: dict[str, Any], tailwatch: set[str], vllm: set[str]) -> list[str]:
    """The metric names the dashboard queries that nobody exports, each with its expression."""
    missing = []
    for expr in expressions(dashboard):
        for name in sorted(metric_names(expr)):
            exported = tailwatch if name.startswith("tailwatch_") else vllm if name.startswith("vllm:") else set()
            if name not in exported:
                missing.append(f"{name} in {expr}")
    return missing


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


@pytest.fixture(scope="module")
def tailwatch_exposition(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The sample names of a running service's /metrics once a detection pass ran on seeded traffic."""
    db = tmp_path_factory.mktemp("grafana") / "tailwatch.duckdb"
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    with RunningService(service_settings(db)) as svc:
        simulate.run(
            SCENARIOS, endpoint=svc.grpc_target, protocol="grpc", emitter="vllm", seed=7, end=end,
            history_hours=2.0, history_rate=0.1, rate=3.0,
        )  # fmt: skip
        svc.wait_committed()
        detection = svc.service.detection
        assert detection is not None
        assert all(r.outcome == "ok" for r in detection.run(end + timedelta(seconds=30)))
        with urllib.request.urlopen(f"{svc.api_url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            "histogram_quantile(0.99, sum by (le, model_name) "
            '(rate(vllm:e2e_request_latency_seconds_bucket{model_name=~"$model"}[5m])))',
            {"vllm:e2e_request_latency_seconds_bucket"},
        ),
        ("sum(rate(a_total[$__rate_interval])) / sum(rate(b_total[1h:5m] offset 1d))", {"a_total", "b_total"}),
        ("max(x) by (tenant_id) > bool 1.5e3", {"x"}),
        ("x * on (pod) group_left (node) y unless z or count without (le) (w)", {"x", "y", "z", "w"}),
        ('label_replace(up{job="a"}, "dst", "$1", "src", "(.*)") == 1', {"up"}),
        ('{__name__="by_name", job="j"}', {"by_name"}),
        ("time() - process_start_time_seconds", {"process_start_time_seconds"}),
        ("topk(5, sum by (detector) (increase(m[1h])))", {"m"}),
        ("vector(0) + -Inf", set()),
    ],
)
def test_the_extractor_finds_exactly_the_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_every_tailwatch_and_vllm_metric_the_dashboard_queries_is_exported(
    dashboard: dict[str, Any], tailwatch_exposition: set[str]
) -> None:
    queried = {name for expr in expressions(dashboard) for name in metric_names(expr)}
    # An extractor that found nothing would pass everything: the dashboard queries dozens of metrics.
    assert len([n for n in queried if n.startswith("tailwatch_")]) >= 30, sorted(queried)
    assert len([n for n in queried if n.startswith("vllm:")]) >= 10, sorted(queried)
    assert {n for n in queried if not n.startswith(("tailwatch_", "vllm:"))} == set()
    assert unexported(dashboard, tailwatch_exposition, vllm_exposition()) == []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("tailwatch_spans_stored_total", "tailwatch_spans_stored"),  # a counter without _total
        ("tailwatch_tenant_fairness_jain_index", "tailwatch_tenant_fairness_jains_index"),
        ("tailwatch_token_latency_n,", "tailwatch_token_latency_count,"),  # in a variable's query
        ("vllm:num_preemptions_total", "vllm:num_preemptions"),
        ("vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_bucket"),
    ],
)
def test_a_misspelt_metric_in_a_copy_of_the_dashboard_is_caught(
    dashboard: dict[str, Any], tailwatch_exposition: set[str], old: str, new: str
) -> None:
    planted = json.loads(json.dumps(dashboard).replace(old, new))
    assert planted != dashboard, f"{old} is not in the dashboard"
    missing = unexported(planted, tailwatch_exposition, vllm_exposition())
    assert missing and all(m.startswith(f"{new.rstrip(',')} in ") for m in missing), missing


def test_every_panel_queries_the_prometheus_variable_and_only_defined_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (variables["DS_PROMETHEUS"]["type"], variables["DS_PROMETHEUS"]["query"]) == ("datasource", "prometheus")
    assert {"model", "deployment"} <= variables.keys()
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in [panel, *panel["targets"]]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$\{?(\w+)", target["expr"])) - GRAFANA_VARIABLES
            assert used <= variables.keys(), (panel["title"], used)


def test_the_engine_names_table_knows_every_vllm_name_tailwatch_joins_with_its_kind() -> None:
    for metric in ENGINE_METRICS.values():
        for name in metric.names:
            if name.startswith("vllm:"):
                assert VLLM_METRICS.get(name) == metric.kind, name
