"""Token budgets: a real tokenizer, offline, and contexts that never exceed its count."""

from __future__ import annotations

import sys

import pytest
from helpers import build_folded
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import T0, running, wire

from voice_context.core.budget import Context, Format, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.recalled import Recalled
from voice_context.core.session import ContextView
from voice_context.core.tokens import CachedCounter, CharEstimate, TokenCounter
from voice_context.core.turns import Note, Turn, TurnRun
from voice_context.errors import ConfigError
from voice_context.tokenizers import EXPECTED_SHA256, _bpe_openai, _loaded, bpe_ranks, load_tokenizer
from voice_context.tokenizers import _tiktoken as tiktoken_counter

O200K = load_tokenizer("o200k_base")
CL100K = load_tokenizer("cl100k_base")

SAMPLES = (
    "Hello world",
    "Alice: Let's book Lisbon for May 3rd, flying out of Porto.",
    "日本語のテキスト 123456 émigré naïve café",
    "  spaces\n\n\ttabs and\r\nwindows lines  ",
    "def f(x):\n    return x ** 2  # squares\n" * 3,
    "<<<SUMMARY >>> ‹‹‹ ››› 🎉🎉🎉 https://example.org/specs/v2?x=1&y=2",
)


def size_in(counter: TokenCounter, ctx: Context) -> int:
    """A context's size in the tokenizer's own count, counted from what the bot receives."""
    if ctx.format == "instructions":
        return counter.count(ctx.instructions)
    return sum(counter.count(m["content"]) for m in ctx.messages)


# -- the tokenizer ------------------------------------------------------------------------


def test_the_shipped_files_are_the_ones_tiktoken_expects_and_load_without_a_network() -> None:
    for name in ("o200k_base", "cl100k_base"):
        ranks = bpe_ranks(name)  # raises unless the SHA-256 is tiktoken's own
        assert len(ranks) > 100_000
        assert name in EXPECTED_SHA256
    assert O200K.name == "o200k_base"
    assert isinstance(O200K, CachedCounter)
    assert O200K.count("Hello world") == 2


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_tiktoken_on_the_shipped_files_counts_exactly_as_bpe_openai_does(name: str) -> None:
    """Two independent encoders of the same files agree, text by text."""
    ours, theirs = tiktoken_counter(name), _bpe_openai(name)
    for text in SAMPLES:
        assert ours.count(text) == theirs.count(text), text


def test_the_two_encodings_count_differently_so_the_session_setting_matters() -> None:
    text = SAMPLES[2]
    assert O200K.count(text) != CL100K.count(text)


def test_without_any_tokenizer_installed_the_estimate_counts_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # an import of it now fails
    monkeypatch.setitem(sys.modules, "bpe_openai", None)
    monkeypatch.delitem(_loaded, "o200k_base", raising=False)
    try:
        counter = load_tokenizer("o200k_base")
        assert counter.name == "chars/3.5"
        assert counter.count("x" * 7) == 2
    finally:
        _loaded.pop("o200k_base", None)
    assert load_tokenizer("chars").count("x" * 8) == 3
    with pytest.raises(ConfigError, match="unknown tokenizer"):
        load_tokenizer("gpt2")


def test_a_session_names_its_tokenizer_and_an_unknown_one_is_refused() -> None:
    assert SessionConfig().tokenizer == "o200k_base"
    assert SessionConfig(tokenizer="cl100k_base").tokenizer == "cl100k_base"
    with pytest.raises(ConfigError, match="tokenizer must be one of"):
        SessionConfig(tokenizer="gpt2")


# -- contexts under a token budget ----------------------------------------------------------

CONVERSATION = tuple(
    Turn(("Alice", "Bob", "Nova")[i % 3], "assistant" if i % 3 == 2 else "user", text, T0 + i)
    for i, text in enumerate(SAMPLES * 4)
)
SUMMARY = "[1 May 2024, 14:03] Alice: We fly to Lisbon on 3 May. Bob: Two window seats. Nova: Booked."


def view(config: SessionConfig | None = None, *, summary: str = SUMMARY) -> ContextView:
    notes = (Note("flight search: LIS, May 3, 2 adults", T0, "Alice", "browser"),)
    return ContextView(40, summary, CONVERSATION, notes, config or SessionConfig())


@pytest.mark.parametrize("fmt", ["instructions", "messages"])
def test_a_token_budget_is_kept_in_the_tokenizers_own_count(fmt: Format) -> None:
    ctx = build_context(view(), fmt, budget_tokens=120, budget_chars=100_000, tokens=O200K)
    assert ctx.tokens == size_in(O200K, ctx) <= 120
    assert (ctx.budget_tokens, ctx.tokenizer) == (120, "o200k_base")
    assert 0 < ctx.turns_shown < len(CONVERSATION)
    assert "older_turns" in ctx.dropped
    loose = build_context(view(), fmt, budget_tokens=100_000, budget_chars=100_000, tokens=O200K)
    assert loose.turns_shown == len(CONVERSATION), "with room for everything, everything shows"


def test_both_budgets_hold_at_once_whichever_is_tighter() -> None:
    by_chars = build_context(view(), "instructions", budget_chars=300, budget_tokens=10_000, tokens=O200K)
    by_tokens = build_context(view(), "instructions", budget_chars=10_000, budget_tokens=60, tokens=O200K)
    assert by_chars.chars <= 300 and by_chars.tokens is not None and by_chars.tokens <= 10_000
    assert by_tokens.chars <= 10_000 and by_tokens.tokens is not None and by_tokens.tokens <= 60
    assert by_tokens.chars < by_chars.chars or by_tokens.turns_shown < by_chars.turns_shown


