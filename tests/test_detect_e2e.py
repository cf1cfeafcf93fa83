"""End to end: spans with past timestamps through a real exporter, `detect --once --at T`, alerts delivered."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import RunningService, service_settings
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from receivers import Alertmanager, WebhookReceiver
from waiting import HANG_GUARD, wait_until

NS = 1_000_000_000


def ns(at: datetime) -> int:
    return int(at.replace(tzinfo=UTC).timestamp() * NS)


def send_vllm_requests(target: str, requests: list[tuple[datetime, float, int]]) -> None:
    """vLLM-style server spans: (end time, tpot in ms, prefill tokens in the batch)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm-llama8b", "tenant.id": "acme"}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=target, insecure=True), max_export_batch_size=512)
    )
    tracer = provider.get_tracer("vllm.tracing.otel")
    for end, tpot_ms, prefill in requests:
        decode_s = tpot_ms * 100 / 1000  # 101 output tokens
        e2e_s = decode_s + 0.2
        span = tracer.start_span(
            "llm_request",
            kind=SpanKind.SERVER,
            start_time=ns(end) - int(e2e_s * NS),
            attributes={
                "gen_ai.response.model": "llama-3.1-8b",
                "gen_ai.usage.prompt_tokens": 900,
                "gen_ai.usage.completion_tokens": 101,
                "gen_ai.latency.time_to_first_token": 0.2,
                "gen_ai.latency.time_in_model_decode": decode_s,
                "gen_ai.latency.e2e": e2e_s,
                "llm.vllm.prefill_in_batch": prefill,
            },
        )
        span.end(end_time=ns(end))
    assert provider.force_flush(30_000)
    provider.shutdown()


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    am = Alertmanager(tmp_path)
    yield am
    am.close()


def test_a_planted_decode_spike_fires_once_and_reaches_the_webhook_and_alertmanager(
    tmp_path: Path, db_path: Path, webhook: WebhookReceiver, alertmanager: Alertmanager
) -> None:
    rng = random.Random(7)
    at = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    window_end = at - timedelta(seconds=30)  # the default settle time
    window_start = window_end - timedelta(minutes=5)
    # Six hours of history: the baseline ends at the last full hour before the window, so at least
    # five of them (~500 requests, over min_baseline_samples) are in it whatever the clock says.
    baseline = [
        (window_start - timedelta(seconds=rng.uniform(1, 6 * 3600)), rng.uniform(9, 11), 500) for _ in range(600)
    ]
    steady = [(window_start + timedelta(seconds=rng.uniform(0, 299)), rng.uniform(9, 11), 500) for _ in range(180)]
    spike = [(window_start + timedelta(seconds=rng.uniform(0, 299)), rng.uniform(40, 50), 6000) for _ in range(20)]
    with RunningService(service_settings(db_path)) as svc:
        send_vllm_requests(svc.grpc_target, baseline + steady + spike)
        assert svc.rows("SELECT count(*) FROM llm_requests") == [(800,)]

    config = tmp_path / "tailwatch.yaml"
    config.write_text(
        f"alerting:\n  webhook_urls: ['{webhook.url}']\n  alertmanager_url: '{alertmanager.url}'\n"
        "  backoff_seconds: 0.1\n  webhook_payloads: both\n"
    )
    cmd = [sys.executable, "-m", "tailwatch", "detect", "--once", "--at", at.isoformat() + "Z",
           "--db", str(db_path), "--config", str(config), "--detector", "token_latency"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=HANG_GUARD * 5).stdout
    assert "token_latency: window" in out and "firing" in out

    con = duckdb.connect(str(db_path), read_only=True)
    alerts = con.execute("SELECT detector, state, labels, summary FROM alerts").fetchall()
    figures = con.execute("SELECT count(*) FROM token_latency WHERE breached").fetchall()
    con.close()
    model_alert = [a for a in alerts if "tenant_id" not in json.loads(a[2])]
    assert len(model_alert) == 1
    detector, state, labels, summary = model_alert[0]
    assert (detector, state) == ("token_latency", "firing")
    assert json.loads(labels) == {"model": "llama-3.1-8b", "deployment": "vllm-llama8b"}
    assert "likely prefill_burst" in summary
    assert figures[0][0] >= 1

    firing = [b for b in webhook.bodies if b["status"] == "firing"]
    assert firing and firing[0]["detector"] == "token_latency"
    assert {a["labels"]["alertname"] for a in firing[0]["alerts"]} == {"tailwatch_token_latency"}

    wait_until(
        lambda: "tailwatch_token_latency" in {a["labels"]["alertname"] for a in alertmanager.alerts()},
        f"Alertmanager at {alertmanager.url} to list the tailwatch_token_latency alert",
    )

    # The condition clears at a later evaluation with no spike: the alert resolves.
    later = at + timedelta(minutes=10)
    cmd[cmd.index("--at") + 1] = later.isoformat() + "Z"
    subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=HANG_GUARD * 5)
    con = duckdb.connect(str(db_path), read_only=True)
    states = con.execute("SELECT DISTINCT state FROM alerts").fetchall()
    con.close()
    assert states == [("resolved",)]
    assert any(b["status"] == "resolved" for b in webhook.bodies)


def test_the_pass_reuses_a_cacheable_baseline_and_shares_reads_within_a_pass(db_path: Path) -> None:
    """A repeated baseline read is fetched once; two detectors declaring the same read in one pass share it."""
    # No scheduler: a scheduled pass landing mid-test would add reads of its own to the counts.
    with RunningService(service_settings(db_path, scheduler=False)) as service:
        detection = service.service.detection
        assert detection is not None
        source = service.service.storage.windows
        reads: list[str] = []
        for method in ("request_summary", "scores"):
            original = getattr(source, method)

            def counting(read: Any, *budget: Any, _method: str = method, _original: Any = original) -> Any:
                # An episode read while no alert fires asks for an empty window, for its columns alone.
                if read.window.start < read.window.end:
                    reads.append(_method)
                return _original(read, *budget)

            setattr(source, method, counting)
        at = datetime(2026, 11, 20, 12, 0)
        detection.run(at)
        assert reads.count("request_summary") == 1
        assert reads.count("scores") == 1  # cache_curve, traffic_pattern and tenant_fairness share one read
        reads.clear()
        detection.run(at + timedelta(minutes=5))  # same hour: the baseline is reused
        assert reads.count("request_summary") == 0
