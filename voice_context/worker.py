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

The loop is woken once for many results: the thread keeps the calls it has run in a list
for their loop and wakes the loop (``call_soon_threadsafe``, a write to its self-pipe) only
when the list was empty, that is when no wake-up is pending already; the loop then settles
every call in the list in one callback. On a busy loop, the results of a burst of calls
cost one wake-up. A caller awaits its call's future itself (no ``asyncio.shield``, no task
of its own): a cancellation cancels that future, and when the call had started, the caller
waits for a new one, shielded, that the loop's settling fills in. A loop closed before its
results arrive is tolerated: they are dropped (nobody waits for them).
"""

from __future__ import annotations

import asyncio
import ctypes
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import anyio

T = TypeVar("T")


_PR_SET_NAME = 15  # prctl(2): the calling thread's name, up to 15 bytes


def _find_prctl() -> Callable[..., int] | None:
    """The C library's ``prctl``, on Linux; ``None`` elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return cast(Callable[..., int], ctypes.CDLL(None).prctl)
    except (OSError, AttributeError):
        return None


_PRCTL = _find_prctl()


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` where the system keeps one (``top -H``,
    ``/proc/PID/task/TID/comm``), without its ``voice-context-`` prefix and cut to the 15 bytes
    Linux keeps: a server's threads can then be told apart from outside (their CPU each, which
    ``scripts/load`` prints)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_NAME, ctypes.c_char_p(name.removeprefix("voice-context-").encode()[:15]), 0, 0, 0)


class _Call(Generic[T]):
    __slots__ = ("dropped", "error", "fn", "future", "loop", "result", "settled", "started")

    def __init__(self, fn: Callable[[], T], loop: asyncio.AbstractEventLoop) -> None:
        self.fn = fn
        self.loop = loop
        self.future: asyncio.Future[T] = loop.create_future()
        self.started = False
        self.dropped = False
        #: what the call did (set in the thread), told to its caller once ``settled`` (in the loop)
        self.result: Any = None
        self.error: BaseException | None = None
        self.settled = False


class Worker:
    """One daemon thread running the calls given to :meth:`run` one at a time, in order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        # a call is either started or dropped, never both; and the lists of ``_ran``
        self._lock = threading.Lock()
        #: the calls run and not yet settled, by their loop: a loop listed here has a wake-up pending
        self._ran: dict[asyncio.AbstractEventLoop, list[_Call[Any]]] = {}
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
            return await call.future
        except BaseException:
            with self._lock:
                call.dropped = not call.started
            if call.dropped:
                raise
        # it started: it ends first, and its caller gets what it did, even when cancelled
        # meanwhile (a cancel scope cancels the caller again at its next checkpoint)
        future = call.future
        if future.cancelled():  # (by the cancellation)
            if call.settled:  # the call's outcome came after it, and is the call's alone
                if call.error is not None:
                    raise call.error
                return cast(T, call.result)
            call.future = future = call.loop.create_future()  # for the settling to fill in
        if not future.done():
            with anyio.CancelScope(shield=True):
                await asyncio.wait([future])
        return future.result()  # (its error retrieved, when it failed)

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
        name_os_thread(self.name)
        lock, ran = self._lock, self._ran
        while (call := self._calls.get()) is not None:
            with lock:
                if call.dropped:
                    continue
                call.started = True
            try:
                call.result = call.fn()
            except BaseException as exc:  # the caller gets it, whatever it is
                call.error = exc
            loop = call.loop
            with lock:
                waiting = ran.get(loop)
                if waiting is None:
                    ran[loop] = [call]
                else:  # a wake-up is pending: the loop settles this call with the others
                    waiting.append(call)
            del call
            if waiting is None:
                try:
                    loop.call_soon_threadsafe(self._settle, loop)
                except RuntimeError:  # the loop is closed: nobody waits for its calls
                    with lock:
                        ran.pop(loop, None)
            del loop, waiting

    def _settle(self, loop: asyncio.AbstractEventLoop) -> None:
        """In the loop: tell the callers of every call run since the loop was woken."""
        with self._lock:
            calls = self._ran.pop(loop, ())
        for call in calls:
            call.settled = True
            future = call.future
            if future.done():  # (cancelled: its caller reads the call's result)
                continue
            if call.error is not None:
                future.set_exception(call.error)
            else:
                future.set_result(call.result)


__all__ = ["Worker"]
