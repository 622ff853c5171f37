"""Run a :class:`~subnetact.serving.ServingApp` on uvicorn, with the timeouts and the SIGTERM drain a server needs.

uvicorn already gives: a listen backlog of 2048 (no resets under bursts of connections), ``TCP_NODELAY`` on every
connection (asyncio sets it; no Nagle stalls between the header and body writes), a keep-alive timeout, HTTP framing
that rejects bad ``Content-Length`` with 400, and a graceful shutdown that stops accepting, closes idle connections
and waits for in-flight requests. What it lacks is a timeout for a client that opens a connection and sends its
headers slowly (or never): :func:`timed_protocol` adds one. Slow *bodies* are the app's ``body_timeout_s`` (408).
It also sends each answer's headers and body in one write (:class:`OneWritePerResponse`; uvicorn writes them
separately, and a client then wakes up twice per answer).

On SIGTERM (what Docker and Kubernetes send) the app first answers ``/readyz`` with 503, keeps serving for
``drain_delay_s`` so that load balancers stop sending, then uvicorn stops accepting, finishes the in-flight requests
(up to ``graceful_timeout_s``), and the app's lifespan shutdown serves whatever is still queued; then :func:`serve`
logs that the drain is complete and returns, so the entry point exits 0 (uvicorn on its own re-raises the signal
after its shutdown, which ends the process with -15/143 and no word of whether the drain finished). A second SIGINT
exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from typing import Any

from .app import ARRIVED, ServingApp

__all__ = ["OneWritePerResponse", "make_server", "serve", "timed_protocol"]

_log = logging.getLogger("subnetact.serving")


class OneWritePerResponse:
    """A transport that sends a response's headers and body in one ``send()``: a write is held until the next write
    of the same event-loop step and sent with it (or at the end of the step if none comes).

    uvicorn writes the status line and headers when the app sends ``http.response.start`` and the body when it sends
    ``http.response.body``; with ``TCP_NODELAY`` those are two segments, and a client may wake up twice per answer
    (issue 22: ``hey`` at 64 connections on a loaded 2-core machine). Everything else is the wrapped transport's.
    """

    __slots__ = ("_flush_handle", "_held", "_loop", "_transport")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        if self._held is None:
            self._held = bytes(data)
            self._flush_handle = self._loop.call_soon(self._flush)
            return
        held, self._held = self._held, None
        self._flush_handle.cancel()  # type: ignore[union-attr]
        self._transport.write(b"".join((held, data)))

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def timed_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class, closing connections whose request headers are not complete within
    ``header_timeout_s`` of the connection opening or of the previous response, and writing each answer at once
    (:class:`OneWritePerResponse`)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(OneWritePerResponse(transport, self.loop))
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            super().connection_lost(exc)

        if hasattr(AutoHTTPProtocol, "on_headers_complete"):  # httptools: parser callback, before the task starts

            def on_headers_complete(self) -> None:
                super().on_headers_complete()
                # The door: stamp the request when its headers are parsed, not when its ASGI task first runs, so
                # the deadline budget and the server's latency include the time the task waits for the event loop.
                if self.scope is not None:
                    self.scope[ARRIVED] = (time.perf_counter(), time.time())

        def _arm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
            # The protocol makes a new `cycle` when a request's headers are complete: if it is still the one seen now
            # when the timer fires, no new request arrived in time.
            waiting_for = self.cycle

            def expire() -> None:
                if self.cycle is waiting_for and not self.transport.is_closing():
                    self.transport.close()

            self._header_timer = self.loop.call_later(header_timeout_s, expire)

    return HeaderTimeoutProtocol


def make_server(
    app: ServingApp,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    header_timeout_s: float = 10.0,
    keep_alive_s: int = 5,
    graceful_timeout_s: float = 30.0,
    drain_delay_s: float = 0.0,
    log_level: str = "warning",
    ready: Any = None,
) -> Any:
    """A ``uvicorn.Server`` for ``app`` on ``host:port`` that drains on SIGTERM (see the module docstring).

    ``server.run()`` blocks until SIGTERM/SIGINT (signals are only caught when it runs in the main thread; elsewhere
    set ``server.should_exit = True`` to stop it the same way). :func:`serve` is ``make_server(...).run()``.

    Args:
        app: The front end.
        host, port: Where to listen (``port=0``: any free port; see ``ready``).
        header_timeout_s: Request headers must be complete within this many seconds of the connection opening or of
            the previous response. Keep it above ``keep_alive_s``, which closes idle keep-alive connections first.
        keep_alive_s: Idle keep-alive connections are closed after this many seconds.
        graceful_timeout_s: On shutdown, in-flight requests get this long before they are cancelled.
        drain_delay_s: After SIGTERM, keep serving (with ``/readyz`` at 503) this long before closing the listener.
        log_level: uvicorn's log level.
        ready: Optional callable ``ready(host, port)`` called once the socket listens.
    """
    import uvicorn

    for name, value, zero_ok in (
        ("header_timeout_s", header_timeout_s, False),
        ("keep_alive_s", keep_alive_s, False),
        ("graceful_timeout_s", graceful_timeout_s, False),
        ("drain_delay_s", drain_delay_s, True),
    ):
        bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        if bad or value < 0 or (value == 0 and not zero_ok):
            raise ValueError(f"{name}={value!r} must be a finite number of seconds {'>= 0' if zero_ok else '> 0'}")
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=timed_protocol(header_timeout_s),
        lifespan="on",
        timeout_keep_alive=keep_alive_s,
        timeout_graceful_shutdown=graceful_timeout_s,
        log_level=log_level,
        access_log=False,
    )

    class DrainingServer(uvicorn.Server):
        exit_at: float | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit and self.exit_at is None:
                _log.info("%s received: draining", signal.Signals(sig).name)
            if self.exit_at is None and drain_delay_s > 0 and sig == signal.SIGTERM:  # first SIGTERM: delay
                app.mark_unready()
                self.exit_at = time.monotonic() + drain_delay_s
                return
            app.begin_drain()
            super().handle_exit(sig, frame)
            # The signal was handled by draining: uvicorn must not raise it again once run() is done (that would end
            # the process with -15 after a clean drain).
            self._captured_signals.clear()

        async def on_tick(self, counter: int) -> bool:
            if self.should_exit:
                app.begin_drain()
            if self.exit_at is not None and time.monotonic() >= self.exit_at:
                app.begin_drain()
                return True
            return await super().on_tick(counter)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if ready is not None and self.servers:
                bound = self.servers[0].sockets[0].getsockname()
                ready(bound[0], bound[1])

    return DrainingServer(config)


def serve(app: ServingApp, **options: Any) -> None:
    """Serve ``app`` until SIGTERM/SIGINT, then drain; blocks, and returns once the drain is complete (logged on the
    ``subnetact.serving`` logger). ``options`` are those of :func:`make_server`."""
    server = make_server(app, **options)
    server.run()
    if server.started:
        answered = sum(s.value for m in app.metrics.requests.collect() for s in m.samples if s.name.endswith("_total"))
        _log.info("drained and stopped: %d request(s) answered in all, queue empty", answered)
