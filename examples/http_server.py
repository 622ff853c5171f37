"""A small HTTP inference server that embeds subnetact + scheduling (standard library only on the HTTP side).

    python examples/http_server.py --port 8080            # serves the embedded digits supernet with SlackFit
    python examples/load_generator.py --url http://127.0.0.1:8080 --rate 300 --duration 10

Endpoints:

- ``POST /predict`` with JSON ``{"image": [...64 values 0..16...] or 8x8 nested lists, "deadline_ms": 50}``
  (``deadline_ms`` optional: the request's latency SLO, default ``--slo-ms``). Answers:
  - ``200`` ``{"prediction", "subnet", "subnet_accuracy", "batch_size", "latency_ms", "on_time": true}``;
  - ``504`` when the deadline was missed: dropped by the scheduler because it could no longer be served in time
    (``"error": "deadline missed"``), or served after the deadline (the prediction is included, ``"on_time": false``);
  - ``429`` when the queue is full, ``503`` when no worker is alive or the server is shutting down;
  - ``400`` for a malformed request (the message names the field, the value and what is allowed), ``500`` if
    inference failed.
- ``GET /metrics``: the scheduler's counters and latency percentiles, plus HTTP status counts, as JSON.
- ``GET /healthz``: ``{"ok": true}``.

Each HTTP request is one scheduler request: the handler thread submits it and waits for its future, so the
scheduler batches concurrent HTTP requests together. Every request gets exactly one answer.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch

import subnetact
from scheduling import (
    DeadlineMissedError,
    Fixed,
    MaxAcc,
    MinCost,
    NoWorkersError,
    Profile,
    QueueFullError,
    Scheduler,
    SchedulerClosedError,
    SlackFit,
)
from subnetact import digits

MAX_BODY = 64 * 1024
POLICIES = {"slackfit": SlackFit, "maxacc": MaxAcc, "mincost": MinCost}


class BadRequest(ValueError):
    """A malformed request: answered with 400 and this message."""


class App:
    """The model side and the scheduler; independent of HTTP so that it is easy to embed or test.

    Args:
        profile: latency/accuracy profile of the served subnets (ids 0..n-1, configs in ``subnet.config``).
        model: the converted supernet with those subnets registered.
        policy: ``"slackfit"``, ``"maxacc"``, ``"mincost"`` or ``"fixed:<id>"``.
        slo_ms: default SLO of a request without ``deadline_ms``.
        workers: inference threads sharing the model (each passes ``subnet=`` per call).
        max_queue: queued requests beyond this are answered 429.
    """

    def __init__(
        self,
        profile: Profile,
        model: torch.nn.Module,
        *,
        policy: str = "slackfit",
        slo_ms: float = 50.0,
        workers: int = 1,
        max_queue: int = 1000,
    ) -> None:
        self.model = model
        self.profile = profile
        self.configs = {s.id: subnetact.SubnetConfig.from_dict(s.config) for s in profile.subnets}
        self.slo_ms = slo_ms
        self.status = Counter()
        self._lock = threading.Lock()
        self.scheduler = Scheduler(_policy(policy, profile), [self._worker] * workers, max_queue=max_queue)

    def infer(self, subnet_id: Any, images: torch.Tensor) -> list[int]:
        """Predicted digit of each image (N, 1, 8, 8) with subnet ``subnet_id``."""
        with torch.inference_mode():
            return self.model(images, subnet=self.configs[subnet_id]).argmax(1).tolist()  # (N, 10) -> N

    def _worker(self, subnet_id: Any, payloads: list[torch.Tensor]) -> list[dict]:
        images = torch.stack(payloads)  # (N, 1, 8, 8)
        predictions = self.infer(subnet_id, images)
        return [{"prediction": p, "subnet": subnet_id, "batch_size": len(payloads)} for p in predictions]

    def predict(self, body: Any) -> tuple[int, dict]:
        """Serve one parsed JSON request; returns (HTTP status, JSON answer). Never raises for request errors."""
        try:
            image, slo_ms = parse_request(body, self.slo_ms)
        except BadRequest as exc:
            return self._answer(400, {"error": str(exc)})
        start = time.monotonic()
        try:
            future = self.scheduler.submit(image, slo_s=slo_ms / 1e3)
        except SchedulerClosedError:
            return self._answer(503, {"error": "server is shutting down"})
        try:
            result = future.result()
        except DeadlineMissedError as exc:
            return self._answer(504, {"error": "deadline missed", "detail": str(exc), "deadline_ms": slo_ms})
        except QueueFullError as exc:
            return self._answer(429, {"error": "queue full", "detail": str(exc)})
        except (NoWorkersError, SchedulerClosedError) as exc:
            return self._answer(503, {"error": "no inference worker", "detail": str(exc)})
        except Exception as exc:  # noqa: BLE001 - the worker's own failure: answer 500, keep serving
            return self._answer(500, {"error": "inference failed", "detail": f"{type(exc).__name__}: {exc}"})
        latency_ms = 1e3 * (time.monotonic() - start)
        answer = {
            **result,
            "subnet_accuracy": self.profile.subnet(result["subnet"]).accuracy,
            "latency_ms": round(latency_ms, 3),
            "on_time": latency_ms <= slo_ms,
        }
        return self._answer(200 if answer["on_time"] else 504, answer)

    def metrics(self) -> dict:
        m = self.scheduler.metrics().as_dict()
        with self._lock:
            m["http_status"] = {str(k): v for k, v in sorted(self.status.items())}
        m["queue_len"] = self.scheduler.queue_len
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in m.items()}

    def close(self) -> None:
        self.scheduler.close(drain=True)

    def _answer(self, status: int, body: dict) -> tuple[int, dict]:
        with self._lock:
            self.status[status] += 1
        return status, body


def parse_request(body: Any, default_slo_ms: float) -> tuple[torch.Tensor, float]:
    """``(image (1, 8, 8) in [0, 1], slo_ms)`` from a request body, or :class:`BadRequest` naming the problem."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object with an 'image' field, got {type(body).__name__}")
    unknown = sorted(set(body) - {"image", "deadline_ms"})
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; allowed: 'image', 'deadline_ms'")
    if "image" not in body:
        raise BadRequest("missing field 'image': 64 numbers in 0..16 (a flat list or 8 rows of 8)")
    raw = body["image"]
    flat = [v for row in raw for v in row] if isinstance(raw, list) and raw and isinstance(raw[0], list) else raw
    if (
        not isinstance(flat, list)
        or len(flat) != 64
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 16 for v in flat)
    ):
        shown = raw if len(repr(raw)) < 80 else repr(raw)[:77] + "..."
        raise BadRequest(f"image={shown!r} must be 64 numbers in 0..16 (a flat list or 8 rows of 8)")
    slo_ms = body.get("deadline_ms", default_slo_ms)
    if isinstance(slo_ms, bool) or not isinstance(slo_ms, (int, float)) or not math.isfinite(slo_ms) or slo_ms <= 0:
        raise BadRequest(f"deadline_ms={slo_ms!r} must be a number of milliseconds > 0")
    return digits.to_input([flat])[0], float(slo_ms)


