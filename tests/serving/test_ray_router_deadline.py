"""The Ray router's deadline guarantee (issue 22) without a Ray cluster: the router class itself, its worker actors
replaced by fakes whose ``run.remote`` never returns until told to (a hung model).

With its only worker hung, the router must still answer every request by its deadline + the grace: the hung batch
with ``DeadlineMissedError`` (the worker marked stuck, not ready), queued requests by the drop rule on the router's
own clock; a late result must not complete a request twice. The full router on Ray is ``tests/e2e/test_e2e_ray.py``.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

pytest.importorskip("ray")
pytest.importorskip("starlette")

from scheduling import DeadlineMissedError, Profile, datasets  # noqa: E402
from subnetact.serving import ModelSpec, ray_serve  # noqa: E402

PROFILE = datasets.superserve_a40_profile()


class FakeActor:
    """``actor.run.remote(subnet_id, payloads)``: an awaitable the test completes (or never does)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, list, asyncio.Future]] = []
        self.run = self

    def remote(self, subnet_id, payloads):
        fut = asyncio.get_running_loop().create_future()
        self.calls.append((subnet_id, payloads, fut))
        return fut


def make_router(monkeypatch, actors):
    user_class = ray_serve.Router.func_or_class.__mro__[1]  # the class under Serve's ASGI wrapper
    assert user_class.__name__ == "Router"
    slots = iter(ray_serve._WorkerSlot(i, f"fake-{i}", a) for i, a in enumerate(actors))
    monkeypatch.setattr(user_class, "_start_workers", lambda self, n: [next(slots) for _ in range(n)])
    monkeypatch.setattr(user_class, "_adopt_orphans", lambda self, n: [])  # no Ray cluster: nothing to adopt
    monkeypatch.setattr(user_class, "_start_lease_keeper", lambda self: None)  # the fakes have no lease
    router = object.__new__(user_class)
    spec = ModelSpec("unused.safetensors", "unused:factory", PROFILE, (1, 8, 8))
    user_class.__init__(router, spec, policy=f"fixed:{PROFILE.ids[0]}", num_workers=len(actors), deadline_grace_s=0.2)
    return router


def test_hung_worker_every_request_answered_by_deadline_plus_1s(monkeypatch):
    actor = FakeActor()
    router = make_router(monkeypatch, [actor])

    async def scenario():
        async def one(k):
            deadline_wall = time.time() + 0.3
            try:
                await router.infer(np.zeros((1, 8, 8), np.float32), deadline_wall)
                outcome = "served"
            except DeadlineMissedError as exc:
                outcome = str(exc)
            return outcome, time.time() - deadline_wall

        first = asyncio.ensure_future(one(0))
        while not actor.calls:  # the worker has taken the first request, and hangs
            await asyncio.sleep(0.01)
        rest = [asyncio.ensure_future(one(k)) for k in range(1, 20)]
        results = await asyncio.wait_for(asyncio.gather(first, *rest), 10)
        assert router.stuck_workers() == 1 and not router.ready()
        # The model comes back with a result for the answered request: it must not be answered twice.
        subnet, payloads, fut = actor.calls[0]
        fut.set_result([{"prediction": 0, "subnet": subnet, "batch_size": len(payloads)}] * len(payloads))
        await asyncio.sleep(0.05)
        return results

    results = asyncio.run(scenario())
    for outcome, late_s in results:
        assert outcome != "served" and late_s < 1.0, (outcome, late_s)
    assert "stuck worker" in results[0][0]
    assert all("dropped" in outcome for outcome, _ in results[1:])  # queued: the drop rule, no free worker
    stats = router.stats()
    assert stats["submitted"] == stats["completed"] == 20 and stats["stuck"] == 1, stats
    assert router.stuck_workers() == 0 and router.ready()  # returned: it serves again


def test_worker_lease_is_held_by_one_router_until_it_lapses():
    # What lets a restarted router adopt a worker without two routers ever sending it batches.
    class Spec:
        def build(self):
            return lambda subnet_id, payloads: [{"prediction": 0} for _ in payloads]

    worker = ray_serve.Worker(Spec(), "router-a", 0.3, "model-1")
    assert worker.claim("router-b", 0.3, "model-1")["granted"] is False  # a's lease is fresh
    assert worker.claim("router-a", 0.3, "model-1")["granted"] is True  # a renews
    assert worker.orphaned_for() == 0.0
    time.sleep(0.4)  # a stops renewing (its process died)
    assert worker.orphaned_for() > 0.0
    late = worker.claim("router-a", 0.3, "model-1")  # a late renewal still works while nobody else has taken it ...
    assert late["granted"] is True and late["since_renewal_s"] > 0.3
    time.sleep(0.4)
    other = worker.claim("router-c", 0.3, "model-2")  # lapsed, but a router of another model never adopts it
    assert other["granted"] is False and other["same_model"] is False
    taken = worker.claim("router-b", 0.3, "model-1")  # ... but once lapsed, b takes it
    assert taken["granted"] is True and taken["since_renewal_s"] > 0.3
    assert worker.claim("router-a", 0.3, "model-1")["granted"] is False  # a has lost it: it must stop using the worker
    assert worker.run(0, [None, None]) == [{"prediction": 0}, {"prediction": 0}]


def test_model_key_tells_models_apart(tmp_path):
    ckpt = tmp_path / "model.safetensors"
    ckpt.write_bytes(b"weights v1")
    spec = ModelSpec(str(ckpt), "subnetact.digits:build", PROFILE, (1, 8, 8))
    key = ray_serve.model_key(spec, PROFILE)
    assert ray_serve.model_key(ModelSpec(str(ckpt), "subnetact.digits:build", PROFILE, (1, 8, 8)), PROFILE) == key
    assert ray_serve.model_key(ModelSpec(str(ckpt), "other:build", PROFILE, (1, 8, 8)), PROFILE) != key
    d = PROFILE.to_dict()
    d["subnets"] = d["subnets"][:3]
    assert ray_serve.model_key(spec, Profile.from_dict(d)) != key  # another profile: other subnets to serve
    ckpt.write_bytes(b"weights v2, retrained")  # the same path rewritten
    assert ray_serve.model_key(spec, PROFILE) != key


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_routers": 0}, "num_routers=0 must be an int >= 1"),
        ({"num_routers": 2, "num_workers": 1}, "num_workers=1 must be >= num_routers=2"),
        ({"num_workers": True}, "num_workers=True must be an int >= 1"),
        ({"lease_s": 0}, "lease_s=0 must be a number of seconds > 0"),
        ({"lease_s": float("nan")}, "lease_s=nan must be"),
    ],
)
def test_build_app_refuses_bad_router_and_lease_settings(kwargs, match):
    from subnetact.errors import ConfigError

    spec = ModelSpec("unused.safetensors", "unused:factory", PROFILE, (1, 8, 8))
    with pytest.raises(ConfigError, match=match) as info:
        ray_serve.build_app(spec, **kwargs)
    assert isinstance(info.value, ValueError)
