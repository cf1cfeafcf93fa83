"""Canonical columns normalization derives from other columns when the source sent no value of its own.

Each rule is written twice, once over Arrow for the decoder and once in SQL for DuckDB, because DuckDB
(`storage.attributes: split`) does not store a derived value: it stores NULL with the rule's bit set in
`columns_derived` and the `spans` view derives the value again when read (~7 bytes a span each, an eighth
of a stored span). `leave_derived` sets the bit only where the SQL gives back the stored value bit for bit:
where the value equals its rule's Arrow result and every input is NULL or finite (DuckDB orders NaN above
every number, where Arrow's comparisons with NaN are false). tests/test_derived_columns.py holds the two
forms equal.

`DERIVATIONS` is append-only: a stored bit means its entry forever.

`duration_ms` is read from the times the same way (`leave_duration`), with no bit: it is never NULL as
decoded, so a NULL stored says "derive". Storage holds the times to the microsecond; the writer stores
the nanoseconds they lost beside it (`duration_rem_ns`, 2 bytes where the double took ~6.5).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from model.columns import MAX_TIME_NS

# Not pa.scalar(None, ...): at import, before the service refuses pandas (collector/kept_out_libraries.py),
# converting a Python value would make pyarrow import it.
NULL_FLOAT = pa.nulls(1, pa.float64())[0]


def as_float(counts: pa.Array) -> pa.Array:
    """A count as a float, as a ratio or a per-token time needs it."""
    # A count past 2^53 has no exact float; for a per-token time or a ratio the nearest one is right,
    # where Arrow's checked cast would fail the whole request. DuckDB's BIGINT → DOUBLE rounds the same way.
    return pc.cast(counts, pa.float64(), safe=False)


def tpot_ms(columns: Mapping[str, pa.Array]) -> pa.Array:
    """Decode time over the tokens after the first, else (e2e − ttft) over them; NULL below two output tokens."""
    out = columns["output_tokens"]
    per_token = pc.subtract(as_float(out), 1.0)
    enough = pc.fill_null(pc.greater_equal(out, 2), False)
    from_decode = pc.divide(columns["decode_ms"], per_token)
    e2e, ttft = columns["e2e_ms"], columns["ttft_ms"]
    from_e2e = pc.if_else(pc.greater_equal(e2e, ttft), pc.divide(pc.subtract(e2e, ttft), per_token), NULL_FLOAT)
    return pc.if_else(enough, pc.coalesce(from_decode, from_e2e), NULL_FLOAT)


def cache_hit_ratio(columns: Mapping[str, pa.Array]) -> pa.Array:
    """Cached prompt tokens over prompt tokens, clamped to 0..1; NULL without a positive prompt."""
    prompt = columns["input_tokens"]
    ratio = pc.divide(as_float(columns["cached_input_tokens"]), as_float(prompt))
    ratio = pc.min_element_wise(pc.max_element_wise(ratio, 0.0, skip_nulls=False), 1.0, skip_nulls=False)
    return pc.if_else(pc.fill_null(pc.greater(prompt, 0), False), ratio, NULL_FLOAT)


_AFTER_FIRST_SQL = "(output_tokens::DOUBLE - 1.0)"


@dataclass(frozen=True)
class Derivation:
    column: str
    inputs: tuple[str, ...]  # the float columns the rule reads (counts are always finite)
    arrow: Callable[[Mapping[str, pa.Array]], pa.Array]
    sql: str  # the same rule over the stored columns


DERIVATIONS: tuple[Derivation, ...] = (
    Derivation(
        "tpot_ms",
        ("decode_ms", "e2e_ms", "ttft_ms"),
        tpot_ms,
        f"CASE WHEN output_tokens >= 2 THEN coalesce(decode_ms / {_AFTER_FIRST_SQL}, CASE WHEN e2e_ms >= ttft_ms "
        f"THEN (e2e_ms - ttft_ms) / {_AFTER_FIRST_SQL} END) END",
    ),
    Derivation(
        "cache_hit_ratio",
        (),
        cache_hit_ratio,
        "CASE WHEN input_tokens > 0 THEN least(greatest(cached_input_tokens::DOUBLE / input_tokens::DOUBLE, 0.0), "
        "1.0) END",
    ),
)
if len(DERIVATIONS) > 8:
    raise RuntimeError("columns_derived is 8 bits: DERIVATIONS needs a wider column first")

# Each derivation's bit in `columns_derived`: bit i is DERIVATIONS[i].
DERIVED_BITS = {d.column: 1 << i for i, d in enumerate(DERIVATIONS)}


def same_float(value: np.ndarray, again: np.ndarray) -> np.ndarray:
    """Where `value` is finite and `again` is the same float bit for bit (-0.0 apart from 0.0): what a
    value must be for storage to leave it out and give it back."""
    same: np.ndarray = np.isfinite(value) & (value.view(np.int64) == again.view(np.int64))
    return same


# (end − start) in ns is exact as a double below 2^53 (104 days), and its microseconds times 1000 cannot
# overflow a BIGINT: a longer span keeps its stored duration.
_EXACT_NS = 1 << 53

_LOST_NS = (
    "epoch_ns(end_time) - epoch_ns(start_time) - (epoch_us(end_time::TIMESTAMP) - epoch_us(start_time::TIMESTAMP)) "
    "* 1000"
)
# What the writer stores as `duration_rem_ns` from the batch's nanosecond times: what storing each at the
# microsecond (DuckDB rounds half up) took off their difference, −1000..1000. Written against the batch
# rather than computed here so that the rounding is DuckDB's own.
DURATION_REM = "duration_rem_ns"
DURATION_REM_SQL = f"CASE WHEN duration_ms IS NULL THEN {_LOST_NS} END"
# `duration_ms` as the `spans` view reads it: the walks' `(end − start) / 1e6` over the stored times.
DURATION_READ_SQL = (
    f"CASE WHEN duration_ms IS NULL THEN ((epoch_us(end_time) - epoch_us(start_time)) * 1000 + {DURATION_REM})"
    "::DOUBLE / 1e6 ELSE duration_ms END"
)


def leave_duration(start_time: pa.Array, end_time: pa.Array, duration_ms: pa.Array) -> pa.Array:
    """`duration_ms` with NULL wherever `DURATION_READ_SQL` gives it back bit for bit."""
    start = start_time.cast(pa.int64()).to_numpy(zero_copy_only=False)
    end = end_time.cast(pa.int64()).to_numpy(zero_copy_only=False)
    ns = end - start
    again = ns.astype(np.float64) / 1e6
    # The latest time there is (MAX_TIME_NS) is DuckDB's infinity, which has no microseconds to read back.
    same = same_float(duration_ms.to_numpy(zero_copy_only=False), again) & (ns < _EXACT_NS) & (end < MAX_TIME_NS)
    if not same.any():
        return duration_ms
    return pc.if_else(pa.array(same), NULL_FLOAT, duration_ms)


def read_sql(derivation: Derivation) -> str:
    """The column as the `spans` view reads it: derived where its bit is set, else as stored."""
    bit = DERIVED_BITS[derivation.column]
    return f"CASE WHEN columns_derived & {bit} <> 0 THEN {derivation.sql} ELSE {derivation.column} END"


def leave_derived(columns: Mapping[str, pa.Array]) -> tuple[dict[str, pa.Array], pa.Array]:
    """The columns with every value its rule gives back replaced by NULL, and `columns_derived`."""
    bits = np.zeros(len(columns[DERIVATIONS[0].column]), np.uint8)
    out = dict(columns)
    for d in DERIVATIONS:
        again = d.arrow(columns).to_numpy(zero_copy_only=False)
        same = same_float(columns[d.column].to_numpy(zero_copy_only=False), again)
        for name in d.inputs:
            given = columns[name]
            same &= np.isfinite(given.to_numpy(zero_copy_only=False)) | ~pc.is_valid(given).to_numpy(
                zero_copy_only=False
            )
        if not same.any():
            continue
        bits |= np.where(same, np.uint8(DERIVED_BITS[d.column]), np.uint8(0))
        out[d.column] = pc.if_else(pa.array(same), NULL_FLOAT, columns[d.column])
    return out, pa.array(bits, pa.uint8())
