"""EDFQueue against a sorted-list model: EDF order, batch bounds, capacity and the drop rule."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling import EDFQueue, InvalidRequestError, QueueFullError

ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 50)),
        st.tuples(st.just("pop"), st.integers(0, 8)),
        st.tuples(st.just("expire"), st.integers(0, 50), st.integers(0, 10)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops, st.booleans())
def test_matches_sorted_list_model(operations, drop_late):
    q = EDFQueue(drop_late=drop_late)
    model = []  # (deadline, seq)
    seq = 0
    for op in operations:
        if op[0] == "push":
            seq += 1
            q.push(float(op[1]), 0.0, seq)
            model.append((float(op[1]), seq))
            model.sort()
        elif op[0] == "pop":
            got = q.pop_batch(op[1])
            want, model[:] = model[: op[1]], model[op[1] :]
            assert [(e[0], e[3]) for e in got] == want  # EDF order, FIFO among equal deadlines
            assert len(got) == min(op[1], len(got) + len(model))
        else:
            now, th = float(op[1]), float(op[2])
            got = q.expire(now, th)
            want = [m for m in model if m[0] - now < th] if drop_late else []
            model[:] = [m for m in model if m not in want]
            assert [(e[0], e[3]) for e in got] == want
        assert len(q) == len(model)
        assert q.peek_deadline() == (model[0][0] if model else math.inf)


def test_capacity_rejects_and_leaves_queue_unchanged():
    q = EDFQueue(capacity=2)
    q.push(1.0, 0.0, "a")
    q.push(2.0, 0.0, "b")
    with pytest.raises(QueueFullError, match="capacity=2"):
        q.push(0.5, 0.0, "c")
    assert [e[3] for e in q.drain()] == ["a", "b"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_rejects_non_finite_deadline(bad):
    q = EDFQueue()
    with pytest.raises(InvalidRequestError, match="deadline must be a finite number"):
        q.push(bad, 0.0)
    assert len(q) == 0


def test_bad_capacity():
    with pytest.raises(InvalidRequestError, match="capacity must be None or an int >= 1, got 0"):
        EDFQueue(capacity=0)
