"""Recall by date: a question that names a time ("on 13 October 2023", "in June", "yesterday")
finds what was said then before the same words said at another time, in process and from a store."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from voice_context.core.turns import Turn
from voice_context.manager import SessionManager
from voice_context.recall.dates import date_terms, query_date_terms
from voice_context.recall.index import RecallIndex
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.deterministic import DeterministicSummarizer

NOW = datetime(2023, 10, 20, 12, 0, tzinfo=UTC).timestamp()  # a Friday


def day(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("query", "terms"),
    [
        ("What did Caroline paint on October 13, 2023?", ["@d2023-10-13"]),
        ("what did we agree on 13 October 2023", ["@d2023-10-13"]),
        ("the 2023-02-01 standup", ["@d2023-02-01"]),
        ("What did John host for the veterans in May 2023?", ["@m2023-05"]),
        ("anything from June of 2022?", ["@m2022-06"]),
        # no year: the latest such month or day on or before now
        ("When did Melanie go camping in June?", ["@m2023-06"]),
        ("what was the plan in November", ["@m2022-11"]),
        ("what did I say on 13 October", ["@d2023-10-13"]),
        # said relative to now
        ("what did I tell you yesterday", ["@d2023-10-19"]),
        ("the thing from last Friday", ["@d2023-10-13"]),
        ("what did we decide last month", ["@m2023-09"]),
        ("what did we do last week", [f"@d2023-10-{d:02d}" for d in range(9, 16)]),
    ],
)
def test_a_query_names_the_days_and_months_it_is_about(query: str, terms: list[str]) -> None:
    assert query_date_terms(query, NOW) == terms


@pytest.mark.parametrize(
    "query",
    [
        "may I ask what the healer said",  # the verb, not the month
        "we should march on the castle",
        "the last week of the raid",  # "of the raid": no date said relative to now
        "what is the code on the door",
    ],
)
def test_words_that_only_look_like_dates_name_no_time(query: str) -> None:
    assert query_date_terms(query, NOW) == []


def test_without_a_now_only_dates_with_their_year_count() -> None:
    assert query_date_terms("in June, yesterday, and on 3 May 2023", None) == ["@d2023-05-03"]


def test_a_passage_is_indexed_under_its_day_and_month() -> None:
    assert date_terms(day("2023-10-13 23:59")) == ("@d2023-10-13", "@m2023-10")


def painting_chats() -> list[Turn]:
    """The same words on three days: a painting is shown on 6, 13 and 19 October."""
    said = [
        ("2023-10-06 10:00", "Look at the painting I finished, a lake at dawn."),
        ("2023-10-06 10:01", "Lovely colours."),
        ("2023-10-13 10:00", "Here is the painting I finished, abstract with blue streaks."),
        ("2023-10-13 10:01", "So bold!"),
        ("2023-10-19 10:00", "Another painting I finished: my horse in the field."),
        ("2023-10-19 10:01", "Beautiful."),
    ]
    return [Turn(("Caroline", "Melanie")[k % 2], "user", text, day(at)) for k, (at, text) in enumerate(said)]


def test_a_question_that_names_a_day_finds_what_was_said_that_day() -> None:
    index = RecallIndex()
    index.add_turns(0, painting_chats())
    asked = "What painting did Caroline share on October 13, 2023?"
    assert [hit.turn for hit in index.search(asked, now=NOW)][:1] == [2]
    asked = "What painting did Caroline share yesterday?"
    assert [hit.turn for hit in index.search(asked, now=NOW)][:1] == [4]
    # the words alone cannot tell the three apart: the newest of equals comes first
    asked = "What painting did Caroline share?"
    assert [hit.turn for hit in index.search(asked, now=NOW)][:1] == [4]


@pytest.mark.asyncio
async def test_a_server_on_sqlite_recalls_by_the_day_a_question_names(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    start = day("2023-10-20 09:00")
    chatter = [Turn("Melanie", "user", f"Sorting school things, {k}.", start + 60 * k) for k in range(80)]
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("art", {"recent_window": 6, "batch_size": 4})
        for turn in [*painting_chats(), *chatter]:
            await manager.append_turn("art", turn)
        await manager.wait_indexed("art")
        ctx = await manager.context(
            "art", "instructions", budget_chars=3000, query="What painting did Caroline share on 13 October?"
        )
    await store.aclose()
    assert 2 in [p.turn for p in ctx.recalled if p.kind == "turn"]
    assert "[13 October 2023, 10:00] Caroline: Here is the painting I finished" in ctx.instructions
