"""The latency/accuracy profile that scheduling policies decide from.

A :class:`Profile` lists subnets (an id, an accuracy, an optional config dict) and, for each subnet, the latency of one
batch at each profiled batch size (:class:`LatencyStats`: mean, p99, optionally std and raw samples). All times are in
**seconds**.

Real profiles are not always monotone. :meth:`Profile.check_properties` reports violations of the SuperServe paper's
properties P1 (latency grows with batch size) and P2 (latency grows with accuracy across subnets) as a
:class:`PropertyReport`; the loaders warn with :class:`~scheduling.errors.ProfilePropertyWarning` but never change the
data.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

from .errors import InvalidProfileError, ProfilePropertyWarning, UnknownSubnetError

__all__ = [
    "SUPERSERVE_WORKER_STAGES",
    "LatencyStats",
    "Profile",
    "PropertyReport",
    "PropertyViolation",
    "Subnet",
    "SubnetId",
    "synthetic_profile",
]

SubnetId = int | str
LatencyStat = Literal["mean", "p99"]
CheckMode = Literal["warn", "raise", "ignore"]

SCHEMA = "scheduling.profile/1"

MAX_BATCH_SIZE = 65_536
"""Largest batch size a profile may list: policies keep per-batch-size tables up to the largest one."""

#: Stages of a SuperServe profile entry that count as worker latency by default: the batch's copies, forward pass and
#: postprocessing. JPEG decode (``deserialize``) is left out: it runs before a request reaches the batch scheduler.
SUPERSERVE_WORKER_STAGES: tuple[str, ...] = ("h2d_copy", "forward", "postprocess", "d2h_copy")
_SUPERSERVE_ALL_STAGES = ("deserialize", "h2d_copy", "forward", "postprocess", "d2h_copy")
# The SuperServe file's forward stage has no p99; its totals use forward.mean + 2.326 * forward.std (the normal
# quantile), which we reproduce so that selecting all stages gives back the file's own p99.
_Z99 = 2.326


def _finite_positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidProfileError(f"{name} must be a positive finite number of seconds, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise InvalidProfileError(f"{name} must be a positive finite number of seconds, got {value!r}")
    return value


@dataclass(frozen=True)
class LatencyStats:
    """Latency of one batch of one subnet at one batch size, in seconds.

    Args:
        mean_s: Mean latency. Must be finite and > 0.
        p99_s: 99th-percentile latency. ``None`` (default) means "unknown" and is stored as ``mean_s``, so a tail-aware
            policy then behaves like a mean-based one.
        std_s: Standard deviation, ``None`` if unknown. Used by the simulator to sample latencies around the mean.
        samples_s: Raw latency samples, ``None`` if not kept.
    """

    mean_s: float
    p99_s: float | None = None
    std_s: float | None = None
    samples_s: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean_s", _finite_positive("mean_s", self.mean_s))
        p99 = self.mean_s if self.p99_s is None else _finite_positive("p99_s", self.p99_s)
        object.__setattr__(self, "p99_s", p99)
        if self.std_s is not None:
            std = self.std_s
            if isinstance(std, bool) or not isinstance(std, (int, float)) or not math.isfinite(std) or std < 0:
                raise InvalidProfileError(f"std_s must be a finite number >= 0 or None, got {std!r}")
            object.__setattr__(self, "std_s", float(std))
        if self.samples_s is not None:
            samples = tuple(_finite_positive("samples_s[i]", s) for s in self.samples_s)
            if not samples:
                raise InvalidProfileError("samples_s must be None or a non-empty sequence, got an empty one")
            object.__setattr__(self, "samples_s", samples)

    def stat(self, name: LatencyStat) -> float:
        """The latency statistic ``name`` (``"mean"`` or ``"p99"``), in seconds."""
        if name == "mean":
            return self.mean_s
        if name == "p99":
            return self.p99_s  # type: ignore[return-value]
        raise InvalidProfileError(f"latency statistic must be 'mean' or 'p99', got {name!r}")


@dataclass(frozen=True, eq=False)
class Subnet:
    """One servable subnet.

    Args:
        id: Unique id (an ``int`` or ``str``); this is what a worker callable receives.
        accuracy: Accuracy used to score served requests (any unit, e.g. top-1 %; must be finite).
        latency: Batch size -> :class:`LatencyStats`. At least one entry; batch sizes are positive ints.
        config: Optional free-form description (e.g. depth/width choices); carried through load/save unchanged.
    """

    id: SubnetId
    accuracy: float
    latency: Mapping[int, LatencyStats]
    config: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.id, bool) or not isinstance(self.id, (int, str)):
            raise InvalidProfileError(f"subnet id must be an int or str, got {self.id!r}")
        acc = self.accuracy
        if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not math.isfinite(acc):
            raise InvalidProfileError(f"accuracy of subnet {self.id!r} must be a finite number, got {acc!r}")
        object.__setattr__(self, "accuracy", float(acc))
        if not isinstance(self.latency, Mapping) or not self.latency:
            raise InvalidProfileError(
                f"subnet {self.id!r} needs a non-empty mapping batch_size -> LatencyStats, got {self.latency!r}"
            )
        for b in self.latency:
            if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BATCH_SIZE:
                raise InvalidProfileError(
                    f"batch sizes of subnet {self.id!r} must be ints in [1, {MAX_BATCH_SIZE}], got {b!r} "
                    "(policies build tables that grow with the largest batch size)"
                )
        table: dict[int, LatencyStats] = {}
        for b in sorted(self.latency):
            stats = self.latency[b]
            if not isinstance(stats, LatencyStats):
                raise InvalidProfileError(
                    f"latency[{b}] of subnet {self.id!r} must be a LatencyStats, got {type(stats).__name__}"
                )
            table[b] = stats
        object.__setattr__(self, "latency", table)
        if self.config is not None:
            object.__setattr__(self, "config", dict(self.config))


@dataclass(frozen=True)
class PropertyViolation:
    """One violation of P1 or P2.

    For ``kind == "P1"``: subnet ``subnet_ids[0]`` is faster at the larger batch ``batch_sizes[1]`` than at the smaller
    ``batch_sizes[0]``. For ``kind == "P2"``: at batch ``batch_sizes[0]`` the more accurate subnet ``subnet_ids[1]`` is
    faster than the less accurate ``subnet_ids[0]``. ``latencies_s`` pairs with the first/second element.
    """

    kind: Literal["P1", "P2"]
    subnet_ids: tuple[SubnetId, ...]
    batch_sizes: tuple[int, ...]
    latencies_s: tuple[float, float]

    def __str__(self) -> str:
        a, b = (x * 1e3 for x in self.latencies_s)
        if self.kind == "P1":
            (s,) = self.subnet_ids
            return f"P1: subnet {s!r} takes {a:.3f} ms at batch {self.batch_sizes[0]} but {b:.3f} ms at batch " + str(
                self.batch_sizes[1]
            )
        lo, hi = self.subnet_ids
        return (
            f"P2: at batch {self.batch_sizes[0]} subnet {hi!r} (more accurate) takes {b:.3f} ms, "
            f"less than subnet {lo!r} ({a:.3f} ms)"
        )


@dataclass(frozen=True)
class PropertyReport:
    """Violations of P1 and P2 found in a profile (computed on the mean latency)."""

    p1: tuple[PropertyViolation, ...] = ()
    p2: tuple[PropertyViolation, ...] = ()

    @property
    def ok(self) -> bool:
        """``True`` when the profile satisfies both properties."""
        return not self.p1 and not self.p2

    def __str__(self) -> str:
        if self.ok:
            return "profile satisfies P1 and P2"
        lines = [f"{len(self.p1)} P1 and {len(self.p2)} P2 violation(s):"]
        lines += [f"  {v}" for v in (*self.p1, *self.p2)]
        return "\n".join(lines)


@dataclass(frozen=True, eq=False)
class Profile:
    """Subnets with their accuracy and per-batch-size latency.

    Args:
        subnets: The subnets, in any order; ids must be unique and at least one is required.
        name: Free-form name.
        metadata: Free-form JSON-serialisable metadata (hardware, provenance, ...).

    Example::

        >>> from scheduling import LatencyStats, Profile, Subnet
        >>> p = Profile([Subnet("small", 70.0, {1: LatencyStats(0.002), 8: LatencyStats(0.005)}),
        ...              Subnet("big", 80.0, {1: LatencyStats(0.004), 8: LatencyStats(0.012)})])
        >>> p.batch_sizes, p.latency("big", 8)
        ((1, 8), 0.012)
    """

    subnets: tuple[Subnet, ...]
    name: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        subnets = tuple(self.subnets) if isinstance(self.subnets, Iterable) else self.subnets
        if not isinstance(subnets, tuple) or not subnets:
            raise InvalidProfileError(f"a profile needs at least one subnet, got {self.subnets!r}")
        index: dict[SubnetId, int] = {}
        for i, s in enumerate(subnets):
            if not isinstance(s, Subnet):
                raise InvalidProfileError(f"subnets[{i}] must be a Subnet, got {type(s).__name__}")
            if s.id in index:
                raise InvalidProfileError(f"duplicate subnet id {s.id!r} (subnets[{index[s.id]}] and subnets[{i}])")
            index[s.id] = i
        object.__setattr__(self, "subnets", subnets)
        object.__setattr__(self, "metadata", dict(self.metadata))
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "batch_sizes", tuple(sorted({b for s in subnets for b in s.latency})))

    batch_sizes: tuple[int, ...] = field(init=False)
    """Sorted union of every subnet's profiled batch sizes."""

    # ------------------------------------------------------------------ lookups
    @property
    def ids(self) -> tuple[SubnetId, ...]:
        """Subnet ids in profile order."""
        return tuple(s.id for s in self.subnets)

    def index_of(self, subnet_id: SubnetId) -> int:
        """Position of ``subnet_id`` in :attr:`subnets`; raises :class:`UnknownSubnetError`."""
        try:
            return self._index[subnet_id]  # type: ignore[attr-defined]
        except (KeyError, TypeError):
            raise UnknownSubnetError(f"unknown subnet id {subnet_id!r}; the profile has {list(self.ids)!r}") from None

    def subnet(self, subnet_id: SubnetId) -> Subnet:
        """The :class:`Subnet` with id ``subnet_id``; raises :class:`UnknownSubnetError`."""
        return self.subnets[self.index_of(subnet_id)]

    def latency(self, subnet_id: SubnetId, batch_size: int, stat: LatencyStat = "mean") -> float:
        """Profiled latency (seconds) of ``subnet_id`` at exactly ``batch_size``.

        Raises:
            UnknownSubnetError: ``subnet_id`` is not in the profile.
            InvalidProfileError: ``batch_size`` was not profiled for that subnet.
        """
        s = self.subnet(subnet_id)
        if batch_size not in s.latency:
            raise InvalidProfileError(
                f"batch_size {batch_size!r} was not profiled for subnet {subnet_id!r}; profiled: {list(s.latency)!r}"
            )
        return s.latency[batch_size].stat(stat)

    def min_latency(self, stat: LatencyStat = "mean") -> float:
        """The fastest latency of any (subnet, batch size) entry, in seconds."""
        return min(st.stat(stat) for s in self.subnets for st in s.latency.values())

    # ------------------------------------------------------------------ properties P1/P2
    def check_properties(self) -> PropertyReport:
        """Report violations of P1 and P2 on the mean latency; the profile is not changed.

        P1 is checked between consecutive profiled batch sizes of each subnet. P2 is checked, at each batch size,
        between consecutive subnets in order of increasing accuracy (equal accuracies are not compared).

        Returns:
            A :class:`PropertyReport`; ``report.ok`` is ``True`` when both properties hold.
        """
        p1: list[PropertyViolation] = []
        for s in self.subnets:
            items = sorted(s.latency.items())
            for (b0, st0), (b1, st1) in pairwise(items):
                if st1.mean_s < st0.mean_s:
                    p1.append(PropertyViolation("P1", (s.id,), (b0, b1), (st0.mean_s, st1.mean_s)))
        p2: list[PropertyViolation] = []
        for b in self.batch_sizes:
            row = sorted((s.accuracy, s.latency[b].mean_s, s.id) for s in self.subnets if b in s.latency)
            for (a0, l0, i0), (a1, l1, i1) in pairwise(row):
                if a1 > a0 and l1 < l0:
                    p2.append(PropertyViolation("P2", (i0, i1), (b,), (l0, l1)))
        return PropertyReport(tuple(p1), tuple(p2))

    def _apply_check(self, check: CheckMode, source: str) -> None:
        if check not in ("warn", "raise", "ignore"):
            raise InvalidProfileError(f"check must be 'warn', 'raise' or 'ignore', got {check!r}")
        if check == "ignore":
            return
        report = self.check_properties()
        if report.ok:
            return
        msg = f"profile {source} violates the monotonicity properties; data kept as is.\n{report}"
        if check == "raise":
            raise InvalidProfileError(msg)
        warnings.warn(msg, ProfilePropertyWarning, stacklevel=3)

    # ------------------------------------------------------------------ own JSON schema
    def to_dict(self) -> dict[str, Any]:
        """This profile in the package's JSON schema (``"schema": "scheduling.profile/1"``, times in seconds)."""
        subnets = []
        for s in self.subnets:
            lat = []
            for b, st in s.latency.items():
                entry: dict[str, Any] = {"batch_size": b, "mean_s": st.mean_s, "p99_s": st.p99_s}
                if st.std_s is not None:
                    entry["std_s"] = st.std_s
                if st.samples_s is not None:
                    entry["samples_s"] = list(st.samples_s)
                lat.append(entry)
            d: dict[str, Any] = {"id": s.id, "accuracy": s.accuracy, "latency": lat}
            if s.config is not None:
                d["config"] = s.config
            subnets.append(d)
        return {"schema": SCHEMA, "name": self.name, "metadata": dict(self.metadata), "subnets": subnets}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, check: CheckMode = "warn") -> Profile:
        """Build a profile from :meth:`to_dict` output.

        Args:
            data: The decoded JSON object.
            check: What to do about P1/P2 violations: ``"warn"`` (default), ``"raise"`` or ``"ignore"``.

        Raises:
            InvalidProfileError: ``data`` does not follow the schema, or values are invalid.
        """
        if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
            got = data.get("schema") if isinstance(data, Mapping) else type(data).__name__
            raise InvalidProfileError(f"expected a mapping with 'schema': {SCHEMA!r}, got schema {got!r}")
        raw = data.get("subnets")
        if not isinstance(raw, list):
            raise InvalidProfileError(f"'subnets' must be a list, got {raw!r}")
        subnets = []
        for i, d in enumerate(raw):
            try:
                lat = {
                    e["batch_size"]: LatencyStats(
                        e["mean_s"],
                        e.get("p99_s"),
                        e.get("std_s"),
                        tuple(e["samples_s"]) if e.get("samples_s") is not None else None,
                    )
                    for e in d["latency"]
                }
                subnets.append(Subnet(d["id"], d["accuracy"], lat, d.get("config")))
            except (KeyError, TypeError) as exc:
                raise InvalidProfileError(f"subnets[{i}] is malformed ({exc!r}): {d!r}") from None
        profile = cls(tuple(subnets), name=str(data.get("name", "")), metadata=data.get("metadata") or {})
        profile._apply_check(check, repr(profile.name or "from dict"))
        return profile

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_dict` as indented JSON to ``path``, atomically: the text goes to a temporary file next to
        it that is renamed into place, so a crash never leaves a half-written profile."""
        path = os.fspath(path)
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, check: CheckMode = "warn") -> Profile:
        """Read a profile saved by :meth:`save`. See :meth:`from_dict` for ``check``."""
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as exc:
                raise InvalidProfileError(f"{os.fspath(path)!r} is not valid JSON: {exc}") from None
        return cls.from_dict(data, check=check)

    # ------------------------------------------------------------------ SuperServe importer
    @classmethod
    def from_superserve(
        cls,
        source: str | os.PathLike[str] | Mapping[str, Any],
        *,
        stages: Sequence[str] = SUPERSERVE_WORKER_STAGES,
        check: CheckMode = "warn",
    ) -> Profile:
        """Import a SuperServe profile (``{"models": [...], "_stage_profile_metadata": ...}``, times in ns).

        Worker latency is the sum of the selected ``stages``: mean = sum of stage means, std = sqrt(sum of stage
        variances) (the file's own rule, assuming independent stages), p99 = sum of the stages' p99 where the forward
        stage, which has none, contributes ``mean + 2.326 * std`` (again the file's rule; with all five stages this
        gives back the file's totals). Entries without per-stage data use the file's totals and require
        ``stages`` to be all five stages.

        Args:
            source: Path to the JSON file, or the decoded object.
            stages: Which stages count as worker latency. Default :data:`SUPERSERVE_WORKER_STAGES`, i.e. copies +
                forward + postprocess, without JPEG decode.
            check: What to do about P1/P2 violations: ``"warn"`` (default), ``"raise"`` or ``"ignore"``.

        Raises:
            InvalidProfileError: unknown stage names, or the file does not have the expected structure.
        """
        bad = [s for s in stages if s not in _SUPERSERVE_ALL_STAGES]
        if bad or not stages or len(set(stages)) != len(stages):
            raise InvalidProfileError(
                f"stages must be distinct names from {_SUPERSERVE_ALL_STAGES!r}, got {tuple(stages)!r}"
            )
        if isinstance(source, Mapping):
            data, origin = source, "<mapping>"
        else:
            origin = os.fspath(source)
            with open(source, encoding="utf-8") as f:
                data = json.load(f)
        models = data.get("models") if isinstance(data, Mapping) else None
        if not isinstance(models, list):
            raise InvalidProfileError(f"{origin!r} is not a SuperServe profile: no 'models' list")
        all_stages = set(stages) == set(_SUPERSERVE_ALL_STAGES)
        subnets = []
        for m in models:
            try:
                lat: dict[int, LatencyStats] = {}
                for e in m["latency_and_batch_ns"]:
                    st = e.get("stages")
                    if st is None:
                        if not all_stages:
                            raise InvalidProfileError(
                                f"model {m.get('id')!r} batch {e.get('batch_size')!r} has no per-stage data, so "
                                f"stages={tuple(stages)!r} cannot be applied; pass all five stages"
                            )
                        mean, std, p99 = e["mean"], e.get("std"), e.get("p99")
                    else:
                        mean = sum(st[k]["mean"] for k in stages)
                        std = math.sqrt(sum(st[k].get("std", 0.0) ** 2 for k in stages))
                        p99 = sum(
                            st[k]["p99"] if "p99" in st[k] else st[k]["mean"] + _Z99 * st[k].get("std", 0.0)
                            for k in stages
                        )
                    lat[int(e["batch_size"])] = LatencyStats(
                        mean * 1e-9, None if p99 is None else p99 * 1e-9, None if std is None else std * 1e-9
                    )
                config = {
                    k: m[k] for k in ("subnet_dimension", "constraint_mflop", "predicted_mflops", "filename") if k in m
                }
                subnets.append(Subnet(m["id"], m["accuracy"], lat, config))
            except (KeyError, TypeError) as exc:
                raise InvalidProfileError(f"{origin!r}: malformed model entry ({exc!r})") from None
        meta = {"source": "superserve", "stages": list(stages)}
        hw = (data.get("_stage_profile_metadata") or {}).get("hardware")
        if hw:
            meta["hardware"] = hw
        profile = cls(tuple(subnets), name=os.path.basename(origin), metadata=meta)
        profile._apply_check(check, repr(profile.name))
        return profile


def synthetic_profile(
    num_subnets: int,
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
    *,
    seed: int = 0,
    base_s: float = 0.004,
    per_item_s: float = 0.0008,
) -> Profile:
    """A random profile satisfying P1 and P2, for tests and benchmarks (e.g. 1000 subnets x 16 batch sizes).

    Subnet ``i`` has accuracy increasing with ``i`` and a cost factor increasing with ``i``; latency is
    ``factor * (base_s + per_item_s * batch)`` with ~5 % std and p99 = mean + 2.326 std.
    """
    if isinstance(num_subnets, bool) or not isinstance(num_subnets, int) or num_subnets < 1:
        raise InvalidProfileError(f"num_subnets must be an int >= 1, got {num_subnets!r}")
    rng = random.Random(seed)
    factors = sorted(rng.uniform(0.5, 3.0) for _ in range(num_subnets))
    accs = sorted(rng.uniform(70.0, 82.0) for _ in range(num_subnets))
    subnets = []
    for i, (f, a) in enumerate(zip(factors, accs, strict=True)):
        lat = {}
        for b in batch_sizes:
            mean = f * (base_s + per_item_s * b)
            lat[b] = LatencyStats(mean, mean * (1 + 0.05 * _Z99), 0.05 * mean)
        subnets.append(Subnet(i, a, lat))
    return Profile(tuple(subnets), name=f"synthetic-{num_subnets}x{len(batch_sizes)}-seed{seed}")
