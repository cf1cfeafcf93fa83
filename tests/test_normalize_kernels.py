"""Normalization converts a gathered column with Arrow kernels when its values allow, and otherwise with
the converter once per distinct value; either way the column is what converting each value gives."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from collector.normalize import (
    MILLISECONDS,
    SECONDS,
    Converter,
    KeyValues,
    _column,
    _count,
    _finish_reason,
    _lower,
    _text,
    gather,
)

_INT64 = st.integers(-(2**63), 2**63 - 1)  # OTLP's int_value
_STRINGS = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["stop", " length ", "", "  ", "[", "{}", "{", '["stop"]', '[ "tool_calls" , "stop" ]']),
    st.sampled_from(['["x\\"y"]', '["\\u00e9"]', '[""]', "[]", '["a",1]', '[1,"a"]', '["a" ', '{"type":"stop"}']),
    st.sampled_from(["\x1c", "\xa0", "\u2003", "\u200b", "\x85", "\t\n\x0b\x0c\r", " \u3000a\u3000 "]),
    # Near misses of a JSON array of strings: the converter keeps them as text.
    st.sampled_from(['["stop"] x', '["stop"]]', '["a\x01"]', '["\t"]', '[\x0c"a"]', '["a"\x0b]', '["a"] \n']),
    st.builds(lambda s: '["' + s + '"]', st.text(max_size=4)),
    st.builds(str, st.integers(-(2**70), 2**70)),
    st.builds(str, st.floats()),
)
_SCALARS = st.one_of(st.none(), _STRINGS, st.booleans(), _INT64, st.floats(), st.floats(-1e9, 1e9))
_VALUES = st.one_of(_SCALARS, st.lists(_SCALARS, max_size=3), st.dictionaries(st.sampled_from(["type", "a"]), _SCALARS))


def _one_kind(kind: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(st.one_of(st.none(), kind), max_size=12)


# Columns of one kind mostly take the kernels; mixed ones (JSON text) the converter.
COLUMNS = st.one_of(
    _one_kind(_STRINGS),
    _one_kind(_INT64),
    _one_kind(st.floats()),
    _one_kind(st.lists(_STRINGS, max_size=3)),
    st.lists(_VALUES, max_size=12),
    _one_kind(st.one_of(_STRINGS, st.lists(_STRINGS, max_size=3))),
)

CONVERTERS: dict[str, Converter] = {
    "seconds": SECONDS,
    "milliseconds": MILLISECONDS,
    "count": _count,
    "text": _text,
    "lower": _lower,
    "finish_reason": _finish_reason,
}


def _same(got: Any, want: Any) -> bool:
    if isinstance(got, float) and isinstance(want, float):
        return got == want or (math.isnan(got) and math.isnan(want))
    return got == want and type(got) is type(want)


@pytest.mark.parametrize("name", CONVERTERS)
@settings(max_examples=400, deadline=None)
@given(values=COLUMNS)
@example(values=[2**53 + 1])  # a count no float holds
def test_a_converted_column_is_what_converting_each_value_gives(name: str, values: list[Any]) -> None:
    convert = CONVERTERS[name]
    gathered = gather(values)
    want = [None if v is None else convert(v) for v in gathered.pylist()]
    got = _column(gathered, convert).to_pylist()
    assert len(got) == len(want)
    assert all(_same(g, w) for g, w in zip(got, want, strict=True)), (got, want)


def test_a_finish_reason_sent_as_json_text_reads_its_first_entry_and_plain_text_reads_as_it_is() -> None:
    sent = pa.array(['["stop"]', '[ "length" , "stop" ]', None, " tool_calls ", ' ["stop"]', '["', '[" x ",1]'])
    column = _column(KeyValues(sent), _finish_reason)
    assert column.to_pylist() == ["stop", "length", None, "tool_calls", '["stop"]', '["', "x"]
