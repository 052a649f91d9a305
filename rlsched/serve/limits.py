"""A cap on request bodies: past `max_bytes`, 413 before the body is read or parsed.

A body is read and parsed as JSON on the endpoint's event loop, so a very large one holds every other
request (a 20 MB body held `/health` for 41 s) and its memory. A declared `Content-Length` over the
cap is refused at once; a chunked body is counted as it arrives and refused as soon as it passes the
cap, before the rest is read. Pure ASGI, so it wraps the app beneath FastAPI's routing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def too_large(max_bytes: int) -> HTTPException:
    mb = max_bytes / (1 << 20)
    return HTTPException(
        413, f"the request body is larger than this endpoint's limit of {mb:g} MB (--max-body-mb)"
    )


class BodyLimit:
    def __init__(self, app: App, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _refuse(send, self.max_bytes)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise too_large(self.max_bytes)  # FastAPI's handler answers 413
            return message

        await self.app(scope, counted, send)


async def _refuse(send: Send, max_bytes: int) -> None:
    """413 with OpenAI's error body, without reading the request."""
    from rlsched.serve.errors import ApiError

    response = ApiError(413, str(too_large(max_bytes).detail)).response()
    await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})
