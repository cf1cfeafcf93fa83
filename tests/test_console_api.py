"""The reads the console adds to the JSON API, on a real service: a detector's figures over a range, the
service's status, one trace; and the console's files and sign-in. (The pages themselves are driven in a real
browser in tests/test_console_browser.py.)"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from builders import T0, gauge, metrics_request, request, span
from conftest import RunningService, service_settings

from storage.ports import EvaluationRecord, RunRecord, Window
from tailwatch.console import RATE_SAMPLES, IngestRate

PROTOBUF = "application/x-protobuf"
TOKEN = "s3cret"
T = datetime(2026, 11, 20, 12, 0)


def call(url: str, data: bytes | None = None, **headers: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def get_json(svc: RunningService, path: str) -> tuple[int, Any]:
    status, _, body = call(svc.api_url + path)
    return status, json.loads(body)


def token_latency_rows(window_end: datetime, p99: float) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "window_start": [window_end - timedelta(minutes=5)],
            "window_end": [window_end],
            "evaluated_at": [window_end + timedelta(seconds=30)],
            "model": ["m"],
            "deployment": ["d"],
            "tenant_id": [None],
            "grouping": ["model"],
            "n": [100],
            "tpot_p99": [p99],
            "breached": [False],
        },
        schema_overrides={"tenant_id": pl.String},
    )


def persist_windows(svc: RunningService, ends: list[datetime]) -> None:
    store = svc.service.storage.detector_store
    for i, end in enumerate(ends):
        window = Window(end - timedelta(minutes=5), end)
        run = RunRecord("token_latency", end, window, "ok", 0.1, rows=1, conditions=0)
        store.persist(EvaluationRecord(run, {"token_latency": token_latency_rows(end, 10.0 + i)}))


def test_figures_are_the_stored_rows_of_the_windows_ending_in_the_range(service: RunningService) -> None:
    ends = [T + timedelta(minutes=5 * i) for i in range(4)]
    persist_windows(service, ends)
    # (from, to]: a window ending exactly at `from` is the range before's, one ending at `to` is in it.
    status, body = get_json(
        service, f"/v1/figures/token_latency?from={ends[0]:%Y-%m-%dT%H:%M:%SZ}&to={ends[2]:%Y-%m-%dT%H:%M:%SZ}"
    )
    assert status == 200
    assert [(r["window_end"], r["tpot_p99"]) for r in body["rows"]] == [
        (f"{ends[1]:%Y-%m-%dT%H:%M:%S}Z", 11.0),
        (f"{ends[2]:%Y-%m-%dT%H:%M:%S}Z", 12.0),
    ]
    assert body["truncated"] is False
    assert "evaluated_at" not in body["rows"][0]
    # The detector's thresholds come along, so a page can draw them.
    assert body["config"]["ratio_threshold"] == 2.0
    assert body["stride"] == 1


def test_past_the_limit_every_stride_th_window_is_kept_counting_back_from_the_newest(service: RunningService) -> None:
    persist_windows(service, [T + timedelta(minutes=5 * i) for i in range(4)])
    day = "from=2026-11-20T00:00:00Z&to=2026-11-21T00:00:00Z"
    # Four windows, three rows allowed: every second window, the newest (13.0) first among them.
    body = get_json(service, f"/v1/figures/token_latency?{day}&limit=3")[1]
    assert ([r["tpot_p99"] for r in body["rows"]], body["stride"], body["truncated"]) == ([11.0, 13.0], 2, True)
    body = get_json(service, f"/v1/figures/token_latency?{day}&limit=4")[1]
    assert ([r["tpot_p99"] for r in body["rows"]], body["stride"], body["truncated"]) == ([10.0, 11.0, 12.0, 13.0], 1,
                                                                                           False)  # fmt: skip
    # Not a time series (no window_end asked for): the cap cuts what sorts first, and says so.
    body = get_json(service, f"/v1/figures/token_latency?{day}&limit=2&columns=tpot_p99")[1]
    assert ([r["tpot_p99"] for r in body["rows"]], body["stride"], body["truncated"]) == ([12.0, 13.0], 1, True)


def test_a_week_of_windows_under_a_small_limit_is_drawn_whole_with_its_newest_window(service: RunningService) -> None:
    """Read oldest first under the cap, a 7-day range used to end early, silently: its newest windows lost."""
    ends = [T + timedelta(minutes=5 * i) for i in range(7 * 288)]
    store = service.service.storage.detector_store
    frames = [token_latency_rows(end, float(i)) for i, end in enumerate(ends)]
    window = Window(ends[0] - timedelta(minutes=5), ends[-1])
    run = RunRecord("token_latency", ends[-1], window, "ok", 0.1, rows=len(ends), conditions=0)
    store.persist(EvaluationRecord(run, {"token_latency": pl.concat(frames)}))
    week = f"from={ends[0] - timedelta(minutes=1):%Y-%m-%dT%H:%M:%SZ}&to={ends[-1]:%Y-%m-%dT%H:%M:%SZ}"
    body = get_json(service, f"/v1/figures/token_latency?{week}&limit=200")[1]
    got = [r["window_end"] for r in body["rows"]]
    assert body["stride"] == 11 and body["truncated"] is True and len(got) <= 200
    assert got[-1] == f"{ends[-1]:%Y-%m-%dT%H:%M:%S}Z" and got == sorted(got)
    assert got[0] <= f"{ends[10]:%Y-%m-%dT%H:%M:%S}Z"  # the whole week, at a coarser grain


def test_figures_narrow_to_chosen_columns_distinct_rows_and_matching_groups(service: RunningService) -> None:
    persist_windows(service, [T + timedelta(minutes=5 * i) for i in range(3)])
    day = "from=2026-11-20T00:00:00Z&to=2026-11-21T00:00:00Z"
    body = get_json(service, f"/v1/figures/token_latency?{day}&columns=tpot_p99,model")[1]
    assert body["rows"] == [{"tpot_p99": p, "model": "m"} for p in (10.0, 11.0, 12.0)]
    body = get_json(service, f"/v1/figures/token_latency?{day}&columns=grouping,model,deployment&distinct=true")[1]
    assert body["rows"] == [{"grouping": "model", "model": "m", "deployment": "d"}]
    assert len(get_json(service, f"/v1/figures/token_latency?{day}&model=m&grouping=model")[1]["rows"]) == 3
    assert get_json(service, f"/v1/figures/token_latency?{day}&model=other")[1]["rows"] == []
    by_number = get_json(service, f"/v1/figures/token_latency?{day}&n=100")[1]["rows"]
    assert [r["tpot_p99"] for r in by_number] == [10.0, 11.0, 12.0]  # a number matches as its text
    status, body = get_json(service, f"/v1/figures/token_latency?{day}&nope=1")
    assert status == 400 and "'nope'" in body["error"]["message"]
    assert get_json(service, f"/v1/figures/token_latency?{day}&columns=model;drop")[0] == 400


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/v1/figures/spans", 404, "unknown_detector"),  # a table, but not a detector's
        ("/v1/figures/detector_runs", 404, "unknown_detector"),
        ("/v1/figures/token_latency?from=yesterday", 400, "bad_request"),
        ("/v1/figures/token_latency?from=2026-11-21T00:00:00Z&to=2026-11-20T00:00:00Z", 400, "bad_request"),
        ("/v1/figures/token_latency?limit=many", 400, "bad_request"),
        ("/v1/figures/token_latency?limit=-1", 400, "bad_request"),
        ("/v1/traces/not-a-trace", 400, "bad_request"),
        (f"/v1/traces/{'ab' * 16}", 404, "not_found"),
    ],
)
def test_a_bad_console_read_is_a_clear_error(service: RunningService, path: str, status: int, code: str) -> None:
    got, body = get_json(service, path)
    assert (got, body["error"]["code"]) == (status, code), body


def test_a_table_that_is_not_a_detectors_own_has_figures_but_no_config(service: RunningService) -> None:
    status, body = get_json(service, "/v1/figures/traffic_pattern_labels")
    assert status == 200 and body["config"] is None and body["rows"] == []


def test_a_trace_comes_with_its_request_row_and_its_range_hint_bounds_the_search(service: RunningService) -> None:
    trace_id = bytes.fromhex("0f" * 16)
    gateway = span("chat", trace_id=trace_id, span_id=b"\x01" * 8, kind=2, attributes={"gen_ai.request.model": "m"})
    engine = span(
        trace_id=trace_id,
        parent_span_id=b"\x01" * 8,
        start=T0 + 1_000_000,
        duration_ns=1_500_000_000,
        attributes={"gen_ai.request.model": "m", "gen_ai.usage.output_tokens": 50, "gen_ai.score.helpful": 0.5},
    )
    assert (
        call(
            f"{service.http_url}/v1/traces",
            request([gateway, engine]).SerializeToString(),
            **{"Content-Type": PROTOBUF},
        )[0]
        == 200
    )
    status, body = get_json(service, f"/v1/traces/{'0F' * 16}")
    assert status == 200
    assert [s["name"] for s in body["spans"]] == ["chat", "llm_request"]
    assert [r["output_tokens"] for r in body["requests"]] == [50]
    assert "attributes" in body["spans"][0] and "resource" not in body["spans"][0]
    end = datetime.fromisoformat(body["spans"][0]["end_time"].rstrip("Z"))
    inside = f"from={end - timedelta(minutes=1):%Y-%m-%dT%H:%M:%SZ}&to={end + timedelta(minutes=1):%Y-%m-%dT%H:%M:%SZ}"
    assert get_json(service, f"/v1/traces/{'0f' * 16}?{inside}")[0] == 200
    outside = f"from={end + timedelta(minutes=1):%Y-%m-%dT%H:%M:%SZ}&to={end + timedelta(minutes=2):%Y-%m-%dT%H:%M:%SZ}"
    assert get_json(service, f"/v1/traces/{'0f' * 16}?{outside}")[0] == 404


def test_a_trace_s_engine_points_reach_a_minute_either_side_of_its_request(service: RunningService) -> None:
    trace_id = bytes.fromhex("1e" * 16)
    pod = {"k8s.pod.name": "pod-a"}
    llm = span(trace_id=trace_id, start=T0, duration_ns=10_000_000_000, attributes={"gen_ai.request.model": "m"})
    traces = request([llm], pod).SerializeToString()
    assert call(f"{service.http_url}/v1/traces", traces, **{"Content-Type": PROTOBUF})[0] == 200
    # Every 5 s from 2 minutes before the request's start to 2 minutes after its end; each point's value is
    # its second relative to the start, so the answer says which seconds came back.
    points = [(T0 + s * 1_000_000_000, float(s)) for s in range(-120, 10 + 125, 5)]
    metrics = metrics_request([gauge("vllm:num_requests_waiting", points)], pod).SerializeToString()
    assert call(f"{service.http_url}/v1/metrics", metrics, **{"Content-Type": PROTOBUF})[0] == 200
    status, trace = get_json(service, f"/v1/traces/{'1e' * 16}")
    assert status == 200
    # The chart shows the queue building before arrival and draining after the end, not the 10 s alone.
    assert [p["value"] for p in trace["engine"]] == [float(s) for s in range(-60, 10 + 65, 5)]


def test_status_reports_what_was_stored_and_each_detectors_last_pass(service: RunningService) -> None:
    status, body = get_json(service, "/v1/status")
    assert status == 200 and body["ready"] is True
    assert body["ingest"]["last_commit"] is None and body["ingest"]["stored"] == 0
    assert {d["detector"] for d in body["detectors"]} >= {"token_latency", "clusters"}
    assert all(d["runs_24h"] == 0 for d in body["detectors"])
    call(f"{service.http_url}/v1/traces", request([span(), span()]).SerializeToString(), **{"Content-Type": PROTOBUF})
    store = service.service.storage.detector_store
    now = datetime.now(UTC).replace(tzinfo=None)
    window = Window(now - timedelta(minutes=5), now)
    store.log_run(RunRecord("cache_curve", now, window, "ok", 0.2))
    store.log_run(RunRecord("cache_curve", now + timedelta(seconds=1), window, "error", 0.3, error="ValueError: x"))
    body = get_json(service, "/v1/status")[1]
    assert body["ingest"]["stored"] == 2 and body["ingest"]["last_commit"] is not None
    [cache] = [d for d in body["detectors"] if d["detector"] == "cache_curve"]
    assert (cache["last_outcome"], cache["last_error"], cache["failures_24h"], cache["runs_24h"]) == (
        "error",
        "ValueError: x",
        1,
        2,
    )


def test_the_ingest_rate_is_taken_over_the_last_minute_of_samples(service: RunningService) -> None:
    clock = iter(float(t) for t in range(0, 1000, 5))
    rate = IngestRate(service.service.registry, clock=lambda: next(clock))
    assert rate.per_second() == (None, None)
    rate.sample()
    call(
        f"{service.http_url}/v1/traces",
        request([span() for _ in range(10)]).SerializeToString(),
        **{"Content-Type": PROTOBUF},
    )
    rate.sample()
    assert rate.per_second() == (2.0, 2.0)  # 10 spans over 5 s
    for _ in range(RATE_SAMPLES):
        rate.sample()
    assert rate.per_second() == (0.0, 0.0)  # the burst is older than a minute


def test_the_console_serves_only_its_own_files_and_never_lets_the_browser_reach_elsewhere(
    service: RunningService,
) -> None:
    status, headers, body = call(service.api_url + "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"/console/app.js" in body
    assert "connect-src 'self'" in headers["Content-Security-Policy"]
    status, headers, _ = call(service.api_url + "/console/app.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    for path in ("/console/..%2Fconsole.py", "/console/settings.py", "/console/", "/console/.%2E%2Fapi.py"):
        assert call(service.api_url + path)[0] == 404, path


def test_signing_in_trades_the_token_for_a_same_site_http_only_cookie(tmp_path: Path) -> None:
    with RunningService(service_settings(tmp_path / "t.duckdb", api={"token": TOKEN})) as svc:
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        assert call(svc.api_url + "/login", b"token=guess", **form)[0] == 401
        status, headers, _ = call(svc.api_url + "/login", f"token={TOKEN}".encode(), **form)
        assert status == 204
        cookie = headers["Set-Cookie"]
        assert cookie.startswith(f"tailwatch_token={TOKEN};") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert call(svc.api_url + "/v1/status", Cookie=f"tailwatch_token={TOKEN}")[0] == 200
        assert call(svc.api_url + "/v1/status", Cookie="tailwatch_token=guess")[0] == 401
        status, headers, body = call(svc.api_url + "/")
        assert status == 401 and b'id="login"' in body  # the sign-in page, where the console would be
        assert call(svc.api_url + "/console/login.js")[0] == 200
        assert call(svc.api_url + "/console/charts.js")[0] == 401
