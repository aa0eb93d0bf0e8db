"""A local stand-in for the Gemini Live API's websocket, reached through google-genai's own client.

It listens on 127.0.0.1 on a port the OS picks, over TLS with a certificate it makes
for itself (google-genai always speaks ``wss`` to a Gemini API base URL), and speaks
the Live API's JSON messages on
``/ws/google.ai.generativelanguage.{version}.GenerativeService.BidiGenerateContent``::

    async with GeminiLiveServer(lifetime=600, clock=clock) as live:
        client = genai.Client(api_key="local", http_options=live.http_options())
        async with client.aio.live.connect(model="gemini-live-2.5-flash-preview", config=...) as s:
            ...
        live.connections[0].system_instruction      # what the first connection was told

What it does, as the service does it:

* takes the ``setup`` message and answers ``setupComplete``; records each connection's
  setup, its ``systemInstruction`` text, the handle it resumes and its API key;
* takes realtime input and client content, and answers each user turn with one exchange:
  ``inputTranscription`` chunks of what it heard (when the setup asks for input
  transcription), ``sessionResumptionUpdate`` with ``resumable: false`` while the model
  answers, a ``modelTurn`` with audio, ``outputTranscription`` chunks of the model's words
  (when asked for), ``generationComplete``, ``turnComplete``, then a new resumable handle
  (``sessionResumptionUpdate`` with ``newHandle``) when the setup asked for resumption;
* sends ``goAway`` with ``timeLeft`` (``go_away_before`` seconds) before it closes a
  connection at the end of its ``lifetime`` (close code 1011, as the service does), on
  ``clock`` (share a :class:`~voice_context.testing.clock.ManualClock` with the test to run
  a long call in a moment);
* :meth:`drop` closes every connection without warning, as a fault does;
* resumes a session from any handle it gave: the resumed connection's model knows the
  conversation so far. With ``refuse_resumption`` it refuses every handle, and with
  ``refuse_while_open`` a handle whose connection is still open (closing the new connection
  before ``setupComplete``, code 1008 or 1011).

What a fake stands in for is a model's words: the user's "audio" is text (its bytes, as
UTF-8, are what the transcription hears), and ``model`` (a function of what was heard,
the connection's system instruction and the session's history) says the reply; by
default it echoes.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import itertools
import re
import ssl
import tempfile
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio
import orjson
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from voice_context.integrations.clock import Clock, WallClock

if TYPE_CHECKING:
    from google.genai.types import HttpOptions

__all__ = ["GeminiLiveServer", "LiveConnection", "LiveReply", "Prompt", "echo"]

PATH = re.compile(r"^/ws/google\.ai\.generativelanguage\.[^./]+\.GenerativeService\.BidiGenerateContent")
DEADLINE = (1011, "Deadline expired before operation could complete.")
INVALID_HANDLE = (1008, "Session resumption handle is invalid or expired.")
STILL_OPEN = (1011, "The session is still served by another connection.")


@dataclass(frozen=True, slots=True)
class Prompt:
    """What the model answers: what it ``heard`` (or was sent as text), the connection's
    ``system_instruction``, and the session's ``history`` before it, as ``(role, text)``."""

    heard: str
    system_instruction: str
    history: tuple[tuple[str, str], ...]


def echo(prompt: Prompt) -> str:
    """The default model's words."""
    return f"You said: {prompt.heard}"


@dataclass(frozen=True, slots=True)
class LiveReply:
    """One exchange as the server played it, with the system instruction of the connection
    whose model said it."""

    connection: int
    heard: str
    said: str
    system_instruction: str
    at: float


@dataclass(eq=False)
class LiveConnection:
    """One connection as the server saw it."""

    number: int
    path: str
    api_key: str | None
    opened_at: float
    setup: dict[str, Any] = field(default_factory=dict)
    system_instruction: str = ""
    resumes: str | None = None
    """The handle this connection asked to resume."""
    refused: str | None = None
    session: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    replies: list[LiveReply] = field(default_factory=list)
    go_away_at: float | None = None
    closed_at: float | None = None
    closed_by_server: bool = False

    @property
    def resumed(self) -> bool:
        return self.resumes is not None and self.refused is None


@dataclass(frozen=True, slots=True)
class _Handle:
    session: int
    history: tuple[tuple[str, str], ...]
    connection: LiveConnection


def _field(message: Any, camel: str) -> Any:
    """A field by its JSON name or its proto name (the client sends either)."""
    if not isinstance(message, dict):
        return None
    if camel in message:
        return message[camel]
    snake = re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()
    return message.get(snake)


def _text_of(content: Any) -> str:
    parts = _field(content, "parts")
    if isinstance(content, str):
        return content
    if not isinstance(parts, list):
        return ""
    return "".join(str(_field(p, "text") or "") for p in parts)


