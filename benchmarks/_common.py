"""Helpers shared by the benchmark scripts (not part of the library)."""

from __future__ import annotations

import ast
import hashlib
import platform
import statistics
import sys
import sysconfig
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

import subnetact


def spanning_subnets(space: subnetact.Space, n: int = 6) -> list[subnetact.SubnetConfig]:
    """``n`` configs from the smallest to the largest: uniform depth and width, interpolated together."""
    depth_entries, width_entries = space.entries("depth"), space.entries("width")
    configs = []
    for i in range(n):
        t = i / (n - 1)
        depth = [e.choices[round(t * (len(e.choices) - 1))] for e in depth_entries]
        width = [e.choices[round(t * (len(e.choices) - 1))] for e in width_entries]
        configs.append(space.make(depth=depth, width=width))
    return configs


def timeit(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of ``repeats`` calls: wall clock by default; ``clock=time.process_time`` counts this process's CPU
    time only, which other jobs on a shared machine disturb far less (they still share caches and memory
    bandwidth)."""
    out = []
    for _ in range(repeats):
        start = clock()
        fn()
        out.append(clock() - start)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, python {platform.python_version()}"
    )


def cache_peak_bytes(model: torch.nn.Module, subnets: list, budget_mb: float | None) -> int:
    """Most bytes the weight cache holds while ``subnets`` run round-robin twice, from an empty cache, at
    ``budget_mb`` (None: the default); the default budget is restored afterwards. The copies' size does not depend
    on the input size, so tiny inputs suffice (uncalibrated subnets' warnings are silenced)."""
    model.set_weight_cache(0)  # start empty: copies left by earlier forwards would count towards the peak
    model.set_weight_cache(budget_mb)
    peak = 0
    x = torch.randn(1, 3, 32, 32)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            for cfg in subnets:
                model(x, subnet=cfg)
                peak = max(peak, model.weight_cache_info().used_bytes)
    model.set_weight_cache(None)
    return peak


def stdlib_docstrings(heldout_percent: int) -> tuple[Iterator[tuple[bool, str]], dict]:
    """The docstrings of the running interpreter's standard library (modules, classes, functions; files parsed
    with ``ast``, never imported; tests, idlelib and site-packages left out), as ``(held_out, docstring)`` in file
    order, and a description of the source. A file is held out if ``sha256(relative path) % 100 <
    heldout_percent``, so a training set and a held-out set built from them share no file."""
    root = Path(sysconfig.get_paths()["stdlib"])
    source = {
        "source": "docstrings of the Python standard library (ast.get_docstring of modules, classes, functions)",
        "python": sys.version.split()[0],
        "stdlib": str(root),
        "split": f"by file: sha256(relative path) % 100 < {heldout_percent} -> held-out",
        "files": 0,
    }

    def walk() -> Iterator[tuple[bool, str]]:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(("site-packages", "test/", "idlelib/", "lib2to3/tests")) or "/test" in rel:
                continue
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            source["files"] += 1
            held = int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 100 < heldout_percent
            for doc in tree_docstrings(tree):
                yield held, doc

    return walk(), source


def tree_docstrings(tree: ast.AST) -> Iterator[str]:
    """The docstrings of a parsed file's module, classes and functions."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield doc


def python_docstrings(root: Path) -> Iterator[str]:
    """The docstrings of the ``.py`` files under ``root`` (a package's directory), in path order; files parsed with
    ``ast``, never imported; tests (a path component starting with ``test``) left out."""
    for path in sorted(root.rglob("*.py")):
        if "/test" in "/" + path.relative_to(root).as_posix():
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        yield from tree_docstrings(tree)


class CpuBudget:
    """The ``on_step`` callback of a :func:`subnetact.train.distill` run that stops after ``minutes`` of process CPU
    time (all threads, ``time.process_time``: on a shared machine wall time says little), or ``wall_minutes``.

    Every ``eval_every`` steps it calls ``table()`` (one score per served subnet) and appends ``{"step", "cpu_s",
    metric: scores}`` to :attr:`curve`; that CPU is not charged to the budget. Each step's losses go to :attr:`log`
    (printed every ``print_every`` steps). :meth:`spent` is the budget used so far; :meth:`lr_factor` decays the
    learning rate with it (the steps a budget buys are not known in advance).
    """

    def __init__(
        self,
        minutes: float,
        *,
        wall_minutes: float | None = None,
        eval_every: int = 0,
        table: Callable[[], list[float]] | None = None,
        metric: str = "score",
        digits: int = 4,
        print_every: int = 1,
    ) -> None:
        self.budget_s = 60.0 * minutes
        self.wall_s = None if wall_minutes is None else 60.0 * wall_minutes
        self.eval_every, self.table, self.metric = eval_every, table, metric
        self.digits, self.print_every = digits, print_every
        self.eval_cpu_s = 0.0  # the tables' CPU: not part of the budget
        self.log: list[dict] = []
        self.curve: list[dict] = []
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()

    def spent(self) -> float:
        """Process CPU seconds charged to the budget so far."""
        return time.process_time() - self.cpu0 - self.eval_cpu_s

    def lr_factor(self, step: int, warmup: int) -> float:
        """A learning-rate multiplier (``LambdaLR``): linear warm-up over ``warmup`` steps, then linear decay to 0
        with the budget spent."""
        return min(1.0, (step + 1) / warmup) * max(0.0, 1.0 - self.spent() / self.budget_s)

    def uncharged(self, fn: Callable[[], object]) -> object:
        """``fn()``, its CPU time left out of the budget (a held-out table)."""
        t = time.process_time()
        try:
            return fn()
        finally:
            self.eval_cpu_s += time.process_time() - t

    def wall(self) -> float:
        """Wall seconds since the budget started."""
        return time.perf_counter() - self.wall0

    def __call__(self, step: int, result) -> bool:
        if self.eval_every and self.table is not None and step % self.eval_every == 0:
            cpu_s = self.spent()
            scores = self.uncharged(self.table)
            self.curve.append({"step": step, "cpu_s": cpu_s, self.metric: scores})
            print(f"eval step {step}: " + "  ".join(f"{v:.{self.digits}f}" for v in scores), flush=True)
        used = self.spent()
        self.log.append({"step": step, "cpu_s": used, "losses": list(result.losses)})
        if step % self.print_every == 0:
            losses = "  ".join(f"{loss:.4f}" for loss in result.losses)
            print(f"step {step:4d}  cpu {used / 60:5.2f} min  losses {losses}", flush=True)
        if self.wall_s is not None and self.wall() > self.wall_s:
            return True
        return used >= self.budget_s
