"""The one typed settings object: YAML file < TAILWATCH_* environment < command-line flags.

Built once in `main`, validated at start, passed down explicitly. An unknown key anywhere is an error
that names it, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from collector.decode import Decoder, choose_decoder
from collector.engine_names import ENGINE_METRICS, EngineNames
from collector.normalize import NormalizeConfig
from detectors.catch_up import Config as CatchUpConfig
from detectors.changes import Config as ChangesConfig
from detectors.incidents import Config as IncidentsConfig
from detectors.notify import WebhookPayloads
from detectors.registry import REGISTRY
from storage.group_queue import DEFAULT_MAX_BYTES
from storage.ports import OtelTraces

ENV_PREFIX = "TAILWATCH_"
ENV_NESTED = "__"
# Read by the CLI to find the YAML file, not a setting itself.
CONFIG_ENV = "TAILWATCH_CONFIG"
# The Python walk holds the GIL, so it needs processes to use both cores.
PYTHON_DECODER_PROCESSES = 2
MAX_DECODER_PROCESSES = 64
MAX_DUCKDB_THREADS = 256


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the platform tells it)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def _count_or_auto(value: Any, low: int, high: int, what: str) -> int | str:
    """A count within [low, high] (as a number or, from the environment, its digits) or "auto"."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if value == "auto":
        return "auto"
    if type(value) is int and low <= value <= high:
        return value
    raise ValueError(f"give {what}, or auto")


