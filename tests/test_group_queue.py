"""The writers' queue refuses work past its rows or its bytes, and takes any one batch when it is empty."""

from __future__ import annotations

from storage.group_queue import GroupQueue


def test_an_offer_that_would_pass_the_bytes_is_refused_while_anything_is_queued() -> None:
    queue: GroupQueue[str] = GroupQueue(max_rows=100, max_bytes=1000)
    assert queue.offer("a", 1, 600)
    assert not queue.offer("b", 1, 401)
    assert queue.offer("c", 1, 400)  # up to the bound exactly
    assert (queue.rows, queue.bytes) == (2, 1000)


def test_an_offer_that_would_pass_the_rows_is_refused_whatever_its_bytes() -> None:
    queue: GroupQueue[str] = GroupQueue(max_rows=10, max_bytes=10**9)
    assert queue.offer("a", 6, 1)
    assert not queue.offer("b", 5, 1)
    assert queue.offer("c", 4, 1)
    assert queue.rows == 10


def test_a_batch_past_either_bound_is_taken_when_nothing_is_queued() -> None:
    for rows, nbytes in ((1, 5000), (50, 1)):
        queue: GroupQueue[str] = GroupQueue(max_rows=10, max_bytes=1000)
        assert queue.offer("big", rows, nbytes), "a request no bound can hold would be refused forever"
        assert not queue.offer("next", 1, 1)


def test_released_rows_and_bytes_make_room_again() -> None:
    queue: GroupQueue[str] = GroupQueue(max_rows=100, max_bytes=1000)
    assert queue.offer("a", 3, 900)
    assert queue.take(0) == ["a"]
    assert not queue.offer("b", 1, 200), "taken is not committed: the bound still covers the group being written"
    queue.release(3, 900)
    assert (queue.rows, queue.bytes) == (0, 0)
    assert queue.offer("b", 1, 200)
    assert queue.offer("c", 1, 800)
