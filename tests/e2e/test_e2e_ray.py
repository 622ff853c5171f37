"""SuperServe's architecture on a local Ray Serve cluster: HTTP through Ray's proxy to the router (the ingress, with
the EDF queue and SlackFit), two workers of the digits supernet; one worker is killed mid-burst. Every request gets
exactly one valid answer, the survivor keeps serving, a worker is added and one removed while serving, and shutdown
is clean.

Starts Ray inside the test (``subnetact.serving.ray_local``: ``ray.init(num_cpus=2)``, no dashboard, loopback only).
Deselect with ``-m "not ray"``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
pytest.importorskip("starlette")

from subnetact import digits  # noqa: E402
from subnetact.serving.digits import digits_spec, measure_digits_profile  # noqa: E402
from subnetact.serving.ray_local import local_ray, serve_app  # noqa: E402
from subnetact.serving.ray_serve import WORKER_NAMESPACE, build_app  # noqa: E402

pytestmark = pytest.mark.ray


def test_router_and_two_workers_survive_a_killed_worker():
    torch.set_num_threads(1)
    spec = digits_spec(measure_digits_profile(batch_sizes=(1, 4, 16), repeats=2), threads=1)
    reference = spec.build()  # the same model in this process: what each subnet must answer
    images, labels = digits.test_split()
    inputs = digits.to_input(images[:96]).numpy()
    t0 = time.monotonic()
    with local_ray(num_cpus=2):
        try:
            served = serve_app(
                build_app(
                    spec,
                    num_workers=2,
                    num_routers=1,  # one router: its stats count every request (two: test_e2e_ray_router_kill.py)
                    worker_options={"num_cpus": 0.5},
                    app_options={"default_deadline_ms": 20000.0},
                    adaptive=True,  # the router refines the profile from the batch times it measures
                )
            )
            check_worker_kill(served, reference, inputs, labels, t0)
        finally:
            serve.shutdown()
    assert not ray.is_initialized()


def check_worker_kill(served, reference, inputs, labels, t0: float) -> None:
    def post(x, deadline_ms: float = 20000.0) -> tuple[int, dict]:
        return served.predict(x, deadline_ms)[:2]

    router = served.handle()
    names = router.worker_names.remote().result()
    assert len(names) == 2
    print(f"ray + serve + 2 workers ready in {time.monotonic() - t0:.1f} s")

    answered = threading.Semaphore(0)
    killed = threading.Event()

    def one(k: int):
        out = post(inputs[k].tolist())
        answered.release()
        return k, *out

    def killer():
        for _ in range(24):  # a quarter of the burst is answered: kill the busiest worker (the router's first)
            answered.acquire()
        ray.kill(ray.get_actor(names[0], namespace=WORKER_NAMESPACE), no_restart=True)
        killed.set()

    threading.Thread(target=killer, daemon=True).start()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(96)))
    assert killed.wait(30)
    assert [k for k, _, _ in results] == list(range(96))
    assert all(status == 200 for _, status, _ in results), [(s, a) for _, s, a in results if s != 200]
    for k, _, answer in results:  # each answer is what its subnet predicts for that input
        expected = reference(answer["subnet"], [inputs[k]])[0]["prediction"]
        assert answer["prediction"] == expected
    assert sum(a["prediction"] == int(labels[k]) for k, _, a in results) >= 0.9 * 96

    # the survivor keeps serving; the router has noticed the death (it always sends to its first free worker)
    for k in range(8):
        assert post(inputs[k].tolist())[0] == 200
    stats = router.stats.remote().result()
    assert stats["workers"] == [names[1]] and stats["worker_deaths"] == 1, stats
    assert stats["submitted"] == stats["completed"] == 104, stats  # every request completed exactly once
    assert stats["retried"] <= 16  # at most the one batch that was running on it

    # add a worker while serving; both serve
    assert len(router.scale.remote(2).result()) == 2
    with ThreadPoolExecutor(8) as pool:
        assert all(s == 200 for s, _ in pool.map(lambda k: post(inputs[k].tolist()), range(32)))
    # a deadline that cannot be met is a 504 through every hop
    status, answer = post(inputs[0].tolist(), deadline_ms=0.001)
    assert status == 504 and answer["error"] == "deadline missed", answer
    stats = router.stats.remote().result()
    assert stats["submitted"] == stats["completed"] == 137 and stats["queue_len"] == 0, stats
    # remove a worker while serving: the other one keeps answering
    assert len(router.scale.remote(1).result()) == 1
    assert post(inputs[1].tolist())[0] == 200
    assert len(router.stats.remote().result()["workers"]) == 1
