"""One canonical LLM request model from every semantic convention in use.

The attribute map (docs/columns.md) is resolved once into a `Plan`: per canonical field, its sources
in priority order, each with its unit conversion. A decoded batch is normalized column-wise: each
plan key present in the batch is gathered once into a column (one dict lookup per span), converted
with Arrow kernels, and the sources of a field are coalesced in priority order. Per-span Python work
measured 22 µs/span; this costs a few. Values a span does not carry stay NULL: nothing is invented.
Derived fields (tpot_ms, cache_hit_ratio, e2e_ms, is_llm, llm_role) follow documented rules.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator

from model.columns import LLM_FIELDS, LLM_TYPES
from model.derived_columns import DERIVATIONS, NULL_FLOAT

# ---------------------------------------------------------------------------------------------------
# Canonical fields filled from attributes, in slot order, and their types: model/columns.py. Derived
# fields are computed after lookup.
FIELDS = LLM_FIELDS

Converter = Callable[[Any], Any]


def parse_number(value: Any) -> float | None:
    """A finite number, or a numeric string, as float; anything else (booleans, NaN, infinities) is None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _scaled(factor: float) -> Converter:
    def convert(value: Any) -> float | None:
        number = parse_number(value)
        scaled = None if number is None else number * factor
        return scaled if scaled is not None and math.isfinite(scaled) else None

    return convert


SECONDS = _scaled(1000.0)
MILLISECONDS = _scaled(1.0)


_MAX_COUNT = float(2**63 - 1024)  # the largest float below int64's limit
_MAX_INT64 = 2**63 - 1


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        # Exactly, as the int64 kernel reads a column of integers: through float a count past 2**53 moves.
        return value if 0 <= value <= _MAX_INT64 else None
    number = parse_number(value)
    return None if number is None or number < 0 or number > _MAX_COUNT else int(number)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, dict | list):
        return None
    text = str(value).strip()
    return text or None


def _lower(value: Any) -> str | None:
    text = _text(value)
    return None if text is None else text.lower()


def _ratio(value: Any) -> float | None:
    number = parse_number(value)
    return None if number is None else min(1.0, max(0.0, number))


def _service(value: Any) -> str | None:
    # The OTel SDK's placeholder when OTEL_SERVICE_NAME is unset (vLLM's default) names no deployment.
    text = _text(value)
    return None if text is None or text.startswith("unknown_service") else text


def _finish_reason(value: Any) -> str | None:
    # semconv: string[]; SGLang: a JSON string such as '["stop"]'; others: a plain string.
    if isinstance(value, str) and value[:1] in "[{":
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return _text(value)
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, dict):
        value = value.get("type") or value.get("finish_reason")
    return _text(value)


def _json_field(field: str) -> Converter:
    """Read one field of an attribute that holds a JSON object as a string (OpenInference `metadata`)."""

    def convert(value: Any) -> str | None:
        if isinstance(value, str):
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError:
                return None
        return _text(value.get(field)) if isinstance(value, dict) else None

    return convert