def _chunks(text: str, words: int) -> list[str]:
    """``text`` in pieces of ``words`` words, each with the spaces before it, as the service
    streams transcriptions."""
    pieces = re.findall(r"\s*\S+", text)
    return ["".join(pieces[k : k + words]) for k in range(0, len(pieces), words)]


def _certificate() -> tuple[bytes, bytes]:
    """A self-signed certificate for 127.0.0.1 and its key, in PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class GeminiLiveServer:
    """The stand-in; see the module docstring. ``base_url`` and :meth:`http_options` are
    for ``genai.Client``; ``connections`` and ``replies`` say what happened."""

    def __init__(
        self,
        *,
        model: Callable[[Prompt], str] = echo,
        lifetime: float | None = None,
        go_away_before: float = 60.0,
        clock: Clock | None = None,
        refuse_resumption: bool = False,
        refuse_while_open: bool = False,
        chunk_words: int = 2,
    ) -> None:
        if lifetime is not None and not 0 <= go_away_before <= lifetime:
            raise ValueError("go_away_before must be within the connection's lifetime")
        self.model = model
        self.lifetime = lifetime
        self.go_away_before = go_away_before
        self.clock: Clock = clock if clock is not None else WallClock()
        self.refuse_resumption = refuse_resumption
        self.refuse_while_open = refuse_while_open
        self.chunk_words = chunk_words
        self.connections: list[LiveConnection] = []
        self.port = 0
        self._handles: dict[str, _Handle] = {}
        self._open: dict[LiveConnection, ServerConnection] = {}
        self._sessions = itertools.count(1)
        self._handle_ids = itertools.count(1)
        self._stack = AsyncExitStack()
        self._server: Server | None = None
        self.client_ssl = ssl.create_default_context()
        self.certificate = b""
        """The server's certificate (PEM), for a client that trusts what a file holds (google-genai
        reads ``SSL_CERT_FILE`` when given no ``ssl`` context)."""

    def __repr__(self) -> str:
        return (
            f"<GeminiLiveServer port={self.port} connections={len(self.connections)} "
            f"open={len(self._open)} replies={len(self.replies)}>"
        )

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def http_options(self) -> HttpOptions:
        """``genai.Client(http_options=...)`` that reaches this server and trusts its certificate."""
        from google.genai.types import HttpOptions

        return HttpOptions(base_url=self.base_url, async_client_args={"ssl": self.client_ssl})

    @property
    def replies(self) -> list[LiveReply]:
        """Every exchange of every connection, in the order played."""
        return sorted((r for c in self.connections for r in c.replies), key=lambda r: (r.at, r.connection))

    async def __aenter__(self) -> Self:
        cert, key = _certificate()
        with tempfile.TemporaryDirectory() as folder:
            (Path(folder) / "cert.pem").write_bytes(cert)
            (Path(folder) / "key.pem").write_bytes(key)
            server_ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server_ssl.load_cert_chain(Path(folder) / "cert.pem", Path(folder) / "key.pem")
        self.certificate = cert
        self.client_ssl = ssl.create_default_context(cadata=cert.decode())
        self._server = await self._stack.enter_async_context(
            serve(self._handler, "127.0.0.1", 0, ssl=server_ssl)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()

    async def drop(self) -> None:
        """Close every open connection at once, without a ``goAway`` (as a network or a server
        fault does)."""
        for conn, ws in list(self._open.items()):
            conn.closed_at = self.clock.now()
            conn.closed_by_server = True
            await ws.close(1011, "Internal error encountered.")

    async def _handler(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        path = ws.request.path
        conn = LiveConnection(
            len(self.connections) + 1, path, ws.request.headers.get("x-goog-api-key"), self.clock.now()
        )
        self.connections.append(conn)
        if not PATH.match(path):
            await ws.close(1008, f"no Live API method at {path}")
            return
        try:
            setup = _field(orjson.loads(await ws.recv()), "setup")
            if not isinstance(setup, dict):
                await ws.close(1007, "the first message must be a setup")
                return
            history = self._set_up(conn, setup)
            if conn.refused is not None:
                code, reason = STILL_OPEN if conn.refused == "still_open" else INVALID_HANDLE
                await ws.close(code, reason)
                return
            self._open[conn] = ws
            await self._send(ws, {"setupComplete": {}})
            async with anyio.create_task_group() as tg:
                if self.lifetime is not None:
                    tg.start_soon(self._expire, ws, conn, self.lifetime)
                await self._serve(ws, conn, setup, history)
                tg.cancel_scope.cancel()
        except ConnectionClosed:
            pass
        finally:
            self._open.pop(conn, None)
            if conn.closed_at is None:
                conn.closed_at = self.clock.now()

    def _set_up(self, conn: LiveConnection, setup: dict[str, Any]) -> list[tuple[str, str]]:
        """Record a setup; the session's history when it resumes one (``conn.refused`` says
        why it may not)."""
        conn.setup = setup
        conn.system_instruction = _text_of(_field(setup, "systemInstruction"))
        resumption = _field(setup, "sessionResumption")
        handle = _field(resumption, "handle") if isinstance(resumption, dict) else None
        if not handle:
            conn.session = next(self._sessions)
            return []
        conn.resumes = str(handle)
        known = self._handles.get(conn.resumes)
        if known is None or self.refuse_resumption:
            conn.refused = "invalid_handle"
            return []
        if self.refuse_while_open and known.connection in self._open:
            conn.refused = "still_open"
            return []
        conn.session = known.session
        return list(known.history)

    async def _expire(self, ws: ServerConnection, conn: LiveConnection, lifetime: float) -> None:
        await self.clock.sleep_until(conn.opened_at + lifetime - self.go_away_before)
        conn.go_away_at = self.clock.now()
        await self._send(ws, {"goAway": {"timeLeft": f"{self.go_away_before:g}s"}})
        await self.clock.sleep_until(conn.opened_at + lifetime)
        conn.closed_at = self.clock.now()
        conn.closed_by_server = True
        await ws.close(*DEADLINE)

    async def _serve(
        self,
        ws: ServerConnection,
        conn: LiveConnection,
        setup: dict[str, Any],
        history: list[tuple[str, str]],
    ) -> None:
        async for raw in ws:
            message = orjson.loads(raw)
            conn.received.append(message)
            realtime = _field(message, "realtimeInput")
            content = _field(message, "clientContent")
            if isinstance(realtime, dict):
                audio = _field(realtime, "audio")
                chunks = _field(realtime, "mediaChunks")
                if isinstance(audio, dict):
                    await self._exchange(ws, conn, setup, history, self._hear(audio), spoken=True)
                elif isinstance(chunks, list) and chunks:
                    heard = " ".join(self._hear(c) for c in chunks if isinstance(c, dict))
                    await self._exchange(ws, conn, setup, history, heard, spoken=True)
                elif isinstance(_field(realtime, "text"), str):
                    await self._exchange(
                        ws, conn, setup, history, str(_field(realtime, "text")), spoken=False
                    )
            elif isinstance(content, dict) and _field(content, "turnComplete"):
                turns = _field(content, "turns") or []
                typed = " ".join(_text_of(t) for t in turns if _field(t, "role") in (None, "user"))
                if typed.strip():
                    await self._exchange(ws, conn, setup, history, typed, spoken=False)

    @staticmethod
    def _hear(blob: dict[str, Any]) -> str:
        """The stand-in's transcription: the audio's bytes as text."""
        return base64.b64decode(str(_field(blob, "data") or "")).decode("utf-8", "replace")

    async def _exchange(
        self,
        ws: ServerConnection,
        conn: LiveConnection,
        setup: dict[str, Any],
        history: list[tuple[str, str]],
        heard: str,
        *,
        spoken: bool,
    ) -> None:
        resumable = isinstance(_field(setup, "sessionResumption"), dict)
        if spoken and isinstance(_field(setup, "inputAudioTranscription"), dict):
            for chunk in _chunks(heard, self.chunk_words):
                await self._send(ws, {"serverContent": {"inputTranscription": {"text": chunk}}})
        if resumable:
            await self._send(ws, {"sessionResumptionUpdate": {}})  # not resumable while it answers
        said = self.model(Prompt(heard, conn.system_instruction, tuple(history)))
        audio = base64.b64encode(said.encode()).decode()
        parts: list[dict[str, Any]] = [{"inlineData": {"mimeType": "audio/pcm;rate=24000", "data": audio}}]
        modalities = _field(_field(setup, "generationConfig"), "responseModalities") or []
        if "TEXT" in modalities:
            parts.append({"text": said})
        await self._send(ws, {"serverContent": {"modelTurn": {"parts": parts}}})
        if isinstance(_field(setup, "outputAudioTranscription"), dict):
            for chunk in _chunks(said, self.chunk_words):
                await self._send(ws, {"serverContent": {"outputTranscription": {"text": chunk}}})
        await self._send(ws, {"serverContent": {"generationComplete": True}})
        await self._send(ws, {"serverContent": {"turnComplete": True}})
        history += [("user", heard), ("model", said)]
        conn.replies.append(LiveReply(conn.number, heard, said, conn.system_instruction, self.clock.now()))
        if resumable:
            handle = f"handle-{conn.session}-{next(self._handle_ids)}"
            self._handles[handle] = _Handle(conn.session, tuple(history), conn)
            await self._send(ws, {"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}})

    @staticmethod
    async def _send(ws: ServerConnection, message: dict[str, Any]) -> None:
        await ws.send(orjson.dumps(message).decode())
