"""A one-line progress indicator on stderr (no dependency): ``label [#####.....] 12/40 3.1s``."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Redraws one line on ``stream`` at most every 0.1 s; a no-op when disabled.

    Args:
        total: number of steps.
        label: text before the bar.
        enabled: draw at all; ``None`` (default) draws only when ``stream`` is a terminal.
        stream: where to draw (default stderr).
    """

    def __init__(self, total: int, label: str, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = (
            (self.stream.isatty() if hasattr(self.stream, "isatty") else False) if enabled is None else enabled
        )
        self.total, self.label, self.done = max(total, 1), label, 0
        self._start = self._last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (now - self._last >= 0.1 or self.done >= self.total):
            self._last = now
            filled = int(20 * self.done / self.total)
            bar = "#" * filled + "." * (20 - filled)
            self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} {now - self._start:.1f}s")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
