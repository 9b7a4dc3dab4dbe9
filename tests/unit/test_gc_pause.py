"""The serving process's heap, frozen once started: later collections do not walk it."""

from __future__ import annotations

import gc

from router.service.gc_pause import settle_heap


class Held:
    """A container object the collector tracks."""

    def __init__(self) -> None:
        self.items: list[object] = []


def test_what_the_process_holds_when_settled_is_out_of_the_collectors_walk() -> None:
    before = Held()
    try:
        frozen = settle_heap()
        after = Held()
        walked = {id(o) for o in gc.get_objects()}
        assert frozen == gc.get_freeze_count() > 0
        assert id(before) not in walked  # frozen: no collection walks it again
        assert id(after) in walked  # allocated since: collected as usual
    finally:
        gc.unfreeze()
    assert id(before) in {id(o) for o in gc.get_objects()}
