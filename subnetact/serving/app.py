"""The ASGI front end (Starlette): ``POST /predict``, health, readiness and Prometheus metrics.

Endpoints:

- ``POST /predict``: a JSON or safetensors body (:mod:`~subnetact.serving.codec`); the deadline budget is turned into
  an absolute time the moment the request's headers arrive, so time spent receiving the body counts against it.
  With ``trust_request_start`` (the Ray router sets it) the budget and the latency start earlier, at the request's
  ``X-Request-Start`` (stamped by Ray's proxy, :mod:`subnetact_proxy`, or a load balancer) when it is plausible;
  the wait before the front end is recorded in ``/metrics`` (``subnetact_upstream_wait_seconds``).
  Answers (always a JSON body):

  ====  ==========================================================================================================
  200   ``{"prediction" | "output", "subnet", "subnet_accuracy", "batch_size", "latency_ms", "on_time": true}``
  400   malformed body, input of the wrong shape, bad ``deadline_ms`` / ``X-Deadline-Ms`` (the message says which)
  404   no such endpoint; 405 wrong method (with ``Allow``); both counted in ``/metrics`` like any answer
  408   the body did not arrive within ``body_timeout_s`` (the connection is closed)
  413   the body is larger than ``max_body_bytes`` (the connection is closed)
  415   ``Content-Type`` is neither ``application/json`` nor ``application/x-safetensors`` (the connection is closed:
        its body is not read)
  429   the queue is full
  500   the model raised
  503   no live worker, or the server is draining (``Retry-After: 1``)
  504   the deadline was missed: dropped because it could no longer be met (``"error": "deadline missed"``), answered
        with an error by the scheduler's reaper because its worker is stuck, not answered by the backend within
        ``backstop_s`` of the deadline (``"error": "deadline missed"``, a detail saying which), or answered after
        it (the prediction is included with ``"on_time": false``)
  ====  ==========================================================================================================

A client that disconnects before its body arrived is logged (one line) and counted as ``client_disconnected``.

**The event loop never parses a large body.** Bodies up to ``inline_decode_bytes`` (16 KiB: a few tens of µs of
parsing) are decoded on the event loop; JSON bodies over ``process_decode_bytes`` (64 KiB) in ``decode_processes``
child processes (:class:`~subnetact.serving.decode_pool.DecodePool`: parsing holds the GIL, so on a thread it would
still stop the event loop for the whole body); the rest (mid-sized JSON, safetensors blobs: a copy) on a small thread
pool (``decode_threads``). The CPU a body can cost is bounded by ``max_body_bytes``, whose default
(:func:`~subnetact.serving.codec.default_max_body_bytes`) is the largest valid body for the input shape: anything
larger is refused with 413 before parsing.

- ``GET /healthz``: 200 while the process serves HTTP (liveness).
- ``GET /readyz``: 200 when a request would be served now; 503 while draining, without a live worker, while every
  worker is stuck, or while no subnet can meet ``default_deadline_ms`` by the backend's current plan
  (``{"ready": false, "reason": ...}``; readiness; see :class:`~subnetact.serving.PlanGuard`, which also probes the
  backend until its plan recovers).
- ``GET /metrics``: Prometheus text (:mod:`~subnetact.serving.metrics`).
- ``GET /stats``: JSON: exact server-side latency percentiles of the last answers to ``/predict``, queue length, and
  what the backend plans with now (``"plan"``: :meth:`~subnetact.serving.PlanGuard.snapshot`).

**The server's latency** (``/metrics``' histogram, ``/stats``) runs from the moment the request's headers were
parsed to the moment the answer's last byte was handed to the transport, as nginx's ``$request_time`` and Envoy's
duration do: the JSON encoding and the write of the answer are the server's time, not the client's. An answer's own
``latency_ms`` and ``on_time`` are taken when it is encoded, just before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scheduling import (
    DeadlineMissedError,
    NoWorkersError,
    QueueFullError,
    SchedulerClosedError,
    WorkerFailedError,
)
from subnetact_proxy import REQUEST_START_HEADER, parse_request_start

from .backend import Backend
from .codec import (
    DEADLINE_HEADER,
    JSON_TYPE,
    TENSOR_TYPE,
    RequestError,
    decode_json,
    decode_tensor,
    default_max_body_bytes,
    parse_budget_header,
    parse_budget_ms,
)
from .decode_pool import DecodePool, DecodePoolError
from .metrics import ServingMetrics
from .plan_guard import PlanGuard

__all__ = ["ServingApp"]

_log = logging.getLogger("subnetact.serving")
_YIELDS_BEFORE_PARSE = 2
"""Event-loop turns a request's handler gives up before parsing its body (see ``ServingApp._serve``)."""
_CLOSE = {"connection": "close"}
REQUEST_START = REQUEST_START_HEADER.encode()
ARRIVED = "subnetact.arrived"
"""ASGI scope key: ``(time.perf_counter(), time.time())`` when the request's headers arrived."""


