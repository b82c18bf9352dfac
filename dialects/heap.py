"""Building and rewriting large IR with Python's cyclic collector paused."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while building or rewriting IR.

    xDSL's IR is full of reference cycles (parent <-> child), so each
    collection rescans the whole, growing program: with it running,
    propagation slowed per op as programs grew (3,100 vs 4,900 ops/s on the
    24-layer step), and importing the 24-layer step took 1.35 s against
    0.80 s paused. Garbage is reclaimed when the collector resumes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
