"""Loading real tokenizers, offline: the shell around :mod:`voice_context.core.tokens`.

``tiktoken`` fetches its BPE files from the network the first time an encoding
is asked for, which a server that must run offline cannot do. The ``bpe-openai``
package ships the very same ``o200k_base`` and ``cl100k_base`` files (gzipped):
they are read from it, checked against the SHA-256 that tiktoken itself expects
of them, and handed to ``tiktoken.Encoding`` directly, so nothing is downloaded
and no cache directory is written. Without tiktoken, ``bpe-openai``'s own
encoder counts; without either, the ``chars/3.5`` estimate does, and a warning
says so once. Both come with the ``tokens`` extra (``pip install
'voice-context[tokens]'``).

Loading a file takes about 0.2 s, so it happens once per process and name
(:func:`load_tokenizer` is cached); the manager calls it off the event loop.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.util
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from voice_context.core.tokens import TOKENIZERS, CachedCounter, CharEstimate, FunctionCounter, TokenCounter
from voice_context.errors import ConfigError
from voice_context.logs import get_logger

log = get_logger("voice_context")

#: The SHA-256 tiktoken checks each file against (``tiktoken_ext.openai_public``).
EXPECTED_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
#: tiktoken's split patterns and special tokens for the two encodings (``tiktoken_ext.openai_public``).
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_SPECIAL = {
    "cl100k_base": {
        "<|endoftext|>": 100257,
        "<|fim_prefix|>": 100258,
        "<|fim_middle|>": 100259,
        "<|fim_suffix|>": 100260,
        "<|endofprompt|>": 100276,
    },
    "o200k_base": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
}
_PATTERNS = {"cl100k_base": _CL100K_PATTERN, "o200k_base": _O200K_PATTERN}

_loaded: dict[str, TokenCounter] = {}
_lock = threading.Lock()


class TokenizerFileError(ConfigError):
    """A tokenizer file is missing or is not the one tiktoken expects."""


def bpe_ranks(name: str) -> dict[bytes, int]:
    """The mergeable ranks of ``name`` from the files ``bpe-openai`` ships, hash-checked.

    Raises ``ModuleNotFoundError`` when ``bpe-openai`` is not installed and
    :class:`TokenizerFileError` when its file is not the expected one.
    """
    # found, not imported: importing bpe_openai parses both files at once, with a warning
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'bpe_openai'", name="bpe_openai")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"{name}.tiktoken.gz"
    try:
        raw = gzip.decompress(path.read_bytes())
    except OSError as exc:
        raise TokenizerFileError(f"{name}: cannot read {path.name} from bpe-openai: {exc}") from exc
    digest = hashlib.sha256(raw).hexdigest()
    if digest != EXPECTED_SHA256[name]:
        raise TokenizerFileError(f"{name}: the shipped file's SHA-256 is {digest}, not tiktoken's")
    ranks: dict[bytes, int] = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _tiktoken(name: str) -> TokenCounter:
    import tiktoken

    encoding: Any = tiktoken.Encoding(
        name=name,
        pat_str=_PATTERNS[name],
        mergeable_ranks=bpe_ranks(name),
        special_tokens=_SPECIAL[name],
    )
    encode = encoding.encode_ordinary
    return FunctionCounter(name, lambda text: len(encode(text)))


def _bpe_openai(name: str) -> TokenCounter:
    with warnings.catch_warnings():  # its import reads its data the deprecated way
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai

        encoding: Any = bpe_openai.get_encoding(name)
    encode = encoding.encode_ordinary
    return FunctionCounter(name, lambda text: len(encode(text)))


def load_tokenizer(name: str) -> TokenCounter:
    """The counter for ``name`` (one of ``o200k_base``, ``cl100k_base``, ``chars``), cached.

    Falls back to the ``chars/3.5`` estimate, with one warning, when no
    tokenizer package is installed. Raises ``ConfigError`` for an unknown name.
    """
    if name not in TOKENIZERS:
        raise ConfigError(f"unknown tokenizer {name!r} (one of {', '.join(sorted(TOKENIZERS))})")
    with _lock:
        counter = _loaded.get(name)
        if counter is not None:
            return counter
        started = time.perf_counter()
        counter = CharEstimate() if name == "chars" else _load_real(name)
        if not isinstance(counter, CharEstimate):  # (the estimate also stands in when no package is)
            log.info(
                "voice_context_tokenizer_loaded",
                tokenizer=name,
                seconds=round(time.perf_counter() - started, 3),
            )
            counter = CachedCounter(counter)
        _loaded[name] = counter
        return counter


def _load_real(name: str) -> TokenCounter:
    for loader in (_tiktoken, _bpe_openai):
        try:
            return loader(name)
        except ModuleNotFoundError:
            continue
    log.warning(
        "voice_context_tokenizer_missing",
        tokenizer=name,
        fallback="chars/3.5",
        hint="pip install 'voice-context[tokens]'",
    )
    return CharEstimate()


__all__ = ["EXPECTED_SHA256", "TokenizerFileError", "bpe_ranks", "load_tokenizer"]
