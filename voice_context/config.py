"""Settings for the service and the tools, from a TOML file and ``VOICE_CONTEXT_*`` variables.

Groups, each a frozen value with named defaults::

    [server]      host, port, max_frame_bytes, max_text_chars, max_sessions_per_connection,
                  turns_per_second, turn_burst, auth_tokens, record_dir, shutdown_timeout,
                  max_connections, max_outbox_chars, send_timeout, ping_interval,
                  ping_timeout, replica, owner_turns_per_second, owner_turn_burst,
                  max_connections_per_owner, lease_ttl, gc_freeze_seconds, workers,
                  reuse_port, worker, listen_fd and loads_fd (the last three set by
                  ``serve --workers`` in its workers)
    [summarizer]  kind ("deterministic" | "openai"), base_url, model (both needed by "openai"),
                  api_key, timeout (per attempt; derived from compaction_timeout when unset),
                  max_retries, compaction_timeout
    [store]       url ("sqlite" default, "memory", "sqlite:///path/to.db", "redis://host:port/0"),
                  data_dir, session_ttl (unset: kept until deleted), sweep_interval
    [session]     any field of SessionConfig (recent_window, batch_size, max_summary_chars, ...)

Environment variables override the file: ``VOICE_CONTEXT_<GROUP>_<FIELD>``, e.g.
``VOICE_CONTEXT_SUMMARIZER_BASE_URL`` or ``VOICE_CONTEXT_SESSION_RECENT_WINDOW``; lists
(``auth_tokens``) are comma-separated. ``VOICE_CONTEXT_SUMMARIZER_API_KEY`` is the place
for a key (it is never logged).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_type_hints

from voice_context.codec import DEFAULT_MAX_TEXT_CHARS
from voice_context.core.config import SessionConfig, did_you_mean
from voice_context.errors import ConfigError
from voice_context.store.sqlite_db import SQLITE_READS, SQLiteReads
from voice_context.summarizers.base import Summarizer

ENV_PREFIX = "VOICE_CONTEXT_"

MIN_WORKERS, MAX_WORKERS = 1, 64
"""How many server processes ``serve`` may run on one port (``[server] workers``)."""
FREEZE_SECONDS = 1.0
"""How often ``serve`` freezes what survived, by default (``server.gc_freeze_seconds``; see
:mod:`voice_context.server.collector`). The collection before a freeze walks what survived since
the last, with the event loop stopped: the more often, the shorter each pause, for about the same
time in all (500 paced sessions in one process: the longest 23 ms at 1 s, 89-312 ms at 10 s, in
0.3-0.4 s of full collections per 32 s either way)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8765
    max_frame_bytes: int = 256 * 1024
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    max_sessions_per_connection: int = 32
    turns_per_second: float = 20.0
    turn_burst: int = 40
    auth_tokens: tuple[str, ...] = ()
    record_dir: str | None = None
    shutdown_timeout: float = 10.0
    #: connections served at once; the next handshake gets HTTP 503
    max_connections: int = 1000
    #: characters of replies and events waiting to be sent on one connection: past this the
    #: server reads no more of that connection's requests, and drops its events
    max_outbox_chars: int = 1 << 20
    #: seconds a frame may wait to be handed to the connection (a client that reads nothing, or
    #: a peer gone without a word, fills the socket's buffers): past it the connection is
    #: aborted, its requests not yet started are dropped and its sessions closed. Also how long
    #: a closing handshake may take.
    send_timeout: float = 5.0
    #: a ping every ``ping_interval`` seconds; a pong not back within ``ping_timeout`` ends the
    #: connection (a peer that vanished from an idle connection)
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    #: who holds compaction leases in the store: the same after a restart, so a restarted
    #: server takes its own leases back at once. By default ``<hostname>:<port>`` (random
    #: when the port is 0); set it when several servers share a host name and a port.
    replica: str | None = None
    #: turns and notes per second for all the sessions of one token together (bursts of
    #: ``owner_turn_burst``), on each replica; only with ``auth_tokens`` (without them there
    #: is no owner to tell apart, and ``max_connections`` bounds everyone)
    owner_turns_per_second: float = 100.0
    owner_turn_burst: int = 200
    #: connections one token may hold open at once on each replica; the next handshake gets 503
    max_connections_per_owner: int = 100
    #: seconds a compaction lease lasts unless renewed (every third of that while the fold
    #: runs): a replica that dies holding one delays the session's next fold by at most this
    lease_ttl: float = 20.0
    #: ``serve`` moves what survived out of the cyclic garbage collector's reach this often
    #: (collecting first, and thawing to reclaim what died frozen: :mod:`voice_context.server.collector`);
    #: 0 never freezes, and leaves the collector to walk every live session
    gc_freeze_seconds: float = FREEZE_SECONDS
    #: server processes ``serve`` runs on this one port over the same store (1..64): one
    #: process's event loop keeps to one core, so with more than one, ``serve`` supervises
    #: that many workers (:mod:`voice_context.commands.workers`); not with the ``memory``
    #: store, which nothing shares
    workers: int = MIN_WORKERS
    #: bind the listener with ``SO_REUSEPORT``, so that several processes share the port (the
    #: kernel spreads new connections over them, by a hash of their addresses): for servers a
    #: user starts apart (the workers of ``serve --workers`` share one socket instead)
    reuse_port: bool = False
    #: which worker of a ``serve --workers`` supervisor this process is (the supervisor sets
    #: it; ``None`` otherwise); ``/healthz`` says it
    worker: int | None = None
    #: for the supervisor of ``serve --workers`` alone, which sets them in each worker: the
    #: descriptor of the listening socket it bound (the worker serves on it instead of binding
    #: one), and that of the shared block of the workers' connection counts (the least loaded
    #: takes the next connection: :mod:`voice_context.server.listener`)
    listen_fd: int | None = None
    loads_fd: int | None = None
    #: read the default tokenizer's file before listening (about half a second of CPU and some
    #: tens of MB for ``o200k_base``), so that the first token-budgeted reply does not wait for
    #: it; false reads it when a token budget first needs it (never, for a bot that budgets chars)
    preload_tokenizer: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"server.port must be 0..65535, got {self.port}")
        if not MIN_WORKERS <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"server.workers must be {MIN_WORKERS}..{MAX_WORKERS}, got {self.workers}")
        if self.worker is not None and not 0 <= self.worker < MAX_WORKERS:
            raise ConfigError(f"server.worker must be 0..{MAX_WORKERS - 1}, got {self.worker}")
        for name in ("listen_fd", "loads_fd"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"server.{name} must be a descriptor (0 or more), got {value}")
        if self.loads_fd is not None and (self.listen_fd is None or self.worker is None):
            raise ConfigError("server.loads_fd needs server.listen_fd and server.worker")
        positive = (
            "max_frame_bytes",
            "max_text_chars",
            "max_sessions_per_connection",
            "turn_burst",
            "max_connections",
            "max_outbox_chars",
            "owner_turn_burst",
            "max_connections_per_owner",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"server.{name} must be positive")
        for name in (
            "turns_per_second",
            "owner_turns_per_second",
            "lease_ttl",
            "send_timeout",
            "ping_interval",
            "ping_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"server.{name} must be positive")
        if not self.gc_freeze_seconds >= 0:  # nan too
            raise ConfigError("server.gc_freeze_seconds must not be negative (0: never freeze)")


MAX_SWEEP_INTERVAL = 60.0
"""The longest wait between two retention sweeps when ``store.sweep_interval`` is unset."""

RETRY_ALLOWANCE = 2.0
"""Seconds the backoff may wait before each retry, set aside from the compaction timeout."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SummarizerSettings:
    """How compactions are summarized, and how long they may take.

    ``compaction_timeout`` bounds a whole compaction: every attempt and the
    waits between them. ``timeout`` bounds one attempt; by default (``None``)
    it is the compaction timeout shared among the ``max_retries + 1`` attempts,
    after :data:`RETRY_ALLOWANCE` per retry (60 s and 2 retries: 18.7 s each).
    The two are checked together: attempts that could outlast the compaction
    would be abandoned while the summarizer still retries. ``fallback`` (on by
    default) folds a batch deterministically when the model fails or answers
    nothing usable, instead of retrying it forever
    (:mod:`voice_context.summarizers.fallback`). ``fold`` is how a model folds a batch:
    ``lines`` (rewrite the batch's dated notes as prose, the previous summary kept as it
    is) or ``paragraph`` (the whole summary written again). Raises :class:`ConfigError`.

    The ``openai`` kind needs ``base_url`` and ``model`` (see :meth:`endpoint`); they are
    checked when the summarizer is made, once every layer of settings has been applied.
    """

    kind: str = "deterministic"
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float | None = None
    max_retries: int = 2
    compaction_timeout: float = 60.0
    fallback: bool = True
    fold: str = "lines"

    def __post_init__(self) -> None:
        if self.kind not in ("deterministic", "openai"):
            raise ConfigError(f"summarizer.kind must be 'deterministic' or 'openai', got {self.kind!r}")
        if self.fold not in ("lines", "paragraph"):
            raise ConfigError(f"summarizer.fold must be 'lines' or 'paragraph', got {self.fold!r}")
        if (self.timeout is not None and self.timeout <= 0) or self.compaction_timeout <= 0:
            raise ConfigError("summarizer timeouts must be positive")
        if self.max_retries < 0:
            raise ConfigError(f"summarizer.max_retries must not be negative, got {self.max_retries}")
        room = self.compaction_timeout - RETRY_ALLOWANCE * self.max_retries
        if room <= 0:
            raise ConfigError(
                f"summarizer.compaction_timeout ({self.compaction_timeout:g}s) leaves no time for "
                f"{self.max_retries + 1} attempts: raise it or lower max_retries"
            )
        if self.timeout is not None and self.timeout * (self.max_retries + 1) > room + 1e-9:
            raise ConfigError(
                f"summarizer: {self.max_retries + 1} attempts of timeout={self.timeout:g}s (and "
                f"{RETRY_ALLOWANCE:g}s before each retry) outlast compaction_timeout="
                f"{self.compaction_timeout:g}s: lower timeout or max_retries, raise compaction_timeout, "
                "or leave timeout unset to derive it"
            )

    def endpoint(self) -> tuple[str, str]:
        """``(base_url, model)`` for the ``openai`` kind. Raises :class:`ConfigError` when either
        is missing: nothing is guessed, since a guess (the OpenAI host, a model name) that does
        not answer would fail every fold over to the deterministic summarizer."""
        missing = [name for name in ("base_url", "model") if not getattr(self, name)]
        if missing or self.base_url is None or self.model is None:
            raise ConfigError(
                f"summarizer.kind = 'openai' needs summarizer.{' and summarizer.'.join(missing)}: the "
                "API root and the model name of an OpenAI-compatible server, e.g. base_url = "
                "'http://127.0.0.1:8080/v1' or 'https://api.openai.com/v1', model = 'gpt-4o-mini' "
                "(VOICE_CONTEXT_SUMMARIZER_BASE_URL and VOICE_CONTEXT_SUMMARIZER_MODEL)"
            )
        return self.base_url, self.model

    @property
    def attempt_timeout(self) -> float:
        """Seconds one attempt may take: ``timeout``, or the compaction timeout shared among attempts."""
        if self.timeout is not None:
            return self.timeout
        room = self.compaction_timeout - RETRY_ALLOWANCE * self.max_retries
        return room / (self.max_retries + 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreSettings:
    """Where sessions live, and for how long.

    ``session_ttl`` is the retention policy: a session idle for that many seconds (no
    turn, note, config change or compaction, and open on no server) is forgotten, with
    its recording; ``None`` (the default) keeps every session until it is deleted. The
    server applies it every ``sweep_interval`` seconds (by default a quarter of the ttl,
    at most 60 s), off the path of any reply.

    ``sqlite_reads`` is where the SQLite store runs a reply's reads (a recall search, the turns
    before the cursor): ``loop`` (the default), on the event loop's own thread, with no hand-off
    to wait for; ``thread``, in a thread of their own, for a file on a disk slow to read (a
    network file system), where a read would make the loop wait for the disk.
    """

    url: str = "sqlite"
    data_dir: str = "data"
    session_ttl: float | None = None
    sweep_interval: float | None = None
    sqlite_reads: SQLiteReads = "loop"

    def __post_init__(self) -> None:
        if self.sqlite_reads not in SQLITE_READS:
            raise ConfigError(f"store.sqlite_reads must be loop or thread, got {self.sqlite_reads!r}")
        if self.session_ttl is not None and self.session_ttl <= 0:
            raise ConfigError("store.session_ttl must be positive (or unset: kept until deleted)")
        if self.sweep_interval is not None and self.sweep_interval <= 0:
            raise ConfigError("store.sweep_interval must be positive")
        ttl, interval = self.session_ttl, self.sweep_interval
        if ttl is not None and interval is not None and interval > ttl / 2:
            raise ConfigError(
                f"store.sweep_interval ({interval:g}s) must be at most half of "
                f"session_ttl ({ttl:g}s): the sweep is what keeps open sessions alive"
            )

    @property
    def retention_interval(self) -> float | None:
        """Seconds between two retention sweeps, or ``None`` without a ``session_ttl``."""
        if self.session_ttl is None:
            return None
        return self.sweep_interval or min(self.session_ttl / 4, MAX_SWEEP_INTERVAL)


AheadMode = Literal["first", "every", "off"]
AHEAD_MODES: tuple[AheadMode, ...] = ("first", "every", "off")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecallSettings:
    """How recall ranks: ``embedder`` is ``none`` (lexical only, the default), ``minilm-static``
    (a static table distilled from all-MiniLM-L6-v2, about 10,000 turns a second), ``minilm``
    (the full model: better on meeting queries, about 100 turns a second a core) or ``auto``
    (``minilm-static`` when the ``recall`` extra is installed).

    ``ahead`` starts recall for a user turn as soon as it is stored, so that the context asked
    for before the reply finds it done (see :mod:`voice_context.manager`): ``first`` (the
    default) for the first user turn after each context, the one a bot in a conversation of two
    answers; ``every`` for every user turn (a group's bot answers the newest of several: its
    replies wait less, at the cost of a search per turn); ``off``."""

    embedder: str = "none"
    ahead: AheadMode = "first"

    def __post_init__(self) -> None:
        if self.ahead not in AHEAD_MODES:
            raise ConfigError(f"recall.ahead must be first, every or off, got {self.ahead!r}")
        if self.embedder not in ("none", "auto", "minilm", "minilm-static"):
            raise ConfigError(
                f"recall.embedder must be none, auto, minilm or minilm-static, got {self.embedder!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceSettings:
    """One ``[[sources]]`` table: a context source over HTTP (see :mod:`voice_context.sources`)."""

    name: str
    url: str
    prompt: str = ""
    timeout: float = 2.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError("sources: every source needs a name")
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"sources.{self.name}: url must be http:// or https://, got {self.url!r}")
        if not isinstance(self.prompt, str):
            raise ConfigError(f"sources.{self.name}: prompt must be a string")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, int | float) or self.timeout <= 0:
            raise ConfigError(f"sources.{self.name}: timeout must be a positive number of seconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    summarizer: SummarizerSettings = field(default_factory=SummarizerSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    recall: RecallSettings = field(default_factory=RecallSettings)
    session: SessionConfig = field(default_factory=SessionConfig)
    #: ``[[sources]]``: the context sources asked about every folded window
    sources: tuple[SourceSettings, ...] = ()
    #: the ``[session]`` fields set by a file, the environment or a flag
    session_explicit: frozenset[str] = frozenset()

    def with_values(self, group: str, values: Mapping[str, Any]) -> Settings:
        """A copy with some fields of one group changed (strings are converted)."""
        current = getattr(self, group, None)
        if current is None or group not in _GROUPS:
            raise ConfigError(f"unknown settings group {group!r}{did_you_mean(group, _GROUPS)}")
        changed = replace(self, **{group: _apply(group, current, values)})
        if group == "session":
            changed = replace(changed, session_explicit=self.session_explicit | frozenset(values))
        return changed

    def session_config(self, summarizer: Summarizer) -> SessionConfig:
        """The session defaults to serve with ``summarizer``: see :func:`session_defaults`."""
        return session_defaults(summarizer, self.session, explicit=self.session_explicit)


def session_defaults(
    summarizer: Summarizer, base: SessionConfig | None = None, *, explicit: frozenset[str] = frozenset()
) -> SessionConfig:
    """``base`` with the summary ceiling the summarizer prefers, unless it was set explicitly.

    The design's 1,200-char ceiling is for a model summarizer, where every char of
    summary is paid for in output tokens on every compaction. A summarizer that
    states ``preferred_max_summary_chars`` (the deterministic one: 12,000, which costs
    nothing to write; a model that folds by lines, which writes only the batch's
    lines, the same; a wrapper passes on what it wraps) gets that ceiling
    instead; an explicit ``max_summary_chars`` always wins.
    """
    config = base or SessionConfig()
    preferred = getattr(summarizer, "preferred_max_summary_chars", None)
    if preferred is None or "max_summary_chars" in explicit:
        return config
    return replace(config, max_summary_chars=int(preferred))


_GROUPS = ("server", "summarizer", "store", "recall", "session")
_SOURCE_KEYS = ("name", "url", "prompt", "timeout")


def _apply(group: str, current: Any, values: Mapping[str, Any]) -> Any:
    hints = get_type_hints(type(current))
    known = {f.name for f in fields(current)}
    changes: dict[str, Any] = {}
    for key, raw in values.items():
        if key not in known:
            raise ConfigError(f"unknown setting {group}.{key}{did_you_mean(key, known)}")
        changes[key] = _convert(f"{group}.{key}", hints[key], raw)
    try:
        return replace(current, **changes)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{group}: {exc}") from exc


def _convert(name: str, hint: Any, raw: Any) -> Any:
    text = str(hint)
    try:
        if isinstance(raw, str):
            if hint is int or text == "int":
                return int(raw)
            if hint is float or text == "float":
                return float(raw)
            if hint is bool:
                return raw.strip().lower() in ("1", "true", "yes", "on")
            if "tuple" in text:
                return tuple(part.strip() for part in raw.split(",") if part.strip())
            if "None" in text and raw.strip().lower() in ("", "none", "null"):
                return None
            if text in ("float | None", "typing.Optional[float]"):
                return float(raw)
            if text in ("int | None", "typing.Optional[int]"):
                return int(raw)
            return raw
        if "tuple" in text and isinstance(raw, list | tuple):
            return tuple(str(x) for x in raw)
        if (hint is float or text == "float") and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        return raw
    except ValueError as exc:
        raise ConfigError(f"{name}: cannot read {raw!r} ({exc})") from exc


def _sources(tables: object) -> tuple[SourceSettings, ...]:
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError("sources must be [[sources]] tables")
    out: list[SourceSettings] = []
    for table in tables:
        unknown = sorted(set(table) - set(_SOURCE_KEYS))
        if unknown:
            raise ConfigError(f"unknown setting sources.{unknown[0]}{did_you_mean(unknown[0], _SOURCE_KEYS)}")
        try:
            out.append(SourceSettings(**table))
        except TypeError as exc:
            raise ConfigError(f"sources: {exc}") from exc
    names = [source.name for source in out]
    if len(set(names)) != len(names):
        raise ConfigError("sources: two sources have the same name")
    return tuple(out)


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    base: Settings | None = None,
) -> Settings:
    """Defaults, then the TOML file (if any), then ``VOICE_CONTEXT_*`` variables."""
    settings = base or Settings()
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        for group, values in data.items():
            if group == "sources":
                settings = replace(settings, sources=_sources(values))
                continue
            if group not in _GROUPS:
                guess = did_you_mean(group, (*_GROUPS, "sources"))
                raise ConfigError(f"unknown config section [{group}]{guess}")
            if not isinstance(values, dict):
                raise ConfigError(f"config section [{group}] must be a table of settings, got {values!r}")
            settings = settings.with_values(group, values)
    environ = os.environ if env is None else env
    by_group: dict[str, dict[str, str]] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        rest = key[len(ENV_PREFIX) :].lower()
        for group in _GROUPS:
            if rest.startswith(group + "_"):
                by_group.setdefault(group, {})[rest[len(group) + 1 :]] = value
                break
    for group, values in by_group.items():
        settings = settings.with_values(group, values)
    return settings


FALLBACK_ALLOWANCE = 1.0
"""Seconds of a compaction kept for the deterministic fold when the model did not answer in time."""


def make_summarizer(settings: SummarizerSettings) -> Summarizer:
    """The summarizer the settings name (the deterministic one by default)."""
    if settings.kind == "openai":
        base_url, model_name = settings.endpoint()
        try:
            from voice_context.summarizers.openai_compat import OpenAISummarizer
        except ImportError as exc:
            raise ConfigError(
                f"the openai summarizer needs the openai package: pip install 'voice-context[openai]' ({exc})"
            ) from exc

        model = OpenAISummarizer(
            base_url=base_url,
            api_key=settings.api_key,
            model=model_name,
            timeout=settings.attempt_timeout,
            max_retries=settings.max_retries,
            fold="paragraph" if settings.fold == "paragraph" else "lines",
        )
        if not settings.fallback:
            return model
        from voice_context.summarizers.fallback import FallbackSummarizer

        # the model's answer must come in time for the deterministic fold to land instead
        deadline = settings.compaction_timeout - FALLBACK_ALLOWANCE
        return FallbackSummarizer(model, deadline=deadline if deadline > 0 else None)
    from voice_context.summarizers.deterministic import DeterministicSummarizer

    return DeterministicSummarizer()
