"""headroom.agent.heap: collections inside a suite free the cycles its cases make and skip everything older."""

import gc
import weakref

from headroom.agent import heap


class Node:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it


def test_a_cycle_made_inside_is_freed_and_the_older_objects_are_left_out_then_handed_back():
    assert gc.get_freeze_count() == 0
    older = Node()
    with heap.older_objects_frozen():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        made = Node()
        gone = weakref.ref(made)
        del made
        heap.collect()
        assert gone() is None
        survivor = Node()
        heap.collect()  # survivors of a collection join the frozen generation
        assert gc.get_freeze_count() > frozen
        with heap.older_objects_frozen():  # an inner block leaves the outer freeze as it is
            pass
        assert gc.get_freeze_count() > frozen
    assert gc.get_freeze_count() == 0
    older_ref, survivor_ref = weakref.ref(older), weakref.ref(survivor)
    del older, survivor
    gc.collect()  # handed back: the cycles alive during the block are garbage the collector reaches again
    assert older_ref() is None and survivor_ref() is None


def test_the_freeze_is_undone_when_the_block_raises():
    try:
        with heap.older_objects_frozen():
            raise KeyError("a case that failed")
    except KeyError:
        pass
    assert gc.get_freeze_count() == 0