# Fixed part of the map: names emitters use for the same thing, highest priority first, with units.
# Sources: shared design docs, "LLM span attribute names used by real emitters" (see docs/columns.md).
SEMCONV: dict[str, list[tuple[str, Converter]]] = {
    "operation": [
        ("gen_ai.operation.name", _lower),
        ("openinference.span.kind", _lower),
        ("gen_ai.span.kind", _lower),
        ("fi.span.kind", _lower),
        ("traceloop.span.kind", _lower),
        ("llm.request.type", _lower),
    ],
    "provider": [
        ("gen_ai.provider.name", _lower),
        ("gen_ai.system", _lower),
        ("llm.provider", _lower),
        ("llm.system", _lower),
    ],
    "model": [
        ("gen_ai.response.model", _text),
        ("llm.response.model_name", _text),
        ("llm.model_name", _text),
        ("embedding.model_name", _text),  # OpenInference and traceAI embedding spans
        ("langfuse.observation.model.name", _text),
        ("gen_ai.request.model", _text),
        ("llm.request.model_name", _text),
    ],
    "input_tokens": [
        ("gen_ai.usage.input_tokens", _count),
        ("gen_ai.usage.prompt_tokens", _count),
        ("llm.token_count.prompt", _count),
    ],
    "output_tokens": [
        ("gen_ai.usage.output_tokens", _count),
        ("gen_ai.usage.completion_tokens", _count),
        ("llm.token_count.completion", _count),
    ],
    "cached_input_tokens": [
        ("gen_ai.usage.cache_read.input_tokens", _count),
        ("llm.token_count.prompt_details.cache_read", _count),
        ("gen_ai.usage.cached_tokens", _count),
        ("gen_ai.usage.input_tokens.cache_read", _count),
        ("gen_ai.usage.cache_read_input_tokens", _count),
        ("gen_ai.usage.cache_read_tokens", _count),
        ("llm.token_count.prompt_details.cache_input", _count),
    ],
    "ttft_ms": [
        ("gen_ai.latency.time_to_first_token", SECONDS),  # vLLM, SGLang: seconds
        ("gen_ai.response.time_to_first_chunk", SECONDS),  # semconv >= 1.41: seconds
        ("gen_ai.server.time_to_first_token", MILLISECONDS),  # traceAI 1.x: milliseconds
    ],
    "tpot_ms": [("gen_ai.server.time_per_output_token", MILLISECONDS)],  # traceAI 1.x: milliseconds
    "queue_ms": [
        ("gen_ai.latency.time_in_queue", SECONDS),
        ("gen_ai.server.queue_time", MILLISECONDS),  # traceAI 1.x
    ],
    "prefill_ms": [("gen_ai.latency.time_in_model_prefill", SECONDS)],
    "decode_ms": [("gen_ai.latency.time_in_model_decode", SECONDS)],
    "e2e_ms": [("gen_ai.latency.e2e", SECONDS)],
    "finish_reason": [
        ("gen_ai.response.finish_reasons", _finish_reason),
        ("llm.finish_reason", _finish_reason),
        ("gen_ai.response.finish_reason", _finish_reason),
        ("llm.response.finish_reason", _finish_reason),
    ],
}

# Operation values that mark a model-inference request, across the conventions above.
LLM_OPERATIONS = frozenset(
    ("chat", "text_completion", "completion", "generate_content", "embeddings", "embedding", "llm")
)
# vLLM names its per-request span `llm_request`; SGLang `f"{role} Req {rid[:8]}"` (role may be empty).
_ENGINE_SPAN = re.compile(r"^(llm_request|\S* ?Req [0-9A-Za-z_-]{1,8})$")
OI_FIRST_TOKEN_EVENT = "First Token Stream Event"  # noqa: S105 - an event name, not a secret
# OpenLLMetry (Traceloop) adds one such event per streamed chunk and no TTFT attribute.
CHUNK_EVENT = "gen_ai.content.completion.chunk"
LANGFUSE_COMPLETION_START = "langfuse.observation.completion_start_time"


