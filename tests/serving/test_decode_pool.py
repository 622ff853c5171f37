"""The child processes that parse large JSON bodies (issue 22): the same answers as
:func:`subnetact.serving.codec.decode_json` in the server's own process, errors included, and a child that dies is
replaced (the caller is told, and parses that body itself)."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import numpy as np
import pytest

from subnetact.serving.codec import RequestError, decode_json
from subnetact.serving.decode_pool import DecodePool, DecodePoolError

SHAPE = (1, 8, 8)
ROWS = np.arange(64, dtype=np.float32).reshape(SHAPE) / 7.0

BODIES = [
    json.dumps({"input": ROWS.tolist(), "deadline_ms": 12.5}),
    json.dumps({"input": ROWS.reshape(-1).tolist()}),  # flat
    json.dumps({"input": [ROWS.tolist()]}),  # with a batch dimension of 1
    json.dumps({"input": [0.25] * 200_000}),  # wrong shape, ~1.2 MB
    json.dumps({"input": ROWS.tolist(), "deadline_ms": "50"}),  # a string deadline
    json.dumps({"input": ROWS.tolist(), "extra": 1}),
    '{"input": [1, 2,',  # truncated
    "[" * 100_000 + "]" * 100_000,  # nesting deeper than the recursion limit
    json.dumps({"input": [[1, 2], [3]]}),  # ragged
    json.dumps({"input": [float("nan")] * 64}).replace("NaN", "NaN"),
    "\udcff",  # not UTF-8 once encoded with surrogateescape
]


def _reference(body: bytes):
    try:
        x, budget = decode_json(body, SHAPE)
    except RequestError as exc:
        return "error", exc.status, str(exc)
    return "ok", x, budget


def test_children_answer_as_decode_json_does():
    async def scenario():
        pool = DecodePool(SHAPE, 2)
        try:
            bodies = [b.encode("utf-8", "surrogateescape") for b in BODIES]
            return bodies, await asyncio.gather(*(_run(pool, b) for b in bodies))  # more bodies than children
        finally:
            await pool.aclose()

    async def _run(pool, body):
        try:
            x, budget = await pool.decode(body)
        except RequestError as exc:
            return "error", exc.status, str(exc)
        return "ok", x, budget

    bodies, answers = asyncio.run(asyncio.wait_for(scenario(), 60))
    for body, got in zip(bodies, answers, strict=True):
        want = _reference(body)
        assert got[0] == want[0], (body[:60], got, want)
        if want[0] == "ok":
            assert got[1].dtype == np.float32 and got[1].shape == SHAPE and got[1].flags.writeable
            np.testing.assert_array_equal(got[1], want[1])
            assert got[2] == want[2]
        else:
            assert got[1:] == want[1:]


def test_a_dead_child_is_reported_and_replaced():
    async def scenario():
        pool = DecodePool(SHAPE, 1)
        try:
            body = json.dumps({"input": ROWS.tolist()}).encode()
            await pool.decode(body)  # started
            (child,) = pool._children
            os.kill(child.pid, signal.SIGKILL)
            await child.wait()
            with pytest.raises(DecodePoolError):
                await pool.decode(body)
            x, _ = await pool.decode(body)  # the replacement answers
            (new,) = pool._children
            assert new.pid != child.pid and pool.restarts == 1
            return x
        finally:
            await pool.aclose()

    np.testing.assert_array_equal(asyncio.run(asyncio.wait_for(scenario(), 60)), ROWS)
