"""Documentation cannot fall behind the code: every setting, metric and command is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from collector.engine_names import ENGINE_METRICS, with_table
from collector.metrics import IngestMetrics
from collector.reasons import LogRejectReason, MetricRejectReason, RequestRefusal, SpanRejectReason
from detectors.detection import DetectorMetrics
from detectors.notify import NotifyMetrics
from storage.duckdb import migrate
from storage.duckdb.database import open_database
from storage.writer_metrics import WriterMetrics
from tailwatch.settings import Settings

DOCS = Path(__file__).resolve().parent.parent / "docs"


def setting_keys(model: type[BaseModel] = Settings, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += setting_keys(field.annotation, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


@pytest.mark.parametrize("key", [k for k in setting_keys() if not k.startswith("detectors.")])
def test_every_setting_is_in_the_configuration_reference(key: str) -> None:
    text = (DOCS / "configuration.md").read_text()
    env = "TAILWATCH_" + key.upper().replace(".", "__")
    assert f"| `{key}` | `{env}` |" in text


def test_every_metric_is_documented() -> None:
    registry = CollectorRegistry()
    IngestMetrics(registry)
    WriterMetrics(registry)
    text = (DOCS / "ingest.md").read_text()
    names = {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}
    assert names
    for name in names:
        assert f"`{name}`" in text, name


def test_every_detector_and_delivery_metric_is_documented() -> None:
    registry = CollectorRegistry()
    DetectorMetrics(registry)
    NotifyMetrics(registry)
    text = (DOCS / "detectors.md").read_text()
    for metric in registry.collect():
        name = metric.name + ("_total" if metric.type == "counter" else "")
        assert f"`{name}`" in text, name


def test_every_reject_reason_and_refusal_is_documented() -> None:
    text = (DOCS / "ingest.md").read_text()
    for reason in (*SpanRejectReason, *LogRejectReason, *MetricRejectReason):
        assert f"| `{reason.value}` |" in text
    for refusal in RequestRefusal:
        assert re.search(rf"\b{refusal.value}\b", text), refusal


def test_every_column_of_the_public_tables_is_in_the_column_reference(tmp_path: Path) -> None:
    con = open_database(tmp_path / "docs.duckdb")
    migrate.upgrade(con)
    text = (DOCS / "columns.md").read_text()
    for table in ("spans", "span_scores", "llm_requests"):
        for column, *_rest in con.execute(f"DESCRIBE {table}").fetchall():
            assert f"`{column}`" in text, f"{table}.{column}"
    con.close()


def test_the_engine_metric_names_page_has_the_table_the_code_generates() -> None:
    # `python -m collector.engine_names --write` regenerates it; the table is not edited by hand.
    page = (DOCS / "engine-metrics.md").read_text()
    assert page == with_table(page), "run: python -m collector.engine_names --write"
    for canonical, metric in ENGINE_METRICS.items():
        rows = [line for line in page.splitlines() if line.startswith(f"| `{canonical}` | {metric.kind.value} |")]
        assert len(rows) == 1, f"docs/engine-metrics.md needs one name-table row for {canonical}"
        assert all(f"`{name}`" in rows[0] for name in metric.names), canonical


def heading_anchors(text: str) -> set[str]:
    """The anchors a Markdown renderer gives a page's headings, GitHub's way: lower case, punctuation dropped,
    spaces as hyphens, a repeated heading numbered. Headings inside code fences are not headings."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = re.match(r"#+\s+(.*)", line)
        if fenced or heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_link_between_the_docs_reaches_a_page_and_a_heading_that_exist() -> None:
    # A moved section breaks its anchors silently: the page still opens, at the top, and the reader
    # is left to search a long page for the figure the link promised.
    broken = []
    for page in [DOCS.parent / "README.md", DOCS.parent / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path) if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text()):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
