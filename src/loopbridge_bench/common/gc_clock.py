"""The garbage collector in a benchmark process that also serves: counted per job, and
kept off the measured requests.

Both benchmarks serve from the process that keeps the run's records (every sample of
every job so far). A full (generation 2) collection walks every tracked object that is
not frozen, holding the GIL, so records that accumulate over a run make each full
collection longer: a pause that every thread of the serving process waits out, in the
middle of measured requests. The stock servers are processes of their own that hold no
such records, and freeze their start-up heap (vLLM's app at its start, SGLang's
launcher after its warm-up).

* :class:`GcClock` counts full collections and the time they take, on every thread of
  this process, so that each job's record says how many ran during it;
* :func:`settle` runs between jobs: one collection, then ``gc.freeze()``, so that what
  survived (the records so far, the servers' state) is not walked again while a later
  job is measured.

Invariant: :func:`settle` runs only between jobs, with no request in flight.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

__all__ = ["GcClock", "settle"]


class GcClock:
    """Counts full collections and the time they take, on every thread of this process."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._t0

    def snapshot(self) -> tuple[int, float]:
        return self.count, self.seconds

    def since(self, then: tuple[int, float]) -> tuple[int, float]:
        """Full collections and their seconds since ``then`` (a :meth:`snapshot`)."""
        return self.count - then[0], self.seconds - then[1]

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)


def settle() -> None:
    """Between jobs: collect what the last job left, then freeze the rest."""
    gc.collect()
    gc.freeze()