class NormalizeConfig(BaseModel):
    """Operator-chosen attribute keys. Each entry is `resource:KEY`, `span:KEY`, or `span:KEY#FIELD` for a
    field inside an attribute that holds a JSON object (OpenInference `metadata`). First present wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant_keys: tuple[str, ...] = Field(
        (
            "resource:tenant.id",
            "span:tenant.id",
            "resource:tenant_id",
            "span:tenant_id",
            "span:metadata.user_api_key_team_id",
            "span:metadata.user_api_key_org_id",
            "span:traceloop.association.properties.tenant_id",
            "span:traceloop.association.properties.tenant",
            "span:metadata#tenant_id",
            "span:metadata#tenant",
            "resource:service.namespace",
            "span:user.id",
        ),
        description="Where the tenant comes from, first present wins.",
    )
    replica_keys: tuple[str, ...] = Field(
        (
            # The pod name first: operators know replicas by it, and the Collector's k8sattributes stamps it
            # on a pod's spans and metrics alike, while service.instance.id differs between the two.
            "resource:k8s.pod.name",
            "resource:service.instance.id",
            "resource:host.name",
            "span:replica_id",
            "resource:vllm.process_id",
        ),
        description="Where the serving replica comes from, first present wins.",
    )
    deployment_keys: tuple[str, ...] = Field(
        ("resource:service.name", "span:deployment"), description="Where the deployment comes from."
    )
    queue_depth_keys: tuple[str, ...] = Field(
        ("span:cluster.queue_depth", "resource:cluster.queue_depth", "span:vllm.num_requests_waiting"),
        description="Requests waiting at the scheduler when this one arrived.",
    )
    replica_count_keys: tuple[str, ...] = Field(
        ("span:cluster.replica_count", "resource:cluster.replica_count"), description="Replicas serving at the time."
    )
    batch_size_keys: tuple[str, ...] = Field(("span:llm.vllm.batch_size",), description="Running batch size.")
    prefill_tokens_in_batch_keys: tuple[str, ...] = Field(
        ("span:llm.vllm.prefill_in_batch",), description="Prefill tokens in the batch this request decoded in."
    )
    quantization_keys: tuple[str, ...] = Field(
        (
            "span:llm.vllm.quantization",
            "resource:llm.vllm.quantization",
            "span:quantization",
            "resource:quantization",
        ),
        description="Quantization variant of the serving model (fp16, fp8, int4 ...).",
    )
    cache_hit_ratio_keys: tuple[str, ...] = Field(
        ("span:llm.vllm.cache_hit_ratio",), description="An explicit KV-cache hit ratio (0..1); wins over derivation."
    )

    @field_validator("*")
    @classmethod
    def _check_sources(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        for key in keys:
            scope, _, name = key.partition(":")
            if scope not in ("resource", "span") or not name:
                raise ValueError(f"{key!r} must look like 'resource:KEY' or 'span:KEY' (or 'span:KEY#FIELD')")
        return keys


_CONFIGURED: dict[str, tuple[str, Converter]] = {
    "tenant_keys": ("tenant_id", _text),
    "replica_keys": ("replica_id", _text),
    "deployment_keys": ("deployment", _service),
    "queue_depth_keys": ("queue_depth", _count),
    "replica_count_keys": ("replica_count", _count),
    "batch_size_keys": ("batch_size", _count),
    "prefill_tokens_in_batch_keys": ("prefill_tokens_in_batch", _count),
    "quantization_keys": ("quantization", _lower),
    "cache_hit_ratio_keys": ("cache_hit_ratio", _ratio),
}


@dataclass(frozen=True)
class Source:
    scope: str  # "span" or "resource"
    key: str
    convert: Converter


@dataclass(frozen=True)
class Plan:
    """Per canonical field, its sources in priority order; built once, used for every batch."""

    sources: dict[str, tuple[Source, ...]]
    # What a decoder's walk gathers: the plan's keys, and the one key first-token time also reads.
    walk_span_keys: tuple[str, ...]
    walk_resource_keys: tuple[str, ...]


def build_plan(config: NormalizeConfig) -> Plan:
    """Resolve the fixed semconv map and the configured keys into one lookup plan."""
    sources: dict[str, list[Source]] = {name: [] for name in FIELDS}
    for field_name, entries in SEMCONV.items():
        sources[field_name] += [Source("span", key, convert) for key, convert in entries]
    for option, (field_name, convert) in _CONFIGURED.items():
        for entry in getattr(config, option):
            scope, _, key = entry.partition(":")
            key, _, json_field = key.partition("#")
            sources[field_name].append(Source(scope, key, _json_field(json_field) if json_field else convert))
    every = [src for srcs in sources.values() for src in srcs]
    span_keys = frozenset(src.key for src in every if src.scope == "span")
    resource_keys = frozenset(src.key for src in every if src.scope == "resource")
    return Plan(
        sources={name: tuple(srcs) for name, srcs in sources.items()},
        walk_span_keys=tuple(sorted(span_keys | {LANGFUSE_COMPLETION_START})),
        walk_resource_keys=tuple(sorted(resource_keys)),
    )


def resolve(plan: Plan, field: str, resource: dict[str, Any], labels: dict[str, Any]) -> Any:
    """One record's value of `field` by the plan's sources in order, `span:` keys read from `labels`.

    Engine metric points are resolved with it, so a pod's spans and its metrics name the replica and
    deployment by the same ordered lists (a point's labels stand where a span's attributes do).
    """
    for src in plan.sources[field]:
        value = (labels if src.scope == "span" else resource).get(src.key)
        if value is not None:
            converted = src.convert(value)
            if converted is not None:
                return converted
    return None


@dataclass(frozen=True)
class KeyValues:
    """One attribute key's value for every row of a batch, as a decoder's walk gathers it.

    A typed column (string, int64, float64, bool, or null when every row lacks the key) when every value
    present is of that one scalar kind; otherwise `json` is set and each value is its JSON text. Both
    decoders gather the same way (collector/span_walk.py, native/), so normalization reads one shape.
    """

    values: pa.Array
    json: bool = False

    def pylist(self) -> list[Any]:
        values = self.values.to_pylist()
        return [None if v is None else orjson.loads(v) for v in values] if self.json else values


_SCALAR_TYPES: dict[type, pa.DataType] = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


def gather(values: list[Any]) -> KeyValues:
    """The gathered column of one key from its Python values (None where a row lacks the key)."""
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if not kinds:
        return KeyValues(pa.nulls(len(values)))
    if len(kinds) == 1 and (kind := kinds.pop()) in _SCALAR_TYPES:
        return KeyValues(pa.array(values, _SCALAR_TYPES[kind]))
    return KeyValues(pa.array([None if v is None else orjson.dumps(v).decode() for v in values], pa.string()), True)


@dataclass
class SpanBatch:
    """What normalization reads from a decoder's walk."""

    span_values: dict[str, KeyValues]  # the plan's span keys present in the batch, one row per span
    resource_values: dict[str, KeyValues]  # the plan's resource keys present, one row per resource
    resource_of: pa.Array  # int32: index into the resource rows for every span
    names: pa.Array
    kinds: pa.Array
    durations_ms: pa.Array
    first_token_ms: pa.Array  # float64, from span events / Langfuse


