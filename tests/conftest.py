"""Shared test settings and tiny models.

Every model here is small enough that a forward on a 32x32 image takes milliseconds, so the suite stays fast on a
2-core CPU.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("SUBNETACT_HYPOTHESIS_EXAMPLES", "12")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
settings.load_profile("ci")


@pytest.fixture(autouse=True)
def _few_threads():
    # Tests are tiny; more threads only add contention on a shared 2-core machine.
    torch.set_num_threads(1)
    yield
