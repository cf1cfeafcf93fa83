"""The ClickHouse backend."""

from typing import Literal

# What Tailwatch does with the OpenTelemetry Collector clickhouseexporter's traces table: `write` (its receivers
# store every span there too), `follow` (a user's Collector fills it; Tailwatch normalizes its rows), `off`
# (neither: spans live in Tailwatch's own tables alone).
OtelTraces = Literal["write", "follow", "off"]
