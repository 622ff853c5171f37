"""A burst of requests is parsed before any of it is submitted (issue 22): the scheduler then sees the burst
together and the requests' clocks start when the event loop reads them, not after the others' parsing."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from asgi_request import DIGITS_BODY, call  # noqa: E402

from scheduling import datasets  # noqa: E402
from subnetact.serving import ServingApp  # noqa: E402


class RecordingBackend:
    """Answers at once, and records how many requests had reached the app when each one was submitted."""

    def __init__(self, profile, entered: list[int]) -> None:
        self.profile = profile
        self.entered = entered
        self.seen_at_submit: list[int] = []

    async def infer(self, payload, deadline_wall):
        self.seen_at_submit.append(self.entered[0])
        return {"prediction": 0, "subnet": self.profile.ids[0], "batch_size": 1}

    def queue_len(self) -> int:
        return 0

    def ready(self) -> bool:
        return True

    def set_batch_observer(self, fn) -> None:
        pass

    async def close(self) -> None:
        pass


def test_a_burst_is_read_before_any_of_it_is_submitted():
    profile = datasets.superserve_a40_profile()
    entered = [0]
    backend = RecordingBackend(profile, entered)
    app = ServingApp(backend, input_shape=(1, 8, 8), decode_processes=0)

    async def one() -> int:
        entered[0] += 1  # uvicorn starts a task per request it has parsed; here, all in the same turn
        return (await call(app, "POST", "/predict", DIGITS_BODY))[0]

    async def burst(n: int) -> list[int]:
        return await asyncio.gather(*(one() for _ in range(n)))

    assert asyncio.run(burst(16)) == [200] * 16
    # Every request of the burst had reached the app before the first was submitted (in one go, the first would be
    # submitted while 15 were still unread: seen_at_submit[0] == 1).
    assert backend.seen_at_submit == [16] * 16
