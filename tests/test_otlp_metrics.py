"""OTLP metrics in, over both transports: the SDK's exporters, plain OTLP/JSON, and bad input.

A success answer means the points are committed; a point that cannot be stored is rejected through
partial success and counted by reason; a name Tailwatch does not know is kept, not joined.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from builders import T0, counter, gauge, histogram, metrics_request
from conftest import RunningService, service_settings
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from test_otlp_http import PROTOBUF, post

from collector.decode import Encoding, decode_metrics
from collector.engine_names import ENGINE_METRICS, EngineNames, Kind, spellings
from collector.reasons import MetricRejectReason, MetricUnjoined

POD = {"service.name": "vllm-llama8b", "service.instance.id": "10.0.0.7:8000", "k8s.pod.name": "vllm-llama8b-0"}


@pytest.fixture
def svc(db_path: Path) -> Iterator[RunningService]:
    with RunningService(service_settings(db_path)) as running:
        yield running


def export_with_sdk(exporter: MetricExporter) -> None:
    """One collection of what an instrumented engine process reports, through the real SDK exporter."""

    def waiting(_options: CallbackOptions) -> list[Observation]:
        return [Observation(3, {"model_name": "llama", "engine": "0"})]

    # The SDK refuses ':' in instrument names; underscore escaping is one of the spellings accepted.
    provider = MeterProvider(
        resource=Resource.create(POD),
        metric_readers=[PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)],
    )
    meter = provider.get_meter("engine")
    meter.create_observable_gauge("vllm_num_requests_waiting", callbacks=[waiting])
    meter.create_counter("vllm_prefix_cache_queries").add(1000, {"model_name": "llama", "engine": "0"})
    meter.create_histogram("vllm_iteration_tokens_total").record(512, {"model_name": "llama", "engine": "0"})
    provider.shutdown()  # collects and exports once


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_the_sdk_exporters_points_are_stored_with_their_canonical_metric(svc: RunningService, transport: str) -> None:
    exporter: MetricExporter = (
        GrpcMetricExporter(endpoint=svc.grpc_target, insecure=True)
        if transport == "grpc"
        else HttpMetricExporter(endpoint=f"{svc.http_url}/v1/metrics")
    )
    export_with_sdk(exporter)
    rows = svc.rows(
        "SELECT name, metric, kind, value, replica_id, deployment, model, engine, source "
        "FROM engine_metrics ORDER BY name"
    )
    assert rows == [
        ("vllm_iteration_tokens_total_count", "step_tokens_count", "cumulative", 1.0, "vllm-llama8b-0",
         "vllm-llama8b", "llama", "0", "otlp"),
        ("vllm_iteration_tokens_total_sum", "step_tokens_sum", "cumulative", 512.0, "vllm-llama8b-0",
         "vllm-llama8b", "llama", "0", "otlp"),
        ("vllm_num_requests_waiting", "requests_waiting", "gauge", 3.0, "vllm-llama8b-0", "vllm-llama8b", "llama",
         "0", "otlp"),
        ("vllm_prefix_cache_queries", "prefix_cache_queries", "cumulative", 1000.0, "vllm-llama8b-0",
         "vllm-llama8b", "llama", "0", "otlp"),
    ]  # fmt: skip
    assert svc.metric("tailwatch_metric_points_received_total", transport=transport) == 3
    assert svc.metric("tailwatch_export_requests_total", transport=transport, signal="metrics", outcome="ok") == 1


def vllm_names_request() -> bytes:
    """vLLM's names as the Collector's prometheus receiver forwards them, and Ray Serve's renamed ones."""
    return metrics_request(
        [
            gauge("vllm:num_requests_waiting", [(T0, 1.0)]),
            gauge("ray_vllm:num_requests_running", [(T0, 2.0)]),
            gauge("ray_vllm_kv_cache_usage_perc", [(T0, 0.5)]),
            gauge("vllm:gpu_cache_usage_perc", [(T0, 0.6)]),
            counter("vllm:prefix_cache_hits_total", [(T0, 10.0)]),
            counter("vllm:prefix_cache_queries", [(T0, 20.0)]),
            counter("vllm:num_preemptions_total", [(T0, 1.0)], delta=True),
            gauge("sglang:num_queue_reqs", [(T0, 4.0)]),
            gauge("sglang:token_usage", [(T0, 0.7)]),
            gauge("sglang:cache_hit_rate", [(T0, 0.4)]),
            counter("sglang:cached_tokens_total", [(T0, 5.0)], {"cache_source": "device"}),
            gauge("ray_serve_deployment_queued_queries", [(T0, 6.0)]),
            histogram("vllm:iteration_tokens_total", [(T0, 100.0, 4)]),
        ],
        POD,
    ).SerializeToString()


