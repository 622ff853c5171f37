"""One HTTP request driven straight through an ASGI app (no server, no socket), for the front end's tests."""

from __future__ import annotations

import asyncio
import json

DIGITS_BODY = json.dumps({"input": [[[0.5] * 8] * 8], "deadline_ms": 5000}).encode()
"""A valid ``POST /predict`` JSON body for the (1, 8, 8) digits input, with a 5 s budget."""


async def call(app, method: str, path: str, body: bytes = b"", *, slow_write_s: float = 0.0) -> tuple[int, bytes]:
    """``(status, body)`` of one request to ``app``; the transport takes ``slow_write_s`` to accept the body."""
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "scheme": "http",
        "server": ("t", 80),
        "root_path": "",
    }
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        if message["type"] == "http.response.body":
            await asyncio.sleep(slow_write_s)
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])
