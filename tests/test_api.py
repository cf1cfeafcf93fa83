"""The API port: health, readiness and Prometheus metrics."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from builders import request, span
from conftest import RunningService, service_settings
from test_otlp_http import post

from collector.decode import DEFAULT_DECODER


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


def test_healthz_and_readyz_answer_when_started(service: RunningService) -> None:
    assert get(f"{service.api_url}/healthz")[0] == 200
    decoder = DEFAULT_DECODER.value
    status, body = get(f"{service.api_url}/readyz")
    assert (status, json.loads(body)) == (200, {"status": "ready", "decoder": decoder, "decoder_processes": "0"})
    metrics = get(f"{service.api_url}/metrics")[1]
    assert f'tailwatch_trace_decoder_info{{decoder="{decoder}"}} 1.0' in metrics
    assert "tailwatch_decoder_processes 0.0" in metrics


def test_the_python_decoder_serves_when_chosen_in_two_processes_by_default(db_path: Path) -> None:
    # The Python walk holds the GIL: by default it gets processes, where the compiled one gets threads.
    settings = service_settings(db_path, ingest={"decoder": "python", "decode_workers": "auto"})
    with RunningService(settings) as running:
        assert '"decoder": "python", "decoder_processes": "2"' in get(f"{running.api_url}/readyz")[1]
        body = request([span(attributes={"gen_ai.usage.input_tokens": 5})]).SerializeToString()
        assert post(f"{running.http_url}/v1/traces", body, "application/x-protobuf")[0] == 200
        metrics = get(f"{running.api_url}/metrics")[1]
        assert 'tailwatch_trace_decoder_info{decoder="python"} 1.0' in metrics
        assert "tailwatch_decoder_processes 2.0" in metrics


def test_metrics_count_received_stored_and_rejected_spans(service: RunningService) -> None:
    body = request([span(), span(), span(span_id=bytes(8))]).SerializeToString()
    assert post(f"{service.http_url}/v1/traces", body, "application/x-protobuf")[0] == 200
    status, text = get(f"{service.api_url}/metrics")
    assert status == 200
    assert 'tailwatch_spans_received_total{transport="http"} 3.0' in text
    assert "tailwatch_spans_stored_total 2.0" in text
    assert 'tailwatch_spans_rejected_total{reason="invalid_span_id"} 1.0' in text
    assert 'tailwatch_export_requests_total{outcome="ok",signal="traces",transport="http"} 1.0' in text