def test_every_spelling_of_an_engine_metric_maps_to_its_canonical_name(svc: RunningService) -> None:
    assert post(f"{svc.http_url}/v1/metrics", vllm_names_request(), PROTOBUF)[0] == 200
    assert dict(svc.rows("SELECT name, metric FROM engine_metrics")) == {
        "vllm:num_requests_waiting": "requests_waiting",
        "ray_vllm:num_requests_running": "requests_running",
        "ray_vllm_kv_cache_usage_perc": "kv_cache_usage",
        "vllm:gpu_cache_usage_perc": "kv_cache_usage",
        "vllm:prefix_cache_hits_total": "prefix_cache_hits",
        "vllm:prefix_cache_queries": "prefix_cache_queries",
        "vllm:num_preemptions_total": "preemptions",
        "sglang:num_queue_reqs": "requests_waiting",
        "sglang:token_usage": "kv_cache_usage",
        "sglang:cache_hit_rate": "cache_hit_rate",
        "sglang:cached_tokens_total": "prefix_cache_hits",
        "ray_serve_deployment_queued_queries": "requests_waiting",
        "vllm:iteration_tokens_total_sum": "step_tokens_sum",
        "vllm:iteration_tokens_total_count": "step_tokens_count",
    }
    assert svc.rows("SELECT DISTINCT kind FROM engine_metrics WHERE name = 'vllm:num_preemptions_total'") == [
        ("delta",)
    ]


def export_dotted_with_sdk(exporter: MetricExporter) -> None:
    """What an engine pushing OTLP metrics through the SDK sends: the SDK spells vLLM's names with dots."""
    engine = {"model_name": "llama", "engine": "0"}

    def waiting(_options: CallbackOptions) -> list[Observation]:
        return [Observation(5, engine)]

    def by_reason(_options: CallbackOptions) -> list[Observation]:
        return [Observation(4, {**engine, "reason": "capacity"}), Observation(1, {**engine, "reason": "deferred"})]

    provider = MeterProvider(
        resource=Resource.create(POD),
        metric_readers=[PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)],
    )
    meter = provider.get_meter("vllm")
    meter.create_observable_gauge("vllm.num_requests_waiting", callbacks=[waiting])
    meter.create_observable_gauge("vllm.num_requests_waiting_by_reason", callbacks=[by_reason])
    meter.create_counter("vllm.prompt_tokens").add(900, engine)
    meter.create_counter("vllm.prompt_tokens_cached").add(300, engine)
    meter.create_histogram("vllm.request_queue_time_seconds").record(0.25, engine)
    meter.create_observable_gauge("sglang.num_queue_reqs", callbacks=[waiting])
    provider.shutdown()  # collects and exports once


def test_dotted_names_of_an_sdk_push_land_as_the_same_canonical_metrics(svc: RunningService) -> None:
    export_dotted_with_sdk(HttpMetricExporter(endpoint=f"{svc.http_url}/v1/metrics"))
    rows = svc.rows(
        "SELECT name, metric, attributes->>'reason', kind, value FROM engine_metrics "
        "ORDER BY name, attributes->>'reason'"
    )
    assert rows == [
        ("sglang.num_queue_reqs", "requests_waiting", None, "gauge", 5.0),
        ("vllm.num_requests_waiting", "requests_waiting", None, "gauge", 5.0),
        ("vllm.num_requests_waiting_by_reason", "requests_waiting_by_reason", "capacity", "gauge", 4.0),
        ("vllm.num_requests_waiting_by_reason", "requests_waiting_by_reason", "deferred", "gauge", 1.0),
        ("vllm.prompt_tokens", "prompt_tokens", None, "cumulative", 900.0),
        ("vllm.prompt_tokens_cached", "prompt_tokens_cached", None, "cumulative", 300.0),
        ("vllm.request_queue_time_seconds_count", "queue_time_count", None, "cumulative", 1.0),
        ("vllm.request_queue_time_seconds_sum", "queue_time_sum", None, "cumulative", 0.25),
    ]
    assert svc.metric("tailwatch_metric_points_unjoined_total", reason="unknown_name") == 0


@pytest.mark.parametrize(
    ("canonical", "name"),
    [(canonical, name) for canonical, metric in ENGINE_METRICS.items() for name in metric.names],
)
def test_every_spelling_of_every_name_in_the_table_finds_its_canonical_metric(canonical: str, name: str) -> None:
    kind = ENGINE_METRICS[canonical].kind
    # Prometheus shows a counter with `_total`; the Collector may keep or strip it.
    suffixes = ("", "_total", "_TOTAL") if kind is Kind.COUNTER else ("",)
    variants = [v + suffix for v in spellings(name) for suffix in suffixes]
    if name.startswith("vllm:"):
        assert len(variants) == 6 * len(suffixes)  # `:`, `_`, `.`, and Ray's three
    assert {v: EngineNames().lookup(v) for v in variants} == dict.fromkeys(variants, (canonical, kind))


