"""A span's attributes stored without the values its canonical columns already hold.

Most of an LLM span's attributes are the values normalization copies into canonical columns: token
counts, latencies, queue depth, the model. Stored twice they are two thirds of a stored span. With
`storage.attributes: split` the writer stores in `attributes_rest` only what no column reproduces, and in
`attributes_moved` one bit per entry of `MOVES` for each attribute it left out; `spans` is a view over
the stored rows (`span_rows`) whose `attributes` puts them back. With `whole` (the default)
`attributes_rest` is the attributes as sent and no bit is set: the split costs the single writer a JSON
parse a span (docs/benchmarks.md).

A value is left out only when putting it back gives exactly what DuckDB read from the span's JSON: the
same JSON text under DuckDB's rendering (`->`, `->>` and every JSON function answer the same), so a
latency sent as `2` (an integer) where the column holds 2000.0 ms, a second value that lost to a
higher-priority key, or a model name with trailing spaces stays in `attributes_rest`. What changes is
the raw text of `attributes`: the moved keys come after the others, and numbers are written as DuckDB
writes them.

`MOVES` is append-only: a stored bit means its entry forever. Adding an entry needs a migration that
redefines the `spans` view's `attributes` with `rebuild_sql()` (tests/test_stored_attributes.py holds the
two equal).
The canonical column of a moved value must never be rewritten in place; settling engine facts writes
`engine_*` columns only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

# The physical columns behind `spans.attributes`: DuckDB's own storage, not part of the request model
# another backend stores.
STORED_ONLY = ("attributes_rest", "attributes_moved")
# The table `spans` is a view of, and what writes go to. Not a virtual column of one table: DuckDB
# evaluates a virtual column on every INSERT to check it, nearly half the cost of inserting a span.
SPAN_ROWS = "span_rows"


@dataclass(frozen=True)
class Move:
    key: str  # the span attribute
    column: str  # the canonical column that holds its value
    per: int = 1  # the column holds value × per (1000: seconds stored as milliseconds)

    def value_sql(self, row: str = "") -> str:
        """The attribute's value as the column gives it back."""
        column = f"{row}{self.column}"
        return f"{column} / {self.per}" if self.per != 1 else column


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
)
if len(MOVES) > 64:
    raise RuntimeError("attributes_moved is 64 bits: MOVES needs a second column first")
# Keys go into SQL and JSON text as they are: only characters neither needs escaped.
if not all(re.fullmatch(r"[A-Za-z0-9_.]+", m.key) for m in MOVES):
    raise RuntimeError("a MOVES key needs escaping")


def _bit(index: int) -> int:
    return 1 << index


def strip_sql(source: str) -> tuple[str, str]:
    """The SELECT list (`attributes_rest`, `attributes_moved`) over `source`, a FROM item with a span
    batch's columns (the decoder's `attributes` text and the canonical columns), and the FROM item to use
    in its place: `source` with each key's value read from the JSON once."""
    paths = ", ".join(f"'$.\"{m.key}\"'" for m in MOVES)
    # Equal only when present: a missing key (NULL) or a NULL column (NULL) is never moved.
    terms = " + ".join(
        f"CASE WHEN _v[{i + 1}]::VARCHAR = to_json({m.value_sql()})::VARCHAR THEN {_bit(i)}::UBIGINT ELSE 0 END"
        for i, m in enumerate(MOVES)
    )
    removed = ", ".join(f"CASE WHEN _moved & {_bit(i)} <> 0 THEN '\"{m.key}\":null' END" for i, m in enumerate(MOVES))
    # A JSON merge patch drops the keys it sets to null; concat_ws skips the NULLs of keys kept.
    patch = f"'{{' || concat_ws(',', {removed}) || '}}'"
    rest = f"CASE WHEN _moved = 0 THEN attributes ELSE json_merge_patch(attributes, {patch}) END"
    values = f"(SELECT *, json_extract(attributes, [{paths}]) AS _v FROM {source})"
    inner = f"(SELECT *, ({terms})::UBIGINT AS _moved FROM {values})"
    return f"{rest} AS attributes_rest, _moved AS attributes_moved", inner


@cache  # one statement per batch shape, not one built per commit
def insert_spans_sql(view: str, columns: tuple[str, ...], *, split: bool) -> str:
    """INSERT a registered batch of spans (`view`, with `columns` as the decoder writes them) stamped with
    the one parameter, `ingested_at`: its attributes split as above, or whole (nothing moved)."""
    kept = [c for c in columns if c != "attributes"]
    select, source = strip_sql(view) if split else ("attributes AS attributes_rest, 0 AS attributes_moved", view)
    names = ", ".join(kept)
    return (
        f"INSERT INTO {SPAN_ROWS} ({names}, attributes_rest, attributes_moved, ingested_at) "
        f"SELECT {names}, {select}, ? FROM {source}"
    )


def rebuild_sql() -> str:
    """The `spans` view's `attributes`: `attributes_rest` with every moved value written back from its column, as text
    (no JSON parse): the rest's closing brace gives way to the moved pairs."""
    pairs = ", ".join(
        f"CASE WHEN attributes_moved & {_bit(i)} <> 0 THEN '\"{m.key}\":' || to_json({m.value_sql()})::VARCHAR END"
        for i, m in enumerate(MOVES)
    )
    rest = "attributes_rest::VARCHAR"
    opening = f"CASE WHEN {rest} = '{{}}' THEN '{{' ELSE left({rest}, -1) || ',' END"
    return (
        "CASE WHEN attributes_moved IS NULL OR attributes_moved = 0 THEN attributes_rest "
        f"ELSE ({opening} || concat_ws(',', {pairs}) || '}}')::JSON END"
    )
