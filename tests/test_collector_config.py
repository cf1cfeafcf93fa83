"""The Collector config Tailwatch ships (deploy/otel-collector.yaml) is one the pinned Collector accepts:
`validate` builds every component it names, so a processor missing from the distribution, a misspelt key or a
wrong type fails here rather than in an operator's first start."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from otelcol import collector_binary, tail
from waiting import HANG_GUARD

# Slow: the first run builds the Collector (scripts/otelcol); CI and `scripts/test --all` run it.
pytestmark = pytest.mark.slow

SHIPPED = Path(__file__).resolve().parents[1] / "deploy" / "otel-collector.yaml"


def validate(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(collector_binary()), "validate", "--config", f"file:{config}"],
        capture_output=True, text=True, timeout=HANG_GUARD, check=False,
    )  # fmt: skip


def test_the_shipped_collector_config_is_valid_for_the_pinned_collector() -> None:
    done = validate(SHIPPED)
    assert done.returncode == 0, tail(done.stdout + done.stderr)


def test_validation_refuses_a_config_whose_processor_the_collector_does_not_have(tmp_path: Path) -> None:
    """The check above can fail: the same file with its first processor misspelt is refused."""
    text = SHIPPED.read_text()
    assert text.count("memory_limiter") >= 2
    broken = tmp_path / "otel-collector.yaml"
    broken.write_text(text.replace("memory_limiter", "memory_limitr"))
    done = validate(broken)
    assert done.returncode != 0
    assert "memory_limitr" in done.stdout + done.stderr
