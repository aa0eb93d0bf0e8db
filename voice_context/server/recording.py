"""Recordings: each accepted message, as the client sent it, appended to its session's file.

``DIR/<session>.jsonl`` holds one JSON object a line (see :func:`recording_name` for the
file name). The files are written off the event loop: :class:`Recorder` hands each line to
one writer task, which appends what has gathered in a worker thread, in the order it came.
A request is answered once its line is written, so a reply the client reads is in the
recording; a delete is ordered after the writes before it. Leaving :meth:`Recorder.run`'s
task group writes what is queued (within ``SHUTDOWN_GRACE``).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread
import orjson
import structlog
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

log = structlog.get_logger("voice_context.server")

#: Writes waiting for the writer, at most (past it, a request waits to queue its line).
QUEUED_WRITES = 1024
#: Seconds the writer may take, at shutdown, to write what is queued.
SHUTDOWN_GRACE = 5.0


def recording_name(session: str) -> str:
    """A file name for a session's recording, safe for any session name.

    Percent-encoding of the name (a leading dot too), with ``.jsonl``; names
    whose encoding is long are cut and given a hash suffix so they stay unique.
    """
    safe = quote(session, safe="-_.")
    if safe.startswith("."):
        safe = "%2E" + safe[1:]
    if len(safe) > 160:
        digest = hashlib.sha256(session.encode()).hexdigest()[:16]
        safe = f"{safe[:140].rstrip('%')}~{digest}"
    return safe + ".jsonl"


@dataclass(eq=False)
class _Job:
    """A line to append to ``path`` (or, with no line, ``path`` to delete); ``done`` is set
    once the writer has done it, and ``error`` says what failed."""

    path: Path
    line: bytes | None
    done: anyio.Event = field(default_factory=anyio.Event)
    error: str | None = None


class Recorder:
    """Writes the recordings of one server into ``record_dir``. Run :meth:`run` in a task
    group with ``await tg.start(recorder.run)``; :meth:`aclose` ends it."""

    def __init__(self, record_dir: Path) -> None:
        self.record_dir = record_dir
        self._jobs: MemoryObjectSendStream[_Job]
        self._queue: MemoryObjectReceiveStream[_Job]
        self._jobs, self._queue = anyio.create_memory_object_stream[_Job](QUEUED_WRITES)
        self._finished = anyio.Event()
        self.written = 0

    def __repr__(self) -> str:
        queued = self._jobs.statistics().current_buffer_used
        return f"<Recorder {str(self.record_dir)!r} written={self.written} queued={queued}>"

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Make the directory, then write each batch of what has gathered, until closed."""
        try:
            await anyio.to_thread.run_sync(lambda: self.record_dir.mkdir(parents=True, exist_ok=True))
            task_status.started()
            async with self._queue:
                async for job in self._queue:
                    batch = [job]
                    with contextlib.suppress(anyio.WouldBlock):
                        while True:
                            batch.append(self._queue.receive_nowait())
                    try:  # a disk that hangs past the shutdown's grace is left to its thread
                        await anyio.to_thread.run_sync(_perform, batch, abandon_on_cancel=True)
                    finally:
                        for done in batch:
                            done.done.set()
        finally:
            self._finished.set()

    async def record(self, session: str, sent: dict[str, Any]) -> None:
        """Append an accepted message, as the client sent it, to its session's recording, and
        wait until it is written. A failure is logged: the request was applied, so it is
        answered anyway."""
        path = self.record_dir / recording_name(session)
        try:
            line = orjson.dumps(sent) + b"\n"
        except orjson.JSONEncodeError as exc:
            log.warning("voice_context_record_failed", path=str(path), error=str(exc))
            return
        job = await self._submit(path, line)
        if job.error is not None:
            log.warning("voice_context_record_failed", path=str(path), error=job.error)
        else:
            self.written += 1

    async def delete(self, session: str, path: Path | None = None) -> None:
        """Delete a session's recording (or the file at ``path``), after every line queued before."""
        path = path if path is not None else self.record_dir / recording_name(session)
        job = await self._submit(path, None)
        if job.error is not None:
            log.warning("voice_context_recording_not_deleted", path=str(path), error=job.error)

    async def _submit(self, path: Path, line: bytes | None) -> _Job:
        job = _Job(path, line)
        try:
            await self._jobs.send(job)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            job.error = "the server has stopped recording"
            return job
        await job.done.wait()
        return job

    async def stale(self, before: float) -> list[tuple[str, Path]]:
        """The recordings last written before ``before`` (unix time), with the session each
        records (read off the event loop)."""
        return await anyio.to_thread.run_sync(_stale_recordings, self.record_dir, before)

    async def aclose(self) -> None:
        """Stop taking lines and let the writer write what is queued, within ``SHUTDOWN_GRACE``."""
        self._jobs.close()
        with anyio.move_on_after(SHUTDOWN_GRACE, shield=True) as waited:
            await self._finished.wait()
        if waited.cancelled_caught:
            log.warning("voice_context_recordings_unwritten", record_dir=str(self.record_dir))


def _perform(batch: list[_Job]) -> None:
    """Do each job in order (in a worker thread): one write of its line (flushed as the file
    closes), or the file's deletion."""
    for job in batch:
        try:
            if job.line is None:
                with contextlib.suppress(FileNotFoundError):
                    job.path.unlink()
            else:
                with job.path.open("ab") as out:
                    out.write(job.line)
        except OSError as exc:
            job.error = str(exc)


def _stale_recordings(record_dir: Path, before: float) -> list[tuple[str, Path]]:
    """The recordings last written before ``before``, with the session each one records."""
    found = []
    for path in record_dir.glob("*.jsonl"):
        try:
            if path.stat().st_mtime >= before:
                continue
            with path.open("rb") as handle:
                first = orjson.loads(handle.readline())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(first, dict) and isinstance(first.get("session"), str):
            found.append((first["session"], path))
    return found
