"""A small, real, scripted server for the OpenAI chat-completions API.

It listens on 127.0.0.1 on a port the OS picks, speaks plain HTTP/1.1 with
keep-alive, and answers ``POST /v1/chat/completions`` the way it is told to,
one scripted behaviour per request; anything else gets a 404. Point any
OpenAI client at :attr:`OpenAIServer.base_url`::

    async with OpenAIServer(default=Reply("all quiet")) as server:
        server.script(Status(500), Reply("Alice picked the blue team."))
        ...  # call the client with base_url=server.base_url
        assert server.requests[-1].json["model"] == "some-model"

A request with ``"stream": true`` gets its answer as the real API streams
it: ``text/event-stream`` in chunked transfer encoding, one
``chat.completion.chunk`` event per word (or per ``Reply.chunk_chars``), the finish reason in the last
chunk (and a usage chunk when ``stream_options.include_usage`` asks), then
``data: [DONE]``. Any other request gets one ``chat.completion`` JSON body.
A streamed or stalled answer whose client hangs up before it is complete is
listed in :attr:`OpenAIServer.abandoned`, which is how a test sees that a
server like llama.cpp would have stopped generating.

Behaviours:

* ``Reply(text, chunk_chars=None)``: a valid ``chat.completion`` whose first choice
  says ``text``; streamed in pieces of ``chunk_chars`` characters when that is set.
* ``ReplyWith(fn)``: the same, with the words computed by ``fn(request_json)``.
* ``Stall(seconds, then=None)``: wait, then do ``then`` (by default, the
  default behaviour). ``Stall()`` never answers at all.
* ``Status(code, body=None, headers={})``: that HTTP status with a JSON error
  body (or ``body``, JSON-encoded unless it is ``str`` or ``bytes``).
* ``Garbage(data)``: a 200 with ``data`` as its JSON body, which it is not.
* ``Empty()``: a valid completion whose content is the empty string.
* ``Cut(text)``: streamed, the words of ``text`` then ``[DONE]`` without a
  finish reason (what llama.cpp's Python server sends to a stream it
  interrupts for another request); not streamed, a 200 with ``text`` as half
  a JSON body.
* ``StallMidStream(text)``: streamed, the words of ``text``, then nothing
  until the client hangs up; not streamed, a plain ``Stall()``.
* ``CallTool(name, arguments, call_id)``: the model asks for a function: an
  assistant message with one ``tool_calls`` entry (its arguments as JSON text,
  streamed in pieces as the real API does) and finish reason ``tool_calls``.

When the script runs out, ``default`` applies to every further request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from types import TracebackType
from typing import Any, Self

__all__ = [
    "Behaviour",
    "CallTool",
    "Cut",
    "Empty",
    "Garbage",
    "OpenAIServer",
    "RecordedRequest",
    "Reply",
    "ReplyWith",
    "Stall",
    "StallMidStream",
    "Status",
]

CHAT_COMPLETIONS = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer with a valid completion saying ``text``; streamed, in pieces of ``chunk_chars``
    characters when that is set (a server that sends many tokens a chunk), else a word a chunk."""

    text: str
    chunk_chars: int | None = None


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


@dataclass(frozen=True, slots=True)
class Cut:
    """Stream the words of ``text``, then end the stream without a finish reason."""

    text: str


@dataclass(frozen=True, slots=True)
class StallMidStream:
    """Stream the words of ``text``, then send nothing more until the client hangs up."""

    text: str


@dataclass(frozen=True, slots=True)
class CallTool:
    """Answer with a call of the function ``name`` with ``arguments`` (a JSON value), id ``call_id``."""

    name: str
    arguments: object = field(default_factory=dict)
    call_id: str = "call_1"

    def as_message(self) -> dict[str, Any]:
        """The assistant message that makes the call, as a complete (not streamed) answer has it."""
        call = {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}


