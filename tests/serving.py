"""Shared by the wire tests: a real server on 127.0.0.1, a raw protocol connection, plain HTTP."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import orjson
from anyio.abc import Process, SocketAttribute
from websockets.asyncio.client import ClientConnection, connect

from voice_context.config import Settings
from voice_context.core.turns import Note, Turn
from voice_context.server import Server
from voice_context.store.base import Store
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.base import Summarizer
from voice_context.summarizers.fakes import ScriptedSummarizer

#: Every guard against a hang is a multiple of this; slow machines raise the scale.
TIMEOUT = 5.0 * float(os.environ.get("VOICE_CONTEXT_TEST_TIMEOUT_SCALE", "1"))

T0 = 1714572187.0


def settings(**server: Any) -> Settings:
    """Default settings on 127.0.0.1, port 0, with some server settings changed."""
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "shutdown_timeout": TIMEOUT,
        "turns_per_second": 1000.0,
        "turn_burst": 1000,
    }
    values.update(server)
    return Settings().with_values("server", values)


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Yield to the event loop until ``predicate()`` holds; fail after the timeout."""
    with anyio.fail_after(TIMEOUT):
        while not predicate():  # noqa: ASYNC110 - a condition owned by the code under test
            await anyio.sleep(0.001)


@asynccontextmanager
async def running(
    config: Settings | None = None,
    *,
    summarizer: Summarizer | None = None,
    store: Store | None = None,
) -> AsyncIterator[Server]:
    """A real server, listening until the block ends."""
    server = Server(
        config or settings(),
        summarizer=summarizer if summarizer is not None else ScriptedSummarizer(),
        store=store if store is not None else MemoryStore(),
    )
    with anyio.fail_after(TIMEOUT * 4):
        async with server:
            yield server


class GatedStore(MemoryStore):
    """Holds every turn append until the test opens the gate (a store mid-write)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()
        self.gate = anyio.Event()

    def close_gate(self) -> None:
        self.entered = anyio.Event()
        self.gate = anyio.Event()

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        self.entered.set()
        await self.gate.wait()
        await super().append_turn(name, index, turn)


class Proxy:
    """A TCP relay in front of a server that the test can cut, as a network drops a connection,
    or take down: then it accepts each connection and closes it at once, counting it in
    ``refused``, as a host whose server is gone (each is one connect a client tried)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.down = False
        self.stalled = False
        self.refused = 0
        self._scopes: set[anyio.CancelScope] = set()
        self._stack = AsyncExitStack()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1"

    @property
    def links(self) -> int:
        return len(self._scopes)

    async def __aenter__(self) -> Proxy:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        await self._stack.enter_async_context(listener)
        self.port = listener.extra(SocketAttribute.local_port)
        tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.callback(tg.cancel_scope.cancel)
        tg.start_soon(listener.serve, self._relay)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def cut(self) -> None:
        """Drop every relayed connection at once, without a closing handshake."""
        for scope in list(self._scopes):
            scope.cancel()

    def go_down(self) -> None:
        """Drop every relayed connection, and refuse every new one until :meth:`come_back`."""
        self.down = True
        self.cut()

    def come_back(self) -> None:
        self.down = False
        self.stalled = False

    def stall(self) -> None:
        """Keep every connection open but pass no more bytes, as a peer that hangs."""
        self.stalled = True

    async def _relay(self, client: anyio.abc.SocketStream) -> None:
        if self.down:
            self.refused += 1
            await client.aclose()
            return
        async with client, await anyio.connect_tcp("127.0.0.1", self.target_port) as upstream:
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._copy, client, upstream, scope)
                        tg.start_soon(self._copy, upstream, client, scope)
                finally:
                    self._scopes.discard(scope)

    async def _copy(
        self, src: anyio.abc.SocketStream, dst: anyio.abc.SocketStream, scope: anyio.CancelScope
    ) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            async for chunk in src:
                if not self.stalled:
                    await dst.send(chunk)
        scope.cancel()


class Hung:
    """A server that hangs: it listens on 127.0.0.1 (port 0) and takes every connection, then
    never answers a byte nor closes it, as a sidecar whose event loop is stuck. ``accepted``
    counts the connections a client made."""

    def __init__(self) -> None:
        self.port = 0
        self.accepted = 0
        self._stack = AsyncExitStack()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> Hung:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        await self._stack.enter_async_context(listener)
        self.port = listener.extra(SocketAttribute.local_port)
        tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.callback(tg.cancel_scope.cancel)
        tg.start_soon(listener.serve, self._take)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _take(self, client: anyio.abc.SocketStream) -> None:
        self.accepted += 1
        async with client:
            await anyio.sleep_forever()


def turn_body(index: int, *, speaker: str | None = None, **extra: Any) -> dict[str, Any]:
    who = speaker or ("Alice", "Bob")[index % 2]
    body: dict[str, Any] = {"speaker": who, "role": "user", "text": f"turn {index}", "at": T0 + index}
    body.update(extra)
    return body


