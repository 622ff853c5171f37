"""What runs in Ray Serve's proxy (issue 22, :mod:`subnetact_proxy`), without a Ray cluster: the ``X-Request-Start``
stamp and its parser, the retry of a request whose router died (an inner app standing in for Ray's proxy: it ends a
request without a response, as Ray's proxy does when the replica's call raises ``ActorDiedError``), and the front
end that starts the deadline clock at the stamp. The same on Ray: ``tests/e2e/test_e2e_ray_router_kill.py``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from subnetact_proxy import ProxyEntry, format_request_start, parse_request_start

NOW = 1_764_000_000.0  # a Unix time in 2025


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("t=1763999999.25", NOW - 0.75),  # nginx: seconds with a fraction
        ("t=1763999999750", NOW - 0.25),  # Heroku: milliseconds
        ("t=1763999999500000", NOW - 0.5),  # Apache %t: microseconds
        ("1763999999", NOW - 1.0),  # no "t="
        (b"t=1764000000500000", NOW),  # 0.5 s in the future: skew between nodes, counted as now
        (" t=1763999999000000 ", NOW - 1.0),
    ],
)
def test_request_start_formats(value, expected):
    assert parse_request_start(value, NOW) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "value",
    ["", "t=", "t=abc", "t=-5", "t=1e9", "t=1_764_000_000", "x=1764000000", "t=1764000000 t=1764000000",
     "t=1763999000",  # 1000 s old: older than any budget, a wrong clock
     "t=1764000005",  # 5 s in the future
     "t=99999999999999999999"],
)  # fmt: skip
def test_request_start_malformed_or_implausible_is_none(value):
    assert parse_request_start(value, NOW) is None


def test_request_start_round_trips():
    assert parse_request_start(format_request_start(NOW - 0.123456), NOW) == pytest.approx(NOW - 0.123456, abs=1e-6)


def test_proxy_entry_is_torch_free():
    # Ray's proxy imports it on every node: it must not pull torch or subnetact in.
    code = "import sys, subnetact_proxy\nheavy = [m for m in ('torch', 'subnetact', 'ray') if m in sys.modules]\n"
    code += "assert not heavy, heavy\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------------- the middleware


class FakeProxy:
    """Stands in for Ray's proxy app: reads the whole body, edits the scope as Ray does for a route prefix, then
    either answers (echoing what it got) or, for the first ``die`` calls, ends without a response (a dead router)."""

    def __init__(self, die: int = 0, raise_instead: bool = False) -> None:
        self.die = die
        self.raise_instead = raise_instead
        self.calls: list[dict] = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.calls.append({"disconnect": True})
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        scope["root_path"] = scope.get("root_path", "") + "/app"  # Ray's proxy: set_root_path(root_path + prefix)
        headers = dict(scope["headers"])
        self.calls.append({"body": body, "root_path": scope["root_path"], "headers": headers})
        if len(self.calls) <= self.die:
            if self.raise_instead:
                raise RuntimeError("replica call failed")
            return
        out = json.dumps({"body": body.decode(), "start": headers[b"x-request-start"].decode()}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})


def run_request(app, method="POST", path="/predict", chunks=(b'{"input": [1, 2]}',), headers=(), disconnect=False):
    """Drive one HTTP request through ``app``; returns (status, headers, body) or None if nothing was sent."""
    incoming = [
        {"type": "http.request", "body": c, "more_body": disconnect or i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]  # a client that disconnects does so mid-body
    sent: list[dict] = []

    async def receive():
        if incoming:
            return incoming.pop(0)
        if disconnect:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client waits for its answer

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": list(headers)}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    if not sent:
        return None
    start, *bodies = sent
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in bodies)


def test_dead_router_request_is_sent_again_with_its_body_and_stamp():
    inner = FakeProxy(die=1)
    status, _, body = run_request(ProxyEntry(inner, retry_delay_s=0), chunks=(b'{"input": ', b"[1, 2]}"))
    assert status == 200
    assert json.loads(body)["body"] == '{"input": [1, 2]}'  # the whole body, both chunks, on the second attempt
    assert len(inner.calls) == 2
    assert [c["root_path"] for c in inner.calls] == ["/app", "/app"]  # each attempt had a fresh scope
    stamps = {c["headers"][b"x-request-start"] for c in inner.calls}
    assert len(stamps) == 1  # one stamp, from the first entry: the retry keeps the original deadline
    assert abs(parse_request_start(stamps.pop(), time.time()) - time.time()) < 5


def test_a_proxy_that_raises_is_a_dead_router_too():
    inner = FakeProxy(die=1, raise_instead=True)
    assert run_request(ProxyEntry(inner, retry_delay_s=0))[0] == 200
    assert len(inner.calls) == 2


def test_every_attempt_failing_is_a_json_503_with_retry_after():
    inner = FakeProxy(die=10)
    status, headers, body = run_request(ProxyEntry(inner, max_attempts=3, retry_delay_s=0))
    assert status == 503 and headers[b"retry-after"] == b"1"
    answer = json.loads(body)
    assert answer["error"] == "no router answered" and "3 attempts" in answer["detail"], answer
    assert len(inner.calls) == 3


def test_a_body_too_large_to_keep_is_not_sent_again():
    inner = FakeProxy(die=1)
    status, _, body = run_request(ProxyEntry(inner, replay_bytes=8, retry_delay_s=0))
    assert status == 503 and "was not kept" in json.loads(body)["detail"]
    assert len(inner.calls) == 1


def test_non_idempotent_requests_are_not_sent_again():
    inner = FakeProxy(die=1)
    assert run_request(ProxyEntry(inner, retry_delay_s=0), path="/orders") is None  # uvicorn answers its own 500
    assert len(inner.calls) == 1
    inner = FakeProxy(die=1)
    assert run_request(ProxyEntry(inner, retry_delay_s=0), method="GET", path="/stats", chunks=(b"",))[0] == 200


def test_a_client_that_went_away_is_not_answered_or_retried():
    inner = FakeProxy()
    assert run_request(ProxyEntry(inner, retry_delay_s=0), chunks=(b"{",), disconnect=True) is None
    assert inner.calls == [{"disconnect": True}]


def test_a_load_balancers_stamp_is_kept_and_a_bad_one_replaced():
    upstream = format_request_start(time.time() - 0.2).encode()
    _, _, body = run_request(ProxyEntry(FakeProxy()), headers=[(b"x-request-start", upstream)])
    assert json.loads(body)["start"] == upstream.decode()
    _, _, body = run_request(ProxyEntry(FakeProxy()), headers=[(b"X-Request-Start", b"t=12")])
    assert abs(parse_request_start(json.loads(body)["start"], time.time()) - time.time()) < 5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"replay_bytes": -1}, "replay_bytes=-1"),
        ({"retry_delay_s": -0.1}, "retry_delay_s=-0.1"),
        ({"retry_paths": "/predict"}, "retry_paths='/predict'"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProxyEntry(FakeProxy(), **kwargs)


# ---------------------------------------------------------------------------------------------------- the front end


def test_front_end_starts_the_deadline_clock_at_the_stamp():
    """The real front end on uvicorn behind the middleware: a request stamped 300 ms before it arrived, with a 200 ms
    budget, is already late (504) when the router sees it, though the model answers at once; unstamped (the
    middleware stamps it on entry) it is served. ``/metrics`` shows the wait before the front end."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    import http.client
    import re
    import threading

    import uvicorn

    from scheduling import datasets
    from subnetact.serving import LocalBackend, ServingApp

    profile = datasets.superserve_a40_profile()

    def model(subnet_id, payloads):
        return [{"prediction": 0, "subnet": subnet_id, "batch_size": len(payloads)} for _ in payloads]

    backend = LocalBackend(model, profile, policy=f"fixed:{profile.ids[0]}", workers=1)
    app = ServingApp(backend, input_shape=(1, 8, 8), trust_request_start=True)
    server = uvicorn.Server(uvicorn.Config(ProxyEntry(app), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        give_up = time.monotonic() + 30
        while not server.started and time.monotonic() < give_up:
            time.sleep(0.01)
        assert server.started
        port = server.servers[0].sockets[0].getsockname()[1]

        def request(method, path, body=None, headers=None):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
                resp = conn.getresponse()
                return resp.status, resp.read().decode()
            finally:
                conn.close()

        def metric(name):
            m = re.search(rf"^{name} (\S+)$", request("GET", "/metrics")[1], re.M)
            return float(m.group(1))

        body = json.dumps({"input": [[[0.5] * 8] * 8], "deadline_ms": 200})
        status, answer = request("POST", "/predict", body)
        assert status == 200, answer
        assert 0 <= metric("subnetact_upstream_wait_seconds_sum") < 0.1  # stamped by the middleware on entry
        waits_before = metric("subnetact_upstream_wait_seconds_count")

        stamp = format_request_start(time.time() - 0.3)  # a load balancer in front saw it 300 ms ago
        status, answer = request("POST", "/predict", body, {"X-Request-Start": stamp})
        assert status == 504 and json.loads(answer)["error"] == "deadline missed", answer
        assert metric("subnetact_upstream_wait_seconds_count") >= waits_before + 1  # every request is, /metrics too
        assert metric("subnetact_upstream_wait_seconds_sum") >= 0.3

        # Behind no middleware, a stamp from a wrong clock is ignored and counted; the budget starts on arrival.
        bare = ServingApp(backend, input_shape=(1, 8, 8), trust_request_start=True)
        scope = {"type": "http", "headers": [(b"x-request-start", b"t=12")], "subnetact.arrived": (1.0, NOW)}
        bare._start_at_request_start(scope)
        assert scope["subnetact.arrived"] == (1.0, NOW) and metric_value(bare, "subnetact_request_start_ignored") == 1
        scope = {"type": "http", "headers": [(b"x-request-start", b"t=1763999999.5")], "subnetact.arrived": (9.0, NOW)}
        bare._start_at_request_start(scope)
        assert scope["subnetact.arrived"] == pytest.approx((8.5, NOW - 0.5))
    finally:
        server.should_exit = True
        thread.join(30)


def metric_value(app, name: str) -> float:
    return app.metrics.registry.get_sample_value(f"{name}_total") or 0.0