class SettingsError(ValueError):
    """Configuration that cannot be used; the message is a sentence for the operator."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IngestSettings(_Section):
    decode_workers: int | Literal["auto"] = Field(
        "auto",
        description="Decoder processes. 0 decodes in threads of the service process. auto: threads with the "
        "native decoder (its walk releases the GIL, and no process hop or second copy of the runtime), 2 "
        "processes with the python one.",
    )
    decoder: Literal["auto", "native", "python"] = Field(
        "auto",
        description="Trace decoder: native (compiled, built by scripts/setup where cargo exists), python (the "
        "reference), or auto (native when installed).",
    )
    max_request_bytes: int = Field(
        32 * 2**20,
        ge=1024,
        description="Largest export request accepted (after gzip inflation): 413 / RESOURCE_EXHAUSTED.",
    )
    max_inflight_bytes: int = Field(
        128 * 2**20,
        ge=1024,
        description="Request bytes admitted but not yet stored; past it requests get 503 / UNAVAILABLE.",
    )
    max_queued_spans: int = Field(
        20_000,
        ge=1,
        description="Decoded spans waiting for the writer; past it requests get 503 / UNAVAILABLE.",
    )
    max_queued_bytes: int = Field(
        DEFAULT_MAX_BYTES,
        ge=1024,
        description="Bytes of the decoded spans, scores and metric points waiting for the writer; past it requests "
        "get 503 / UNAVAILABLE. What bounds their memory: a span carrying its prompt decodes to several times one "
        "that does not.",
    )
    max_concurrent_requests: int = Field(
        32,
        ge=1,
        le=1024,
        description="OTLP/gRPC requests in progress at once is twice this; past it a request is refused as "
        "retryable (UNAVAILABLE with RetryInfo).",
    )
    http_read_timeout_seconds: float = Field(
        60.0, gt=0, description="OTLP/HTTP: a request body not received within this is refused (408) and closed."
    )
    http_idle_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="OTLP/HTTP and API ports: a connection with no request being handled (idle, or still sending "
        "its headers) is closed after this.",
    )
    http_max_connections: int = Field(
        4096,
        ge=1,
        description="OTLP/HTTP and API ports, each: connections open at once; past it a new one is closed on accept.",
    )
    retry_after_seconds: int = Field(1, ge=1, le=3600, description="Retry hint sent with retryable refusals.")
    dedup_window_seconds: float = Field(
        300.0,
        ge=0,
        description="A retried span arriving this long after the original is still dropped as a duplicate.",
    )
    dedup_max_spans: int = Field(
        1_000_000,
        ge=0,
        description=(
            "Cap on remembered span identities, and apart from them on score identities (about 110 bytes each); "
            "shortens the window when hit."
        ),
    )
    spool: bool = Field(
        True,
        description="DuckDB: while the writer is behind, acknowledge a trace request once it is synced to the "
        "ingest spool (<db>.spool/) instead of once committed; it is committed moments later in a larger group, "
        "and a restart replays it. false: every acknowledgement waits for its commit.",
    )
    spool_backlog_spans: int = Field(
        1000,
        ge=0,
        description="Spans already waiting for the writer from which a trace request is spooled (ingest.spool).",
    )

    @field_validator("decode_workers", mode="before")
    @classmethod
    def _processes_or_auto(cls, value: Any) -> Any:
        return _count_or_auto(
            value, 0, MAX_DECODER_PROCESSES, f"from 0 to {MAX_DECODER_PROCESSES} decoder processes (0: threads)"
        )

    @field_validator("decoder")
    @classmethod
    def _decoder_installed(cls, value: str) -> str:
        choose_decoder(value)  # a sentence naming the setting when the compiled one is asked for but absent
        return value

    def trace_decoder(self) -> Decoder:
        return choose_decoder(self.decoder)

    def decoder_processes(self) -> int:
        """How many decoder processes to start; 0 decodes in threads."""
        if self.decode_workers != "auto":
            return self.decode_workers
        return 0 if self.trace_decoder() is Decoder.NATIVE else PYTHON_DECODER_PROCESSES


class ClickHouseSettings(_Section):
    dsn: SecretStr | None = Field(
        None,
        description="Where ClickHouse is: http(s)://user:password@host:8123/database, or chdb:///path?database=name "
        "for ClickHouse in-process (chDB). The database is created when missing.",
    )
    otel_table: str = Field(
        "otel_traces",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The OpenTelemetry Collector clickhouseexporter traces table spans are read from or written to.",
    )
    otel_traces: OtelTraces = Field(
        "write",
        description="write: otel_table shows every stored span once in the Collector clickhouseexporter's layout, "
        "as a view of spans (a store whose otel_table is a table from before keeps feeding it). follow: the "
        "user's Collector fills otel_table and Tailwatch normalizes its new rows into spans. off: no otel_table.",
    )
    follow_interval_seconds: float = Field(10.0, gt=0, description="follow: how often new rows are read.")
    follow_lag_seconds: float = Field(
        60.0,
        ge=0,
        description="follow: rows are read once their start is this old, so a Collector's batching and retries "
        "have landed; a span stored later than that is missed.",
    )
    lease_seconds: float = Field(
        60.0,
        ge=5,
        description="Processes with scheduler: true on one ClickHouse take turns by a lease: the holder renews it "
        "at each job; another takes over once it has not been renewed for this long.",
    )
    cluster: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="A ClickHouse cluster name: tables are created ON CLUSTER with Replicated engines, the span "
        "tables sharded by trace behind Distributed tables of the same names (docs/scale-out.md; needs 23.8+).",
    )


class StorageSettings(_Section):
    backend: Literal["duckdb", "clickhouse"] = Field(
        "duckdb",
        description="duckdb: one embedded file (db). clickhouse: storage.clickhouse.dsn, for fleets past "
        "one machine (docs/scale-out.md).",
    )
    clickhouse: ClickHouseSettings = ClickHouseSettings()

    @field_validator("threads", mode="before")
    @classmethod
    def _threads_or_auto(cls, value: Any) -> Any:
        return _count_or_auto(value, 1, MAX_DUCKDB_THREADS, f"from 1 to {MAX_DUCKDB_THREADS} DuckDB threads")

    def duckdb_threads(self) -> int:
        """DuckDB's worker threads: as set; for `auto`, 1 where this process may run on 2 cores or fewer (a second
        thread would wait for a core the decoders and the writer keep busy), else 2."""
        if self.threads != "auto":
            return self.threads
        return 1 if usable_cores() <= 2 else 2

    def splits_attributes(self) -> bool:
        """Whether spans are decoded with their attributes split (only DuckDB stores them so)."""
        return self.backend == "duckdb" and self.attributes == "split"

    @model_validator(mode="after")
    def _clickhouse_has_a_dsn(self) -> StorageSettings:
        if self.backend == "clickhouse" and self.clickhouse.dsn is None:
            raise ValueError("storage.backend is clickhouse but storage.clickhouse.dsn is not set: name the server")
        return self

    memory_limit: str = Field(
        "512MB", description="DuckDB memory_limit; beyond it DuckDB spills to disk. Bounds the service RSS."
    )
    threads: int | Literal["auto"] = Field(
        "auto",
        description="DuckDB worker threads, shared by ingest, detection and queries. auto: 1 on a machine with 2 "
        "cores or fewer, where a second one has no core of its own while spans are decoded and written (up to "
        "15% more durable spans/s, docs/benchmarks.md), else 2.",
    )
    attributes: Literal["whole", "split"] = Field(
        "split",
        description="How new spans' attributes are stored (DuckDB). split: the values a canonical column holds "
        "exactly are stored once, in the column (about 0.43 of the bytes, and faster ingest). whole: as sent, "
        "the raw text kept byte for byte.",
    )
    detection_memory_mb: int = Field(
        256,
        ge=1,
        description="The most the detection pass holds of per-request frames at once; a detector whose window "
        "needs more is not evaluated that time (outcome too_large). Bounds the pass's memory whatever the traffic.",
    )
    checkpoint_threshold: str = Field(
        "256MB", description="WAL size that triggers a DuckDB checkpoint; larger means fewer ingest stalls."
    )
    retention_days: float = Field(7.0, gt=0, description="Spans whose end_time is older than this are deleted.")
    retention_interval_seconds: int = Field(3600, ge=10, description="How often expired spans are deleted.")
    reserve_mb: int = Field(
        256,
        ge=0,
        description="Space held in <db>.reserve while the filesystem has room, given up when it is full so that "
        "retention can delete and checkpoint; at least checkpoint_threshold. 0: none.",
    )


class AlertingSettings(_Section):
    webhook_urls: tuple[str, ...] = Field(
        (), description="Generic JSON webhooks that get every firing and resolved transition."
    )
    webhook_payloads: WebhookPayloads = Field(
        "incidents",
        description="What webhooks are sent: incidents (each incident opened, updated when it grows or changes "
        "severity, and resolved: one page a fault), alerts (each alert firing and resolved), or both.",
    )
    alertmanager_url: str | None = Field(
        None, description="Prometheus Alertmanager base URL (e.g. http://localhost:9093); alerts go to /api/v2/alerts."
    )
    timeout_seconds: float = Field(5.0, gt=0, description="Timeout of one delivery attempt.")
    max_attempts: int = Field(5, ge=1, description="Delivery attempts before a notification is given up.")
    backoff_seconds: float = Field(1.0, ge=0, description="First retry delay; doubles with each attempt.")
    queue_size: int = Field(
        1000, ge=1, description="Notifications queued per destination; the oldest is dropped beyond."
    )

    @field_validator("webhook_urls", "alertmanager_url")
    @classmethod
    def _http_only(cls, value: Any) -> Any:
        for url in value if isinstance(value, tuple) else [value] if value else []:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} must be an http:// or https:// URL")
        return value


class ApiSettings(_Section):
    token: SecretStr | None = Field(
        None,
        description="Bearer token the API port requires (Authorization: Bearer TOKEN); /healthz and /readyz stay open.",
    )
    tls_cert_file: Path | None = Field(
        None, description="PEM certificate chain: with tls_key_file, the API port speaks HTTPS."
    )
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file.")

    @model_validator(mode="after")
    def _tls_pair(self) -> ApiSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: set both or neither")
        return self


class SqlSettings(_Section):
    timeout_seconds: float = Field(
        30.0, gt=0, le=3600, description="An analyst's statement is cancelled after this long (POST /v1/sql)."
    )
    max_rows: int = Field(
        10_000, ge=1, le=10_000_000, description="Rows a statement returns at most; beyond, truncated is true."
    )
    max_concurrent: int = Field(
        2, ge=1, le=64, description="Analyst statements and exports running at once; more wait for a turn."
    )


class ScrapeTarget(_Section):
    url: str = Field(description="The engine's Prometheus endpoint, e.g. http://10.0.0.7:8000/metrics.")
    replica: str | None = Field(
        None, description="Replica id its points carry; name it as the replica's spans do (e.g. the pod name)."
    )
    deployment: str | None = Field(None, description="Deployment its points carry; as the spans' service.name.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} must be an http:// or https:// URL")
        return url


class ScrapeSettings(_Section):
    targets: tuple[ScrapeTarget, ...] = Field(
        (), description="Engines whose /metrics Tailwatch scrapes itself, for fleets without a Collector."
    )
    timeout_seconds: float = Field(
        2.0, gt=0, le=60, description="A target slower than this is marked down for that scrape; others go on."
    )


class MetricsSettings(_Section):
    interval_seconds: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="How often engines report: the scrape interval here, and the Collector's scrape_interval. "
        "A value older than two intervals is no longer current.",
    )
    names: dict[str, tuple[str, ...]] = Field(
        {},
        description="More names per canonical engine metric (docs/engine-metrics.md), e.g. for an engine fork.",
    )
    scrape: ScrapeSettings = ScrapeSettings()
    settle_after_seconds: float = Field(
        330.0,
        gt=0,
        le=86400,
        description="A request's engine facts are computed and stored once it ended this long ago and its own "
        "replica's metrics source has reported past its end (or, an hour later, with what exists); points "
        "arriving later do not change them. At least the Collector's retry window (deploy/otel-collector.yaml: "
        "300 s), so a retried batch still counts.",
    )
    settle_interval_seconds: int = Field(
        30, ge=1, le=3600, description="How often requests whose engine metrics have arrived are settled."
    )

    @field_validator("names")
    @classmethod
    def _known_metrics(cls, names: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for key in names:
            if key not in ENGINE_METRICS:
                known = ", ".join(ENGINE_METRICS)
                raise ValueError(f"{key!r} is not a canonical engine metric; known: {known}")
        return names

    def engine_names(self) -> EngineNames:
        return EngineNames(tuple((k, tuple(v)) for k, v in sorted(self.names.items())), self.interval_seconds)


# One section per registered detector, typed by its own Config; the key is the registry key.
DetectorsSettings: type[_Section] = create_model(  # type: ignore[call-overload]
    "DetectorsSettings",
    __base__=_Section,
    **{key: (spec.config, spec.config()) for key, spec in REGISTRY.items()},
)


class Settings(_Section):
    """Every setting; field names are the YAML keys, and TAILWATCH_<KEY> / TAILWATCH_<SECTION>__<KEY> env vars."""

    db: Path = Field(Path("tailwatch.duckdb"), description="DuckDB database file.")
    host: str = Field("127.0.0.1", description="Address every port binds to; 0.0.0.0 to listen on all interfaces.")
    grpc_port: int = Field(4317, ge=0, le=65535, description="OTLP/gRPC port (0 picks a free port).")
    http_port: int = Field(4318, ge=0, le=65535, description="OTLP/HTTP port (0 picks a free port).")
    api_port: int = Field(
        4319, ge=0, le=65535, description="Tailwatch API port: /v1/sql, /v1/alerts, /metrics, /healthz, /readyz."
    )
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$", description="Service log level.")
    shutdown_grace_seconds: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM, how long in-flight requests get to finish before the final flush.",
    )
    scheduler: bool = Field(
        True,
        description="Run the detection pass, retention and engine-fact settling here. On ClickHouse, processes "
        "with it take turns by a lease (storage.clickhouse.lease_seconds); receiver-only processes set it false.",
    )
    ingest: IngestSettings = IngestSettings()
    storage: StorageSettings = StorageSettings()
    normalize: NormalizeConfig = NormalizeConfig()
    metrics: MetricsSettings = MetricsSettings()
    detectors: DetectorsSettings = DetectorsSettings()
    incidents: IncidentsConfig = IncidentsConfig()
    changes: ChangesConfig = ChangesConfig()
    catch_up: CatchUpConfig = CatchUpConfig()
    alerting: AlertingSettings = AlertingSettings()
    api: ApiSettings = ApiSettings()
    sql: SqlSettings = SqlSettings()

    def detector_configs(self) -> dict[str, Any]:
        """Each detector's config by registry key."""
        return {key: getattr(self.detectors, key) for key in REGISTRY}


