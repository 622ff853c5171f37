"""The hostile-client audit of issue 22 as tests: the real front end on uvicorn over loopback, a model callable that
can be made to hang, and raw sockets for what HTTP clients do not do.

Reproduced: a large body must not stall the event loop (1); a hung model must not leave any request without an
answer past its deadline, and ``/readyz`` must say so (2); the smaller findings of item 5 (disconnects mid-body,
deadline parsing, 404/405 latency, 415 on an unread body). The clean SIGTERM exit is in
``tests/e2e/test_e2e_http.py::test_sigterm_drains_the_entry_point`` (it needs the real entry point process).

Bounds are generous (a loaded 2-core machine): each asserts a structural property that the old code fails by
seconds, not a speed.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from scheduling import datasets  # noqa: E402
from subnetact.serving import LocalBackend, ServingApp, make_server  # noqa: E402
from subnetact.serving import app as app_module  # noqa: E402

SHAPE = (1, 8, 8)
PROFILE = datasets.superserve_a40_profile()
JSON = {"Content-Type": "application/json"}
X = [[[0.5] * 8] * 8]
HANG = [[[7.0] * 8] * 8]  # the input that makes the model hang


class Model:
    """The model side: answers at once, except on the HANG input, where it blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.hanging = threading.Event()

    def __call__(self, subnet_id, payloads):
        if any(float(p.flat[0]) == 7.0 for p in payloads):
            self.hanging.set()
            self.release.wait(30)
        return [{"prediction": 0, "subnet": subnet_id, "batch_size": len(payloads)} for _ in payloads]


