"""Group commit: writes that arrive while one is in flight go out together in the next.

A durable store pays for every write it makes durable (an ``fsync`` of the
SQLite log, a round trip and an ``fsync`` in Redis), whatever the write
holds. :class:`GroupCommit` lets many small writes share that price::

    group = GroupCommit(write_many)     # write_many(batch) makes a whole batch durable
    await group.submit(op)              # returns once ``op``'s batch is durable, or raises its error

There is no writer task: the first caller that finds nothing in flight writes
the queue as it stands (its own write among them), and those that arrive
meanwhile wait; when that group is durable they wake, and one of them writes
the next group, with every write queued since. The group being written is
shielded from cancellation, so a cancelled caller never abandons the writes
of others; a caller cancelled while its write still waits in the queue takes
it out (it was never written).

The shield has a deadline, ``deadline`` seconds, which the store chooses no
shorter than its own give-up time for a write, so that the deadline never cuts
a write the database would still complete: a group still unwritten by then is
given up (logged as ``voice_context_store_group_abandoned``) and every write in
it fails with a retryable ``StoreError``; none of them is acknowledged.

A group holds at most ``max_group`` writes, and, when the store gives each write a
``weight`` (the work it costs), writes up to ``max_weight`` of it: a group past that
waits for the next (a group always takes at least one write). A store whose writes
hold a lock others wait on bounds each hold that way.

The store's ``write_many`` decides each write's fate: it sets ``error`` on a
write that failed alone (the others in its group are unaffected) and raises
when the whole group failed (then every write in it gets that error). A
write is acknowledged only once ``write_many`` has returned, that is once
its group is durable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import anyio
import anyio.lowlevel

from voice_context.errors import StoreError
from voice_context.logs import get_logger

T = TypeVar("T")

log = get_logger("voice_context.store")

MAX_GROUP = 1000
"""At most this many writes in one group (the rest go in the next)."""
DEADLINE = 60.0
"""The longest (seconds) a group's shielded write may take when the store names no deadline."""


@dataclass(eq=False, slots=True)
class Pending(Generic[T]):
    """One write waiting for its group: ``error`` is set when it failed alone."""

    op: T
    error: BaseException | None = None
    done: bool = False


class GroupCommit(Generic[T]):
    """Gathers writes into groups, each made durable by one call of ``write_many``."""

    def __init__(
        self,
        write_many: Callable[[list[Pending[T]]], Awaitable[None]],
        *,
        max_group: int = MAX_GROUP,
        deadline: float = DEADLINE,
        weight: Callable[[T], int] | None = None,
        max_weight: int = 0,
    ) -> None:
        if max_group < 1:
            raise ValueError("a group holds at least one write")
        if weight is not None and max_weight < 1:
            raise ValueError("a group weighed by its writes needs a positive max_weight")
        if not deadline > 0:
            raise ValueError("a group's write needs a positive deadline")
        self._write_many = write_many
        self.max_group = max_group
        self.deadline = deadline
        self.weight = weight
        self.max_weight = max_weight
        self._queue: list[Pending[T]] = []
        self._writing = False
        self._written = anyio.Event()
        #: groups written, writes in them, and the largest group so far
        self.groups = 0
        self.writes = 0
        self.largest = 0

    def __repr__(self) -> str:
        return (
            f"<GroupCommit queued={len(self._queue)} writing={self._writing} "
            f"groups={self.groups} writes={self.writes} largest={self.largest}>"
        )

    async def submit(self, op: T) -> None:
        """Write ``op`` in the next group; returns once that group is durable.

        Raises the error ``write_many`` gave this write, or the group's.
        """
        item = Pending(op)
        self._queue.append(item)
        try:
            while not item.done:
                if self._writing:
                    await self._written.wait()
                else:
                    await self._write_next()
        except BaseException:
            if not item.done and item in self._queue:
                self._queue.remove(item)  # never written: nothing to undo
            raise
        if item.error is not None:
            raise item.error

    def _next_size(self) -> int:
        """How many of the queued writes the next group takes: up to ``max_group``, and up to
        ``max_weight`` of their weight (at least one)."""
        size = min(len(self._queue), self.max_group)
        if self.weight is None:
            return size
        total = 0
        for taken, item in enumerate(self._queue[:size]):
            total += self.weight(item.op)
            if total > self.max_weight:
                return max(taken, 1)
        return size

    async def idle(self) -> None:
        """Return once no write waits and none is being written (at once when that is so
        already): what a lower-priority writer waits for before it takes the same worker."""
        while self._queue or self._writing:
            if self._writing:
                await self._written.wait()
            else:  # a submitter is about to write its group: let it
                await anyio.lowlevel.checkpoint()

    async def _write_next(self) -> None:
        size = self._next_size()
        batch = self._queue[:size]
        del self._queue[:size]
        self._writing = True
        failed: BaseException | None = None
        try:
            # others wait on this group: it is written whole, or given up after the deadline
            with anyio.move_on_after(self.deadline, shield=True) as scope:
                await self._write_many(batch)
            if scope.cancelled_caught:
                log.warning("voice_context_store_group_abandoned", writes=len(batch), seconds=self.deadline)
                raise StoreError(
                    f"the write did not finish within {self.deadline:g}s; it may or may not be stored",
                    retryable=True,
                )
        except BaseException as exc:
            failed = exc
            if not isinstance(exc, Exception):
                raise
        finally:
            for item in batch:
                if failed is not None and item.error is None:
                    item.error = (
                        failed
                        if isinstance(failed, Exception)
                        else StoreError("the write was interrupted", retryable=True)
                    )
                item.done = True
            self.groups += 1
            self.writes += len(batch)
            self.largest = max(self.largest, len(batch))
            self._writing = False
            written, self._written = self._written, anyio.Event()
            written.set()
