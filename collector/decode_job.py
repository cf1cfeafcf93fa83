"""What a decoder worker process runs. Its own module so that a worker imports the decoder alone, not the
pipeline's storage port (Polars): 121 MiB a worker instead of 218 (docs/benchmarks.md)."""

from __future__ import annotations

from functools import cache

from collector.decode import Decoded, Decoder, Encoding, Signal, decode
from collector.engine_names import EngineNames
from collector.normalize import NormalizeConfig, Plan, build_plan


@cache
def _plan(config: NormalizeConfig) -> Plan:
    # Built once per process (decoder workers included): the config is sent, the plan is not.
    return build_plan(config)


def decode_request(
    signal: Signal, payload: bytes, encoding: Encoding, config: NormalizeConfig, names: EngineNames, *, decoder: Decoder
) -> Decoded:
    """The decoder entry point run in the worker processes."""
    return decode(signal, payload, encoding, _plan(config), names, decoder=decoder)