class Handler(BaseHTTPRequestHandler):
    app: App  # set on the server's handler subclass by make_server
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if self.path != "/predict":
            return self._send(404, {"error": f"no such endpoint: POST {self.path}; use POST /predict"})
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0 or length > MAX_BODY:
            return self._send(400, {"error": f"Content-Length={length} must be between 1 and {MAX_BODY} bytes"})
        try:
            body = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return self._send(400, {"error": f"the body is not valid JSON: {exc}"})
        self._send(*self.app.predict(body))

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/metrics":
            return self._send(200, self.app.metrics())
        if self.path == "/healthz":
            return self._send(200, {"ok": True})
        self._send(404, {"error": f"no such endpoint: GET {self.path}; use GET /metrics or /healthz"})

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet by default
        if getattr(self.server, "verbose", False):
            super().log_message(format, *args)


def make_server(app: App, host: str = "127.0.0.1", port: int = 0, *, verbose: bool = False) -> ThreadingHTTPServer:
    """An HTTP server for ``app`` bound to ``(host, port)`` (port 0: any free port; see ``server.server_address``)."""
    handler = type("AppHandler", (Handler,), {"app": app})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.verbose = verbose
    return server


def digits_app(*, batch_sizes=(1, 2, 4, 8, 16), repeats: int = 10, profile_path: str | None = None, **kwargs) -> App:
    """An :class:`App` serving the embedded digits supernet, profiled on this machine (or from ``profile_path``)."""
    model, record = digits.load_supernet()
    if profile_path is not None:
        profile = Profile.load(profile_path)
    else:
        profile = subnetact.profile(
            model,
            [subnetact.SubnetConfig.from_dict(r["config"]) for r in record["pareto"]],
            list(batch_sizes),
            example_input=digits.to_input(digits.test_split()[0][:1]),
            accuracies=[r["accuracy"] for r in record["pareto"]],
            repeats=repeats,
        )
    return App(profile, model, **kwargs)


def _policy(name: str, profile: Profile):
    if name in POLICIES:
        return POLICIES[name](profile)
    if name.startswith("fixed:"):
        key = name.split(":", 1)[1]
        ids = {str(i): i for i in profile.ids}
        if key in ids:
            return Fixed(profile, ids[key])
    allowed = [*POLICIES, *(f"fixed:{i}" for i in profile.ids)]
    raise ValueError(f"policy={name!r} is not one of {allowed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--policy", default="slackfit", help="slackfit, maxacc, mincost or fixed:<id>")
    parser.add_argument("--slo-ms", type=float, default=50.0, help="SLO of requests without deadline_ms")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--max-queue", type=int, default=1000)
    parser.add_argument("--profile", default=None, help="a profile JSON (e.g. from `subnetact profile`)")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    app = digits_app(
        profile_path=args.profile,
        policy=args.policy,
        slo_ms=args.slo_ms,
        workers=args.workers,
        max_queue=args.max_queue,
    )
    server = make_server(app, args.host, args.port, verbose=args.verbose)
    host, port = server.server_address[:2]
    print(
        f"serving the digits supernet ({len(app.configs)} subnets, {args.policy}) on http://{host}:{port}", flush=True
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        app.close()


if __name__ == "__main__":
    main()
