"""What every API handler answers with: the error body, and instants read from a query string."""

from __future__ import annotations

from datetime import UTC, datetime

from aiohttp import web

from storage.ports import QueryError


def error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def instant(text: str, name: str) -> datetime:
    """An ISO 8601 instant as naive UTC, like the stored columns; a QueryError says what was wrong."""
    if not text:
        raise QueryError("bad_request", f"{name} is required (ISO 8601, e.g. 2026-11-20T00:00:00Z)")
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError("bad_request", f"{name} must be ISO 8601 (got {text!r})") from None
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
