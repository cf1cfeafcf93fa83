"""Changes found in the data (docs/changes.md): the rules over sightings, the store's sightings read on both
backends, incidents naming the change before them, and the comparison of two sets of requests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl
import pyarrow as pa
import pytest
from clickhouse_stores import OPENERS
from conftest import RunningService, service_settings
from waiting import HANG_GUARD

from detectors.changes import CACHE_LABELS, RESOURCE_KEYS, ChangePass, Config, describe, find
from detectors.clusters import Config as ClustersConfig
from detectors.compare import Sets, compare, differences
from detectors.incidents import Config as IncidentsConfig
from detectors.incidents import build
from model.columns import ENGINE_METRIC_BATCH_SCHEMA, SPAN_BATCH_SCHEMA
from simulator import model, simulate
from simulator.scenarios import ROLLED_OUT, SCENARIOS
from storage.duckdb.backend import DuckDBStorage
from storage.ports import SIGHTING_COLUMNS, Alert, Change, Sightings, Storage, Window

AT = datetime(2026, 12, 1, 13, 0)
CONFIG = Config()
KEYS = ("model", "quantization", *RESOURCE_KEYS, *(f"engine.cache.{k}" for k in CACHE_LABELS))
OLD = {"model": "llama", "quantization": "fp16", "service.version": "1.4.2"}
NEW = {"model": "llama", "quantization": "int4", "service.version": "1.5.0"}


def seen(
    replica: str, start: datetime, end: datetime, values: dict[str, str] | None = None, *,
    deployment: str | None = "vllm-b", source: str = "spans", per_minute: int = 10,
) -> list[dict[str, Any]]:  # fmt: skip
    """Sightings of a replica every minute of [start, end) carrying `values`, as the store reads them."""
    rows = []
    minute = start
    while minute < end:
        rows.append({
            "source": source, "deployment": deployment, "replica_id": replica, "minute": minute,
            "first_seen": minute, "last_seen": minute + timedelta(seconds=59), "n": per_minute,
            **dict.fromkeys(KEYS), **(OLD if values is None else values),
        })  # fmt: skip
        minute += timedelta(minutes=1)
    return rows


def sightings(*parts: list[dict[str, Any]]) -> pl.DataFrame:
    schema = {"source": pl.Utf8, "deployment": pl.Utf8, "replica_id": pl.Utf8, "minute": pl.Datetime("us"),
              "first_seen": pl.Datetime("us"), "last_seen": pl.Datetime("us"), "n": pl.Int64,
              **dict.fromkeys(KEYS, pl.Utf8)}  # fmt: skip
    return pl.DataFrame([row for part in parts for row in part], schema=schema)


def fleet(n: int, start: datetime, end: datetime, values: dict[str, str] | None = None,
          first: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    return [row for i in range(first, first + n) for row in seen(f"r{i}", start, end, values)]


H = timedelta(hours=1)
ROLL = AT - timedelta(minutes=20)  # the newer half of the default 60-minute lookback, settled


def rollout(at_roll: datetime = ROLL) -> pl.DataFrame:
    """Six replicas of 1.4.2/fp16; at `at_roll` r4 and r5 go and r6, r7 of 1.5.0/int4 arrive."""
    return sightings(
        fleet(4, AT - H, AT),
        fleet(2, AT - H, at_roll, first=4),
        fleet(2, at_roll, AT, NEW, first=6),
    )


def test_replicas_replaced_by_others_of_a_new_version_are_a_rollout_at_the_time_the_new_ones_came() -> None:
    [change] = find(rollout(), CONFIG, AT).changes
    assert (change.kind, change.at) == ("rollout", ROLL)
    assert (change.before, change.after) == ({"quantization": "fp16", "service.version": "1.4.2"},
                                             {"quantization": "int4", "service.version": "1.5.0"})  # fmt: skip
    assert change.scope == {"deployment": "vllm-b", "model": "llama", "replicas": ["r4", "r5", "r6", "r7"],
                            "added": ["r6", "r7"], "removed": ["r4", "r5"]}  # fmt: skip
    assert change.summary == ("rollout of vllm-b at 12:40 UTC: service.version 1.4.2 → 1.5.0, quantization fp16 → "
                              "int4; replicas r6, r7 added; r4, r5 removed")  # fmt: skip


def test_a_change_is_reported_once_settled_and_while_what_came_before_is_in_the_newer_half_of_the_lookback() -> None:
    settle = timedelta(seconds=CONFIG.settle_seconds)
    frame = rollout()
    assert find(frame, CONFIG, ROLL + settle - timedelta(seconds=1)).changes == []  # not settled yet
    [settled] = find(frame, CONFIG, ROLL + settle).changes
    half = timedelta(minutes=CONFIG.lookback_minutes) / 2
    [last] = find(frame, CONFIG, ROLL + half).changes  # its before-state still in view
    assert find(frame, CONFIG, ROLL + half + timedelta(seconds=1)).changes == []
    # Found again at each pass, it is the same change: the same id, the same time.
    assert (settled.change_id, settled.at) == (last.change_id, last.at)


def test_a_canary_of_another_version_is_a_rollout_though_no_replica_left() -> None:
    frame = sightings(fleet(4, AT - H, AT), fleet(1, ROLL, AT, NEW, first=4))
    [change] = find(frame, CONFIG, AT).changes
    assert (change.kind, change.scope["added"], change.scope["removed"]) == ("rollout", ["r4"], [])


def test_a_version_switched_on_running_replicas_is_a_version_change_and_a_quantization_alone_a_config_one() -> None:
    version = {**OLD, "service.version": "1.4.3"}
    quantized = {**OLD, "quantization": "int8"}
    frame = sightings(
        fleet(2, AT - H, AT),
        seen("r2", AT - H, ROLL), seen("r2", ROLL, AT, version),
        seen("r3", AT - H, ROLL + timedelta(minutes=2)), seen("r3", ROLL + timedelta(minutes=2), AT, version),
        seen("r4", AT - H, ROLL), seen("r4", ROLL, AT, quantized),
    )  # fmt: skip
    by_kind = {c.kind: c for c in find(frame, CONFIG, AT).changes}
    assert set(by_kind) == {"version", "config"}
    assert by_kind["version"].scope["changed"] == ["r2", "r3"]  # one switch on two replicas within the neighbourhood
    assert (by_kind["version"].before, by_kind["version"].after) == ({"service.version": "1.4.2"},
                                                                     {"service.version": "1.4.3"})  # fmt: skip
    assert (by_kind["config"].at, by_kind["config"].after) == (ROLL, {"quantization": "int8"})
    settle = timedelta(seconds=CONFIG.settle_seconds)
    assert find(frame, CONFIG, ROLL + settle - timedelta(seconds=1)).changes == []  # a switch not yet settled
    early = {c.kind: c for c in find(frame, CONFIG, ROLL + settle).changes}
    assert early["version"] == replace(by_kind["version"], found_at=ROLL + settle)  # found again: the same change
    half = timedelta(minutes=CONFIG.lookback_minutes) / 2
    assert "config" in {c.kind for c in find(frame, CONFIG, ROLL + half).changes}
    assert "config" not in {c.kind for c in find(frame, CONFIG, ROLL + half + timedelta(seconds=1)).changes}


def test_replicas_added_of_the_same_build_are_a_scale_step_reported_once_no_more_of_it_can_come() -> None:
    frame = sightings(fleet(4, AT - H, AT), fleet(2, ROLL, AT, first=4))
    closes = timedelta(seconds=CONFIG.neighbourhood_seconds + CONFIG.settle_seconds)
    assert find(frame, CONFIG, ROLL + closes - timedelta(seconds=1)).changes == []
    [change] = find(frame, CONFIG, ROLL + closes).changes
    assert (change.kind, change.at, change.before, change.after) == ("scale", ROLL, {"replica_count": 4},
                                                                     {"replica_count": 6})  # fmt: skip
    assert change.summary.startswith("scale of vllm-b at 12:40 UTC: 4 → 6 replicas")
    down = find(sightings(fleet(4, AT - H, AT), fleet(2, AT - H, ROLL, first=4)), CONFIG, AT).changes
    assert [(c.kind, c.before, c.after) for c in down] == [("scale", {"replica_count": 6}, {"replica_count": 4})]


def test_replicas_replaced_by_others_of_the_same_build_are_a_rollout_of_new_replicas() -> None:
    frame = sightings(fleet(4, AT - H, AT), fleet(2, AT - H, ROLL, first=4), fleet(2, ROLL, AT, first=6))
    [change] = find(frame, CONFIG, AT).changes
    assert (change.kind, change.before, change.after) == ("rollout", {"replicas": ["r4", "r5"]},
                                                          {"replicas": ["r6", "r7"]})  # fmt: skip


def test_a_replica_that_came_and_went_within_one_step_is_a_crash_loop_not_a_change() -> None:
    brief = seen("r4", ROLL, ROLL + timedelta(minutes=3))
    assert find(sightings(fleet(4, AT - H, AT), brief), CONFIG, AT).changes == []


def test_an_attribute_flapping_span_by_span_is_counted_and_no_change() -> None:
    flapping = [
        row for minute in range(60) for row in seen(
            "r0", AT - H + timedelta(minutes=minute), AT - H + timedelta(minutes=minute + 1),
            {**OLD, "service.version": ("1.4.2", "1.5.0")[minute % 2]},
        )
    ]  # fmt: skip
    found = find(sightings(flapping, fleet(3, AT - H, AT, first=1)), CONFIG, AT)
    assert found.changes == []
    assert found.skipped["two_values"] == 1


def test_a_replica_reporting_two_versions_at_once_is_counted_and_no_change() -> None:
    both = seen("r0", AT - H, AT) + seen("r0", ROLL, AT, NEW)
    found = find(sightings(both, fleet(3, AT - H, AT, first=1)), CONFIG, AT)
    assert found.changes == []
    assert found.skipped["two_values"] == 2  # its quantization and its version


def test_a_value_seen_past_the_next_within_switch_seconds_is_still_a_switch() -> None:
    late = timedelta(seconds=CONFIG.switch_seconds)
    old = seen("r0", AT - H, ROLL)
    old[-1]["last_seen"] = ROLL + late  # a request in flight when the engine restarted
    [change] = find(sightings(old, seen("r0", ROLL, AT, NEW), fleet(3, AT - H, AT, first=1)), CONFIG, AT).changes
    assert change.kind == "version"
    old[-1]["last_seen"] = ROLL + late + timedelta(seconds=1)
    found = find(sightings(old, seen("r0", ROLL, AT, NEW), fleet(3, AT - H, AT, first=1)), CONFIG, AT)
    assert found.changes == [] and found.skipped["two_values"] == 2


def test_thousands_of_replicas_in_one_deployment_are_counted_and_skipped_not_a_scale_step() -> None:
    # A replica id that is a request's: every span a new replica.
    churn = [
        row for i in range(CONFIG.max_replicas + 1)
        for row in seen(f"pod-{i}", AT - timedelta(minutes=25), AT - timedelta(minutes=24), per_minute=3)
    ]  # fmt: skip
    found = find(sightings(churn, fleet(4, AT - H, AT)), CONFIG, AT)
    assert found.changes == [] and found.skipped["too_many_replicas"] == 1
    bounded = find(sightings(churn[: CONFIG.max_replicas]), CONFIG, AT)
    assert bounded.skipped["too_many_replicas"] == 0
    over = find(sightings(churn), CONFIG.model_copy(update={"max_sightings": len(churn) - 1}), AT)
    assert over.changes == [] and over.skipped["too_many_sightings"] == 1


def test_missing_version_attributes_name_no_version_and_a_replica_seen_too_seldom_nothing() -> None:
    bare = {"model": "llama"}
    seldom = seen("r9", ROLL, ROLL + timedelta(minutes=1), bare, per_minute=CONFIG.min_sightings - 1)
    frame = sightings(fleet(4, AT - H, AT, bare), fleet(1, ROLL, AT, bare, first=4), seldom)
    closes = ROLL + timedelta(seconds=CONFIG.neighbourhood_seconds + CONFIG.settle_seconds)
    found = find(frame, CONFIG, max(AT, closes))
    assert [(c.kind, c.after) for c in found.changes] == [("scale", {"replica_count": 5})]
    assert found.skipped["few_sightings"] == 1
    # New pods that send no version where the old ones did: compared on what both sides say, a scale step.
    unversioned = find(sightings(fleet(4, AT - H, AT), fleet(1, ROLL, AT, bare, first=4)), CONFIG, max(AT, closes))
    assert [(c.kind, c.after) for c in unversioned.changes] == [("scale", {"replica_count": 5})]
    just = seen("r9", ROLL, ROLL + timedelta(minutes=1), bare, per_minute=CONFIG.min_sightings)
    counted = find(sightings(fleet(4, AT - H, AT, bare), just), CONFIG, max(AT, closes))
    assert counted.skipped["few_sightings"] == 0  # seen exactly min_sightings times: it counts
    nameless = find(sightings(seen("r0", ROLL, AT, deployment=None)), CONFIG, AT)
    assert nameless.changes == [] and nameless.skipped["no_deployment"] > 0


def test_spans_say_what_a_replica_served_and_metrics_what_spans_do_not_carry() -> None:
    cache = {"engine.cache.num_gpu_blocks": "64"}
    grown = {"engine.cache.num_gpu_blocks": "128"}
    frame = sightings(
        fleet(4, AT - H, AT),
        *(seen(f"r{i}", AT - H, ROLL, {**cache, "model": "meta/llama"}, source="metrics") for i in range(4)),
        *(seen(f"r{i}", ROLL, AT, {**grown, "model": "meta/llama"}, source="metrics") for i in range(4)),
    )  # fmt: skip
    [change] = find(frame, CONFIG, AT).changes
    assert (change.kind, change.after, change.scope["changed"]) == ("config", grown, ["r0", "r1", "r2", "r3"])
    assert change.scope["model"] == "llama"  # as the spans named it


def test_a_configured_attribute_is_tracked_and_a_key_that_is_no_attribute_refused() -> None:
    assert Config(attributes=("deployment.environment",)).resource_keys()[-1] == "deployment.environment"
    with pytest.raises(ValueError, match="is not an attribute key"):
        Config(attributes=("x') OR 1=1 --",))


# ---- incidents name the change before them ----------------------------------------------------------


def _alert(started: datetime, labels: dict[str, str]) -> Alert:
    return Alert(
        alert_id="a1", detector="replica_skew", fingerprint="f1", severity="warning", state="firing",
        labels={**labels, "signal": "json_adherence"}, summary="replica r6: json_adherence mean 0.74 vs 0.85",
        value=0.11, threshold=0.05, window_start=started - timedelta(minutes=5), window_end=started,
        started_at=started, resolved_at=None, updated_at=started,
    )  # fmt: skip


def _change(at: datetime, **scope: Any) -> Change:
    scope = {"deployment": "vllm-b", "model": "llama", "replicas": ["r4", "r5", "r6", "r7"], "added": ["r6", "r7"],
             "removed": ["r4", "r5"], **scope}  # fmt: skip
    before, after = {"service.version": "1.4.2", "quantization": "fp16"}, {"service.version": "1.5.0",
                                                                           "quantization": "int4"}  # fmt: skip
    return Change(f"c{at:%H%M}", at, "rollout", scope, before, after, describe("rollout", at, scope, before, after), at)


def test_an_incident_lists_the_changes_in_its_scope_before_it_and_is_titled_by_the_one_its_cause_came_with() -> None:
    started = AT - timedelta(minutes=5)
    began = started - timedelta(minutes=5)  # an alert's window before it fired
    lookback = timedelta(minutes=IncidentsConfig().change_lookback_minutes)
    inside, edge = _change(began - timedelta(minutes=3)), _change(began - lookback)
    too_early = _change(began - lookback - timedelta(seconds=1))
    after_it = _change(started + timedelta(seconds=1))
    elsewhere = _change(began - timedelta(minutes=2), deployment="vllm-c", model="qwen", replicas=["q1"],
                        added=["q1"], removed=[])  # fmt: skip
    [incident] = build([_alert(started, {"replica_id": "r6"})], [], IncidentsConfig(), AT,
                       changes=[inside, edge, too_early, after_it, elsewhere])  # fmt: skip
    assert incident.change_ids == (edge.change_id, inside.change_id)
    assert incident.title.startswith(f"since rollout 1.5.0, int4 of vllm-b at {inside.at:%H:%M} UTC: replica r6")
    assert f"Changed just before: {edge.summary}; {inside.summary}." in incident.summary


def test_an_incident_whose_cause_the_change_did_not_bring_lists_it_but_is_not_titled_by_it() -> None:
    started = AT - timedelta(minutes=5)
    change = _change(started - timedelta(minutes=10))
    [incident] = build([_alert(started, {"replica_id": "r1"})], [], IncidentsConfig(), AT, changes=[change])
    assert incident.change_ids == ()  # r1 is not among its replicas: not in its scope
    fleet_wide = _alert(started, {"tenant_id": "smallco"})
    [incident] = build([fleet_wide], [], IncidentsConfig(), AT, changes=[change])
    assert incident.change_ids == (change.change_id,)  # an incident naming no replica sees the fleet's changes
    assert not incident.title.startswith("since")


# ---- comparing two sets -------------------------------------------------------------------------------


def test_the_values_a_set_holds_more_of_than_its_baseline_rank_first_with_their_counts_and_evidence() -> None:
    a = pl.DataFrame({"version": ["1.5.0"] * 60 + ["1.4.2"] * 40, "tenant_id": ["acme", "globex"] * 50})
    b = pl.DataFrame({"version": ["1.4.2"] * 100, "tenant_id": ["acme", "globex"] * 50})
    found = differences(a, b, ["version", "tenant_id"])
    top = found[0]
    assert (top.dimension, top.value, top.a_count, top.b_count, top.a_share, top.b_share) == (
        "version", "1.5.0", 60, 0, 0.6, 0.0)  # fmt: skip
    assert top.passes and top.p_value < 1e-20 and top.excess == 60
    # Shares the same in both: no evidence at all; a value only the baseline has is never over-represented.
    by = {(d.dimension, d.value): d for d in found}
    assert by["tenant_id", "acme"].p_value == 1.0 and not by["tenant_id", "acme"].passes
    assert by["version", "1.4.2"].p_value == 1.0 and by["version", "1.4.2"].excess == -60
    # The bar is Bonferroni over every value tried: a weak difference passes alone, not among many.
    weak_a = pl.DataFrame({"v": ["x"] * 33 + ["y"] * 67})
    weak_b = pl.DataFrame({"v": ["x"] * 15 + ["y"] * 85})
    assert differences(weak_a, weak_b, ["v"])[0].passes
    weaker = pl.DataFrame({"v": ["x"] * 30 + ["y"] * 70})  # p = 0.0086: under 0.01, not under 0.01 / 2 values
    assert not differences(weaker, weak_b, ["v"])[0].passes
    # Chances too small for a double are equal: the one with more requests beyond the baseline's share ranks first.
    big = pl.DataFrame({"small": ["s"] * 1500 + ["-"] * 3500, "big": ["b"] * 3000 + ["-"] * 2000})
    base = pl.DataFrame({"small": ["-"] * 5000, "big": ["-"] * 5000})
    ranked = differences(big, base, ["small", "big"])
    assert ranked[0].p_value == ranked[1].p_value
    assert [(d.dimension, d.value) for d in ranked[:2]] == [("big", "b"), ("small", "s")]
    many = [f"d{i}" for i in range(40)]
    wide_a = weak_a.with_columns(pl.lit("same").alias(d) for d in many)
    wide_b = weak_b.with_columns(pl.lit("same").alias(d) for d in many)
    assert not differences(wide_a, wide_b, ["v", *many])[0].passes


# ---- the store's sightings, on both backends ----------------------------------------------------------

BACKENDS = {
    "duckdb": lambda directory: DuckDBStorage.open(directory / "changes.duckdb"),
    **{name: (lambda directory, o=opener: o(directory.name)) for name, opener in OPENERS.items()},
}


def _spans(replica: str, start: datetime, n: int, resource: dict[str, str], quantization: str,
           step: timedelta = timedelta(seconds=20)) -> list[dict[str, Any]]:  # fmt: skip
    return [
        {"trace_id": f"{int(replica[1:]):04x}{i:028x}", "span_id": f"{i + 1:016x}", "name": "llm_request",
         "kind": "SERVER", "start_time": start + i * step - timedelta(seconds=1), "end_time": start + i * step,
         "status_code": "OK", "is_llm": True, "llm_role": "server", "model": "llama", "deployment": "vllm-b",
         "service_name": "vllm-b", "replica_id": replica, "quantization": quantization,
         "e2e_ms": 1000.0, "duration_ms": 1000.0,
         "resource": json.dumps({**resource, "request.id": f"req-{i}"})}
        for i in range(n)
    ]  # fmt: skip


@pytest.fixture(params=sorted(BACKENDS))
def store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Storage]:
    opened = BACKENDS[request.param](tmp_path)
    yield opened
    opened.close()


def _fill(store: Storage) -> None:
    old = {"service.version": "1.4.2", "k8s.replicaset.name": "vllm-b-7d9"}
    new = {"service.version": "1.5.0", "k8s.replicaset.name": "vllm-b-5f2"}
    rows = [
        *(row for i in range(4) for row in _spans(f"r{i}", AT - H, 180, old, "fp16")),
        *(row for i in (4, 5) for row in _spans(f"r{i}", AT - H, 120, old, "fp16")),
        *(row for i in (6, 7) for row in _spans(f"r{i}", ROLL, 60, new, "int4")),
    ]
    gateway = [{**row, "trace_id": "e" + row["trace_id"][1:], "replica_id": None} for row in rows[:10]]
    spans = pa.Table.from_pylist(rows + gateway, schema=SPAN_BATCH_SCHEMA)  # a gateway's spans name no replica
    labels = {"num_gpu_blocks": "64", "block_size": "16", "engine": "0"}
    metrics = pa.Table.from_pylist([
        {"time": AT - H + timedelta(seconds=15 * i), "name": name, "kind": "gauge", "value": 1.0,
         "replica_id": "r0", "deployment": "vllm-b", "model": "meta/llama", "source": "scrape", "interval_s": 15.0,
         "attributes": json.dumps(labels if name == "vllm:cache_config_info" else {"engine": "0"}),
         "resource": json.dumps({"service.name": "vllm"})}
        for i in range(240) for name in ("vllm:cache_config_info", "vllm:num_requests_waiting")
    ], schema=ENGINE_METRIC_BATCH_SCHEMA)  # fmt: skip
    for batch in (store.sink.try_submit(spans), store.sink.try_submit(None, None, metrics)):
        assert batch is not None
        batch.result(timeout=HANG_GUARD)


def test_a_store_reads_sightings_by_replica_minute_and_tracked_value_and_keeps_changes_by_id(store: Storage) -> None:
    _fill(store)
    read = Sightings(Window(AT - H, AT), RESOURCE_KEYS, CACHE_LABELS, 10_000)
    frame = pl.from_arrow(store.change_store.sightings(read))
    assert isinstance(frame, pl.DataFrame)
    assert frame.columns[: len(SIGHTING_COLUMNS)] == list(SIGHTING_COLUMNS)
    assert set(frame.columns) == {*SIGHTING_COLUMNS, *KEYS}
    spans = frame.filter(pl.col("source") == "spans")
    assert spans["n"].sum() == 4 * 180 + 2 * 120 + 2 * 60  # every span, however many request ids their resources hold
    r6 = spans.filter(pl.col("replica_id") == "r6")
    assert set(r6["service.version"]) == {"1.5.0"} and set(r6["quantization"]) == {"int4"}
    assert set(r6["k8s.replicaset.name"]) == {"vllm-b-5f2"} and r6["first_seen"].min() == ROLL
    assert frame["container.image.name"].null_count() == frame.height  # an attribute no one sent is no value
    metrics = frame.filter(pl.col("source") == "metrics")
    assert metrics["n"].sum() == 480
    assert set(metrics["engine.cache.num_gpu_blocks"].drop_nulls()) == {"64"}
    assert metrics.filter(pl.col("engine.cache.num_gpu_blocks").is_null())["n"].sum() == 240  # the other gauge
    capped = store.change_store.sightings(Sightings(Window(AT - H, AT), RESOURCE_KEYS, CACHE_LABELS, 5))
    assert capped.num_rows == 6  # one more than the limit says there were more

    changes = ChangePass(store.change_store, CONFIG)
    [found] = changes.run(AT).changes
    after = {"k8s.replicaset.name": "vllm-b-5f2", "quantization": "int4", "service.version": "1.5.0"}
    assert (found.kind, found.at, found.after) == ("rollout", ROLL, after)
    again = changes.run(AT + timedelta(minutes=1)).changes  # read from where the last pass left off
    assert [c.change_id for c in again] == [found.change_id]
    [kept] = [Change.from_row(r) for r in store.change_store.changes().to_pylist()]
    assert kept == found  # one row, first found at the first pass
    assert store.change_store.change(found.change_id) == found and store.change_store.change("none") is None
    assert store.change_store.changes(since=ROLL + timedelta(seconds=1)).num_rows == 0
    assert store.change_store.changes(until=ROLL).num_rows == 0


def test_a_pass_that_reads_on_from_the_last_finds_what_a_pass_reading_its_whole_lookback_finds(store: Storage) -> None:
    _fill(store)
    stepping = ChangePass(store.change_store, CONFIG)
    for minute in range(0, 35, 7):  # the last at AT + 4 min
        stepping.run(AT - timedelta(minutes=30) + timedelta(minutes=minute))
    at = AT + timedelta(minutes=5)
    read_on, whole = stepping.sightings(at), ChangePass(store.change_store, CONFIG).sightings(at)
    assert read_on.height == whole.height > 0
    assert read_on.sort(read_on.columns, nulls_last=True).equals(whole.sort(whole.columns, nulls_last=True))


# ---- end to end: a simulated fleet, a real service ------------------------------------------------------


def simulated(db: Path, scenario: str) -> dict[str, Any]:
    """`scenario` sent to a real service over OTLP, one detection pass after it; what the API then says."""
    end = datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30)
    shape: dict[str, Any] = {"seed": 7, "end": end, "history_hours": 2.0, "history_rate": 0.1, "rate": 3.0}
    with RunningService(service_settings(db, scheduler=False)) as svc:
        simulate.run([scenario], endpoint=svc.grpc_target, protocol="grpc", **shape)
        svc.wait_committed()
        detection = svc.service.detection
        assert detection is not None
        detection.run(end + timedelta(seconds=30))

        def get(path: str) -> Any:
            with urllib.request.urlopen(svc.api_url + path, timeout=HANG_GUARD) as response:
                body = response.read().decode()
            return json.loads(body) if path != "/metrics" else body

        changes = get("/v1/changes")["changes"]
        incidents = get("/v1/incidents")["incidents"]
        return {
            "end": end, "changes": changes, "incidents": incidents, "metrics": get("/metrics"),
            "since": get(f"/v1/changes?since={quote(changes[0]['at'])}")["changes"] if changes else [],
            "by_change": [get(f"/v1/compare?change={c['change_id']}&limit=5") for c in changes],
            "by_incident": [get(f"/v1/compare?incident={i['incident_id']}&limit=5") for i in incidents],
        }  # fmt: skip


def test_a_rollout_of_a_worse_build_is_found_at_its_time_named_by_the_incident_and_ranked_first_by_compare(
    tmp_path: Path,
) -> None:
    seen = simulated(tmp_path / "rollout.duckdb", "rollout")
    [change] = seen["changes"]
    window_start = seen["end"] - timedelta(minutes=SCENARIOS["rollout"].minutes)
    at = datetime.fromisoformat(change["at"].removesuffix("Z"))
    assert window_start <= at < window_start + timedelta(seconds=5)  # the first span of a new pod
    assert change["kind"] == "rollout"
    assert (change["before"], change["after"]) == ({"quantization": "fp16", "service.version": "1.4.2"},
                                                   {"quantization": "int4", "service.version": "1.5.0"})  # fmt: skip
    new, old = [model.pod(r) for r in ROLLED_OUT], [model.pod(r) for r in ("r4", "r5")]
    assert (change["scope"]["added"], change["scope"]["removed"]) == (new, old)
    assert seen["since"] == [change]
    [incident] = seen["incidents"]
    assert incident["change_ids"] == [change["change_id"]]
    assert incident["title"].startswith(f"since rollout 1.5.0, int4 of {model.DEPLOYMENT} at {at:%H:%M:%S} UTC: ")
    assert f"Changed just before: {change['summary']}." in incident["summary"]
    # After the change against before it, and the incident's bad requests against the hour before it: the new
    # version and its quantization first.
    for compared in (*seen["by_change"], *seen["by_incident"]):
        top = {(d["dimension"], d["value"]) for d in compared["differences"][:2]}
        assert top == {("service.version", "1.5.0"), ("quantization", "int4")}
        assert all(d["passes"] for d in compared["differences"][:2])
    [by_change] = seen["by_change"]
    assert by_change["differences"][0]["b_count"] == 0 and by_change["a"]["deployment"] == model.DEPLOYMENT
    [by_incident] = seen["by_incident"]
    assert by_incident["a"]["symptom"] == "score:json_adherence"
    assert by_incident["differences"][0]["a_share"] > 0.9  # of the bad requests, nearly all the new build's
    assert 'tailwatch_changes_in_lookback{kind="rollout"} 1.0' in seen["metrics"]


def test_a_scale_up_of_the_same_build_is_recorded_and_names_no_incident(tmp_path: Path) -> None:
    seen = simulated(tmp_path / "scale.duckdb", "scale_up")
    [change] = seen["changes"]
    assert (change["kind"], change["before"], change["after"]) == ("scale", {"replica_count": 4},
                                                                   {"replica_count": 6})  # fmt: skip
    assert change["scope"]["added"] == [model.pod(r) for r in ("r4", "r5")]
    assert seen["incidents"] == []


def test_compare_refuses_what_it_cannot_compare_with_a_sentence(service: Any) -> None:
    def status(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(service.api_url + path, timeout=HANG_GUARD) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert status("/v1/compare?incident=nope")[0] == 404
    assert status("/v1/compare?change=nope")[0] == 404
    code, body = status("/v1/compare")
    assert code == 400 and "since before until" in body
    assert status("/v1/compare?since=2026-12-01T12:00:00Z&until=2026-12-01T11:00:00Z")[0] == 400
    assert status("/v1/compare?since=yesterday")[0] == 400
    code, body = status("/v1/compare?since=2026-12-01T12:00:00Z&until=2026-12-01T13:00:00Z")
    assert code == 200 and json.loads(body)["b"]["since"] == "2026-12-01T11:00:00Z"
    assert json.loads(body)["differences"] == []
    assert status("/v1/changes?since=2026-12-01")[1] == '{"changes": []}'


def test_compare_reads_both_sets_through_the_ports_and_gives_each_request_its_replicas_attributes(
    store: Storage,
) -> None:
    _fill(store)
    sets = Sets(Window(ROLL, AT), Window(AT - H, ROLL), deployment="vllm-b")
    found = compare(store.windows, store.change_store, sets, ClustersConfig(), CONFIG, limit=100)
    # The gateway's ten spans are requests too (of no replica), in the hour before.
    assert (found.a_requests, found.b_requests) == (4 * 60 + 2 * 60, 4 * 120 + 2 * 120 + 10)
    top = {(d.dimension, d.value) for d in found.differences[:3]}
    assert top == {("service.version", "1.5.0"), ("quantization", "int4"), ("k8s.replicaset.name", "vllm-b-5f2")}
    assert all(d.passes and d.b_count == 0 for d in found.differences[:3])
    other = Sets(Window(ROLL, AT), Window(AT - H, ROLL), deployment="vllm-c")
    assert compare(store.windows, store.change_store, other, ClustersConfig(), CONFIG).differences == []


def test_spans_that_arrive_late_within_relook_minutes_are_read_by_the_next_pass(store: Storage) -> None:
    _fill(store)
    passes = ChangePass(store.change_store, CONFIG)
    passes.run(AT)
    late = _spans("r6", AT - timedelta(minutes=3), 6, {"service.version": "1.5.0"}, "int4")
    for row in late:
        row["trace_id"] = "f" + row["trace_id"][1:]  # other requests than those already stored
    batch = store.sink.try_submit(pa.Table.from_pylist(late, schema=SPAN_BATCH_SCHEMA))
    assert batch is not None
    batch.result(timeout=HANG_GUARD)
    at = AT + timedelta(minutes=1)
    read_on = passes.sightings(at)
    assert read_on["n"].sum() == ChangePass(store.change_store, CONFIG).sightings(at)["n"].sum()