_NUMBER_TYPES = (pa.int64(), pa.float64(), pa.null())


def _as(arr: pa.Array, typ: pa.DataType) -> pa.Array:
    # A cast to the type a column already has still costs a kernel call: ~6 µs, some 40 times a batch.
    return arr if arr.type == typ else arr.cast(typ)


def _column(gathered: KeyValues, convert: Converter) -> pa.Array:
    """Convert one gathered source column; Arrow kernels when the values are of the usual type."""
    arr, typ = gathered.values, gathered.values.type
    try:
        # JSON text (values of mixed kinds) always takes the general path below.
        if gathered.json:
            pass
        elif convert is SECONDS or convert is MILLISECONDS:
            if typ in _NUMBER_TYPES:
                arr = _as(arr, pa.float64())
                arr = pc.multiply(arr, 1000.0) if convert is SECONDS else arr
                # NaN and infinities (and seconds too large for milliseconds) are no value, as in parse_number.
                return pc.if_else(pc.is_finite(arr), arr, NULL_FLOAT)
        elif convert is _count:
            if typ in (pa.int64(), pa.null()):
                arr = _as(arr, pa.int64())
                return pc.if_else(pc.less(arr, 0), pa.scalar(None, pa.int64()), arr)
        elif convert in (_text, _lower) and typ in (pa.string(), pa.null()):
            arr = pc.utf8_trim_whitespace(_as(arr, pa.string()))
            arr = pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.string()), arr)
            return pc.utf8_lower(arr) if convert is _lower else arr
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass  # e.g. an integer beyond float64's exact range: take the general path
    # Each distinct value converted once: a few finish reasons, models or tenants among a thousand spans.
    encoded = pc.dictionary_encode(gathered.values)
    distinct = KeyValues(encoded.dictionary, gathered.json).pylist()
    converted = pa.array([None if v is None else convert(v) for v in distinct], _ARROW_TYPE.get(convert, pa.string()))
    return converted.take(encoded.indices)


