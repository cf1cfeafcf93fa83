"""Every detector, by key. The key is also its config key, results table, metric label and docs heading."""

from __future__ import annotations

from typing import Protocol

from detectors import (
    cache_curve,
    clusters,
    context_length,
    quantization_delta,
    replica_skew,
    saturation,
    slo_burn,
    tenant_fairness,
    token_latency,
    traffic_pattern,
)
from detectors.base import Detect, DetectorConfig, DetectorSpec, Inputs


class DetectorModule(Protocol):
    """What a detector module declares (detectors/base.py): mypy checks every module in MODULES against it."""

    # Read-only, so each module's narrower types (its own Config, a fixed-length LABELS) fit.
    @property
    def KEY(self) -> str: ...  # noqa: N802
    @property
    def SUMMARY(self) -> str: ...  # noqa: N802
    @property
    def LABELS(self) -> tuple[str, ...]: ...  # noqa: N802
    @property
    def Config(self) -> type[DetectorConfig]: ...  # noqa: N802
    @property
    def inputs(self) -> Inputs: ...
    @property
    def detect(self) -> Detect: ...


MODULES: tuple[DetectorModule, ...] = (
    token_latency,
    cache_curve,
    traffic_pattern,
    tenant_fairness,
    replica_skew,
    saturation,
    quantization_delta,
    context_length,
    slo_burn,
    # Last: it reads the traffic labels and the firing alerts the detectors above just wrote.
    clusters,
)

REGISTRY: dict[str, DetectorSpec] = {
    module.KEY: DetectorSpec(module.KEY, module.Config, module.inputs, module.detect, module.SUMMARY)
    for module in MODULES
}


def get(key: str) -> DetectorSpec:
    """The detector registered under `key`; an unknown key is an error that lists the known ones."""
    try:
        return REGISTRY[key]
    except KeyError:
        raise KeyError(f"unknown detector {key!r}; known detectors: {', '.join(REGISTRY)}") from None