def test_a_current_turn_larger_than_the_token_budget_is_clipped_to_fit() -> None:
    long = Turn("Alice", "user", "Lisbon and Porto and Faro. " * 80, T0)
    v = ContextView(0, "", (long,), (), SessionConfig(max_turn_chars=8000))
    ctx = build_context(v, "messages", budget_tokens=40, tokens=O200K)
    assert ctx.tokens is not None and ctx.tokens <= 40
    assert ctx.messages[-1]["content"].startswith("Alice: Lisbon")
    assert ctx.messages[-1]["content"].endswith("…")


def test_a_summary_is_shrunk_by_whole_sentences_to_its_token_share() -> None:
    long_summary = "\n".join(
        f"[{d} May 2024, 14:03] Alice: We chose plan {d} of many. Bob agreed." for d in range(1, 29)
    )
    no_floor = SessionConfig(recent_floor=0.0)  # the summary's share, not what the turns leave it
    summarized = view(no_floor, summary=long_summary)
    ctx = build_folded(summarized, "instructions", budget_tokens=400, budget_chars=None, tokens=O200K)
    assert ctx.tokens is not None and ctx.tokens <= 400
    assert ctx.summary and ctx.summary != long_summary
    assert all(line in long_summary for line in ctx.summary.split("\n") if "…" not in line)


def test_a_token_budget_without_a_tokenizer_counts_chars_over_three_and_a_half() -> None:
    ctx = build_context(view(), "messages", budget_tokens=100)
    assert ctx.tokenizer == "chars/3.5"
    assert ctx.tokens == size_in(CharEstimate(), ctx) <= 100


# -- the property: no budget is ever exceeded ---------------------------------------------

TEXTS = st.sampled_from((*SAMPLES, "ok", "Friday.", "word " * 60, "🎉" * 30, "a\n\n\nb"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(TEXTS, min_size=0, max_size=12),
    summary=st.sampled_from(("", SUMMARY, "One. Two. Three. " * 30, "<<<SUMMARY>>> " * 10)),
    fmt=st.sampled_from(["instructions", "messages"]),
    budget_tokens=st.integers(0, 400),
    budget_chars=st.one_of(st.none(), st.integers(0, 2000)),
    base=st.sampled_from(("", "You are Nova.", "Be brief. " * 40)),
    facts=st.lists(st.sampled_from(("Alice is vegan.", "日本語", "Bob: 42")), max_size=3),
    recalled=st.booleans(),
    counter=st.sampled_from([O200K, CL100K, CharEstimate()]),
    shares=st.sampled_from([(0.85, 0.1, 0.05), (0.0, 0.0, 1.0), (0.5, 0.5, 0.0)]),
)
def test_no_context_ever_exceeds_its_token_budget_or_its_char_budget(
    texts: list[str],
    summary: str,
    fmt: Format,
    budget_tokens: int,
    budget_chars: int | None,
    base: str,
    facts: list[str],
    recalled: bool,
    counter: TokenCounter,
    shares: tuple[float, float, float],
) -> None:
    config = SessionConfig(
        recent_share=shares[0],
        recall_share=shares[1],
        summary_share=shares[2],
        default_recall_share=shares[2],  # a context without a query trades the two
        default_summary_share=shares[1],
    )
    conversation = tuple(
        Turn(("Alice", "Nova")[i % 2], ("user", "assistant")[i % 2], t, T0 + i) for i, t in enumerate(texts)
    )
    older = TurnRun.of(9, [Turn("Bob", "user", "Earlier: the raid is at nine.", T0 - 5)])
    passages = (
        [Recalled("turn", 9, "[1 May 2024, 14:00] Bob: the raid is at nine", 2.0, at=T0 - 9)]
        if recalled
        else []
    )
    v = ContextView(10, summary, conversation, (Note("a map", T0),), config)
    ctx = build_context(
        v,
        fmt,
        budget_chars=budget_chars,
        budget_tokens=budget_tokens,
        tokens=counter,
        base_instructions=base,
        facts=facts,
        recalled=passages,
        older=older,
        asked=len(texts) % 2 == 0,
    )
    assert ctx.tokens == size_in(counter, ctx) <= budget_tokens
    if budget_chars is not None:
        assert ctx.chars <= budget_chars


# -- over the wire ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_context_get_with_budget_tokens_over_a_real_server() -> None:
    async with running() as server, wire(server) as bot:
        await bot.open("room-1", config={"tokenizer": "cl100k_base"})
        for i, text in enumerate(SAMPLES * 3):
            await bot.append("room-1", i, text=text)
        reply = await bot.request("context.get", session="room-1", format="messages", budget_tokens=80)
        assert reply["type"] == "context"
        assert (reply["budget_tokens"], reply["tokenizer"]) == (80, "cl100k_base")
        assert reply["tokens"] == sum(CL100K.count(m["content"]) for m in reply["messages"]) <= 80
        assert 0 < reply["turns_shown"] < len(SAMPLES) * 3

        both = await bot.request(
            "context.get", session="room-1", format="instructions", budget_tokens=50, budget_chars=5200
        )
        assert both["tokens"] == CL100K.count(both["instructions"]) <= 50
        assert both["chars"] <= 5200

        unbudgeted = await bot.request("context.get", session="room-1", format="messages")
        assert (unbudgeted["budget_tokens"], unbudgeted["tokens"]) == (None, None), "counted only when asked"

        for bad in (-1, 2.5, "80", True):
            refused = await bot.request("context.get", session="room-1", budget_tokens=bad)
            assert (refused["type"], refused["code"]) == ("error", "bad_request")
            assert "budget_tokens" in refused["message"]
        wrong = await bot.open("room-2", config={"tokenizer": "gpt2"})
        assert (wrong["type"], wrong["code"]) == ("error", "bad_request")