class _Answer(Exception):
    """Raised inside the handler to answer at once with ``status`` and a JSON body."""

    def __init__(self, status: int, outcome: str, body: dict[str, Any], headers: dict[str, str] | None = None):
        super().__init__(body.get("error"))
        self.status, self.outcome, self.body, self.headers = status, outcome, body, headers


class ServingApp:
    """An ASGI application serving one backend; pass it to uvicorn (or :func:`subnetact.serving.serve`).

    Args:
        backend: A :class:`~subnetact.serving.LocalBackend` or the Ray backend.
        input_shape: One request's input shape without the batch dimension, e.g. ``(1, 8, 8)``.
        default_deadline_ms: Budget of a request that gives none. Default 100 ms.
        max_body_bytes: Larger bodies are answered 413. Default ``None``: the largest valid body for
            ``input_shape`` (:func:`~subnetact.serving.codec.default_max_body_bytes`; 67,584 bytes for the digits).
        body_timeout_s: The whole body must arrive within this many seconds of the headers, else 408.
            Default 5 s.
        backstop_s: The front end's own timeout: a request the backend has not answered ``backstop_s`` after its
            deadline is answered 504 (the scheduler answers by deadline + its ``deadline_grace_s`` already; this
            covers a backend that does not). Default 1.5 s.
        decode_threads: Threads parsing bodies larger than ``inline_decode_bytes`` off the event loop. Default 2.
        inline_decode_bytes: Bodies up to this size are parsed on the event loop (cheaper than a thread hop).
            Default 16 KiB.
        decode_processes: Child processes parsing JSON bodies larger than ``process_decode_bytes``; 0: such bodies
            are parsed on the thread pool. Default 2.
        process_decode_bytes: JSON bodies larger than this go to a child process (about 1 ms of parsing; below it
            a thread costs less than the pipe). Default 64 KiB.
        trust_request_start: Start each request's budget and latency at its ``X-Request-Start`` header (see
            :func:`subnetact_proxy.parse_request_start`: malformed or implausible values are ignored and counted;
            a stamp can shorten a budget, never lengthen it). Default ``False``: a server facing clients directly
            starts the clock when the headers arrive; the Ray router, behind Ray's proxy, sets it.

    Attributes:
        metrics: The :class:`~subnetact.serving.metrics.ServingMetrics` behind ``GET /metrics``.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        input_shape: Sequence[int],
        default_deadline_ms: float = 100.0,
        max_body_bytes: int | None = None,
        body_timeout_s: float = 5.0,
        backstop_s: float = 1.5,
        decode_threads: int = 2,
        inline_decode_bytes: int = 16 << 10,
        decode_processes: int = 2,
        process_decode_bytes: int = 64 << 10,
        trust_request_start: bool = False,
    ) -> None:
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route

        self.default_deadline_ms = parse_budget_ms(default_deadline_ms, "default_deadline_ms")
        for name, value, low in (
            ("max_body_bytes", max_body_bytes, 1),
            ("decode_threads", decode_threads, 1),
            ("inline_decode_bytes", inline_decode_bytes, 0),
            ("decode_processes", decode_processes, 0),
            ("process_decode_bytes", process_decode_bytes, 0),
        ):
            if value is None and name == "max_body_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r} must be an int >= {low}")
        for name, value in (("body_timeout_s", body_timeout_s), ("backstop_s", backstop_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
                raise ValueError(f"{name}={value!r} must be a number of seconds > 0")
        self.backend = backend
        self.input_shape = tuple(input_shape)
        self.max_body_bytes = default_max_body_bytes(self.input_shape) if max_body_bytes is None else max_body_bytes
        self.body_timeout_s = float(body_timeout_s)
        self.backstop_s = float(backstop_s)
        self.inline_decode_bytes = inline_decode_bytes
        self._decode_pool = ThreadPoolExecutor(decode_threads, thread_name_prefix="subnetact-decode")
        self.process_decode_bytes = process_decode_bytes
        self._decode_children = DecodePool(self.input_shape, decode_processes) if decode_processes else None
        self.trust_request_start = bool(trust_request_start)
        self.draining = False  # new predictions are refused (503)
        self.unready = False  # /readyz answers 503, predictions are still served
        self.metrics = ServingMetrics(
            queue_length=backend.queue_len, stuck_workers=getattr(backend, "stuck_workers", None)
        )
        self.plan_guard = PlanGuard(backend, budget_s=self.default_deadline_ms / 1e3, input_shape=self.input_shape)
        backend.set_batch_observer(self.metrics.batch_size.observe)
        self._app = Starlette(
            routes=[
                Route("/predict", self._predict, methods=["POST"]),
                Route("/healthz", self._healthz, methods=["GET"]),
                Route("/readyz", self._readyz, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                Route("/stats", self._stats, methods=["GET"]),
            ],
            exception_handlers={HTTPException: self._http_error},
            lifespan=self._lifespan,
        )

    async def __call__(self, scope, receive, send) -> None:
        # The door: the request's deadline budget and its latency start here, or earlier where the server stamped
        # the scope when the headers were parsed (subnetact.serving.serve does).
        if ARRIVED not in scope:
            scope[ARRIVED] = (time.perf_counter(), time.time())
        if self.trust_request_start and scope["type"] == "http":
            self._start_at_request_start(scope)
        await self._app(scope, receive, send)

    def _start_at_request_start(self, scope) -> None:
        """Move the scope's arrival back to its ``X-Request-Start`` (the proxy's entry), recording the wait."""
        stamps = [value for name, value in scope.get("headers", ()) if name.lower() == REQUEST_START]
        if not stamps:
            return
        arrived, arrived_wall = scope[ARRIVED]
        start = parse_request_start(stamps[0], arrived_wall) if len(stamps) == 1 else None
        if start is None:
            self.metrics.request_start_ignored.inc()
            return
        waited = arrived_wall - start
        self.metrics.upstream_wait.observe(waited)
        scope[ARRIVED] = (arrived - waited, start)

    def mark_unready(self) -> None:
        """Answer ``/readyz`` with 503 from now on, still serving predictions (the first phase of a drain)."""
        self.unready = True

    def begin_drain(self) -> None:
        """Answer new predictions and ``/readyz`` with 503 from now on (on SIGTERM)."""
        self.unready = self.draining = True

    # ------------------------------------------------------------------ responses
    @staticmethod
    def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None):
        from starlette.responses import Response

        return Response(json.dumps(body), status, headers=headers, media_type=JSON_TYPE)

    def _observed(
        self,
        arrived: float,
        outcome: str,
        status: int,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        subnet: object = None,
        window: bool = True,
    ):
        """The JSON answer, counted in ``/metrics`` (and ``/stats`` unless ``window=False``) once it is written: its
        latency ends when the last byte is handed to the transport."""
        response = self._json(status, body, headers)
        send_answer = response.__call__
        metrics = self.metrics

        async def send_then_observe(scope, receive, send) -> None:
            try:
                await send_answer(scope, receive, send)
            finally:  # a client gone before the write still got an answer from us: count it
                metrics.observe(outcome, time.perf_counter() - arrived, subnet, window=window)

        return send_then_observe

    async def _http_error(self, request, exc):
        # Starlette's own 404/405 (plain text by default) as JSON, keeping its headers (Allow on 405).
        what = {404: "not found", 405: "method not allowed"}.get(exc.status_code, exc.detail)
        detail = f"{request.method} {request.url.path}"
        if exc.status_code == 405:
            allow = {k.lower(): v for k, v in (exc.headers or {}).items()}.get("allow", "")
            detail += f"; allowed: {allow}"
        arrived = request.scope.get(ARRIVED, (time.perf_counter(), 0.0))[0]
        body = {"error": what, "detail": detail}
        return self._observed(arrived, what.replace(" ", "_"), exc.status_code, body, exc.headers, window=False)

    # ------------------------------------------------------------------ endpoints
    async def _predict(self, request):
        arrived, arrived_wall = request.scope[ARRIVED]
        try:
            answer = await self._serve(request, arrived_wall)
        except _Answer as a:
            return self._observed(arrived, a.outcome, a.status, a.body, a.headers)
        latency = time.perf_counter() - arrived
        on_time = latency <= answer.pop("_budget_s")
        answer["latency_ms"] = round(1e3 * latency, 3)
        answer["on_time"] = on_time
        outcome, status = ("ok", 200) if on_time else ("late", 504)
        return self._observed(arrived, outcome, status, answer, subnet=answer.get("subnet"))

    async def _serve(self, request, arrived_wall: float) -> dict[str, Any]:
        if self.draining:
            raise _Answer(503, "unavailable", {"error": "server is draining"}, {"retry-after": "1", **_CLOSE})
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media not in (JSON_TYPE, TENSOR_TYPE):
            raise _Answer(
                415,
                "unsupported_media_type",
                {"error": f"Content-Type {media or '(none)'!r} is not supported; use {JSON_TYPE} or {TENSOR_TYPE}"},
                _CLOSE,  # its body is not read: closing beats waiting for (or draining) a body nobody wants
            )
        length = request.headers.get("content-length")
        if length is not None and int(length) > self.max_body_bytes:  # the HTTP parser already checked it is an int
            raise self._too_large(int(length))
        # Two turns of the event loop before this request's body is parsed and submitted. A burst of requests is read
        # in one turn and each handler then runs in one go (~50 µs: body, decode, submit), so without them the loop
        # parses and submits the whole burst before it reads a socket again: the scheduler starts a batch with the
        # first requests while the rest are still being parsed, and requests arriving meanwhile wait in the kernel,
        # off the server's clock. Yielding lets the loop read every socket of the burst first. Measured (hey, 20 and
        # 64 connections, docs/benchmarks.md): clients' p50 8.9 -> 7.0 and 20.3 -> 17.5 ms, 15 % fewer batches, the
        # server's clock within 1.3-2.3 ms of the clients' at 64 (was 2.9-4.1); cost about 6 µs of CPU per yield.
        for _ in range(_YIELDS_BEFORE_PARSE):
            await asyncio.sleep(0)
        try:
            body = await _within(self._read_body(request), self.body_timeout_s)
        except asyncio.TimeoutError:
            raise _Answer(
                408, "timeout", {"error": f"the body did not arrive within {self.body_timeout_s:g} s"}, _CLOSE
            ) from None
        try:
            header = request.headers.get(DEADLINE_HEADER)
            header_ms = None if header is None else parse_budget_header(header)
            payload, budget_ms = await self._decode_body(media, body)
            if header_ms is not None:
                if budget_ms is not None:
                    raise RequestError(400, "give the deadline as the X-Deadline-Ms header or deadline_ms, not both")
                budget_ms = header_ms
        except RequestError as exc:
            raise _Answer(exc.status, "bad_request", {"error": str(exc)}) from None
        budget_ms = self.default_deadline_ms if budget_ms is None else budget_ms
        deadline_wall = arrived_wall + budget_ms / 1e3
        try:
            # The backstop: the backend should answer by the deadline (+ its grace); if it does not, we do.
            backstop = max(0.0, deadline_wall - time.time()) + self.backstop_s
            result = await _within(self.backend.infer(payload, deadline_wall), backstop)
        except DeadlineMissedError as exc:  # first: it is also a TimeoutError
            raise _Answer(
                504, "deadline_missed", {"error": "deadline missed", "detail": str(exc), "deadline_ms": budget_ms}
            ) from None
        except asyncio.TimeoutError:
            raise _Answer(
                504,
                "deadline_missed",
                {
                    "error": "deadline missed",
                    "detail": f"the backend did not answer within {self.backstop_s:g} s of the deadline",
                    "deadline_ms": budget_ms,
                },
            ) from None
        except QueueFullError as exc:
            raise _Answer(429, "queue_full", {"error": "queue full", "detail": str(exc)}) from None
        except (NoWorkersError, SchedulerClosedError, WorkerFailedError) as exc:
            raise _Answer(
                503, "unavailable", {"error": "no inference worker", "detail": str(exc)}, {"retry-after": "1"}
            ) from None
        except Exception as exc:  # noqa: BLE001 - the model's own failure: answer 500, keep serving
            raise _Answer(
                500, "failed", {"error": "inference failed", "detail": f"{type(exc).__name__}: {exc}"}
            ) from None
        answer = dict(result)
        answer["subnet_accuracy"] = self.backend.profile.subnet(answer["subnet"]).accuracy
        answer["_budget_s"] = budget_ms / 1e3
        return answer

    async def _decode_body(self, media: str, body: bytes) -> tuple[Any, float | None]:
        if len(body) <= self.inline_decode_bytes:
            return self._decode(media, body)
        if media == JSON_TYPE and len(body) > self.process_decode_bytes and self._decode_children is not None:
            try:  # in a child process: parsing holds a GIL, not ours
                return await self._decode_children.decode(body)
            except DecodePoolError as exc:
                _log.warning("%s; parsing this body on a thread", exc)
        # off the event loop: other clients keep being served while it parses
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._decode_pool, self._decode, media, body)

    def _decode(self, media: str, body: bytes) -> tuple[Any, float | None]:
        if media == JSON_TYPE:
            return decode_json(body, self.input_shape)
        return decode_tensor(body, self.input_shape), None

    def _too_large(self, size: int) -> _Answer:
        return _Answer(
            413,
            "too_large",
            {"error": f"body of {size} bytes exceeds the limit of {self.max_body_bytes} bytes"},
            _CLOSE,
        )

    async def _read_body(self, request) -> bytes:
        from starlette.requests import ClientDisconnect

        chunks, size = [], 0
        try:
            async for chunk in request.stream():  # chunked bodies have no Content-Length: count as they come
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise self._too_large(size)
                chunks.append(chunk)
        except ClientDisconnect:
            # Nobody is left to answer: one log line and a count, not a traceback per connection.
            _log.info("client %s disconnected after %d bytes of its body", _peer(request), size)
            raise _Answer(499, "client_disconnected", {"error": "client disconnected"}) from None
        return b"".join(chunks)

    async def _healthz(self, request):
        return self._json(200, {"ok": True})

    async def _readyz(self, request):
        if self.unready:
            return self._json(503, {"ready": False, "reason": "draining"})
        if not self.backend.ready():
            stuck = getattr(self.backend, "stuck_workers", None)
            if stuck is not None and stuck():
                return self._json(
                    503, {"ready": False, "reason": f"every worker is stuck ({stuck()} past a deadline + grace)"}
                )
            return self._json(503, {"ready": False, "reason": "no live worker"})
        plan = self.plan_guard.check()
        if not plan.feasible:
            return self._json(503, {"ready": False, "reason": plan.reason})
        return self._json(200, {"ready": True})

    async def _metrics(self, request):
        from starlette.responses import Response

        body, content_type = self.metrics.render()
        return Response(body, 200, media_type=content_type)

    async def _stats(self, request):
        return self._json(
            200,
            {
                "latency": self.metrics.window.percentiles(50, 90, 99),
                "queue_len": self.backend.queue_len(),
                "plan": self.plan_guard.snapshot(),
            },
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app):
        # Logs the plan and, while no subnet can meet the budget, probes the backend so that its plan recovers.
        guard = asyncio.get_running_loop().create_task(self.plan_guard.run())
        try:
            yield
        finally:
            guard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await guard
        # uvicorn has stopped accepting and finished the in-flight requests; serve what is still queued, then stop.
        self.begin_drain()
        await self.backend.close()
        self._decode_pool.shutdown(wait=False)
        if self._decode_children is not None:
            await self._decode_children.aclose()


if sys.version_info >= (3, 11):

    async def _within(awaitable, seconds: float):
        """``await awaitable``, cancelled with ``TimeoutError`` after ``seconds``: a timer on the request's own task.

        ``asyncio.wait_for`` would wrap the awaitable in a task of its own, one more task and two more event-loop
        turns per call; twice per request, that was a third of the front end's per-request CPU (issue 22, hey at 64
        connections: ``docs/benchmarks.md``). The two turns a handler takes before parsing its body
        (``_YIELDS_BEFORE_PARSE``) are there on purpose, and cost less without the tasks."""
        async with asyncio.timeout(seconds):
            return await awaitable

else:  # Python 3.10: no asyncio.timeout
    _within = asyncio.wait_for


def _peer(request) -> str:
    client = request.client
    return f"{client.host}:{client.port}" if client is not None else "(unknown)"
