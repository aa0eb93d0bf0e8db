"""A worker thread of one's own: the calls given to it run one after another, in order, and each
caller awaits its own result.

``anyio.to_thread.run_sync`` behind a capacity limiter of one runs one call at a
time too, but it holds the limiter until the event loop has resumed the caller:
on a busy loop the thread sits idle between two calls for as long as the loop
takes to get round to the first one's result, and the calls queue behind the
event loop rather than behind the database. Measured on a served replica with
400 paced sessions: a recall read spent 0.4 ms in its thread and 12 ms (p50) to
390 ms (p90) waiting for it. Here the thread takes the next call as soon as the
last one returns; the loop hears of each result whenever it gets to it.

A call, once started, runs to its end and its caller is told what it did, as
with anyio's worker threads: a caller cancelled meanwhile waits for it, shielded,
so no transaction is ever left open or unreported by a cancelled caller (an anyio
cancel scope cancels it again at its next checkpoint). A call whose caller was
cancelled before the thread took it never runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio

T = TypeVar("T")


class _Call(Generic[T]):
    __slots__ = ("dropped", "fn", "future", "loop", "started")

    def __init__(self, fn: Callable[[], T], loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn
        self.loop = loop
        self.future: asyncio.Future[T] = loop.create_future()
        self.started = False
        self.dropped = False


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Worker:
    """One daemon thread running the calls given to :meth:`run` one at a time, in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # a call is either started or dropped, never both
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        alive = self._thread is not None and self._thread.is_alive()
        return f"<Worker {self.name} alive={alive}>"

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in the worker's thread, after every call given before it."""
        call: _Call[T] = _Call(fn, asyncio.get_running_loop())
        self._start()
        self._calls.put(call)
        try:
            return await asyncio.shield(call.future)
        except BaseException:
            with self._lock:
                call.dropped = not call.started
            if call.dropped:
                raise
        # cancelled while it runs: it ends first, and its caller gets what it did (a cancel
        # scope cancels the caller again at its next checkpoint)
        with anyio.CancelScope(shield=True):
            await asyncio.wait([call.future])
        return call.future.result()

    def stop(self) -> None:
        """Let the thread end once the calls given so far have run."""
        if self._thread is not None:
            self._calls.put(None)
            self._thread = None

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
            self._thread.start()

    def _main(self) -> None:
        while (call := self._calls.get()) is not None:
            with self._lock:
                if call.dropped:
                    continue
                call.started = True
            result: Any = None
            error: BaseException | None = None
            try:
                result = call.fn()
            except BaseException as exc:  # the caller gets it, whatever it is
                error = exc
            with contextlib.suppress(RuntimeError):  # (the loop is closed: nobody waits for it)
                call.loop.call_soon_threadsafe(_settle, call.future, result, error)
            del call, result, error


__all__ = ["Worker"]
