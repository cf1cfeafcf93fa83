"""Attribute keys Tailwatch is configured to track (`service.version`), checked before they are pasted into a
JSON path, a string literal or a quoted alias."""

from __future__ import annotations

import re

_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/:]*")


def attribute_key(key: str) -> str:
    """An attribute key (`service.version`) checked for pasting into a JSON path, a string literal or a quoted
    alias: change tracking's keys come from config."""
    if not _KEY.fullmatch(key):
        raise ValueError(f"{key!r} is not an attribute key Tailwatch tracks: letters, digits and _ . - / : only")
    return key
