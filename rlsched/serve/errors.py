"""The endpoint's errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, and
FastAPI's validation errors turned into them: 400 naming the field that is unknown, not implemented,
missing or of the wrong type, or a body that is not JSON."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def field_name(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts)


def validation_error(err: RequestValidationError) -> ApiError:
    first = err.errors()[0]
    kind, where, msg = first.get("type", ""), field_name(first.get("loc", ())), str(first.get("msg", ""))
    if kind == "json_invalid":
        return ApiError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', msg)}")
    if kind == "extra_forbidden":
        return ApiError(
            400, f"unknown field '{where}': this server does not know it (see docs/endpoint.md)", param=where
        )
    if "NOT_IMPLEMENTED:" in msg:
        name = msg.split("NOT_IMPLEMENTED:", 1)[1].strip()
        return ApiError(400, f"'{name}' is not implemented by this server; leave it unset", param=name)
    if kind == "missing":
        if not where:
            return ApiError(400, "the request has no JSON body")
        return ApiError(400, f"missing required field '{where}'", param=where)
    return ApiError(400, f"{where or 'body'}: {msg.removeprefix('Value error, ')}", param=where or None)
