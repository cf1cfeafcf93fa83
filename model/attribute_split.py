"""A span's attributes without the values its canonical columns already hold, split in the decoder.

Most of an LLM span's attributes are the values normalization copies into canonical columns: token
counts, latencies, queue depth, the model. Stored twice they are two thirds of a stored span. When the
store asks for it (DuckDB's `storage.attributes: split`), the walks leave every `MOVES` key out of the
attributes JSON they write and hand its text over on the side; `split` then compares each left-out value
with its column and keeps out of the stored JSON only those the column gives back exactly, setting one
bit of `attributes_moved` for each (bit i is `MOVES[i]`). Storage writes them back when read
(storage/duckdb/stored_attributes.py).

"Exactly" means the same JSON value under DuckDB's rendering, which the written-back value
(`to_json(column / per)`) and a read of the stored JSON (`->`) share: the same kind (an integer for an
integer column, a float for a float column, text for text) and the same value, bit for bit for floats
(so -0.0 stays apart from 0.0), finite. A latency sent as `2` (an integer) where the column holds
2000.0 ms, a second value that lost to a higher-priority key, or a model name with trailing spaces is
written back into the stored JSON as the walk wrote it.

`MOVES` is append-only: a stored bit means its entry forever.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Protocol

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from model.derived_columns import same_float


class Gathered(Protocol):
    """One key's value for every row of a batch as a walk gathers it (collector/normalize.py's `KeyValues`):
    a typed column, or each value's JSON text where `json` is set. Named by shape so that the split needs
    nothing of the decoder that gathers it."""

    @property
    def values(self) -> pa.Array: ...

    @property
    def json(self) -> bool: ...


@dataclass(frozen=True)
class Move:
    key: str  # the span attribute
    column: str  # the canonical column that holds its value
    per: int = 1  # the column holds value × per (1000: seconds stored as milliseconds)
    # A second column the value is the sum with (each over `per`): a value no column holds alone but two
    # give back, as vLLM's inference time is its prefill time plus its decode time.
    plus: str | None = None


_SECONDS = 1000
# Span attribute keys of normalization's fixed map and its default configured keys (collector/normalize.py),
# in the order their bits were given. Append only.
MOVES: tuple[Move, ...] = (
    Move("gen_ai.operation.name", "operation"),
    Move("openinference.span.kind", "operation"),
    Move("gen_ai.span.kind", "operation"),
    Move("fi.span.kind", "operation"),
    Move("traceloop.span.kind", "operation"),
    Move("llm.request.type", "operation"),
    Move("gen_ai.provider.name", "provider"),
    Move("gen_ai.system", "provider"),
    Move("llm.provider", "provider"),
    Move("llm.system", "provider"),
    Move("gen_ai.response.model", "model"),
    Move("llm.response.model_name", "model"),
    Move("llm.model_name", "model"),
    Move("langfuse.observation.model.name", "model"),
    Move("gen_ai.request.model", "model"),
    Move("llm.request.model_name", "model"),
    Move("gen_ai.usage.input_tokens", "input_tokens"),
    Move("gen_ai.usage.prompt_tokens", "input_tokens"),
    Move("llm.token_count.prompt", "input_tokens"),
    Move("gen_ai.usage.output_tokens", "output_tokens"),
    Move("gen_ai.usage.completion_tokens", "output_tokens"),
    Move("llm.token_count.completion", "output_tokens"),
    Move("gen_ai.usage.cache_read.input_tokens", "cached_input_tokens"),
    Move("llm.token_count.prompt_details.cache_read", "cached_input_tokens"),
    Move("gen_ai.usage.cached_tokens", "cached_input_tokens"),
    Move("gen_ai.usage.input_tokens.cache_read", "cached_input_tokens"),
    Move("gen_ai.usage.cache_read_input_tokens", "cached_input_tokens"),
    Move("gen_ai.usage.cache_read_tokens", "cached_input_tokens"),
    Move("llm.token_count.prompt_details.cache_input", "cached_input_tokens"),
    Move("gen_ai.latency.time_to_first_token", "ttft_ms", _SECONDS),
    Move("gen_ai.response.time_to_first_chunk", "ttft_ms", _SECONDS),
    Move("gen_ai.server.time_to_first_token", "ttft_ms"),
    Move("gen_ai.server.time_per_output_token", "tpot_ms"),
    Move("gen_ai.latency.time_in_queue", "queue_ms", _SECONDS),
    Move("gen_ai.server.queue_time", "queue_ms"),
    Move("gen_ai.latency.time_in_model_prefill", "prefill_ms", _SECONDS),
    Move("gen_ai.latency.time_in_model_decode", "decode_ms", _SECONDS),
    Move("gen_ai.latency.e2e", "e2e_ms", _SECONDS),
    Move("llm.finish_reason", "finish_reason"),
    Move("gen_ai.response.finish_reason", "finish_reason"),
    Move("llm.response.finish_reason", "finish_reason"),
    Move("cluster.queue_depth", "queue_depth"),
    Move("vllm.num_requests_waiting", "queue_depth"),
    Move("cluster.replica_count", "replica_count"),
    Move("llm.vllm.batch_size", "batch_size"),
    Move("llm.vllm.prefill_in_batch", "prefill_tokens_in_batch"),
    Move("llm.vllm.quantization", "quantization"),
    Move("quantization", "quantization"),
    Move("llm.vllm.cache_hit_ratio", "cache_hit_ratio"),
    Move("tenant.id", "tenant_id"),
    Move("tenant_id", "tenant_id"),
    Move("replica_id", "replica_id"),
    Move("deployment", "deployment"),
    # vLLM sends it as last token − scheduled, its prefill (first token − scheduled) plus its decode (last −
    # first) exactly: both are differences of one monotonic clock. No canonical column reads it.
    Move("gen_ai.latency.time_in_model_inference", "prefill_ms", _SECONDS, plus="decode_ms"),
)
if len(MOVES) > 64:
    raise RuntimeError("attributes_moved is 64 bits: MOVES needs a second column first")
# Keys go into SQL and JSON text as they are: only characters neither needs escaped.
if not all(re.fullmatch(r"[A-Za-z0-9_.]+", m.key) for m in MOVES):
    raise RuntimeError("a MOVES key needs escaping")

# Each move's bit in `attributes_moved`: bit i is MOVES[i].
BITS = {m.key: 1 << i for i, m in enumerate(MOVES)}


@cache  # once per plan, not once per request
def gathered_keys(span_keys: tuple[str, ...]) -> tuple[str, ...]:
    """What a walk that splits gathers: `span_keys` (normalization's) and the keys only a move reads."""
    return span_keys + tuple(m.key for m in MOVES if m.plus is not None and m.key not in span_keys)


@cache  # once per plan
def left_out(span_keys: tuple[str, ...]) -> tuple[str, ...]:
    """The keys a walk leaves out of the attributes JSON: the moves among the keys it gathers (the split reads
    each one's gathered values)."""
    gathered = set(span_keys)
    return tuple(m.key for m in MOVES if m.key in gathered)


def split(
    attributes: pa.Array, left_out_json: pa.Array, span_values: Mapping[str, Gathered], columns: dict[str, pa.Array]
) -> tuple[pa.Array, pa.Array]:
    """`attributes_rest` and `attributes_moved` of a walked batch: `attributes` (the JSON without the left-out
    keys), `left_out_json` (each row's left-out pairs as a JSON object, null when it had none), the gathered
    values and the canonical columns."""
    n = len(attributes)
    moved = np.zeros(n, np.uint64)
    present = np.zeros(n, np.uint64)
    for m in MOVES:
        gathered = span_values.get(m.key)
        if gathered is None:
            continue
        bit = np.uint64(BITS[m.key])
        present |= np.where(pc.is_valid(gathered.values).to_numpy(zero_copy_only=False), bit, np.uint64(0))
        same = _same(gathered, _given_back(m, columns))
        if same is not None:
            moved |= np.where(same, bit, np.uint64(0))
    kept = present & ~moved
    rows = np.flatnonzero(kept)
    if not len(rows):
        return attributes, pa.array(moved, pa.uint64())
    rest = attributes.to_pylist()
    pairs = left_out_json.to_pylist()
    for i in rows.tolist():
        rest[i] = _written_back(rest[i], pairs[i], int(kept[i]))
    return pa.array(rest, pa.string()), pa.array(moved, pa.uint64())


def _given_back(move: Move, columns: dict[str, pa.Array]) -> pa.Array:
    """The value as the columns give it back (storage/duckdb/stored_attributes.py writes the same in SQL)."""
    over = [columns[move.column]] if move.plus is None else [columns[move.column], columns[move.plus]]
    if move.per != 1:
        over = [pc.divide(c, pa.scalar(float(move.per))) for c in over]
    return over[0] if len(over) == 1 else pc.add(over[0], over[1])


def _same(gathered: Gathered, column: pa.Array) -> np.ndarray | None:
    """Where the sent value is the value its column gives back; None when no row's can be."""
    sent = gathered.values
    if gathered.json or sent.type != column.type or sent.type not in (pa.int64(), pa.float64(), pa.string()):
        return None
    if sent.type == pa.float64():
        return same_float(sent.to_numpy(zero_copy_only=False), column.to_numpy(zero_copy_only=False))
    equal: np.ndarray = pc.fill_null(pc.equal(sent, column), False).to_numpy(zero_copy_only=False)
    return equal


def _written_back(rest: str, pairs: str, kept: int) -> str:
    """`rest` with the left-out pairs whose bit is in `kept`, as the walk wrote them, before its closing brace."""
    values = orjson.loads(pairs)
    written = ",".join(
        f"{orjson.dumps(k).decode()}:{orjson.dumps(v).decode()}" for k, v in values.items() if kept & BITS[k]
    )
    return f"{{{written}}}" if rest == "{}" else f"{rest[:-1]},{written}}}"
