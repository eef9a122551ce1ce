"""One rule for reading many files' heads (costs/files.map_reads): the cost index's contents
stamps, the dataset probes' image and audio headers and the manifest index all read through it."""

from __future__ import annotations

import pytest


def test_map_reads_keeps_order_and_reads_many_files_on_threads():
    """One rule for reading files' heads: serial below READ_THREADS_FROM items or with one worker,
    on named threads from there; the results keep the items' order either way."""
    import threading

    from mimo_accel.costs.files import READ_THREADS_FROM, map_reads, read_threads

    def where(i):
        return i * i, threading.current_thread().name

    few = map_reads(where, list(range(READ_THREADS_FROM - 1)))
    many = map_reads(where, list(range(READ_THREADS_FROM)), name="mimo-accel-test")
    serial = map_reads(where, list(range(READ_THREADS_FROM)), workers=1)
    assert [v for v, _ in many] == [i * i for i in range(READ_THREADS_FROM)]
    assert {t for _, t in few} == {t for _, t in serial} == {threading.current_thread().name}
    assert all(t.startswith("mimo-accel-test") for _, t in many)
    assert read_threads(3) == 3 and 1 <= read_threads() <= 8


def test_map_reads_raises_the_earliest_items_error():
    from mimo_accel.costs.files import READ_THREADS_FROM, map_reads

    def read(i):
        if i in (5, 40):
            raise OSError(f"item {i}")
        return i

    with pytest.raises(OSError, match="item 5"):
        map_reads(read, list(range(2 * READ_THREADS_FROM)))
