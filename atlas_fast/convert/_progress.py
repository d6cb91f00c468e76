"""Progress of a conversion: a run's examples batched (``Emitter``), a phase shown."""

from __future__ import annotations

import sys
import time

__all__ = ["Emitter", "Progress"]

_EVERY = 0.1  # seconds between progress messages of a worker


class Emitter:
    """Batches progress for ``emit(examples, nbytes)`` to at most one call per 0.1 s."""

    def __init__(self, emit):
        self.emit, self.examples, self.last = emit, 0, time.monotonic()

    def example(self) -> None:
        self.examples += 1
        if not self.examples & 63 and time.monotonic() - self.last > _EVERY:
            self.flush(0)

    def flush(self, nbytes: int) -> None:
        self.emit(self.examples, nbytes)
        self.examples, self.last = 0, time.monotonic()


class Progress:
    """Progress of one phase: a tqdm bar (``progress=True``, when tqdm is installed), a
    callable ``progress(examples, nbytes)`` given increments, or nothing. The bar counts
    bytes of ``total`` (``unit="B"``), or examples (``unit="examples"``)."""

    def __init__(self, progress, total: int, desc: str, unit: str = "B"):
        self.callback = progress if callable(progress) and progress is not True else None
        self.by_examples = unit != "B"
        self.bar = None
        self.examples = 0
        self.start = self.last = time.monotonic()
        if progress is True:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(
                total=total,
                desc=desc,
                unit=" examples" if self.by_examples else "B",
                unit_scale=True,
                unit_divisor=1000,
                file=sys.stderr,
                dynamic_ncols=True,
                leave=False,
            )

    def __call__(self, examples: int, nbytes: int) -> None:
        self.examples += examples
        if self.callback is not None:
            self.callback(examples, nbytes)
        if self.bar is None:
            return
        if self.by_examples:
            if examples:
                self.bar.update(examples)
            return
        if nbytes:
            self.bar.update(nbytes)
        now = time.monotonic()
        if now - self.last > 0.2:
            rate = self.examples / max(now - self.start, 1e-9)
            self.bar.set_postfix_str(f"{self.examples:,} examples, {rate:,.0f} ex/s", False)
            self.bar.refresh()
            self.last = now

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
