"""The person on a pipecat call, typing: a frame processor that stands at the top of a pipeline,
where a voice bot has its transport and speech-to-text, so that a bot runs with no audio device.

    caller = Caller(["Hi, I'm Ana.", "What is my name?"], echo=True)
    pipeline = Pipeline([caller, aggregators.user(), llm, aggregators.assistant()])

Needs the ``pipecat`` extra (``pip install 'voice-context[pipecat]'``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from pipecat.frames.frames import (
    EndWorkerFrame,
    Frame,
    LLMContextAssistantTurnFrame,
    LLMMessagesAppendFrame,
    StartFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

__all__ = ["Caller", "says"]


def says(text: str) -> list[Frame]:
    """A user turn put in the context with pipecat's own frame: appended, then an LLM run."""
    return [LLMMessagesAppendFrame(messages=[{"role": "user", "content": text}], run_llm=True)]


class Caller(FrameProcessor):
    """Says each of ``lines`` once the bot's answer to the one before is in the context (the
    assistant aggregator announces it up the pipeline), then hangs up: the pipeline ends. A line
    is words (see :func:`says`) or the frames to push (a context reset, say). With ``echo``,
    prints the words of each line and of each answer, as ``caller: ...`` and ``bot: ...``."""

    def __init__(self, lines: Iterable[str | Sequence[Frame]], *, echo: bool = False) -> None:
        super().__init__()
        self.lines = deque(lines)
        self.echo = echo

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, LLMContextAssistantTurnFrame) and self.echo:
            print(f"bot: {frame.text}")
        if isinstance(frame, StartFrame | LLMContextAssistantTurnFrame):
            await self.say_next()

    async def say_next(self) -> None:
        """Say the next line, or hang up when none is left."""
        if not self.lines:
            await self.push_frame(EndWorkerFrame(), FrameDirection.UPSTREAM)
            return
        line = self.lines.popleft()
        if isinstance(line, str):
            if self.echo:
                print(f"caller: {line}")
            line = says(line)
        for frame in line:
            await self.push_frame(frame)
