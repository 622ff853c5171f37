"""Data shipped with the package (see ``scheduling/data/README.md`` for provenance and licences)."""

from __future__ import annotations

import csv
import io
import json
from functools import lru_cache
from importlib import resources
from typing import Any

from .profile import SUPERSERVE_WORKER_STAGES, CheckMode, Profile

__all__ = ["maf_per_minute", "superserve_a40_profile", "superserve_a40_raw"]

_PROFILE = "ofa_resnet50_A40_profile.json"
_MAF = "maf_per_minute_total_sample1250.csv"


def _read(name: str) -> str:
    return resources.files("scheduling").joinpath("data", name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _raw_profile_text() -> str:
    return _read(_PROFILE)


def superserve_a40_raw() -> dict[str, Any]:
    """The SuperServe authors' OFA-ResNet50 A40 profile, as decoded JSON (times in ns; a fresh copy each call)."""
    return json.loads(_raw_profile_text())


def superserve_a40_profile(
    *, stages: tuple[str, ...] = SUPERSERVE_WORKER_STAGES, check: CheckMode = "ignore"
) -> Profile:
    """The six OFA-ResNet50 Pareto subnets profiled on an NVIDIA A40 by the SuperServe authors.

    Args:
        stages: Which stages count as worker latency; default copies + forward + postprocess (no JPEG decode).
        check: P1/P2 handling, as in :meth:`Profile.from_dict`. Default ``"ignore"`` because the violations of this
            profile are known and documented (call ``check_properties()`` to see them).
    """
    return Profile.from_superserve(superserve_a40_raw(), stages=stages, check=check)


@lru_cache(maxsize=1)
def _maf() -> tuple[int, ...]:
    rows = csv.DictReader(io.StringIO(_read(_MAF)))
    return tuple(int(r["total_invocations"]) for r in rows)


def maf_per_minute() -> list[int]:
    """Azure Functions 2019 invocations per minute (1440 values), summed over InVitro's 1250-function sample."""
    return list(_maf())
