from typing import Any

class ArrowBatch:
    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]: ...

def walk_traces(
    payload: bytes, span_keys: list[str], resource_keys: list[str], left_out: list[str]
) -> tuple[
    ArrowBatch,
    ArrowBatch,
    list[str],
    ArrowBatch,
    list[str],
    list[tuple[str, int, str]],
    ArrowBatch,
    ArrowBatch,
    list[int],
]: ...
