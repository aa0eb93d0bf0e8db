"""HTTP on the websocket's port, and the admission of each websocket handshake.

``/healthz``, ``/metrics`` and ``/favicon.ico`` answer anyone; ``/inspector``
(:mod:`voice_context.server.inspector`) answers behind the same tokens as the protocol. A
handshake on ``/v1`` is refused with HTTP 503 while the server is short of file descriptors,
past ``max_connections`` or past a token's ``max_connections_per_owner``, and with 401 without
a valid token when tokens are configured; each refusal's body is an ``error`` message.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from voice_context.codec import (
    INTERNAL,
    RATE_LIMITED,
    UNAUTHORIZED,
    UNKNOWN_SESSION,
    ErrorReply,
    encode_reply,
)
from voice_context.config import ServerSettings
from voice_context.errors import StoreError, UnknownSession
from voice_context.logs import get_logger
from voice_context.manager import SessionManager
from voice_context.server import inspector
from voice_context.server.descriptors import DescriptorGuard, refusal_body
from voice_context.server.limits import Limits
from voice_context.server.metrics import CONTENT_TYPE, Metrics
from voice_context.store.base import Store

log = get_logger("voice_context.server")

PATH = "/v1"


def bearer_token(headers: Headers) -> str | None:
    value = headers.get("Authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_matches(token: str | None, tokens: tuple[str, ...]) -> bool:
    if token is None:
        return False
    matched = False
    for candidate in tokens:  # compare against all of them, in constant time each
        matched |= hmac.compare_digest(token.encode(), candidate.encode())
    return matched


def owner_of(token: str | None) -> str | None:
    """Who owns the sessions opened under a token: a digest of it (tokens are never stored)."""
    if token is None:
        return None
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]


class Health(NamedTuple):
    """What ``/healthz`` says."""

    stopping: bool
    sessions: int
    connections: int
    in_flight: int


@dataclass(eq=False, kw_only=True)
class Routes:
    """Answers the HTTP requests on the server's port (websockets' ``process_request``)."""

    settings: ServerSettings
    metrics: Metrics
    journal: inspector.Journal
    descriptors: DescriptorGuard
    limits: Limits
    health: Callable[[], Health]
    manager: Callable[[], SessionManager | None]
    store: Callable[[], Store | None]

    def owner(self, request: Request | None) -> str | None:
        """The owner of a connection's sessions: its token's, when tokens are configured."""
        if not self.settings.auth_tokens or request is None:
            return None
        return owner_of(bearer_token(request.headers))

    def process_request(
        self, connection: ServerConnection, request: Request
    ) -> Response | Coroutine[Any, Any, Response] | None:
        """An HTTP response (a coroutine for the inspector's: it may read the store), or
        ``None`` to let the websocket handshake go on."""
        path = urlsplit(request.path).path
        if path == "/healthz":
            health = self.health()
            status = HTTPStatus.SERVICE_UNAVAILABLE if health.stopping else HTTPStatus.OK
            body = {
                "status": "stopping" if health.stopping else "ok",
                "sessions": health.sessions,
                "connections": health.connections,
                "in_flight": health.in_flight,
                "worker": self.settings.worker,  # which of `serve --workers`' processes answered
            }
            return _response(status, orjson.dumps(body), "application/json")
        if path == "/metrics":
            return _response(HTTPStatus.OK, self.metrics.render(), CONTENT_TYPE)
        if path == "/favicon.ico":  # the inspector's icon, which a browser asks for on any page
            return _response(HTTPStatus.OK, inspector.ICON, "image/svg+xml")
        if path == "/inspector" or path.startswith("/inspector/"):
            return self._inspector(path, request)  # a coroutine: it may read the store
        if path != PATH:
            return _error(HTTPStatus.NOT_FOUND, ErrorReply("not_found", f"no such path: {path}"))
        return self._admit(connection, request)

    def _admit(self, connection: ServerConnection, request: Request) -> Response | None:
        """Refuse a handshake the server cannot take now, or one without a valid token."""
        if self.descriptors.short():
            self.metrics.errors.labels(code=RATE_LIMITED).inc()
            self.descriptors.refuse("handshake")
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, refusal_body(), "application/json")
        limit = self.settings.max_connections
        connections = self.health().connections
        if connections >= limit:
            self.metrics.errors.labels(code=RATE_LIMITED).inc()
            log.warning("voice_context_connection_refused", connections=connections)
            text = f"the server serves {limit} connections at most: try again later"
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, ErrorReply(RATE_LIMITED, text, limit="connections"))
        tokens = self.settings.auth_tokens
        if tokens and not token_matches(bearer_token(request.headers), tokens):
            self.metrics.errors.labels(code=UNAUTHORIZED).inc()
            log.info("voice_context_unauthorized", remote=remote(connection))
            denied = ErrorReply(UNAUTHORIZED, "a valid 'Authorization: Bearer <token>' is required")
            return _error(
                HTTPStatus.UNAUTHORIZED, denied, ("WWW-Authenticate", 'Bearer realm="voice-context"')
            )
        owner = self.owner(request)
        held = self.limits.connections_of(owner)
        cap = self.settings.max_connections_per_owner
        if owner is not None and held >= cap:
            self.metrics.errors.labels(code=RATE_LIMITED).inc()
            log.warning("voice_context_connection_refused", reason="owner_connections", connections=held)
            text = f"this token has {held} connections open (limit {cap}): close one first"
            return _error(
                HTTPStatus.SERVICE_UNAVAILABLE, ErrorReply(RATE_LIMITED, text, limit="owner_connections")
            )
        return None

    async def _inspector(self, path: str, request: Request) -> Response:
        """The read-only inspector (:mod:`voice_context.server.inspector`), behind the same tokens: a
        token comes as ``Authorization: Bearer`` or, for a browser, as ``?token=``."""
        tokens = self.settings.auth_tokens
        query = parse_qs(urlsplit(request.path).query)
        asked = query.get("token", [])
        token = bearer_token(request.headers) or (asked[0] if asked else None)
        if tokens and not token_matches(token, tokens):
            self.metrics.errors.labels(code=UNAUTHORIZED).inc()
            denied = ErrorReply(UNAUTHORIZED, "the inspector needs a valid token (?token=...)")
            return _error(HTTPStatus.UNAUTHORIZED, denied)
        owner = owner_of(token) if tokens else None
        manager, store = self.manager(), self.store()
        if path == "/inspector":
            return _response(HTTPStatus.OK, inspector.page(), "text/html; charset=utf-8")
        prefix = "/inspector/api/sessions/"
        # a session's name comes percent-encoded: "/turns" after it is never part of it
        raw = path[len(prefix) :] if path.startswith(prefix) else ""
        turns_of = raw.endswith("/turns")
        name = unquote(raw.removesuffix("/turns"))
        try:
            if manager is not None and store is not None:
                if path == "/inspector/api/sessions":
                    listed = await inspector.session_list(manager, store, owner)
                    return _response(HTTPStatus.OK, orjson.dumps(listed), "application/json")
                if turns_of:
                    start, end = _int(query, "start"), _int(query, "end")
                    turns = await inspector.folded_turns(manager, store, name, owner, start, end)
                    return _response(HTTPStatus.OK, orjson.dumps(turns), "application/json")
                if name:
                    chosen = _int(query, "context") or None
                    view = await inspector.session_view(manager, store, self.journal, name, owner, chosen)
                    return _response(HTTPStatus.OK, orjson.dumps(view), "application/json")
        except UnknownSession:
            missing = ErrorReply(UNKNOWN_SESSION, f"no session {name!r} for this token")
            return _error(HTTPStatus.NOT_FOUND, missing)
        except StoreError as exc:
            failed = ErrorReply(INTERNAL, f"the store cannot be read: {exc}", retryable=exc.retryable)
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, failed)
        return _error(HTTPStatus.NOT_FOUND, ErrorReply("not_found", f"no such path: {path}"))


def _int(query: dict[str, list[str]], key: str) -> int:
    """An integer query parameter (0 when absent or not a number)."""
    values = query.get(key, [])
    return int(values[0]) if values and values[0].lstrip("-").isdigit() else 0


def _error(status: HTTPStatus, error: ErrorReply, *extra: tuple[str, str]) -> Response:
    return _response(status, encode_reply(error).encode(), "application/json", *extra)


def _response(status: HTTPStatus, body: bytes, content_type: str, *extra: tuple[str, str]) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            ("Cache-Control", "no-store"),
            *extra,
        ]
    )
    return Response(status.value, status.phrase, headers, body)


def remote(ws: ServerConnection) -> str:
    """The peer's address as ``host:port``."""
    address: Any = ws.remote_address
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)
