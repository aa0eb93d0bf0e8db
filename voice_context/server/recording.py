"""Recordings: each accepted message, as the client sent it, appended to its session's file.

``DIR/<session>.jsonl`` holds one JSON object a line (see :func:`recording_name` for the
file name). The files are written off the event loop: each line is appended by a worker
thread (at most ``WRITERS`` at once), one write each, flushed as the file closes. A
session's lines are written one at a time, in the order they came (a delete too, after the
lines before it); different sessions' side by side, so a file the disk holds up holds up
only its own session. A request is answered once its line is written, so a reply the client
reads is in the recording. :meth:`Recorder.aclose` stops taking lines and waits (within
``SHUTDOWN_GRACE``) for those being written.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import anyio.to_thread
import orjson

from voice_context.logs import get_logger

log = get_logger("voice_context.server")

#: Worker threads writing recordings at once, at most.
WRITERS = 8
#: Seconds the recorder may take, at shutdown, to finish the lines being written.
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
class _Lane:
    """The writes of one file, one at a time in the order they came (anyio's lock is fair)."""

    lock: anyio.Lock = field(default_factory=anyio.Lock)
    users: int = 0


class Recorder:
    """Writes the recordings of one server into ``record_dir``."""

    def __init__(self, record_dir: Path) -> None:
        self.record_dir = record_dir
        self.written = 0
        self._threads = anyio.CapacityLimiter(WRITERS)
        self._lanes: dict[Path, _Lane] = {}
        self._busy = 0
        self._idle = anyio.Event()
        self._closed = False

    def __repr__(self) -> str:
        return f"<Recorder {str(self.record_dir)!r} written={self.written} files_busy={len(self._lanes)}>"

    async def prepare(self) -> None:
        """Make the directory."""
        await anyio.to_thread.run_sync(lambda: self.record_dir.mkdir(parents=True, exist_ok=True))

    async def record(self, session: str, sent: dict[str, Any]) -> None:
        """Append an accepted message, as the client sent it, to its session's recording, and
        wait until it is written. A failure is logged: the request was applied, so it is
        answered anyway."""
        path = self.record_dir / recording_name(session)
        try:
            line = orjson.dumps(sent) + b"\n"
            async with self._lane(path):
                await anyio.to_thread.run_sync(
                    _append, path, line, limiter=self._threads, abandon_on_cancel=True
                )
        except (OSError, orjson.JSONEncodeError, anyio.ClosedResourceError) as exc:
            log.warning("voice_context_record_failed", path=str(path), error=str(exc))
        else:
            self.written += 1

    async def delete(self, session: str, path: Path | None = None) -> None:
        """Delete a session's recording (or the file at ``path``), after the lines queued before."""
        path = path if path is not None else self.record_dir / recording_name(session)
        try:
            async with self._lane(path):
                await anyio.to_thread.run_sync(_unlink, path, limiter=self._threads, abandon_on_cancel=True)
        except (OSError, anyio.ClosedResourceError) as exc:
            log.warning("voice_context_recording_not_deleted", path=str(path), error=str(exc))

    async def stale(self, before: float) -> list[tuple[str, Path]]:
        """The recordings last written before ``before`` (unix time), with the session each
        records (read off the event loop)."""
        return await anyio.to_thread.run_sync(_stale_recordings, self.record_dir, before)

    async def aclose(self) -> None:
        """Take no more lines, and let those being written finish, within ``SHUTDOWN_GRACE``."""
        self._closed = True
        with anyio.move_on_after(SHUTDOWN_GRACE, shield=True) as waited:
            while self._busy:
                await self._idle.wait()
        if waited.cancelled_caught:
            log.warning("voice_context_recordings_unwritten", files=len(self._lanes))

    @contextlib.asynccontextmanager
    async def _lane(self, path: Path) -> AsyncIterator[None]:
        """Hold ``path``'s turn to be written."""
        if self._closed:
            raise anyio.ClosedResourceError("the server has stopped recording")
        lane = self._lanes.get(path)
        if lane is None:
            lane = self._lanes[path] = _Lane()
        lane.users += 1
        self._busy += 1
        try:
            async with lane.lock:
                yield
        finally:
            lane.users -= 1
            if not lane.users:
                del self._lanes[path]
            self._busy -= 1
            if not self._busy:
                self._idle.set()
                self._idle = anyio.Event()


def _append(path: Path, line: bytes) -> None:
    with path.open("ab") as out:  # one write, flushed on close
        out.write(line)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


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
