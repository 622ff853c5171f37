"""The shipped digits supernet as a :class:`~subnetact.serving.ModelSpec` (examples, tests, benchmarks)."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

from scheduling import Profile

from .. import digits
from ..config import SubnetConfig
from .runner import ModelSpec

__all__ = ["INPUT_SHAPE", "digits_spec", "measure_digits_profile"]

INPUT_SHAPE = (1, 8, 8)


def measure_digits_profile(*, batch_sizes: Sequence[int] = (1, 2, 4, 8, 16), repeats: int = 10) -> Profile:
    """Profile the digits supernet's Pareto subnets on this machine (ids 0..n-1 in increasing cost)."""
    from ..profiler import profile

    model, record = digits.load_supernet()
    return profile(
        model,
        [SubnetConfig.from_dict(r["config"]) for r in record["pareto"]],
        list(batch_sizes),
        example_input=digits.to_input(digits.test_split()[0][:1]),
        accuracies=[r["accuracy"] for r in record["pareto"]],
        repeats=repeats,
        name="digits",
    )


def digits_spec(profile: Profile | str | None = None, *, threads: int | None = None, **measure) -> ModelSpec:
    """A :class:`ModelSpec` of the shipped digits supernet: its package file, ``subnetact.digits:build`` and
    ``profile`` (a Profile or JSON path; measured here with ``measure`` options when ``None``).

    Requests are the digits as :func:`subnetact.digits.to_input` makes them: shape ``(1, 8, 8)``, values in [0, 1].
    """
    if profile is None:
        profile = measure_digits_profile(**measure)
    checkpoint = resources.files(digits.DATA_PACKAGE).joinpath(digits.WEIGHTS_FILE)
    return ModelSpec(
        checkpoint=str(checkpoint),
        factory="subnetact.digits:build",
        profile=profile,
        input_shape=INPUT_SHAPE,
        threads=threads,
    )
