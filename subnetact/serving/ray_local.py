"""Ray Serve on this machine, set up as in production (Ray's proxy running :class:`subnetact_proxy.ProxyEntry`):
for trying the Ray deployment on one machine, and for the tests and benchmarks that do
(``tests/e2e/test_e2e_ray*.py``, ``benchmarks/serving/bench_router_kill.py``).

::

    with local_ray(num_cpus=2):
        served = serve_app(build_app(spec, num_workers=2))   # Ray's proxy on a free loopback port
        status, answer, headers = served.predict(x, budget_ms=100.0)
        served.shutdown()                                     # serve.shutdown(): the routers stop their workers

:func:`local_ray` starts a local cluster with the proxy callback in its environment (``ray.init`` passes the
driver's environment on to the proxy) and stops it on exit; :func:`serve_app` starts Serve's proxy and runs an
application; :class:`LocalServe` is its HTTP address with a few client calls (one attempt each, no retry: what a
client sees is what is measured).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from subnetact_proxy import PROXY_CALLBACK

from ..errors import ConfigError

__all__ = ["PROXY_CALLBACK_ENV", "LocalServe", "free_port", "local_ray", "serve_app"]

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
"""The environment variable naming Ray Serve's proxy callback (``subnetact_proxy.PROXY_CALLBACK``)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_ray(num_cpus: int = 2, *, proxy_entry: bool = True) -> Iterator[None]:
    """A local Ray cluster for the ``with`` block: ``ray.init(num_cpus)``, no dashboard, the cluster's logs kept out
    of this process's output; ``ray.shutdown()`` on exit.

    Args:
        num_cpus: CPUs the cluster may schedule (workers ask for ``worker_options={"num_cpus": ...}``).
        proxy_entry: Ray's proxy runs :class:`subnetact_proxy.ProxyEntry` (the callback is set in this process's
            environment for ``ray.init`` and restored after it). ``False``: Ray's proxy alone.
    """
    if isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1:
        raise ConfigError(f"num_cpus={num_cpus!r} must be an int >= 1")
    before = os.environ.get(PROXY_CALLBACK_ENV)
    if proxy_entry:
        os.environ[PROXY_CALLBACK_ENV] = PROXY_CALLBACK
    else:
        os.environ.pop(PROXY_CALLBACK_ENV, None)
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    finally:  # the cluster's processes have their environment: this process gets its own back
        if before is None:
            os.environ.pop(PROXY_CALLBACK_ENV, None)
        else:
            os.environ[PROXY_CALLBACK_ENV] = before
    try:
        yield
    finally:
        ray.shutdown()


@dataclass
class LocalServe:
    """An application served through Ray's HTTP proxy at ``http://host:port/``."""

    host: str
    port: int
    name: str

    def handle(self, deployment: str = "Router") -> Any:
        """A handle to one of the application's deployments (``"Router"`` for :func:`~.ray_serve.build_app`)."""
        return serve.get_deployment_handle(deployment, app_name=self.name)

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None, timeout: float = 60.0
    ) -> tuple[int, bytes, dict[str, str]]:
        """One HTTP request: ``(status, body, headers with lower-case names)``; ``OSError`` or
        ``http.client.HTTPException`` if the connection fails."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()

    def predict(self, x: Any, budget_ms: float, timeout: float | None = None) -> tuple[int, dict, dict[str, str]]:
        """``POST /predict`` of input ``x`` (nested lists) with ``deadline_ms=budget_ms``, once:
        ``(status, JSON answer, headers)``; status 0 if the connection dropped (the answer says how). Waits up to
        ``timeout`` seconds (default: the budget + 30 s)."""
        body = json.dumps({"input": x, "deadline_ms": budget_ms}).encode()
        wait = budget_ms / 1e3 + 30.0 if timeout is None else timeout
        try:
            status, raw, headers = self.request("POST", "/predict", body, {"Content-Type": "application/json"}, wait)
        except (OSError, http.client.HTTPException) as exc:
            return 0, {"error": f"{type(exc).__name__}: {exc}"}, {}
        try:
            return status, json.loads(raw), headers
        except ValueError:  # Ray's proxy's own errors are plain text
            return status, {"error": raw.decode(errors="replace")}, headers

    def metric(self, name: str) -> float | None:
        """An unlabelled sample of ``GET /metrics`` (from whichever router Ray's proxy picks); ``None`` if absent."""
        text = self.request("GET", "/metrics")[1].decode()
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else None

    def router_stats(self, want: int, limit_s: float) -> dict[int, dict]:
        """``Router.stats()`` of up to ``want`` distinct router replicas, by process id, asking for up to
        ``limit_s`` seconds (a handle call reaches a replica of Serve's choosing; one that just died is skipped)."""
        router = self.handle()
        seen: dict[int, dict] = {}
        give_up = time.monotonic() + limit_s
        while len(seen) < want and time.monotonic() < give_up:
            try:
                stats = router.stats.remote().result(timeout_s=30)
            except ray.exceptions.RayError:
                continue
            seen[stats["pid"]] = stats
        return seen

    def shutdown(self) -> None:
        """``serve.shutdown()``: every application and Serve's proxy stop (the routers stop their workers)."""
        serve.shutdown()


def serve_app(app: Any, *, name: str = "subnetact", host: str = "127.0.0.1", port: int | None = None) -> LocalServe:
    """Start Serve's HTTP proxy on ``host:port`` (default: a free port) and run ``app`` (a bound application, e.g.
    :func:`~.ray_serve.build_app`'s) at ``/``; returns once it is ready."""
    port = free_port(host) if port is None else port
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=name, route_prefix="/")
    return LocalServe(host, port, name)
