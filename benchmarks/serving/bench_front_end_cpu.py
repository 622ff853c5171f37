"""CPU time the HTTP front end spends per ``POST /predict``, in-process: no sockets, no model, no other thread.

    PYTHONPATH=. python benchmarks/serving/bench_front_end_cpu.py --requests 2000 --repeats 5

Drives :class:`subnetact.serving.ServingApp` directly through ASGI with fake ``receive``/``send`` and a backend that
answers at once, and reports the event-loop thread's CPU time (``time.thread_time``) per request: the front end's
own share of every request's cost on the event loop (parsing the digits JSON body, the deadline handling, routing,
metrics, the JSON answer), without uvicorn's HTTP parser. CPU time, not wall time, so that it can be compared on a
busy machine; run it with each tree first on ``PYTHONPATH`` to compare two versions (``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time


class InstantBackend:
    """A backend that answers every request at once (the front end's cost alone)."""

    def __init__(self, profile) -> None:
        self.profile = profile
        self.subnet = profile.ids[0]

    async def infer(self, payload, deadline_wall):
        return {"prediction": 0, "subnet": self.subnet, "batch_size": 1}

    def queue_len(self) -> int:
        return 0

    def ready(self) -> bool:
        return True

    def set_batch_observer(self, fn) -> None:
        pass

    async def close(self) -> None:
        pass


async def one_request(app, body: bytes, headers: list) -> int:
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": "/predict", "headers": list(headers), "query_string": b"",
        "root_path": "", "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
        "http_version": "1.1", "asgi": {"version": "3.0"},
    }  # fmt: skip
    await app(scope, receive, send)
    return sent[0]["status"]


async def measure(requests: int, repeats: int) -> list[float]:
    from scheduling import datasets
    from subnetact.serving import ServingApp

    profile = datasets.superserve_a40_profile()
    app = ServingApp(InstantBackend(profile), input_shape=(1, 8, 8), decode_processes=0)
    body = json.dumps({"input": [[[0.1] * 8] * 8]}).encode()
    headers = [(b"host", b"bench"), (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    for _ in range(200):  # warm up
        await one_request(app, body, headers)
    per_request_us = []
    for _ in range(repeats):
        t0 = time.thread_time()
        statuses = [await one_request(app, body, headers) for _ in range(requests)]
        per_request_us.append(1e6 * (time.thread_time() - t0) / requests)
        assert set(statuses) <= {200, 504}, set(statuses)  # 504: a request the OS paused past its 100 ms budget
    return per_request_us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    import subnetact.serving

    us = asyncio.run(measure(args.requests, args.repeats))
    print(
        f"{os.path.dirname(os.path.dirname(os.path.dirname(subnetact.serving.__file__)))}: front-end CPU per request "
        f"min {min(us):.1f} us, median {statistics.median(us):.1f} us over {args.repeats} x {args.requests} "
        f"(load average {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    main()