def test_names_added_in_config_are_joined_like_the_built_in_ones(db_path: Path) -> None:
    settings = service_settings(db_path, metrics={"names": {"requests_waiting": ["myengine:queue_len"]}})
    with RunningService(settings) as svc:
        body = metrics_request([gauge("myengine:queue_len", [(T0, 7.0)])], POD).SerializeToString()
        assert post(f"{svc.http_url}/v1/metrics", body, PROTOBUF)[0] == 200
        assert svc.rows("SELECT metric FROM engine_metrics") == [("requests_waiting",)]


def test_otlp_json_metrics_with_gzip_are_stored(svc: RunningService) -> None:
    doc = {
        "resourceMetrics": [
            {
                "resource": {"attributes": [{"key": "k8s.pod.name", "value": {"stringValue": "vllm-llama8b-0"}}]},
                "scopeMetrics": [
                    {
                        "metrics": [
                            {
                                "name": "vllm:num_requests_waiting",
                                "gauge": {
                                    "dataPoints": [
                                        {
                                            "timeUnixNano": str(T0),
                                            "asInt": "5",
                                            # Exemplars carry hex ids; they are not used and must not break parsing.
                                            "exemplars": [{"spanId": "eee19b7ec3c1b174", "asDouble": 1.0}],
                                        }
                                    ]
                                },
                            }
                        ]
                    }
                ],
            }
        ]
    }
    body = gzip.compress(json.dumps(doc).encode())
    status, _, answer = post(f"{svc.http_url}/v1/metrics", body, "application/json", **{"Content-Encoding": "gzip"})
    assert status == 200 and json.loads(answer) == {}
    assert svc.rows("SELECT value, replica_id FROM engine_metrics") == [(5.0, "vllm-llama8b-0")]


def bad_points_request() -> bytes:
    nan, inf = float("nan"), float("inf")
    far = 1 << 63
    return metrics_request(
        [
            gauge("vllm:num_requests_waiting", [(T0, 1.0), (T0 + 1, nan), (T0 + 2, inf), (T0 + 3, -inf), (far, 1.0)]),
            gauge("vllm:num_requests_running", [(0, 1.0)]),
            # A known gauge name arriving as a counter: kept for SQL, not joined.
            counter("vllm:kv_cache_usage_perc", [(T0, 0.5)]),
            gauge("my_engine_custom_thing", [(T0, 42.0)]),
            gauge("", [(T0, 1.0)]),
        ],
        POD,
    ).SerializeToString()


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_bad_points_are_rejected_through_partial_success_and_the_rest_is_stored(
    svc: RunningService, transport: str
) -> None:
    if transport == "http":
        status, _, answer = post(f"{svc.http_url}/v1/metrics", bad_points_request(), PROTOBUF)
        assert status == 200
        response = ExportMetricsServiceResponse.FromString(answer)
    else:
        with grpc.insecure_channel(svc.grpc_target) as channel:
            call = channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export")
            response = ExportMetricsServiceResponse.FromString(call(bad_points_request(), timeout=60))
    assert response.partial_success.rejected_data_points == 6
    message = response.partial_success.error_message
    assert "non_finite_value" in message and "missing_time" in message and "invalid_time" in message
    assert "missing_name" in message and "missing_time (time_unix_nano is 0)" in message
    assert sorted(svc.rows("SELECT name, metric FROM engine_metrics"), key=str) == [
        ("my_engine_custom_thing", None),
        ("vllm:kv_cache_usage_perc", None),
        ("vllm:num_requests_waiting", "requests_waiting"),
    ]
    assert svc.metric("tailwatch_metric_points_rejected_total", reason="non_finite_value") == 3
    assert svc.metric("tailwatch_metric_points_unjoined_total", reason="unknown_name") == 1
    assert svc.metric("tailwatch_metric_points_unjoined_total", reason="type_mismatch") == 1


def test_summaries_and_staleness_markers_are_ignored_not_errors(svc: RunningService) -> None:
    request = metrics_request([gauge("vllm:num_requests_waiting", [(T0, 1.0)])], POD)
    metrics = request.resource_metrics[0].scope_metrics[0].metrics
    summary = metrics.add(name="vllm:request_latency")
    summary.summary.data_points.add(time_unix_nano=T0, count=3, sum=1.5)
    stale = metrics.add(name="vllm:num_requests_running")
    stale.gauge.data_points.add(time_unix_nano=T0, as_double=0.0, flags=1)  # no recorded value
    status, _, answer = post(f"{svc.http_url}/v1/metrics", request.SerializeToString(), PROTOBUF)
    assert status == 200 and not ExportMetricsServiceResponse.FromString(answer).HasField("partial_success")
    assert svc.rows("SELECT name FROM engine_metrics") == [("vllm:num_requests_waiting",)]
    assert svc.metric("tailwatch_metric_points_ignored_total") == 2