Behaviour = Reply | ReplyWith | Stall | Status | Garbage | Empty | Cut | StallMidStream | CallTool


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
    answered with a 404; ``abandoned`` those whose client hung up before
    their answer was complete (while it stalled, or in the middle of a
    stream).
    """

    def __init__(self, *, default: Behaviour = Reply("ok"), model: str = "scripted") -> None:
        self.default: Behaviour = default
        self.model = model
        self.requests: list[RecordedRequest] = []
        self.abandoned: list[RecordedRequest] = []
        self._hung_up = asyncio.Event()
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

    async def wait_abandoned(self, count: int = 1) -> list[RecordedRequest]:
        """Wait until ``count`` answers have been abandoned by their clients; the list of them."""
        while len(self.abandoned) < count:
            self._hung_up.clear()
            await self._hung_up.wait()
        return self.abandoned

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
                    if not await self._perform(behaviour, request, reader, writer, keep_alive=keep_alive):
                        self.abandoned.append(request)
                        self._hung_up.set()
                        return
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
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        keep_alive: bool,
    ) -> bool:
        """Answer ``request`` as ``behaviour`` says; ``False`` if the client hung up first."""
        streamed = isinstance(request.json, dict) and request.json.get("stream") is True
        match behaviour:
            case Reply(text) | Cut(text) | StallMidStream(text) if streamed:
                return await self._stream(behaviour, request, text, reader, writer)
            case CallTool() if streamed:
                return await self._stream_call(behaviour, request, writer)
            case CallTool():
                message, finish = behaviour.as_message(), "tool_calls"
                body = self._completion(request, "", message=message, finish_reason=finish)
                await self._send(writer, 200, body, keep_alive=keep_alive)
            case ReplyWith(fn):
                try:
                    text = fn(request.json)
                except Exception as exc:  # a broken test helper: say so instead of hanging up
                    failed = _error_body(f"ReplyWith function raised {exc!r}", "server_error")
                    await self._send(writer, 500, failed, keep_alive=keep_alive)
                    return True
                return await self._perform(Reply(text), request, reader, writer, keep_alive=keep_alive)
            case Empty():
                return await self._perform(Reply(""), request, reader, writer, keep_alive=keep_alive)
            case Reply(text):
                await self._send(writer, 200, self._completion(request, text), keep_alive=keep_alive)
            case Cut(text):
                half = json.dumps(self._completion(request, text))[:40]
                await self._send(writer, 200, half, keep_alive=False)
            case StallMidStream():
                return await self._perform(Stall(), request, reader, writer, keep_alive=keep_alive)
            case Garbage(data):
                await self._send(writer, 200, data, keep_alive=keep_alive)
            case Status(code, body, headers):
                if body is None:
                    body = _error_body(
                        f"scripted status {code}", "api_error" if code >= 500 else "invalid_request_error"
                    )
                await self._send(writer, code, body, headers=headers, keep_alive=keep_alive)
            case Stall(seconds, then):
                if not await _wait_unless_client_leaves(reader, seconds):
                    return False
                return await self._perform(
                    self.default if then is None else then, request, reader, writer, keep_alive=keep_alive
                )
        return True

    async def _stream(
        self,
        behaviour: Behaviour,
        request: RecordedRequest,
        text: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Send ``text`` as server-sent events (a word a chunk, or ``Reply.chunk_chars`` a chunk);
        ``False`` if the client hung up."""
        asked = request.json if isinstance(request.json, dict) else {}
        chunk_id = f"chatcmpl-{next(self._ids)}"
        size = behaviour.chunk_chars if isinstance(behaviour, Reply) else None
        if size:
            pieces = [text[i : i + size] for i in range(0, len(text), size)] or [text]
        else:
            pieces = re.findall(r"\s*\S+\s*", text) or [text]

        def event(delta: dict[str, str], finish_reason: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._chunk(chunk_id, asked, [choice])

        try:
            writer.write(_STREAM_HEAD)
            await _send_event(writer, event({"role": "assistant", "content": ""}))
            for piece in pieces:
                await _send_event(writer, event({"content": piece}))
            match behaviour:
                case StallMidStream():
                    await _wait_unless_client_leaves(reader, math.inf)
                    return False
                case Reply():
                    await _send_event(writer, event({}, "stop"))
                    options = asked.get("stream_options")
                    if isinstance(options, dict) and options.get("include_usage"):
                        usage = self._chunk(chunk_id, asked, [])
                        usage["usage"] = self._usage(asked, text)
                        await _send_event(writer, usage)
            await _end_stream(writer)
        except ConnectionError:
            return False
        return True

    async def _stream_call(
        self, behaviour: CallTool, request: RecordedRequest, writer: asyncio.StreamWriter
    ) -> bool:
        """Stream a tool call as the real API does: the call's id and name first, then its
        arguments in pieces, then finish reason ``tool_calls``; ``False`` if the client hung up."""
        asked = request.json if isinstance(request.json, dict) else {}
        chunk_id = f"chatcmpl-{next(self._ids)}"
        arguments = json.dumps(behaviour.arguments)
        opening = {"index": 0, "id": behaviour.call_id, "type": "function"}
        deltas: list[dict[str, Any]] = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{**opening, "function": {"name": behaviour.name, "arguments": ""}}],
            },
            *(
                {"tool_calls": [{"index": 0, "function": {"arguments": arguments[i : i + 8]}}]}
                for i in range(0, len(arguments), 8)
            ),
        ]
        try:
            writer.write(_STREAM_HEAD)
            for delta in deltas:
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
                await _send_event(writer, self._chunk(chunk_id, asked, [choice]))
            done = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
            await _send_event(writer, self._chunk(chunk_id, asked, [done]))
            await _end_stream(writer)
        except ConnectionError:
            return False
        return True

    def _chunk(self, chunk_id: str, asked: dict[str, Any], choices: list[Any]) -> dict[str, Any]:
        return {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": asked.get("model", self.model),
            "choices": choices,
        }

    @staticmethod
    def _usage(asked: dict[str, Any], text: str) -> dict[str, int]:
        messages = asked.get("messages")
        prompt_words = (
            sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
            if isinstance(messages, list)
            else 0
        )
        completion_words = len(text.split())
        return {
            "prompt_tokens": prompt_words,
            "completion_tokens": completion_words,
            "total_tokens": prompt_words + completion_words,
        }

    def _completion(
        self,
        request: RecordedRequest,
        text: str,
        *,
        message: dict[str, Any] | None = None,
        finish_reason: str = "stop",
    ) -> dict[str, Any]:
        asked = request.json if isinstance(request.json, dict) else {}
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": asked.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": message or {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": self._usage(asked, text),
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


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
)


async def _end_stream(writer: asyncio.StreamWriter) -> None:
    """``data: [DONE]``, then the last (empty) HTTP chunk."""
    await _send_event(writer, "[DONE]")
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _send_event(writer: asyncio.StreamWriter, data: object) -> None:
    """One server-sent event (``data: ...`` and a blank line) as one HTTP chunk."""
    payload = data if isinstance(data, str) else json.dumps(data)
    event = f"data: {payload}\n\n".encode()
    writer.write(f"{len(event):x}\r\n".encode("latin-1") + event + b"\r\n")
    await writer.drain()


async def _wait_unless_client_leaves(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Wait ``seconds`` (forever if infinite); ``False`` as soon as the client hangs up."""

    async def client_left() -> None:
        while await reader.read(4096):
            pass  # a client that sends more while it waits has not left

    try:
        async with asyncio.timeout(None if math.isinf(seconds) else seconds):
            await client_left()
    except TimeoutError:
        return True
    return False


def _error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
