"""A program that uses voice-context as a library and never configures logging prints what it
prints, not voice-context's log lines: those follow structlog's configuration when the program
makes one, and are warnings only, on stderr, when it does not."""

from __future__ import annotations

import subprocess
import sys

from serving import TIMEOUT, clean_env

PROGRAM = """
import anyio
{configure}
from voice_context import DeterministicSummarizer, SessionManager, Turn
from voice_context.logs import get_logger


async def main() -> None:
    async with SessionManager(DeterministicSummarizer()) as manager:
        await manager.open("room-1")
        for i in range(61):
            await manager.append_turn("room-1", Turn("Ann", "user", f"Point {{i}}.", at=1.7e9 + i))
        await manager.context("room-1", "messages")  # starts a fold, logged at info
    get_logger("voice_context.story").warning("voice_context_story_warned", about="a warning")
    print("the program's own line")


anyio.run(main)
"""


def run(configure: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM.format(configure=configure)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=TIMEOUT * 6,
        check=True,
    )


def test_without_a_logging_configuration_only_warnings_are_logged_and_to_stderr() -> None:
    result = run(configure="")
    assert result.stdout == "the program's own line\n"
    assert "voice_context_story_warned" in result.stderr
    assert "voice_context_compaction_started" not in result.stderr


def test_a_program_that_configures_structlog_gets_every_line_as_it_configured() -> None:
    result = run(configure="import structlog\nstructlog.configure()")  # structlog's defaults: stdout
    assert "voice_context_compaction_started" in result.stdout
    assert "voice_context_story_warned" in result.stdout
    assert result.stdout.endswith("the program's own line\n")
