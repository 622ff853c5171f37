"""What subnetact runs inside Ray Serve's HTTP proxy: an ASGI middleware that stamps when each request entered the
proxy and answers for a router replica that died while holding it.

A package of its own, torch-free (like ``subnetact_cli``): Ray's proxy process on every node imports it, and must
not load torch (seconds, hundreds of MB) to stamp a header. Installed through Ray Serve's proxy callback, set in the
environment of every Ray node before it starts (``ray start``, or the driver's ``ray.init()`` on a local cluster)::

    RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=subnetact_proxy:proxy_middlewares ray start --head

(:data:`PROXY_CALLBACK`; Ray 2.60 refuses ``HTTPOptions(middlewares=...)``, the callback is what remains.)

:class:`ProxyEntry` does two things (``docs/deployment.md``, issue 22):

- **The deadline clock starts at the proxy.** It adds ``X-Request-Start: t=<microseconds since the epoch>`` (the
  convention of Apache's ``%t``, nginx's ``t=${msec}`` and Heroku's router) the moment the proxy calls it, keeping a
  plausible stamp a load balancer in front already set. The router's front end starts the request's budget and
  latency there and records the wait before it (``subnetact_upstream_wait_seconds`` in ``/metrics``).
- **A dead router's requests are sent again.** When a router replica dies (SIGKILL, node lost) with requests in
  flight, Ray's proxy ends each of them without a response (uvicorn would answer a plain-text 500). The middleware
  sees that the proxy returned without starting a response while the client is still connected, and sends the same
  request (method, headers, the body it buffered) through the proxy again, which routes it to a live replica: Ray
  marks a replica whose call raised ``ActorDiedError`` dead at once. Only idempotent requests are sent again:
  ``GET``/``HEAD`` and paths ending in ``/predict`` (a prediction is a pure function of its input, so running it
  twice is harmless). The retried request keeps its ``X-Request-Start``, so it keeps its original deadline: the
  router answers 504 if it can no longer be met. When every attempt fails (or the body was too large to buffer),
  the answer is a JSON 503 with ``Retry-After: 1`` instead of the proxy's bare 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

__all__ = [
    "PROXY_CALLBACK",
    "REQUEST_START_HEADER",
    "ProxyEntry",
    "format_request_start",
    "parse_request_start",
    "proxy_middlewares",
]

PROXY_CALLBACK = "subnetact_proxy:proxy_middlewares"
"""The value of ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` that installs :class:`ProxyEntry` in Ray's proxy."""
REQUEST_START_HEADER = "x-request-start"
MAX_AGE_S = 600.0
"""A stamp older than this (the largest deadline budget, 10 minutes) is a wrong clock, not a slow hop: ignored."""
FUTURE_SKEW_S = 1.0
"""A stamp up to this far in the future is clock skew between nodes (counted as now); further, it is ignored."""

_START = re.compile(r"(?:t=)?([0-9]{1,20}(?:\.[0-9]{1,9})?)")
_HEADER = REQUEST_START_HEADER.encode()
_log = logging.getLogger("subnetact.proxy")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def format_request_start(wall: float) -> str:
    """``X-Request-Start``'s value for a ``time.time()``: ``"t="`` and integer microseconds since the epoch."""
    return f"t={round(wall * 1e6)}"


def parse_request_start(value: str | bytes, now: float) -> float | None:
    """The ``time.time()`` a request started at, from an ``X-Request-Start`` value; ``None`` if it is malformed or
    implausible.

    Accepts ``t=`` followed by (or just) seconds, milliseconds or microseconds since the epoch, told apart by their
    magnitude (``1700000000.123``, ``1700000000123``, ``1700000000123456``). Plausible means not older than
    ``MAX_AGE_S`` before ``now`` and not later than ``FUTURE_SKEW_S`` after it; a start after ``now`` (clock skew
    between nodes) is returned as ``now``, so a stamp can shorten a request's budget but never lengthen it.
    """
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    match = _START.fullmatch(text.strip())
    if match is None:
        return None
    number = float(match.group(1))
    scale = 1e-6 if number >= 1e14 else 1e-3 if number >= 1e11 else 1.0  # µs (Apache), ms (Heroku), s (nginx)
    start = number * scale
    if not now - MAX_AGE_S <= start <= now + FUTURE_SKEW_S:
        return None
    return min(start, now)


def _stamp(scope: Scope, now: float) -> None:
    """Give ``scope`` one ``X-Request-Start``: a plausible one already there (a load balancer's), else ``now``."""
    headers = scope.get("headers") or []
    ours = [value for name, value in headers if name.lower() == _HEADER]
    if len(ours) == 1 and parse_request_start(ours[0], now) is not None:
        return
    scope["headers"] = [(n, v) for n, v in headers if n.lower() != _HEADER]
    scope["headers"].append((_HEADER, format_request_start(now).encode()))


class _BodyTape:
    """The request's body messages as attempts read them, so that the next attempt gets them again.

    Each :meth:`receive` replays what earlier attempts consumed, then reads on from the client; bodies beyond
    ``limit`` bytes are not kept (the request cannot be sent again)."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self._receive = receive
        self._limit = limit
        self._messages: list[Message] = []
        self._size = 0
        self.replayable = True
        self.disconnected = False  # the client went away: nobody to answer

    def receive(self) -> Receive:
        pending = list(self._messages)

        async def receive() -> Message:
            if pending:
                return pending.pop(0)
            message = await self._receive()
            if message["type"] == "http.request":
                self._size += len(message.get("body", b""))
                if self._size > self._limit:
                    self.replayable = False
                    self._messages.clear()
                elif self.replayable:
                    self._messages.append(message)
            elif message["type"] == "http.disconnect":
                self.disconnected = True
            return message

        return receive


class ProxyEntry:
    """ASGI middleware for Ray Serve's HTTP proxy: stamps ``X-Request-Start`` and sends a request again when the
    router replica holding it died (see the module docstring).

    Args:
        app: The proxy's ASGI application (Ray passes it).
        max_attempts: How many times an idempotent request is sent through the proxy before the answer is 503.
            Default 3: two router replicas, and one more for a replica Ray has not yet marked dead.
        replay_bytes: Bodies up to this size are buffered to be sent again; a larger one whose router died is
            answered 503. Default 1 MiB (the front end refuses larger bodies anyway).
        retry_paths: Paths (suffixes) whose ``POST`` is idempotent. Default ``("/predict",)``.
        retry_delay_s: Pause before attempt ``k + 1``: ``k * retry_delay_s``. Default 0.02 s.
    """

    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        *,
        max_attempts: int = 3,
        replay_bytes: int = 1 << 20,
        retry_paths: Sequence[str] = ("/predict",),
        retry_delay_s: float = 0.02,
    ) -> None:
        for name, value, low in (("max_attempts", max_attempts, 1), ("replay_bytes", replay_bytes, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be an int >= {low}")
        if isinstance(retry_delay_s, bool) or not isinstance(retry_delay_s, (int, float)) or not 0 <= retry_delay_s:
            raise ValueError(f"retry_delay_s={retry_delay_s!r} must be a number of seconds >= 0")
        if isinstance(retry_paths, str) or not all(isinstance(p, str) and p.startswith("/") for p in retry_paths):
            raise ValueError(f"retry_paths={retry_paths!r} must be a sequence of paths starting with '/'")
        self.app = app
        self.max_attempts = max_attempts
        self.replay_bytes = replay_bytes
        self.retry_paths = tuple(retry_paths)
        self.retry_delay_s = float(retry_delay_s)

    def _idempotent(self, scope: Scope) -> bool:
        return scope.get("method") in ("GET", "HEAD") or (
            scope.get("method") == "POST" and scope.get("path", "").endswith(self.retry_paths)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        _stamp(scope, time.time())
        if not self._idempotent(scope):
            await self.app(scope, receive, send)
            return
        tape = _BodyTape(receive, self.replay_bytes)
        failure = "the router replica ended the request without an answer"
        attempt = 0
        while True:
            attempt += 1
            started = False

            async def send_once(message: Message) -> None:
                nonlocal started
                if message["type"] == "http.response.start":
                    started = True
                await send(message)

            # A copy per attempt: Ray's proxy edits the scope it is given (root_path for a route prefix).
            try:
                await self.app({**scope, "headers": list(scope["headers"])}, tape.receive(), send_once)
            except Exception as exc:  # noqa: BLE001 - Ray's proxy answers its own errors; anything else is one too
                if started:
                    raise
                failure = f"Ray's proxy raised {type(exc).__name__}: {exc}"
            if started or tape.disconnected:
                return
            if not tape.replayable or attempt >= self.max_attempts:
                break
            _log.warning(
                "%s %s: %s; sending it again (attempt %d of %d)",
                scope.get("method"), scope.get("path"), failure, attempt + 1, self.max_attempts,
            )  # fmt: skip
            await asyncio.sleep(self.retry_delay_s * attempt)
        detail = failure if tape.replayable else f"{failure}; its body (> {self.replay_bytes} bytes) was not kept"
        await _answer_unavailable(send, f"{detail} ({attempt} attempt{'s' * (attempt > 1)})")


async def _answer_unavailable(send: Send, detail: str) -> None:
    body = json.dumps({"error": "no router answered", "detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", b"1"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def proxy_middlewares() -> list[Any]:
    """Ray Serve's proxy callback (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``): ``[Middleware(ProxyEntry)]``."""
    from starlette.middleware import Middleware

    return [Middleware(ProxyEntry)]