def as_turn(body: dict[str, Any]) -> Turn:
    return Turn(body["speaker"], body["role"], body["text"], body["at"], body.get("id"))


def as_note(body: dict[str, Any]) -> Note:
    return Note(body["text"], body["at"], body.get("speaker"), body.get("source"))


@dataclass
class Wire:
    """A raw protocol connection: JSON objects in and out, pushes kept aside."""

    ws: ClientConnection
    pushed: list[dict[str, Any]] = field(default_factory=list)
    ids: int = 0

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        if isinstance(message, dict):
            message = orjson.dumps(message).decode()
        await self.ws.send(message)

    async def recv(self) -> dict[str, Any]:
        with anyio.fail_after(TIMEOUT):
            frame = await self.ws.recv()
        value = orjson.loads(frame)
        assert isinstance(value, dict)
        return value

    async def reply(self) -> dict[str, Any]:
        """The next message that is not a pushed compaction event."""
        while True:
            message = await self.recv()
            if str(message.get("type", "")).startswith("compaction."):
                self.pushed.append(message)
                continue
            return message

    async def request(self, type: str, **fields: Any) -> dict[str, Any]:
        self.ids += 1
        await self.send({"type": type, "id": self.ids, **fields})
        answer = await self.reply()
        assert answer.get("id") == self.ids, answer
        return answer

    async def push(self) -> dict[str, Any]:
        """The next pushed compaction event (waiting for it if none has arrived)."""
        if self.pushed:
            return self.pushed.pop(0)
        message = await self.recv()
        assert str(message["type"]).startswith("compaction."), message
        return message

    async def open(self, session: str, **fields: Any) -> dict[str, Any]:
        return await self.request("session.open", session=session, **fields)

    async def append(self, session: str, index: int, **extra: Any) -> dict[str, Any]:
        return await self.request("turn.append", session=session, turn=turn_body(index, **extra))

    async def closed_with(self) -> int | None:
        """Wait for the server to close the connection; its close code."""
        with anyio.fail_after(TIMEOUT):
            await self.ws.wait_closed()
        return self.ws.close_code


@asynccontextmanager
async def wire(server: Server, *, token: str | None = None, **kwargs: Any) -> AsyncIterator[Wire]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    with anyio.fail_after(TIMEOUT):
        ws = await connect(server.url, additional_headers=headers, open_timeout=TIMEOUT, **kwargs)
    async with ws:
        yield Wire(ws)


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


async def http_get(port: int, path: str, headers: Sequence[tuple[str, str]] = ()) -> HttpReply:
    """A plain HTTP/1.1 GET on 127.0.0.1 over a raw socket."""
    with anyio.fail_after(TIMEOUT):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in headers)
            await stream.send((head + "\r\n").encode())
            data = b""
            while True:
                try:
                    data += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    break
    raw_head, _, body = data.partition(b"\r\n\r\n")
    lines = raw_head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    parsed = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        parsed[key.strip().lower()] = value.strip()
    return HttpReply(status, parsed, body)


@dataclass
class Running:
    """A ``voice-context serve`` process and where it listens."""

    process: Process
    url: str
    port: int


#: What every server the suite starts is told. Some fifty of them: each reads the tokenizer's
#: file when a token budget first needs it, not at its start (half a second of CPU apiece).
SERVE_ENV = {"VOICE_CONTEXT_SERVER_PRELOAD_TOKENIZER": "false"}


def clean_env() -> dict[str, str]:
    """This process's environment for a server it starts: none of the developer's own
    ``VOICE_CONTEXT_*`` settings, only :data:`SERVE_ENV`."""
    return {k: v for k, v in os.environ.items() if not k.startswith("VOICE_CONTEXT_")} | SERVE_ENV


@asynccontextmanager
async def serve_process(*args: str, env: Mapping[str, str] | None = None) -> AsyncIterator[Running]:
    """``voice-context serve`` as a real process on a free port, killed when the block ends.

    Its stderr is a pipe nobody reads while the block runs: keep the logs few
    (``--log-level warning``) or the server blocks once the pipe is full.
    """
    command = [sys.executable, "-m", "voice_context", "serve", "--port", "0", "--log-format", "json", *args]
    async with await anyio.open_process(command, env={**clean_env(), **(env or {})}) as process:
        try:
            assert process.stdout is not None
            with anyio.fail_after(TIMEOUT * 2):
                line = b""
                while not line.endswith(b"\n"):
                    line += await process.stdout.receive()
            text = line.decode().split("\n")[0].strip()  # the inspector's URL may come with it
            assert text.startswith("listening on ws://127.0.0.1:"), text
            url = text.removeprefix("listening on ")
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            yield Running(process, url, port)
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.move_on_after(TIMEOUT):
                    await process.wait()