_ARROW_TYPE: dict[Converter, pa.DataType] = {
    SECONDS: pa.float64(),
    MILLISECONDS: pa.float64(),
    _count: pa.int64(),
    _ratio: pa.float64(),
}


def _type_of(field: str) -> pa.DataType:
    return LLM_TYPES[field]


def normalize_batch(plan: Plan, batch: SpanBatch) -> tuple[dict[str, pa.Array], pa.Array, pa.Array]:
    """Canonical columns (FIELDS), is_llm and llm_role for every span of a decoded batch."""
    n = len(batch.names)
    columns: dict[str, pa.Array] = {}
    for field, sources in plan.sources.items():
        typ = _type_of(field)
        candidates = []
        for src in sources:
            if src.scope == "span":
                if (gathered := batch.span_values.get(src.key)) is not None:
                    candidates.append(_as(_column(gathered, src.convert), typ))
            elif (gathered := batch.resource_values.get(src.key)) is not None:
                candidates.append(_as(_column(gathered, src.convert), typ).take(batch.resource_of))
        if field == "ttft_ms":
            candidates.append(batch.first_token_ms)
        columns[field] = _coalesce(candidates, typ, n)

    operation = columns["operation"]
    engine = pc.match_substring_regex(batch.names, _ENGINE_SPAN.pattern)
    reports_usage = pc.or_(pc.is_valid(columns["input_tokens"]), pc.is_valid(columns["output_tokens"]))
    is_llm = pc.if_else(
        pc.is_valid(operation),
        pc.is_in(operation, pa.array(sorted(LLM_OPERATIONS))),
        pc.or_(engine, reports_usage),
    )
    server = pc.or_(engine, pc.equal(batch.kinds, "SERVER"))
    role = pc.if_else(is_llm, pc.if_else(server, "server", "client"), pa.scalar(None, pa.string()))

    columns["e2e_ms"] = pc.coalesce(columns["e2e_ms"], pc.if_else(is_llm, batch.durations_ms, NULL_FLOAT))
    # A value the source sent wins over the rule (model/derived_columns.py).
    for derivation in DERIVATIONS:
        columns[derivation.column] = pc.coalesce(columns[derivation.column], derivation.arrow(columns))
    return columns, is_llm, role


def _coalesce(candidates: list[pa.Array], typ: pa.DataType, n: int) -> pa.Array:
    if not candidates:
        return pa.nulls(n, typ)
    return candidates[0] if len(candidates) == 1 else pc.coalesce(*candidates)


def first_token_ms(events: list[dict[str, Any]] | None, completion_start: Any, start_ns: int) -> float | None:
    """TTFT from an OpenInference first-token event, else the first completion chunk's event (when the first
    chunk reached the instrumented client), else Langfuse's completion start, when a span has one."""
    if events:
        first_chunk_ns: int | None = None
        for event in events:
            time_ns = int(event["time_unix_nano"])
            if time_ns < start_ns:
                continue
            if event["name"] == OI_FIRST_TOKEN_EVENT:
                return (time_ns - start_ns) / 1e6
            # The earliest chunk, whatever order the exporter listed the events in.
            if event["name"] == CHUNK_EVENT and (first_chunk_ns is None or time_ns < first_chunk_ns):
                first_chunk_ns = time_ns
        if first_chunk_ns is not None:
            return (first_chunk_ns - start_ns) / 1e6
    if isinstance(completion_start, str):
        try:
            at = datetime.fromisoformat(completion_start.strip('"').replace("Z", "+00:00"))
        except ValueError:
            return None
        delta_ms = at.timestamp() * 1e3 - start_ns / 1e6
        return delta_ms if delta_ms >= 0 else None
    return None
