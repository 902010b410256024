"""ARM-shaped error answers, shared by every route module (``{"error": {"code", "message", "details"}}``)."""

from __future__ import annotations

from typing import Any

from aiohttp import web


def arm_error(status: int, code: str, message: str, extra: dict[str, Any] | None = None) -> web.Response:
    body = {"code": code, "message": message, "details": [], **(extra or {})}
    return web.json_response({"error": body}, status=status)


def method_not_allowed() -> web.Response:
    return arm_error(405, "MethodNotAllowed", "The requested HTTP method is not supported by this resource.")
