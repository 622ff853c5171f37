"""Each answer leaves the server in one write (issue 22): uvicorn writes a response's headers and its body
separately, so a keep-alive client used to see the headers alone first and wake up again for the body.
:class:`subnetact.serving.server.OneWritePerResponse` holds a write until the next one of the same event-loop step.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import sys
import threading

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from asgi_request import DIGITS_BODY, call  # noqa: E402

from scheduling import datasets  # noqa: E402
from subnetact.serving import LocalBackend, ServingApp, make_server  # noqa: E402
from subnetact.serving.server import OneWritePerResponse  # noqa: E402


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name):
        return ("127.0.0.1", 1) if name == "peername" else None


def test_two_writes_of_a_step_are_one_and_a_lone_write_leaves_at_the_end_of_the_step():
    async def scenario():
        inner = FakeTransport()
        t = OneWritePerResponse(inner, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        t.write(memoryview(b"body"))
        assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        t.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # nothing follows in this step
        assert len(inner.writes) == 1
        await asyncio.sleep(0)
        assert inner.writes[1] == b"HTTP/1.1 100 Continue\r\n\r\n"
        t.write(b"last")
        t.close()  # a held write goes out before the close
        assert inner.writes[2] == b"last" and inner.closed
        await asyncio.sleep(0)
        assert len(inner.writes) == 3  # the cancelled flush did not write it twice
        assert t.get_extra_info("peername") == ("127.0.0.1", 1)  # everything else is the transport's

    asyncio.run(scenario())


def data_segments_in(sock: socket.socket) -> int:
    """``tcpi_data_segs_in`` of Linux's ``struct tcp_info`` (offset 152, Linux >= 4.6)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    if len(info) < 156:
        pytest.skip("this kernel's struct tcp_info has no tcpi_data_segs_in (Linux < 4.6)")
    return struct.unpack_from("I", info, 152)[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's struct tcp_info")
def test_a_keep_alive_client_gets_each_answer_in_one_segment():
    profile = datasets.superserve_a40_profile()

    def model(subnet_id, payloads):
        return [{"prediction": 0, "subnet": subnet_id, "batch_size": len(payloads)} for _ in payloads]

    app = ServingApp(LocalBackend(model, profile, policy=f"fixed:{profile.ids[0]}"), input_shape=(1, 8, 8))
    bound = threading.Event()
    server = make_server(app, host="127.0.0.1", port=0, ready=lambda h, p: bound.set())
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert bound.wait(30)
        port = server.servers[0].sockets[0].getsockname()[1]
        body = json.dumps({"input": [[[0.5] * 8] * 8], "deadline_ms": 5000}).encode()
        request = b"POST /predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            segments_before = data_segments_in(s)
            for _ in range(20):
                s.sendall(request)
                answer = b""
                while b"}" not in answer:  # the JSON answer's last byte
                    answer += s.recv(65536)
                assert answer.startswith(b"HTTP/1.1 200") and b'"prediction": 0' in answer, answer
            # The kernel's count of segments with data this socket received: one per answer (it was two).
            assert data_segments_in(s) - segments_before == 20
    finally:
        server.should_exit = True
        thread.join(30)


def test_the_servers_latency_ends_when_the_answer_is_written():
    """``/stats`` and the ``/metrics`` histogram count an answer's latency to its write, as nginx's
    ``$request_time`` does: a transport that takes 80 ms to accept the answer shows in them, not in the answer."""
    profile = datasets.superserve_a40_profile()

    def model(subnet_id, payloads):
        return [{"prediction": 0, "subnet": subnet_id, "batch_size": len(payloads)} for _ in payloads]

    app = ServingApp(LocalBackend(model, profile, policy=f"fixed:{profile.ids[0]}"), input_shape=(1, 8, 8))

    async def scenario():
        _, answer = await call(app, "POST", "/predict", DIGITS_BODY, slow_write_s=0.08)  # a slow transport
        _, stats = await call(app, "GET", "/stats")
        return json.loads(answer), json.loads(stats)

    try:
        answer, stats = asyncio.run(scenario())
    finally:
        asyncio.run(app.backend.close())
    assert answer["on_time"] and answer["latency_ms"] < 80, answer  # taken when the answer was encoded
    assert stats["latency"]["p50_ms"] >= 80 + answer["latency_ms"] * 0.5, stats  # the write included
    text = app.metrics.render()[0].decode()
    assert 'subnetact_request_latency_seconds_count{outcome="ok"} 1.0' in text
    assert 'subnetact_request_latency_seconds_bucket{le="0.05",outcome="ok"} 0.0' in text, text
