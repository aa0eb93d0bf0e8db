"""A small, real, scripted server for the OpenAI chat-completions API.

It listens on 127.0.0.1 on a port the OS picks, speaks plain HTTP/1.1 with
keep-alive, and answers ``POST /v1/chat/completions`` the way it is told to,
one scripted behaviour per request; anything else gets a 404. Point any
OpenAI client at :attr:`OpenAIServer.base_url`::

    async with OpenAIServer(default=Reply("all quiet")) as server:
        server.script(Status(500), Reply("Alice picked the blue team."))
        ...  # call the client with base_url=server.base_url
        assert server.requests[-1].json["model"] == "some-model"

Behaviours:

* ``Reply(text)``: a valid ``chat.completion`` whose first choice says ``text``.
* ``ReplyWith(fn)``: the same, with the words computed by ``fn(request_json)``.
* ``Stall(seconds, then=None)``: wait, then do ``then`` (by default, the
  default behaviour). ``Stall()`` never answers at all.
* ``Status(code, body=None, headers={})``: that HTTP status with a JSON error
  body (or ``body``, JSON-encoded unless it is ``str`` or ``bytes``).
* ``Garbage(data)``: a 200 with ``data`` as its JSON body, which it is not.
* ``Empty()``: a valid completion whose content is the empty string.

When the script runs out, ``default`` applies to every further request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any, Self

__all__ = [
    "Behaviour",
    "Empty",
    "Garbage",
    "OpenAIServer",
    "RecordedRequest",
    "Reply",
    "ReplyWith",
    "Stall",
    "Status",
]

CHAT_COMPLETIONS = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer with a valid completion saying ``text``."""

    text: str


@dataclass(frozen=True, slots=True)
class ReplyWith:
    """Answer with a valid completion saying ``fn(request_json)``."""

    fn: Callable[[Any], str]


@dataclass(frozen=True, slots=True)
class Stall:
    """Wait ``seconds`` (forever by default), then behave as ``then`` or the default."""

    seconds: float = math.inf
    then: Behaviour | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """Answer with HTTP ``code``, an OpenAI-style error body unless ``body`` is given."""

    code: int
    body: object = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Garbage:
    """Answer 200, ``Content-Type: application/json``, with ``data`` as the body."""

    data: bytes = b'{"choices": [{"message": {"content": "cut off'


@dataclass(frozen=True, slots=True)
class Empty:
    """Answer with a valid completion whose content is empty."""


Behaviour = Reply | ReplyWith | Stall | Status | Garbage | Empty


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as the server received it. ``json`` is ``None`` if the body was not JSON."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    json: Any


class _BadRequest(Exception):
    """The bytes on the wire are not an HTTP request this server understands."""


