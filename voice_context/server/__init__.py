"""The websocket service: protocol v1 at ``/v1``, ``/healthz`` and ``/metrics`` on the same port.

A thin shell around :class:`~voice_context.manager.SessionManager`. Frames become typed
messages in :mod:`voice_context.codec`, and typed replies become frames there again; the
decisions that are not the manager's (rate limits, duplicate turns, file names for
recordings) are small pure functions and classes here, fed the time as plain data.

Lifetimes are lexical::

    async with Server(settings) as server:
        print(server.url)            # ws://127.0.0.1:8765/v1 (port 0 picks a free one)
        await server.serve_forever() # until server.request_shutdown() or cancellation

Leaving the block shuts down gracefully: stop accepting, let each request in progress
finish and its reply go out, close every connection with 1001, write the recordings
queued, then let the session manager land (or give up on) the compactions in flight, and
close the store if the server opened it. Each wait has a deadline.

The parts:

- :mod:`~voice_context.server.app`: :class:`Server`, the composition root and its lifetime;
  the background loops (tier rolls, retention).
- :mod:`~voice_context.server.connection`: one connection's outbox and the scheduler that
  answers its requests (one at a time per session, sessions side by side).
- :mod:`~voice_context.server.handlers`: the handler of each message type, in one table,
  and the one place where errors become protocol error codes.
- :mod:`~voice_context.server.local`: a connection in the process to those handlers, no
  socket needed (the replay feeds recordings through it).
- :mod:`~voice_context.server.http`: ``/healthz``, ``/metrics``, ``/inspector``, and the
  admission of handshakes (tokens, ``max_connections``, descriptors).
- :mod:`~voice_context.server.limits`: turns and notes per second, per session and per token.
- :mod:`~voice_context.server.recording`: recordings, written off the event loop.
- :mod:`~voice_context.server.metrics`: the Prometheus metrics of ``/metrics``.
- :mod:`~voice_context.server.inspector`: the read-only inspector of ``/inspector``.
- :mod:`~voice_context.server.descriptors`: serving at the limit of file descriptors.
- :mod:`~voice_context.server.collector`: the garbage collector kept off live sessions (``serve``).
"""

from voice_context.server.app import Server, replica_name
from voice_context.server.handlers import find_duplicate
from voice_context.server.http import PATH, bearer_token, owner_of, token_matches
from voice_context.server.limits import TokenBucket
from voice_context.server.recording import recording_name

__all__ = [
    "PATH",
    "Server",
    "TokenBucket",
    "bearer_token",
    "find_duplicate",
    "owner_of",
    "recording_name",
    "replica_name",
    "token_matches",
]
