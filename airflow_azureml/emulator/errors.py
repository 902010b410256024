"""Errors as the emulated service reports them: ``EmulatorError`` and the ARM error answers.

Every part of the emulator raises ``EmulatorError`` for what a client did wrong; the server turns it
into ARM's error body (``{"error": {"code", "message", "details"}}``), as every route module does with
``arm_error`` and ``not_found``. It lives here, beneath every other module, so that any of them can
raise it without importing the workspace.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web


class EmulatorError(Exception):
    """An error the emulator reports to clients as an ARM error body (``extra``: more keys of that body)."""

    def __init__(self, status: int, code: str, message: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra or {}


def arm_error(status: int, code: str, message: str, extra: dict[str, Any] | None = None) -> web.Response:
    body = {"code": code, "message": message, "details": [], **(extra or {})}
    return web.json_response({"error": body}, status=status)


def method_not_allowed() -> web.Response:
    return arm_error(405, "MethodNotAllowed", "The requested HTTP method is not supported by this resource.")


def not_found(kind: str, name: str) -> web.Response:
    return arm_error(404, "ResourceNotFound", f"The resource '{kind}/{name}' was not found.")
