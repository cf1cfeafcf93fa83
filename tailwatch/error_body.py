"""The one error body every API handler answers a refusal with: `{"error": {"code", "message"}}`."""

from __future__ import annotations

from aiohttp import web


def error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)