def load_settings(
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Build the settings from a YAML file, the environment and flag overrides (highest wins)."""
    environ = os.environ if environ is None else environ
    file_data = _read_yaml(config_file) if config_file else {}
    env_data = _env_data(environ)
    merged = _deep_merge(_deep_merge(file_data, env_data), dict(overrides or {}))
    source = f"{config_file} or the environment" if config_file else "the environment or flags"
    try:
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise SettingsError(_explain(exc, source)) from None


def _read_yaml(path: str | Path) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must hold a mapping of settings at the top level")
    return data


def _env_key_path(name: str) -> list[str]:
    return name[len(ENV_PREFIX) :].lower().split(ENV_NESTED)


def _env_data(environ: Mapping[str, str]) -> dict[str, Any]:
    """TAILWATCH_* variables as nested settings data; an unknown one is an error that names it."""
    data: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name == CONFIG_ENV:
            continue
        path = _env_key_path(name)
        model: type[BaseModel] = Settings
        node = data
        for i, part in enumerate(path):
            field = model.model_fields.get(part)
            if field is None:
                known = ", ".join(ENV_PREFIX + "__".join([*path[:i], k]).upper() for k in model.model_fields)
                raise SettingsError(
                    f"unknown environment variable {name}: no setting '{'.'.join(path[: i + 1])}'; known here: {known}"
                )
            annotation = field.annotation
            last = i == len(path) - 1
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                if last:
                    raise SettingsError(f"environment variable {name} names a section; set one of its keys instead")
                model = annotation
                node = node.setdefault(part, {})
            elif not last:
                raise SettingsError(f"unknown environment variable {name}: '{part}' has no sub-settings")
            else:
                node[part] = _list_value(value) if get_origin(annotation) in (tuple, list) else value
    return data


def _list_value(value: str) -> list[Any]:
    # A JSON array, or a comma-separated list for the common case of plain keys.
    if value.strip().startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"cannot parse {value!r} as a JSON array: {exc}") from None
        if isinstance(parsed, list):
            return parsed
    return [item.strip() for item in value.split(",") if item.strip()]


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _explain(exc: ValidationError, source: str) -> str:
    sentences = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            sentences.append(f"unknown setting '{key}' in {source}")
        else:
            sentences.append(f"setting '{key}' is invalid: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(sentences)
