"""gc_paused(): the cyclic garbage collector off for a block of bulk work, restored after.

Public names: gc_paused, PROMOTE.

Compiling, attaching, removing and reading a run all make or free many small objects while
the model's (and torch's) own objects are alive; the full collections those allocations
trigger cost more than the work itself (attach at 100k modules: 7.7 s with the collector,
about 2 s without; indexing a 100k-entry run: 10x). The state is restored in ``finally``,
and a collector the caller had switched off stays off.

What the block built lives as long as its graph (bindings, action closures, hook handles),
so when it ends without error, having built at least ``PROMOTE_AT`` objects, those objects
move straight to the oldest generation (``gc.freeze()`` then ``gc.unfreeze()``: two list
splices) instead of waiting for the next young collection to walk every one of them
(160 ms after compiling 28,000 bindings).
Nothing is frozen for good: full collections still see them. The caller's own young objects
move too, so a reference cycle among them that is already garbage waits for the next full
collection instead of the next young one (graphs, their stores and records are freed by
reference counting, not by the collector). Where the caller froze objects itself,
unfreezing would undo that, so nothing is moved then.

That move is why the promotion is opt-in: ``PROMOTE`` is False in a library call (someone
else's process: its young objects stay where its collector put them) and set True by
``python -m hookgraph`` (hookgraph's own process). The collector's pause itself is kept for
every call: it changes nothing once the block ends. ``benchmarks/gc_pause.py`` measures both
(see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused", "PROMOTE"]

# Promote only after bulk work (tracked objects allocated in the block, net): a small compile
# in a loop must not keep moving the program's young garbage past the young collections.
PROMOTE_AT = 20_000

# Promote after bulk work at all: only in a process hookgraph owns (the command line sets it).
PROMOTE = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if PROMOTE and was_enabled and gc.get_count()[0] >= PROMOTE_AT and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
    finally:
        if was_enabled:
            gc.enable()
