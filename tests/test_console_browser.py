"""The console in a real browser (the system's headless Chromium, driven by Playwright) against a real service
seeded by the simulator with planted faults: every page loads without a console error and without a request
to any address but this machine's loopback, its charts carry the values the API holds for the planted data,
and a deep link restores its view.

Run alone with `scripts/test tests/test_console_browser.py`. Each test writes a picture of its page to
build/screenshots/, or to TAILWATCH_SCREENSHOTS=DIR (docs/screenshots holds the ones the README shows)."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import polars as pl
import pytest
from conftest import RunningService, service_settings
from console_seed import EARLY_BEFORE, fault_end, seed
from receivers import TEST_EXTRA, import_or_skip, require_or_skip
from test_detector_token_latency import plant_tpot

from detectors.detection import DetectionPass
from detectors.registry import REGISTRY
from detectors.token_latency import Config as TokenLatency
from simulator import simulate
from storage.duckdb.backend import DuckDBStorage
from storage.ports import EvaluationRecord, RunRecord, Window

# Slow: a real headless Chromium per page; CI and `scripts/test --all` run it.
pytestmark = pytest.mark.slow

playwright_api = import_or_skip("playwright.sync_api", TEST_EXTRA)

SCREENSHOTS = Path(__file__).resolve().parents[1] / "build" / "screenshots"
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
TOKEN = "console-test-token"
# Only the passes the seed runs: the scheduler's own would evaluate the empty minutes after the seed.
NO_SCHEDULE = {"detectors": {key: {"interval_seconds": 86_400} for key in REGISTRY}}
NO_SCHEDULE["detectors"]["slo_burn"]["slos"] = [
    {"name": "ttft-5s", "objective": 0.99, "sli": {"ttft_ms_max": 5000}, "group_by": ["tenant_id"]}
]


def chromium() -> str:
    path = os.environ.get("TAILWATCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        require_or_skip("Chromium is not on PATH", "apt-get install chromium (Debian/Ubuntu; .ci/run does this in CI)")
    assert path is not None
    return path


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningService, datetime]]:
    end = fault_end()
    db = tmp_path_factory.mktemp("console") / "tailwatch.duckdb"
    with RunningService(service_settings(db, **NO_SCHEDULE)) as svc:
        seed(svc, end)
        yield svc, end


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield b
        b.close()


class Console:
    """One browser page on the console, recording console errors and every request that would leave the host."""

    def __init__(self, browser: Any, base: str) -> None:
        self.base = base
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.context.route("**/*", self._only_loopback)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _only_loopback(self, route: Any) -> None:
        host = urlparse(route.request.url).hostname
        if host not in LOOPBACK:
            self.outside.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    def open(self, fragment: str, shot: str | None = None) -> Any:
        """Go to a view and wait until it is drawn; with `shot`, keep a picture of it under that name."""
        page = self.after(lambda: self.page.goto(f"{self.base}/#/{fragment}"))
        if shot is not None:
            self.shot(shot)
        return page

    def after(self, action: Callable[[], object]) -> Any:
        """Do `action` and wait for the render it starts. The mark of the last render is cleared first: a
        click or a hash change starts the next render only at the browser's hashchange event, after the
        action returns, and until then the old mark would say the new view is drawn."""
        self.page.evaluate("document.body && delete document.body.dataset.rendered")
        action()
        self.page.wait_for_selector("body[data-rendered='1']", timeout=30_000)
        return self.page

    def points(self, chart: str, series: str, selector: str = "circle.pt") -> dict[str, float]:
        """What a chart drew for one series: x (an ISO time or a category) -> value."""
        return self.page.eval_on_selector_all(
            f"svg[data-chart='{chart}'] {selector}[data-series={json.dumps(series, ensure_ascii=False)}]",
            "els => Object.fromEntries(els.map(e => [e.dataset.x, Number(e.dataset.v)]))",
        )

    def shot(self, name: str) -> None:
        target = Path(os.environ.get("TAILWATCH_SCREENSHOTS") or SCREENSHOTS)
        target.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(target / f"{name}.png"), full_page=True)

    def close(self) -> None:
        assert self.outside == [], f"requests left the host: {self.outside}"
        self.context.close()


@pytest.fixture
def console(browser: Any, seeded: tuple[RunningService, datetime]) -> Iterator[Console]:
    c = Console(browser, seeded[0].api_url)
    yield c
    assert c.errors == [], c.errors
    c.close()


def get(svc: RunningService, path: str, token: str | None = None) -> Any:
    request = urllib.request.Request(svc.api_url + path, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def iso(value: str) -> str:
    """The API's timestamps as the charts write them (JavaScript's toISOString)."""
    instant = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return f"{instant:%Y-%m-%dT%H:%M:%S}.{instant.microsecond // 1000:03d}Z"


def weighted(rows: list[dict[str, Any]], field: str, weight: str) -> float:
    rows = [r for r in rows if r[field] is not None and r[weight]]
    return sum(r[field] * r[weight] for r in rows) / sum(r[weight] for r in rows)


def test_the_overview_shows_the_planted_alerts_top_clusters_and_health(
    console: Console, seeded: tuple[RunningService, datetime]
) -> None:
    svc, _ = seeded
    page = console.open("overview", shot="overview")
    firing = page.eval_on_selector_all("#firing tbody tr", "rows => rows.map(r => r.innerText)")
    api_firing = get(svc, "/v1/alerts?state=firing")["alerts"]
    assert len(firing) == len(api_firing) > 0
    assert any("tenant_fairness" in row and "tenant_id=smallco" in row for row in firing), firing
    assert any("cache_curve" in row and "bucket=low" in row for row in firing), firing
    # The top clusters are the newest window's, in rank order, with links to their example traces.
    clusters = get(svc, "/v1/clusters?limit=200")["clusters"]
    newest = [c for c in clusters if c["window_end"] == clusters[0]["window_end"]][:10]
    shown = page.eval_on_selector_all("#clusters tbody tr td:nth-child(2)", "cells => cells.map(c => c.innerText)")
    assert shown == [", ".join(f"{k}={v}" for k, v in c["signature"].items()) for c in newest]
    links = page.eval_on_selector_all("#clusters a.trace", "links => links.map(a => a.getAttribute('href'))")
    assert links[0].startswith(f"#/request?trace={newest[0]['example_trace_ids'][0]}&at=")
    # Health: every detector ran its 36+ passes without a failure, and the writer has committed.
    detectors = page.eval_on_selector_all("#detectors tbody tr", "rows => rows.map(r => r.cells[2].innerText)")
    assert detectors == ["ok"] * len(REGISTRY)
    tile = page.eval_on_selector_all(".tile", "ts => Object.fromEntries(ts.map(t => [t.dataset.tile, t.innerText]))")
    assert tile["Ready"].endswith("yes")
    assert "ago" in tile["Last commit"]


def test_the_overview_leads_with_the_open_incidents_and_a_timeline_of_the_range(
    console: Console, seeded: tuple[RunningService, datetime]
) -> None:
    svc, _ = seeded
    page = console.open("overview", shot="overview-incidents")
    api_open = get(svc, "/v1/incidents?state=open&limit=500")["incidents"]
    assert api_open, "the planted faults opened no incident"
    cards = page.eval_on_selector_all("#incidents .incident-card", "cs => cs.map(c => c.dataset.incident)")
    assert sorted(cards) == sorted(i["incident_id"] for i in api_open)
    # Under the picture of the range (test_at_1280_by_800_...), the open incidents, the gravest first.
    first = page.eval_on_selector("main section h2", "h => h.innerText")
    assert first == f"Open incidents ({len(api_open)})"
    titles = page.eval_on_selector_all("#incidents h3 a", "as => as.map(a => a.innerText)")
    assert set(titles) == {i["title"] for i in api_open}
    # The timeline draws every incident of the range as a bar, the fleet's p99 and request rate under it.
    bars = page.eval_on_selector_all(
        "svg[data-chart='timeline'] rect.episode.incident", "rs => rs.map(r => r.dataset.id)"
    )
    assert set(cards) <= set(bars)
    assert page.eval_on_selector_all("svg[data-chart='timeline'] rect.episode.alert", "rs => rs.length") > 0
    assert console.points("fleet-p99", "fleet p99") and console.points("fleet-rate", "requests/s")


def test_an_incident_page_draws_its_story_engine_facts_alerts_clusters_and_examples(
    console: Console, seeded: tuple[RunningService, datetime]
) -> None:
    svc, _ = seeded
    incident = max(get(svc, "/v1/incidents?limit=500")["incidents"], key=lambda i: len(i["alert_ids"]))
    page = console.open(f"incident?id={incident['incident_id']}", shot="incident")
    assert page.eval_on_selector("#incident h2", "h => h.innerText").endswith(incident["title"])
    assert page.eval_on_selector("#incident-summary", "p => p.innerText") == incident["summary"]
    alerts = page.eval_on_selector_all("#incident-alerts tbody tr", "rs => rs.length")
    assert alerts == len(incident["alert_ids"])
    clusters = page.eval_on_selector_all("#incident-clusters tbody tr", "rs => rs.length")
    assert clusters == len(incident["cluster_ids"])
    shown = page.eval_on_selector_all("#incident-engine tbody tr td:first-child", "cs => cs.map(c => c.innerText)")
    assert shown == [k for k in ("queue_depth", "kv_cache_usage", "preempted_share", "cache_hit_ratio")
                     if k in incident["engine"]]  # fmt: skip
    drawn = page.eval_on_selector_all(
        "svg[data-chart='incident-timeline'] rect.episode", "rs => rs.map(r => r.dataset.series)"
    )
    assert drawn.count("incident") == 1 and drawn.count("alert") == len(incident["alert_ids"])
    links = page.eval_on_selector_all("#incident-examples a.trace", "as => as.map(a => a.getAttribute('href'))")
    assert [link.split("trace=")[1].split("&")[0] for link in links] == incident["example_trace_ids"]


def test_the_per_token_chart_draws_the_stored_p99_against_its_baseline_band_with_the_breach_reason(
    console: Console, seeded: tuple[RunningService, datetime]
) -> None:
    svc, end = seeded
    page = console.open("tokens?range=6h", shot="tokens")
    rows = [
        r for r in get(svc, "/v1/figures/token_latency?from=2000-01-01T00:00:00Z")["rows"] if r["grouping"] == "model"
    ]
    drawn = console.points("tpot", "tpot p99")
    assert drawn == {iso(r["window_end"]): r["tpot_p99"] for r in rows}
    # The early fault window breached, tagged with its reason, above the band's top (2x the baseline).
    breach = iso(f"{end - EARLY_BEFORE:%Y-%m-%dT%H:%M:%S}Z")
    marks = page.eval_on_selector_all(
        "svg[data-chart='tpot'] g.mark", "ms => ms.map(m => [m.dataset.x, m.dataset.label])"
    )
    assert [breach, "prefill_burst"] in marks
    band = page.eval_on_selector(
        f"svg[data-chart='tpot'] g.band-pt[data-x='{breach}']", "b => [Number(b.dataset.lo), Number(b.dataset.hi)]"
    )
    assert drawn[breach] > band[1] > band[0]
    assert page.eval_on_selector_all("#breaches tbody tr", "rows => rows.length") >= 1


def test_the_tenant_chart_shows_the_small_tenant_above_every_tenant_together(
    console: Console, seeded: tuple[RunningService, datetime]
) -> None:
    svc, end = seeded
    console.open("tenants?range=6h&tenant=smallco", shot="tenants")
    rows = get(svc, "/v1/figures/tenant_fairness?from=2000-01-01T00:00:00Z")["rows"]
    smallco = {iso(r["window_end"]): r["latency_p99"] for r in rows if r["tenant_id"] == "smallco"}
    drawn = console.points("tenant-e2e", "tenant smallco")
    everyone = console.points("tenant-e2e", "all tenants")
    assert drawn == smallco
    last = iso(f"{end:%Y-%m-%dT%H:%M:%S}Z")
    assert drawn[last] > 1.4 * everyone[last]  # the noisy neighbour's burst, against the aggregate
    jain = console.points("jain", "Jain's index")
    assert all(0 < v <= 1 for v in jain.values()) and jain
    # The tenant's SLO: its burn rate over the hour and its budget left, as slo_burn stored them.
    slo = get(svc, "/v1/figures/slo_burn?from=2000-01-01T00:00:00Z&burn_window=1h&tenant_id=smallco")["rows"]
    assert slo
    burn = console.points("slo-burn", "ttft-5s · smallco")
    assert burn == {iso(r["window_end"]): r["burn_rate"] for r in slo}
    budget = console.points("slo-budget", "ttft-5s · smallco")
    assert budget == {iso(r["window_end"]): r["budget_remaining"] for r in slo}


def test_the_curves_show_the_cache_cliff_the_worse_variant_and_the_long_contexts(
    console: Console, seeded: tuple[RunningService, datetime]
) -> None:
    svc, _ = seeded
    page = console.open("curves?range=6h&score=groundedness", shot="curves")
    cache = get(svc, "/v1/figures/cache_curve?from=2000-01-01T00:00:00Z")["rows"]
    drawn = console.points("cache-score", "this range", "rect.bar")
    for bucket in ("high", "medium", "low"):
        mine = [r for r in cache if r["bucket"] == bucket and r["score_name"] == "groundedness"]
        assert drawn[bucket] == pytest.approx(weighted(mine, "score_mean", "score_n"), rel=1e-12)
    assert drawn["low"] < drawn["high"] - 0.02  # the planted eviction cost quality in the low-hit bucket
    # The int4 variant scores worse on the score the scenario degrades.
    page = console.open("curves?range=6h&score=tool_call_correctness")
    variant = console.points("quant-score", "variant", "rect.bar")
    baseline = console.points("quant-score", "baseline", "rect.bar")
    [int4] = [k for k in variant if k.endswith("int4")]
    assert variant[int4] < baseline[int4]
    # Long prompts are the slow row of the heatmap; each pattern timeline step adds up to every request.
    cells = console.points("context-latency", "64k+", "rect.cell")
    short = console.points("context-latency", "0-8k", "rect.cell")
    assert cells and all(cells[o] > short[o] for o in cells)
    shares = page.eval_on_selector_all(
        "svg[data-chart='traffic'] rect.seg", "rs => rs.map(r => [r.dataset.x, Number(r.dataset.v)])"
    )
    totals: dict[str, float] = {}
    for x, v in shares:
        totals[x] = totals.get(x, 0) + v
    assert totals and all(t == pytest.approx(1) for t in totals.values())


def test_a_clusters_example_opens_the_request_with_its_scores_and_its_replicas_engine_metrics(
    console: Console, seeded: tuple[RunningService, datetime]
) -> None:
    svc, _ = seeded
    page = console.open("overview")
    link = page.locator("#clusters a.trace").first
    trace_id = link.get_attribute("href").split("trace=")[1].split("&")[0]
    page = console.after(link.click)
    console.shot("request")
    assert page.evaluate("document.body.dataset.view") == "request"
    body = get(svc, f"/v1/traces/{trace_id}")
    spans = page.eval_on_selector_all("svg[data-chart='spans'] rect.span", "rs => rs.map(r => r.dataset.series)")
    assert sorted(spans) == sorted(s["span_id"] for s in body["spans"]) and len(spans) == 2  # gateway + vLLM
    column = page.eval_on_selector("#request-columns td[data-column='trace_id']", "td => td.innerText")
    assert column == trace_id
    scores = page.eval_on_selector_all("#scores tbody tr", "rows => rows.map(r => r.cells[0].innerText)")
    assert scores == [s["name"] for s in body["scores"]] and scores
    # The KV-cache usage its replica reported around it, as stored.
    [replica] = {p["replica_id"] for p in body["engine"]}
    kv = {iso(p["time"]): p["value"] for p in body["engine"] if p["metric"] == "kv_cache_usage"}
    assert console.points("engine-kv_cache_usage", replica) == kv and kv


def test_a_deep_link_restores_the_view_range_selection_and_refresh(console: Console) -> None:
    page = console.open("tenants?range=6h&tenant=smallco&refresh=60")
    assert page.eval_on_selector("nav a.active", "a => a.dataset.view") == "tenants"
    assert page.eval_on_selector("#range", "s => s.value") == "6h"
    assert page.eval_on_selector("#refresh", "s => s.value") == "60"
    assert page.eval_on_selector("select[aria-label='Tenant']", "s => s.value") == "smallco"
    # Changing the range writes it into the URL, keeping the selection, and redraws.
    console.after(lambda: page.select_option("#range", "1h"))
    assert "range=1h" in page.url and "tenant=smallco" in page.url
    # Another page keeps the range and the refresh, not the tenant.
    page = console.after(lambda: page.click("nav a[data-view='curves']"))
    assert page.eval_on_selector("nav a.active", "a => a.dataset.view") == "curves"
    assert page.url.endswith("#/curves?range=1h&refresh=60"), page.url


def test_the_console_forbids_loading_anything_from_elsewhere(seeded: tuple[RunningService, datetime]) -> None:
    svc, _ = seeded
    with urllib.request.urlopen(svc.api_url + "/", timeout=10) as response:
        policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "script-src 'self'" in policy


def test_the_api_token_guards_the_console_and_a_deep_link_survives_signing_in(browser: Any, tmp_path: Path) -> None:
    with RunningService(service_settings(tmp_path / "t.duckdb", api={"token": TOKEN}, **NO_SCHEDULE)) as svc:
        # Without the token: the console's page is the sign-in form; its script and data are refused.
        refusals = [("/", 401), ("/console/app.js", 401), ("/v1/status", 401), ("/v1/figures/token_latency", 401)]
        for path, code in [*refusals, (f"/v1/traces/{'a' * 32}", 401)]:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(svc.api_url + path, timeout=10)
            assert refused.value.code == code, path
        assert refused.value.headers["WWW-Authenticate"] == 'Bearer realm="tailwatch"'
        # A cookie that is not the token opens nothing either.
        wrong = urllib.request.Request(svc.api_url + "/v1/status", headers={"Cookie": "tailwatch_token=guess"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(wrong, timeout=10)
        assert refused.value.code == 401
        assert get(svc, "/v1/status", TOKEN)["ready"] is True
        c = Console(browser, svc.api_url)
        c.page.goto(f"{svc.api_url}/#/curves?range=1h")
        c.page.wait_for_selector("#login")
        assert c.page.url.endswith("/#/curves?range=1h")
        c.shot("login")
        c.page.fill("#token", "wrong")
        c.page.click("button[type=submit]")
        c.page.wait_for_selector("#error:has-text('not this service')")
        c.page.fill("#token", TOKEN)
        page = c.after(lambda: c.page.click("button[type=submit]"))
        assert page.evaluate("document.body.dataset.view") == "curves" and page.url.endswith("#/curves?range=1h")
        assert not page.query_selector("p.error")
        # The only console errors are the browser's notes of the two 401s: the page before signing in, and
        # the wrong token.
        assert all("401" in e for e in c.errors) and len(c.errors) == 2, c.errors
        c.close()


@pytest.fixture(scope="module")
def rolled_out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    """A service that saw the `rollout` scenario and one detection pass after it."""
    end = fault_end()
    db = tmp_path_factory.mktemp("rollout") / "tailwatch.duckdb"
    with RunningService(service_settings(db, **NO_SCHEDULE)) as svc:
        simulate.run(["rollout"], endpoint=svc.grpc_target, protocol="grpc", seed=7, end=end, history_hours=2.0,
                     history_rate=0.1, rate=3.0)  # fmt: skip
        svc.wait_committed()
        assert svc.service.detection is not None
        svc.service.detection.run(end + timedelta(seconds=30))
        yield svc


def test_every_timeline_marks_the_fleets_changes_and_an_incident_page_shows_its_change_and_its_diff(
    browser: Any, rolled_out: RunningService
) -> None:
    [change] = get(rolled_out, "/v1/changes")["changes"]
    [incident] = get(rolled_out, "/v1/incidents")["incidents"]
    console = Console(browser, rolled_out.api_url)
    page = console.open("overview", shot="overview-change")
    for chart in ("timeline", "fleet-p99", "fleet-rate"):
        marks = page.eval_on_selector_all(
            f"svg[data-chart='{chart}'] g.mark.change",
            "gs => gs.map(g => [g.dataset.id, g.dataset.x, g.dataset.label])",
        )
        label = f"rollout {change['scope']['deployment']}"
        assert marks == [[change["change_id"], iso(change["at"]), label]], chart
    console.open("tenants")
    assert page.eval_on_selector_all("svg[data-chart='tenant-e2e'] g.mark.change", "gs => gs.length") == 1
    page = console.open(f"incident?id={incident['incident_id']}", shot="incident-change")
    assert page.eval_on_selector("#incident h2", "h => h.innerText").endswith(incident["title"])
    assert page.eval_on_selector_all("svg[data-chart='incident-timeline'] g.mark.change", "gs => gs.length") == 1
    rows = page.eval_on_selector_all("#incident-changes tbody tr", "rs => rs.map(r => r.innerText)")
    assert len(rows) == 1 and change["summary"] in rows[0]
    first_two = page.eval_on_selector_all(
        "#incident-compare tbody tr", "rs => rs.slice(0, 2).map(r => [...r.cells].slice(0, 2).map(c => c.innerText))"
    )
    assert sorted(first_two) == [["quantization", "int4"], ["service.version", "1.5.0"]]
    assert console.errors == [], console.errors
    console.close()


# --- legible at a glance ------------------------------------------------------------------------------------

# Rendered size of each chart text: its font size in the SVG's units times the SVG's scale on the page.
RENDERED_TEXT = """svgs => svgs.flatMap(svg => {
  const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  return [...svg.querySelectorAll('text')].filter(t => t.textContent)
    .map(t => [svg.dataset.chart, t.textContent, parseFloat(getComputedStyle(t).fontSize) * scale]);
})"""

# Pairs of boxes that overlap: (a's text, b's text) for a in `first`, b in `second` of the same chart.
OVERLAPS = """([svgs, first, second]) => svgs.flatMap(svg => {
  const box = e => e.getBoundingClientRect();
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const bs = [...svg.querySelectorAll(second)];
  return [...svg.querySelectorAll(first)].flatMap(a => bs.filter(b => b !== a && hit(box(a), box(b)))
    .map(b => [svg.dataset.chart, a.textContent, b.textContent || b.dataset.series]));
})"""


@pytest.mark.parametrize("view", ["overview", "tokens", "tenants", "curves"])
def test_chart_text_renders_at_11_px_or_more_and_a_unit_stays_clear_of_the_ticks(console: Console, view: str) -> None:
    # Reached from another page, as a person moves through the console: no load or resize of the window helps.
    page = console.open("curves" if view == "overview" else "overview")
    page = console.after(lambda: page.click(f"nav a[data-view='{view}']"))
    console.shot(f"legible-{view}")
    sizes = page.eval_on_selector_all("svg[data-chart]", RENDERED_TEXT)
    assert sizes, "no chart text on the page"
    small = [(chart, text, round(px, 1)) for chart, text, px in sizes if px < 11 - 0.05]
    assert small == [], small
    overlaps = page.eval_on_selector_all("svg[data-chart]", f"svgs => ({OVERLAPS})([svgs, 'text.unit', 'text.tick'])")
    assert overlaps == [], overlaps
    # Nor cut off at the chart's edge: a y tick label or a heatmap row name wider than the margin lost its
    # first characters ("15000" read ".5000").
    clipped = page.eval_on_selector_all(
        "svg[data-chart]",
        """svgs => svgs.flatMap(svg => { const s = svg.getBoundingClientRect();
             return [...svg.querySelectorAll('text.tick, text.unit')].filter(t => t.textContent)
               .map(t => [t, t.getBoundingClientRect()])
               .filter(([, b]) => b.left < s.left - 0.5 || b.right > s.right + 0.5)
               .map(([t]) => [svg.dataset.chart, t.textContent]); })""",
    )
    assert clipped == [], clipped


def test_a_narrowed_window_redraws_chart_text_at_its_size(console: Console) -> None:
    page = console.open("curves")
    page.set_viewport_size({"width": 800, "height": 900})
    page.wait_for_function(
        "() => [...document.querySelectorAll('svg[data-chart]')].every(s => "
        "Math.abs(parseFloat(s.style.getPropertyValue('--k')) - s.viewBox.baseVal.width / "
        "s.getBoundingClientRect().width) < 0.01)",
        timeout=10_000,
    )
    small = [s for s in page.eval_on_selector_all("svg[data-chart]", RENDERED_TEXT) if s[2] < 11 - 0.05]
    assert small == [], small


def test_a_legend_names_only_what_is_drawn_and_says_why_a_series_is_absent(console: Console) -> None:
    page = console.open("curves")
    legends = page.eval_on_selector_all(
        "figure.chart",
        """figs => figs.flatMap(f => [...f.querySelectorAll('.legend li')].map(li => [
             f.querySelector('svg').dataset.chart, li.innerText, li.classList.contains('absent'),
             f.querySelectorAll(`svg [data-series="${CSS.escape(li.innerText)}"]`).length]))""",
    )
    listed_but_not_drawn = [(c, name) for c, name, absent, drawn in legends if not absent and drawn == 0]
    assert listed_but_not_drawn == []
    # The seed's history is two hours: the same range a day earlier holds nothing, and the legend says so.
    absent = {(c, name) for c, name, is_absent, _ in legends if is_absent}
    assert ("cache-latency", "a day earlier: no figures to draw in this range") in absent


def test_a_quantized_variant_is_drawn_against_its_baseline_and_the_baseline_not_against_itself(
    console: Console, seeded: tuple[RunningService, datetime]
) -> None:
    svc, _ = seeded
    page = console.open("curves")
    rows = get(svc, "/v1/figures/quantization_delta")["rows"]
    baselines = {f"{r['model']} · {r['quantization']}" for r in rows if r["quantization"] == r["baseline_quantization"]}
    variants = {f"{r['model']} · {r['quantization']}" for r in rows} - baselines
    assert baselines and variants
    drawn = set(console.points("quant-latency", "variant", "rect.bar"))
    assert drawn == variants
    caption = page.eval_on_selector("svg[data-chart='quant-latency']", "s => s.closest('figure').innerText")
    assert all(b in caption for b in baselines), caption


def test_the_waterfall_has_a_time_axis_and_no_label_printed_over_a_bar(console: Console) -> None:
    page = console.open("overview")
    page = console.after(page.locator("#clusters a.trace").first.click)
    ticks = page.eval_on_selector_all("svg[data-chart='spans'] text.tick", "ts => ts.map(t => t.textContent)")
    assert ticks[0] == "+0 ms" and len(ticks) >= 3 and all(t.startswith("+") and t.endswith(" ms") for t in ticks)
    overlaps = page.eval_on_selector_all(
        "svg[data-chart='spans']", f"svgs => ({OVERLAPS})([svgs, 'text.label', 'rect.span'])"
    )
    assert overlaps == [], overlaps
    assert page.eval_on_selector_all("svg[data-chart='spans']", RENDERED_TEXT)


def test_at_1280_by_800_the_overview_shows_the_range_picture_then_the_incidents_without_scrolling(
    browser: Any, seeded: tuple[RunningService, datetime]
) -> None:
    c = Console(browser, seeded[0].api_url)
    try:
        c.page.set_viewport_size({"width": 1280, "height": 800})
        page = c.open("overview", shot="overview-1280x800")
        box = lambda selector: page.eval_on_selector(  # noqa: E731
            selector, "e => { const b = e.getBoundingClientRect(); return [b.top, b.bottom]; }"
        )
        timeline, p99, rate, incidents = (box(s) for s in ("svg[data-chart='timeline']", "svg[data-chart='fleet-p99']",
                                                            "svg[data-chart='fleet-rate']", "#incidents"))  # fmt: skip
        assert timeline[1] <= p99[0] and p99[1] <= incidents[0]  # the picture first, the incidents under it
        assert max(timeline[1], p99[1], rate[1]) <= 800 and incidents[0] < 800, (timeline, p99, rate, incidents)
        assert c.errors == []
    finally:
        c.close()


# --- a long range is drawn whole --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def a_week(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningService, list[datetime]]]:
    """A service holding a week of token_latency windows for one group, one of them breaching mid-week."""
    now = datetime.now(UTC).replace(tzinfo=None, second=0, microsecond=0)
    last = now.replace(minute=now.minute - now.minute % 5) - timedelta(minutes=5)
    ends = [last - timedelta(minutes=5 * i) for i in range(7 * 288 - 12)][::-1]
    breach = len(ends) - 1 - 1001  # an odd count back from the newest: a window one in two leaves out
    rows = pl.DataFrame(
        {
            "window_start": [e - timedelta(minutes=5) for e in ends], "window_end": ends,
            "model": ["llama"] * len(ends), "deployment": ["vllm-a"] * len(ends), "tenant_id": [None] * len(ends),
            "grouping": ["model"] * len(ends), "n": [300] * len(ends),
            "tpot_p99": [90.0 if i == breach else 20.0 + i % 7 for i in range(len(ends))],
            "tpot_p50": [12.0] * len(ends), "baseline_p99": [25.0] * len(ends),
            "ratio": [3.6 if i == breach else 1.0 for i in range(len(ends))],
            "breached": [i == breach for i in range(len(ends))],
            "reason": ["prefill_burst" if i == breach else None for i in range(len(ends))],
        },
        schema_overrides={"tenant_id": pl.String, "reason": pl.String},
    )  # fmt: skip
    db = tmp_path_factory.mktemp("week") / "tailwatch.duckdb"
    with RunningService(service_settings(db, **NO_SCHEDULE)) as svc:
        run = RunRecord("token_latency", ends[-1], Window(ends[0] - timedelta(minutes=5), ends[-1]), "ok", 0.1)
        svc.service.storage.detector_store.persist(EvaluationRecord(run, {"token_latency": rows}))
        yield svc, [ends[breach], ends[-1]]


def test_a_week_is_drawn_to_its_newest_window_with_every_breach_and_the_page_says_it_was_thinned(
    browser: Any, a_week: tuple[RunningService, list[datetime]]
) -> None:
    svc, (breach, newest) = a_week
    c = Console(browser, svc.api_url)
    try:
        page = c.open("tokens?range=7d", shot="tokens-week")
        drawn = sorted(c.points("tpot", "tpot p99"))
        assert drawn[-1] == f"{newest:%Y-%m-%dT%H:%M:%S}.000Z"  # the newest window, not the week's first half
        assert 1000 <= len(drawn) <= 1500  # one window in two of ~2,000: what the chart can draw
        note = page.eval_on_selector("#capped", "p => p.innerText")
        assert "token_latency: one window in 2" in note
        marks = page.eval_on_selector_all("svg[data-chart='tpot'] g.mark", "gs => gs.map(g => g.dataset.x)")
        # A breach the thinned series left out is still marked and listed.
        assert f"{breach:%Y-%m-%dT%H:%M:%S}.000Z" not in drawn
        assert f"{breach:%Y-%m-%dT%H:%M:%S}.000Z" in marks
        rows = page.eval_on_selector_all("#breaches tbody tr", "rs => rs.length")
        assert rows == 1 and c.errors == []
    finally:
        c.close()


# --- the band after a breach --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def after_a_breach(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningService, datetime, datetime]]:
    """A day at 15–30 ms, an hour at three times that, then two healthy hours, token_latency evaluated every five
    minutes from the hour before the fault as the scheduler would have; then a service on the file."""
    now = datetime.now(UTC).replace(tzinfo=None)
    day0 = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=31)
    fault = day0 + timedelta(hours=26)
    db = tmp_path_factory.mktemp("breach") / "tailwatch.duckdb"
    storage = DuckDBStorage.open(db)
    try:
        plant_tpot(storage, day0, 26 * 60, (15.0, 30.0))
        plant_tpot(storage, fault, 60, (45.0, 90.0))
        plant_tpot(storage, fault + timedelta(hours=1), 120, (15.0, 30.0))
        detection = DetectionPass(storage.windows, storage.detector_store, {"token_latency": TokenLatency()})
        for step in range(12 * 4 + 1):  # 25:00 to 29:00, every five minutes
            [result] = detection.run(fault - timedelta(hours=1) + timedelta(minutes=5 * step), only=["token_latency"])
            assert result.outcome == "ok", result.error
    finally:
        storage.close()
    with RunningService(service_settings(db, **NO_SCHEDULE)) as svc:
        yield svc, fault, fault + timedelta(hours=1)


def test_after_a_breach_the_band_stays_at_its_level_before_it(
    browser: Any, after_a_breach: tuple[RunningService, datetime, datetime]
) -> None:
    svc, fault, healed = after_a_breach
    c = Console(browser, svc.api_url)
    try:
        page = c.open("tokens?range=24h", shot="tokens-after-breach")
        band = page.eval_on_selector_all(
            "svg[data-chart='tpot'] g.band-pt", "gs => gs.map(g => [g.dataset.x, Number(g.dataset.lo)])"
        )
        before = [lo for x, lo in band if x < f"{fault:%Y-%m-%dT%H:%M:%S}"]
        after = [lo for x, lo in band if x > f"{healed + timedelta(hours=1):%Y-%m-%dT%H:%M:%S}"]
        assert before and after
        # The baseline the band is drawn from left the breaching hour out: it neither tripled nor moved.
        level = min(before)
        assert max(before) == pytest.approx(level, rel=0.01) and max(after) == pytest.approx(level, rel=0.01)
        marks = page.eval_on_selector_all("svg[data-chart='tpot'] g.mark", "gs => gs.map(g => g.dataset.x)")
        assert len(marks) >= 10 and c.errors == []
    finally:
        c.close()
