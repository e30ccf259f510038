"""Garbage collections that walk only the objects made since the last one.

The agent collects after every case, so that tensors only a reference cycle
keeps alive are gone before the next case allocates and its memory is read.
A full collection walks every object the process tracks: after torch,
SQLAlchemy and torch._dynamo (which the first optimizer step imports) that is
about 340,000 objects and 0.2 s on a 2-core CPU, more in a test process.
The CPU smoke suite collected 53 times, a third of its wall time.

Objects that survived a collection are modules, classes and caches, not the
garbage a case leaves; inside `older_objects_frozen` they move to the
collector's permanent generation (`gc.freeze`) and later collections skip
them. On leaving, they are handed back to the collector (`gc.unfreeze`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def older_objects_frozen() -> Iterator[None]:
    """Leave the objects alive now out of every collection inside the block.

    A block inside another's leaves the outer freeze as it is.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def collect() -> None:
    """Free the garbage reference cycles hold; inside `older_objects_frozen`, freeze what survived."""
    gc.collect()
    if gc.get_freeze_count():
        gc.freeze()
