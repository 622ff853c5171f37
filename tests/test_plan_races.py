"""Plan-cache races (issue 14): the LRU reorder and ``invalidate`` against concurrent ``actuate``.

Both tests shrink the interpreter's switch interval so that threads interleave every few bytecodes, and are bounded
in time (a few seconds).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings

import torch
from tiny_models import TINY_MODELS, image_batch

import subnetact
from subnetact import UncalibratedSubnetWarning
from subnetact.state import PLAN_CACHE_SIZE


@contextlib.contextmanager
def fast_switching(interval: float = 1e-6):
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UncalibratedSubnetWarning)
            yield
    finally:
        sys.setswitchinterval(old)


def _run_threads(targets, timeout=120.0):
    errors = []

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        return run

    threads = [threading.Thread(target=guard(fn)) for fn in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive()
    return errors


def test_lru_reorder_from_several_threads_with_more_configs_than_the_cache():
    # main reordered the LRU outside the lock: another thread's eviction in between raised KeyError.
    model = subnetact.convert(TINY_MODELS["basic"]())
    configs = list(dict.fromkeys(model.space.sample(i) for i in range(PLAN_CACHE_SIZE + 600)))
    assert len(configs) > PLAN_CACHE_SIZE
    x = image_batch(1)

    def churn(seed):
        order = torch.randperm(len(configs), generator=torch.Generator().manual_seed(seed)).tolist()

        def run():
            for i in order * 2:
                model.actuate(configs[i])

        return run

    with fast_switching():
        errors = _run_threads([churn(seed) for seed in range(4)])
    assert errors == []
    # The cache is still coherent: the active config's plan is the one model(x) runs.
    torch.testing.assert_close(model(x), model(x, subnet=model.active), rtol=0, atol=0)


def test_actuate_during_invalidate_leaves_the_active_config_running():
    # main: invalidate() read the default config, compiled its plan (warning outside the lock), then set it as the
    # default; an actuate(b) in between was overwritten, leaving model.active = b while model(x) ran a. The
    # UncalibratedSubnetWarning main emits at that point lets the test stop the invalidating thread right there.
    model = subnetact.convert(TINY_MODELS["basic"]())
    a, b = model.space.sample(3), model.space.min()
    assert a != b
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedSubnetWarning)
        for cfg in (b, a):
            model.actuate(cfg)
    model._subnetact._warned.clear()  # so that a recompilation of `a` warns again (main's pause point)
    paused, resume = threading.Event(), threading.Event()

    def pause_in_invalidate(message, category, *args, **kwargs):
        if threading.current_thread() is invalidating and category is UncalibratedSubnetWarning:
            paused.set()
            resume.wait(30)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = pause_in_invalidate
        invalidating = threading.Thread(target=model.load_state_dict, args=(model.state_dict(),))
        invalidating.start()
        while invalidating.is_alive() and not paused.wait(0.01):
            pass
        model.actuate(b)
        resume.set()
        invalidating.join(30)
    assert not invalidating.is_alive()
    assert model.active == b
    x = image_batch(1)
    with torch.no_grad():
        assert torch.equal(model(x), model(x, subnet=b))


def test_warned_set_is_bounded():
    model = subnetact.convert(TINY_MODELS["basic"]())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedSubnetWarning)
        for i in range(PLAN_CACHE_SIZE + 50):
            model.actuate(model.space.sample(i))
    assert len(model._subnetact._warned) <= PLAN_CACHE_SIZE
