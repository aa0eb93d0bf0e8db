"""One feed point: outside the core, a session receives its events in one place only, the
runtime's feed, which performs what the core says; a second caller would decide on its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import turns

import voice_context
from voice_context.core.session import (
    Applied,
    CommitCompaction,
    CompactionStored,
    ContextRequested,
    Effect,
    Session,
    StartCompaction,
    SummaryReturned,
    TurnAppended,
)
from voice_context.manager.live import Live
from voice_context.manager.runtime import Runtime

PACKAGE = Path(voice_context.__file__).parent


def receive_calls() -> list[str]:
    """Every call ``x.receive(event)`` (with an argument: a stream's ``receive()`` takes none)
    outside the core, as ``path:line``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if relative.startswith("voice_context/core/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), relative)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "receive"
                and (node.args or node.keywords)
            ):
                found.append(f"{relative}:{node.lineno}")
    return found


def test_the_runtimes_feed_is_the_only_caller_of_receive_outside_the_core() -> None:
    [call] = receive_calls()
    assert call.startswith("voice_context/manager/runtime.py:"), call


@pytest.mark.asyncio
async def test_feed_performs_each_effect_and_returns_it_followed_by_what_it_led_to() -> None:
    runtime = Runtime()
    live = Live(Session("room"), owner=None)
    for t in turns(61):
        await runtime.feed(live, TurnAppended(t))  # nothing performs them here: answers alone
    [start] = await runtime.feed(live, ContextRequested(61.0))
    assert isinstance(start, StartCompaction)
    committed: list[CommitCompaction] = []

    async def commit(live: Live, session: Session, effect: CommitCompaction) -> list[Effect]:
        committed.append(effect)  # as a store would hold it, then the session is told
        return await runtime.feed(live, CompactionStored(effect.plan.plan_id, 62.0), session=session)

    runtime.performs(CommitCompaction, commit)
    effects = await runtime.feed(live, SummaryReturned(start.plan.plan_id, "The start.", 62.0))
    assert [type(effect) for effect in effects] == [CommitCompaction, Applied]
    assert committed == effects[:1] and live.session.cursor == start.plan.end
    with pytest.raises(ValueError, match="CommitCompaction is performed already"):
        runtime.performs(CommitCompaction, commit)
    assert repr(runtime) == "<Runtime performs=CommitCompaction>"
