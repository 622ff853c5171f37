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


def pytest_terminal_summary(terminalreporter):
    # CI's output must always say whether the CUDA kernels were compiled, and if not, why (shown even with -q).
    from subnetact_cuda import _build

    problem = _build.incompatibility(torch.version.cuda, _build.cuda_home())
    build_test = "tests/cuda/test_cuda_build.py::test_extension_builds_and_registers_cuda_kernels"
    if problem is None:
        outcomes = [
            kind
            for kind in ("passed", "failed", "error", "skipped")
            for r in terminalreporter.stats.get(kind, [])
            if getattr(r, "nodeid", None) == build_test
        ]
        outcome = outcomes[-1] if outcomes else "not run"
        terminalreporter.write_line(f"subnetact CUDA kernels: buildable here; the build test {outcome}")
    else:
        terminalreporter.write_line(f"subnetact CUDA kernels: NOT compiled: {problem}")
