"""Building many small records at once without the cyclic garbage collector's passes.

Loading a long run creates tens of thousands of acyclic objects (row tuples, bytes,
records). Each 700 of them trigger a pass of CPython's cyclic collector, and the older
generations' passes walk everything already alive: on the resume of a 10,000-step run
in a busy process that costs as much as the loading itself. Those objects cannot form
cycles, so the collector is paused while they are built; nothing is lost, the next pass
sees everything.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (if it runs at all)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