class Served:
    """A ServingApp on uvicorn in a thread, on a free loopback port."""

    def __init__(self, app: ServingApp) -> None:
        self.app = app
        bound = threading.Event()
        self.server = make_server(app, host="127.0.0.1", port=0, ready=lambda h, p: bound.set(), keep_alive_s=5)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        assert bound.wait(30), "server did not start"
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    def request(self, method: str, path: str, body=None, headers=None, timeout: float = 30.0):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, dict):
                body = json.dumps(body).encode()
            conn.request(method, path, body=body, headers=JSON if headers is None else headers)
            resp = conn.getresponse()
            data = resp.read()
            is_json = resp.getheader("content-type", "").startswith("application/json")
            return resp.status, (json.loads(data) if is_json else data.decode())
        finally:
            conn.close()

    def metric(self, name: str, **labels) -> float:
        text = self.request("GET", "/metrics")[1]
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        m = re.search(rf"^{re.escape(name)}{{{re.escape(want)}}} (\S+)$" if labels else rf"^{name} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def model():
    m = Model()
    yield m
    m.release.set()


def serve(model, *, workers: int = 1, **options) -> Served:
    policy = f"fixed:{PROFILE.ids[0]}"
    backend = LocalBackend(model, PROFILE, policy=policy, workers=workers, deadline_grace_s=0.2)
    return Served(ServingApp(backend, input_shape=SHAPE, **{"default_deadline_ms": 2000.0, **options}))


@pytest.fixture
def served(model):
    s = serve(model)
    yield s
    model.release.set()
    s.close()


# ---------------------------------------------------------------------------------------------------- 1. large bodies


def test_large_body_is_parsed_off_the_event_loop(model, monkeypatch):
    # A parse that takes 2 s (sleeping, as a huge body would hold a thread) must not stall other clients: on the
    # event loop it delayed every other request by the whole parse (the audit's 0.76 s -> 23 s probe p50).
    started = threading.Event()
    real = app_module.decode_json

    def slow_decode(body, shape):
        started.set()
        time.sleep(2.0)
        return real(body, shape)

    monkeypatch.setattr(app_module, "decode_json", slow_decode)
    s = serve(model, max_body_bytes=4 << 20, decode_processes=0)  # the thread pool (child processes: test below)
    try:
        big = json.dumps({"input": [0.25] * 200_000}).encode()  # ~1.2 MB, over inline_decode_bytes
        with ThreadPoolExecutor(1) as pool:
            flood = pool.submit(s.request, "POST", "/predict", big)
            assert started.wait(30)
            t = time.perf_counter()
            assert s.request("GET", "/healthz") == (200, {"ok": True})
            assert time.perf_counter() - t < 1.0  # answered while the big body is still being parsed
            status, answer = flood.result(30)
        assert status == 400 and "shape" in answer["error"]  # the flood's answer is unchanged
    finally:
        s.close()


def test_large_json_body_is_parsed_in_a_child_process(model, monkeypatch):
    # On a thread, json.loads still holds this process's GIL for the whole body; in a child it cannot.
    def not_here(body, shape):
        raise AssertionError("a large JSON body was parsed in the server's process")

    monkeypatch.setattr(app_module, "decode_json", not_here)
    s = serve(model, max_body_bytes=4 << 20)
    try:
        big = json.dumps({"input": [0.25] * 200_000}).encode()  # ~1.2 MB: over process_decode_bytes
        status, answer = s.request("POST", "/predict", big)
        assert status == 400 and "shape [200000]" in answer["error"], answer  # decode_json's own message
        rows = [[[0.125 * ((i + j) % 8) for j in range(8)] for i in range(8)]]
        padded = json.dumps({"input": rows, "deadline_ms": 1500}) + " " * (100 << 10)  # valid, ~100 KiB
        status, answer = s.request("POST", "/predict", padded.encode())
        assert status == 200 and answer["prediction"] == 0, answer
        pool = s.app._decode_children
        assert len(pool._children) == 2 and all(c.returncode is None for c in pool._children)
    finally:
        s.close()
    assert all(c.returncode is not None for c in pool._children) or not pool._children  # stopped with the app


def test_default_body_limit_refuses_a_1mib_json_before_parsing(served):
    # From its Content-Length alone: the answer comes while the body is still being sent (it is never read).
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(head + b'{"input": [' + b"0.25, " * 1000)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 413") and f"limit of {32 * 64 + 65536} bytes".encode() in out, out


# ---------------------------------------------------------------------------------------------------- 2. hung model


def _timed(s: Served, body: dict, budget_ms: float):
    t0 = time.perf_counter()
    status, answer = s.request("POST", "/predict", {**body, "deadline_ms": budget_ms})
    return status, answer, time.perf_counter() - t0


def test_hung_only_worker_every_request_answered_by_deadline_plus_2s_and_readyz_503(served, model):
    budget = 300.0
    with ThreadPoolExecutor(8) as pool:
        hung = pool.submit(_timed, served, {"input": HANG}, budget)
        assert model.hanging.wait(30)
        others = [pool.submit(_timed, served, {"input": X}, budget) for _ in range(16)]
        answers = [f.result(30) for f in [hung, *others]]
    for status, answer, took in answers:
        assert status == 504 and answer["error"] == "deadline missed", answer
        assert took < budget / 1e3 + 2.0, took
    assert "stuck worker" in answers[0][1]["detail"], answers
    status, ready = served.request("GET", "/readyz")
    assert status == 503 and "stuck" in ready["reason"], ready
    assert served.metric("subnetact_workers_stuck") == 1.0
    model.release.set()  # the model comes back: the worker serves again and is ready
    assert served.request("POST", "/predict", {"input": X})[0] == 200
    assert served.request("GET", "/readyz") == (200, {"ready": True})
    assert served.metric("subnetact_workers_stuck") == 0.0


def test_hung_and_healthy_worker_only_the_hung_request_misses(model):
    s = serve(model, workers=2)
    try:
        with ThreadPoolExecutor(8) as pool:
            hung = pool.submit(_timed, s, {"input": HANG}, 300.0)
            assert model.hanging.wait(30)
            others = [pool.submit(_timed, s, {"input": X}, 300.0) for _ in range(16)]
            status, answer, took = hung.result(30)
            assert status == 504 and took < 0.3 + 2.0
            assert all(f.result(30)[0] == 200 for f in others)  # the healthy worker serves the rest
        assert s.request("GET", "/readyz") == (200, {"ready": True})  # one healthy worker: still ready
    finally:
        model.release.set()
        s.close()


class NeverAnswers:
    """A backend that accepts requests and never answers them (what the HTTP backstop is for)."""

    profile = PROFILE

    async def infer(self, payload, deadline_wall):
        await threading_event_never()

    def queue_len(self):
        return 0

    def ready(self):
        return True

    def set_batch_observer(self, fn):
        pass

    async def close(self):
        pass


async def threading_event_never():
    import asyncio

    await asyncio.Event().wait()


def test_http_backstop_answers_when_the_backend_does_not():
    s = Served(ServingApp(NeverAnswers(), input_shape=SHAPE, backstop_s=0.3))
    try:
        t0 = time.perf_counter()
        status, answer = s.request("POST", "/predict", {"input": X, "deadline_ms": 200})
        took = time.perf_counter() - t0
        assert status == 504 and "did not answer within 0.3 s of the deadline" in answer["detail"]
        assert 0.45 <= took < 0.2 + 2.0
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------------- 5. the rest


def test_client_disconnecting_mid_body_is_one_log_line_and_counted(served, caplog):
    with caplog.at_level(logging.INFO):
        head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
                sock.sendall(head + b'{"input": [')
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while served.metric("subnetact_requests_total", outcome="client_disconnected") < 3:
            assert time.monotonic() < deadline, "disconnects not counted"
            time.sleep(0.05)
    lines = [r for r in caplog.records if "disconnected after" in r.getMessage()]
    assert len(lines) == 3 and all(r.exc_info is None for r in lines)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert served.request("GET", "/healthz")[0] == 200


@pytest.mark.parametrize(
    "body, headers, match",
    [
        ({"input": X, "deadline_ms": "50"}, JSON, r"deadline_ms='50' must be a number of milli.*not a str"),
        ({"input": X, "deadline_ms": 1e308}, JSON, r"deadline_ms=1e\+308 must be .* <= 600000"),
        ({"input": X, "deadline_ms": 600001}, JSON, r"deadline_ms=600001 must be"),
        ({"input": X}, {**JSON, "X-Deadline-Ms": "1_000"}, r"X-Deadline-Ms='1_000' .*plain digits"),
        ({"input": X}, {**JSON, "X-Deadline-Ms": " 50 "}, r"X-Deadline-Ms=' ?50 ' .*plain digits"),
        ({"input": X}, {**JSON, "X-Deadline-Ms": "1e308"}, r"X-Deadline-Ms='1e308'"),
        ({"input": X}, {**JSON, "X-Deadline-Ms": "+50"}, r"X-Deadline-Ms='\+50'"),
        ({"input": X}, {**JSON, "X-Deadline-Ms": "0"}, r"X-Deadline-Ms='0' must be"),
        ({"input": X}, {**JSON, "X-Deadline-Ms": "inf"}, r"X-Deadline-Ms='inf'"),
    ],
)
def test_deadline_parsing_is_strict(served, body, headers, match):
    status, answer = served.request("POST", "/predict", body, headers)
    assert status == 400 and re.search(match, answer["error"]), answer


@pytest.mark.parametrize("headers", [{**JSON, "X-Deadline-Ms": "1500"}, {**JSON, "X-Deadline-Ms": "1500.5"}])
def test_plain_header_deadlines_are_accepted(served, headers):
    assert served.request("POST", "/predict", {"input": X}, headers)[0] == 200


def test_404_and_405_are_in_the_latency_histogram(served):
    assert served.request("GET", "/nothing")[0] == 404
    assert served.request("GET", "/predict")[0] == 405
    for outcome in ("not_found", "method_not_allowed"):
        assert served.metric("subnetact_requests_total", outcome=outcome) == 1.0
        assert served.metric("subnetact_request_latency_seconds_count", outcome=outcome) == 1.0


def test_415_on_a_huge_declared_body_closes_the_connection_at_once(served):
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1000000000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        t0 = time.perf_counter()
        sock.sendall(head)
        out = b""
        while chunk := sock.recv(65536):  # returns b"" when the server closes
            out += chunk
        took = time.perf_counter() - t0
    assert out.startswith(b"HTTP/1.1 415") and b"connection: close" in out.lower(), out
    assert took < 3.0  # was held open for the 5 s body timeout