def test_a_malformed_metrics_body_is_400_and_nothing_is_stored(svc: RunningService) -> None:
    status, _, answer = post(f"{svc.http_url}/v1/metrics", b"\xff\xfe not protobuf", PROTOBUF)
    assert status == 400
    assert "ExportMetricsServiceRequest" in status_pb2.Status.FromString(answer).message
    assert svc.rows("SELECT count(*) FROM engine_metrics") == [(0,)]


def test_a_point_s_labels_name_its_replica_and_deployment_as_a_span_s_attributes_would(db_path: Path) -> None:
    # Ray Serve reports every replica's figures from one process, naming each in the point's labels.
    normalize = {
        "replica_keys": ["span:replica", "resource:k8s.pod.name", "resource:service.instance.id"],
        "deployment_keys": ["span:deployment", "resource:service.name"],
    }
    with RunningService(service_settings(db_path, normalize=normalize)) as svc:
        labels = {"deployment": "llm-app", "replica": "llm-app#abc"}
        body = metrics_request(
            [
                gauge("ray_serve_num_ongoing_requests_at_replicas", [(T0, 2.0)], labels),
                gauge("ray_serve_deployment_queued_queries", [(T0, 1.0)], {"deployment": "llm-app"}),
            ],
            {"service.name": "ray", "service.instance.id": "10.0.0.9:8080"},
        ).SerializeToString()
        assert post(f"{svc.http_url}/v1/metrics", body, PROTOBUF)[0] == 200
        assert sorted(svc.rows("SELECT metric, replica_id, deployment FROM engine_metrics")) == [
            ("requests_running", "llm-app#abc", "llm-app"),
            ("requests_waiting", "10.0.0.9:8080", "llm-app"),
        ]


def test_every_kind_of_point_is_stored_as_its_temporality_says_or_counted_as_ignored() -> None:
    request = metrics_request(
        [
            # An up-down counter's cumulative value is a level: a gauge, joined as one.
            counter("vllm:num_requests_waiting", [(T0, 4.0)], monotonic=False),
            # A non-monotonic delta is a counter's increments: kept, not joined as a gauge.
            counter("vllm:num_requests_running", [(T0, -1.0)], delta=True, monotonic=False),
            histogram("my_engine:step_seconds", [(T0, 2.0, 8)]),  # unknown name: kept, not joined
            gauge("vllm:kv_cache_usage_perc", [(1, 0.5)]),  # 1 ns after the epoch is a time, if an odd one
        ],
        POD,
    )
    metrics = request.resource_metrics[0].scope_metrics[0].metrics
    delta = metrics.add(name="vllm:iteration_tokens_total").histogram
    delta.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
    delta.data_points.add(time_unix_nano=T0, count=3)  # no sum: only the count is stored
    delta.data_points.add(time_unix_nano=T0 + 1, count=9, sum=1.0, flags=1)  # no recorded value
    stale = metrics.add(name="vllm:prefix_cache_hits_total").sum
    stale.is_monotonic = True
    stale.data_points.add(time_unix_nano=T0, as_double=5.0, flags=1)  # no recorded value
    metrics.add(name="vllm:latency").exponential_histogram.data_points.add(time_unix_nano=T0, count=1)
    metrics.add(name="vllm:kv_cache_usage_perc").gauge.data_points.add(time_unix_nano=T0)  # no value at all
    decoded = decode_metrics(request.SerializeToString(), Encoding.PROTOBUF)
    rows = sorted(
        (r["name"], r["metric"], r["kind"], r["value"])
        for r in decoded.metrics.select(["name", "metric", "kind", "value"]).to_pylist()
    )
    assert rows == [
        ("my_engine:step_seconds_count", None, "cumulative", 8.0),
        ("my_engine:step_seconds_sum", None, "cumulative", 2.0),
        ("vllm:iteration_tokens_total_count", "step_tokens_count", "delta", 3.0),
        ("vllm:kv_cache_usage_perc", "kv_cache_usage", "gauge", 0.5),
        ("vllm:num_requests_running", None, "delta", -1.0),
        ("vllm:num_requests_waiting", "requests_waiting", "gauge", 4.0),
    ]
    assert decoded.ignored == 3  # the two no-recorded-value points and the exponential histogram
    assert dict(decoded.rejections.counts) == {MetricRejectReason.MISSING_VALUE: 1}
    assert decoded.points == 5 and decoded.items == 8
    assert dict(decoded.unjoined) == {MetricUnjoined.UNKNOWN_NAME: 1, MetricUnjoined.TYPE_MISMATCH: 1}