class OpenAIServer:
    """A scripted OpenAI-compatible server; use it with ``async with``.

    ``requests`` lists every request received, in order, including those
    answered with a 404.
    """

    def __init__(self, *, default: Behaviour = Reply("ok"), model: str = "scripted") -> None:
        self.default: Behaviour = default
        self.model = model
        self.requests: list[RecordedRequest] = []
        self._script: deque[Behaviour] = deque()
        self._server: asyncio.Server | None = None
        self._port = 0
        self._connections: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Start listening on 127.0.0.1, on a port the OS picks."""
        if self._server is not None:
            raise RuntimeError("server already started")
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self._port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop listening and drop every open connection, stalled ones included."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- what tests use ----------------------------------------------------

    @property
    def port(self) -> int:
        """The port the server listens on (0 before it starts)."""
        return self._port

    @property
    def base_url(self) -> str:
        """The API root to give an OpenAI client, ending in ``/v1``."""
        if self._server is None:
            raise RuntimeError("server not started")
        return f"http://127.0.0.1:{self._port}/v1"

    def script(self, *behaviours: Behaviour) -> None:
        """Queue behaviours for the next chat-completions requests, in order."""
        self._script.extend(behaviours)

    @property
    def pending(self) -> int:
        """How many scripted behaviours have not been used yet."""
        return len(self._script)

    @property
    def completions(self) -> list[RecordedRequest]:
        """The chat-completions requests received, in order."""
        return [r for r in self.requests if r.method == "POST" and r.path == CHAT_COMPLETIONS]

    # -- HTTP ----------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    request = await self._read_request(reader)
                except _BadRequest as exc:
                    await self._send(
                        writer, 400, _error_body(str(exc), "invalid_request_error"), keep_alive=False
                    )
                    return
                if request is None:
                    return
                self.requests.append(request)
                keep_alive = request.headers.get("connection", "").lower() != "close"
                if request.method == "POST" and request.path == CHAT_COMPLETIONS:
                    behaviour = self._script.popleft() if self._script else self.default
                    await self._perform(behaviour, request, writer, keep_alive=keep_alive)
                else:
                    message = f"no route for {request.method} {request.path}"
                    await self._send(writer, 404, _error_body(message, "not_found"), keep_alive=keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return  # the client went away, e.g. after timing out on a stall
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_request(self, reader: asyncio.StreamReader) -> RecordedRequest | None:
        line = await reader.readline()
        while line in (b"\r\n", b"\n"):
            line = await reader.readline()
        if not line:
            return None
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest(f"bad request line {line!r}")
        method, target, _ = parts
        headers: dict[str, str] = {}
        while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, sep, value = header.decode("latin-1").partition(":")
            if not sep:
                raise _BadRequest(f"bad header line {header!r}")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise _BadRequest("chunked request bodies are not supported; send Content-Length")
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError as exc:
            raise _BadRequest("bad Content-Length") from exc
        body = await reader.readexactly(length) if length > 0 else b""
        try:
            parsed: Any = json.loads(body) if body else None
        except ValueError:
            parsed = None
        return RecordedRequest(method, target.split("?", 1)[0], headers, body, parsed)

    async def _perform(
        self,
        behaviour: Behaviour,
        request: RecordedRequest,
        writer: asyncio.StreamWriter,
        *,
        keep_alive: bool,
    ) -> None:
        match behaviour:
            case Reply(text):
                await self._send(writer, 200, self._completion(request, text), keep_alive=keep_alive)
            case ReplyWith(fn):
                try:
                    text = fn(request.json)
                except Exception as exc:  # a broken test helper: say so instead of hanging up
                    failed = _error_body(f"ReplyWith function raised {exc!r}", "server_error")
                    await self._send(writer, 500, failed, keep_alive=keep_alive)
                else:
                    await self._send(writer, 200, self._completion(request, text), keep_alive=keep_alive)
            case Empty():
                await self._send(writer, 200, self._completion(request, ""), keep_alive=keep_alive)
            case Garbage(data):
                await self._send(writer, 200, data, keep_alive=keep_alive)
            case Status(code, body, headers):
                if body is None:
                    body = _error_body(
                        f"scripted status {code}", "api_error" if code >= 500 else "invalid_request_error"
                    )
                await self._send(writer, code, body, headers=headers, keep_alive=keep_alive)
            case Stall(seconds, then):
                if math.isinf(seconds):
                    await asyncio.get_running_loop().create_future()  # until the server closes
                await asyncio.sleep(seconds)
                await self._perform(
                    self.default if then is None else then, request, writer, keep_alive=keep_alive
                )

    def _completion(self, request: RecordedRequest, text: str) -> dict[str, Any]:
        asked = request.json if isinstance(request.json, dict) else {}
        messages = asked.get("messages")
        prompt_words = (
            sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
            if isinstance(messages, list)
            else 0
        )
        completion_words = len(text.split())
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": asked.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_words,
                "completion_tokens": completion_words,
                "total_tokens": prompt_words + completion_words,
            },
        }

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter,
        status: int,
        body: object,
        *,
        headers: Mapping[str, str] | None = None,
        keep_alive: bool,
    ) -> None:
        if isinstance(body, bytes):
            payload = body
        elif isinstance(body, str):
            payload = body.encode()
        else:
            payload = json.dumps(body).encode()
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        fields = {
            "Content-Type": "application/json",
            "Content-Length": str(len(payload)),
            "Connection": "keep-alive" if keep_alive else "close",
        }
        for name, value in (headers or {}).items():
            fields = {k: v for k, v in fields.items() if k.lower() != name.lower()}
            fields[name] = value
        head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
        writer.write(head.encode("latin-1") + b"\r\n" + payload)
        await writer.drain()


def _error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
