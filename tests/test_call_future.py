"""``CallFuture``: a ``concurrent.futures.Future`` that makes its condition only when needed.

No Redis: the future alone, as the pending-call table and callers use it, and what a call
in flight costs the table and its future (``bench/client_memory.py`` measures whole clients).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import gc
import threading
import time
import tracemalloc
from typing import Any

import pytest

from toolfleet.producer.client import CallFuture


def test_a_pending_future_with_a_callback_holds_no_condition() -> None:
    future = CallFuture("a")
    seen: list[Any] = []
    future.add_done_callback(seen.append)
    assert future._cond is None and not future.done() and not future.running()
    future.set_result(5)  # type: ignore[arg-type]
    assert future._cond is None
    assert future.done() and future.result() == 5 and seen == [future]


def test_callbacks_run_in_order_and_at_once_when_done() -> None:
    future, order = CallFuture("b"), []
    future.add_done_callback(lambda f: order.append(1))
    future.add_done_callback(lambda f: order.append(2))
    future.set_result(None)  # type: ignore[arg-type]
    future.add_done_callback(lambda f: order.append(3))
    assert order == [1, 2, 3]


def test_a_failing_callback_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    future, seen = CallFuture("c"), []
    future.add_done_callback(lambda f: 1 / 0)
    future.add_done_callback(seen.append)
    future.set_result(1)  # type: ignore[arg-type]
    assert seen == [future] and "exception calling callback" in caplog.text


def test_setting_twice_raises() -> None:
    future = CallFuture("d")
    future.set_result(1)  # type: ignore[arg-type]
    with pytest.raises(cf.InvalidStateError):
        future.set_result(2)  # type: ignore[arg-type]
    with pytest.raises(cf.InvalidStateError):
        future.set_exception(ValueError())


def test_a_waiting_thread_wakes_and_a_timeout_times_out() -> None:
    future = CallFuture("e")
    with pytest.raises(cf.TimeoutError):
        future.result(timeout=0.02)
    threading.Timer(0.05, future.set_result, [7]).start()
    assert future.result(timeout=5) == 7


def test_cancel_runs_the_callbacks_and_result_raises() -> None:
    future, seen = CallFuture("f"), []
    future.add_done_callback(lambda f: seen.append(f.cancelled()))
    assert future.cancel() and future.cancelled() and seen == [True]
    with pytest.raises(cf.CancelledError):
        future.result()


def test_an_exception_is_kept_and_raised() -> None:
    future = CallFuture("g")
    future.set_exception(ValueError("boom"))
    assert isinstance(future.exception(), ValueError)
    with pytest.raises(ValueError, match="boom"):
        future.result()


def test_wait_and_as_completed_see_every_future() -> None:
    futures = [CallFuture(str(i)) for i in range(50)]

    def resolve() -> None:
        for i, future in enumerate(futures):
            time.sleep(0.001)
            future.set_result(i)  # type: ignore[arg-type]

    threading.Thread(target=resolve).start()
    assert sorted(f.result() for f in cf.as_completed(futures, timeout=10)) == list(range(50))  # type: ignore[type-var]
    some = [CallFuture(str(i)) for i in range(5)]
    threading.Timer(0.05, some[2].set_result, [1]).start()
    done, not_done = cf.wait(some, timeout=5, return_when=cf.FIRST_COMPLETED)
    assert done == {some[2]} and len(not_done) == 4


def test_many_threads_waiting_while_another_resolves() -> None:
    futures = [CallFuture(str(i)) for i in range(2000)]
    sums: list[int] = []

    def wait_for(start: int) -> None:
        sums.append(sum(futures[i].result(timeout=30) for i in range(start, 2000, 8)))  # type: ignore[misc]

    threads = [threading.Thread(target=wait_for, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for i, future in enumerate(futures):
        future.set_result(i)  # type: ignore[arg-type]
    for thread in threads:
        thread.join(30)
    assert sum(sums) == sum(range(2000))


def test_repr_names_the_state() -> None:
    future = CallFuture("h")
    assert "pending" in repr(future)
    future.set_result(1)  # type: ignore[arg-type]
    assert "finished" in repr(future)


def _bytes_per_pending_call(make_future: Any, calls: int = 2000) -> float:
    """Bytes the pending-call table and the futures hold per call (requests made before)."""
    from toolfleet.producer._core.calls import build_request
    from toolfleet.producer._core.pending import PendingTable
    from toolfleet.shared.wire import CallContext

    context = CallContext()
    requests = [
        build_request(
            "f", {"n": i}, tool_call_id=None, context=context, timeout_s=60.0, reply_to="r"
        )
        for i in range(calls)
    ]
    table = PendingTable(lambda: None)
    futures: list[Any] = [None] * calls
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i, request in enumerate(requests):
            futures[i] = make_future(request.id)
            table.add(request, futures[i])
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert table.in_flight == calls
    return held / calls


def test_a_sync_call_in_flight_takes_little_memory() -> None:
    assert _bytes_per_pending_call(CallFuture) < 768


def test_an_async_call_in_flight_takes_little_memory() -> None:
    from toolfleet.producer.async_listener import AsyncCallFuture

    loop = asyncio.new_event_loop()
    try:
        assert _bytes_per_pending_call(lambda call_id: AsyncCallFuture(call_id, loop=loop)) < 768
    finally:
        loop.close()
