"""A pipecat bot with long memory: ``VoiceContextProcessor`` goes around the LLM service, stores
what the pipeline's context gains at each LLM run, and hands the LLM voice-context's context (the
summary of what is old, what was recalled for this turn, the recent turns) instead of the whole
history.

The call is typed, not spoken: a caller (``voice_context.testing.pipecat_caller``) stands where a
voice bot has its transport and speech-to-text, so nothing needs an audio device. Offline, in one
command: a voice-context server runs in this process, and a stand-in for OpenAI on 127.0.0.1
answers a question by quoting its prompt, so the last reply shows what the memory kept of a call
too long for the budget:

    python examples/pipecat_bot.py       # in a clone of the repository: scripts/example pipecat_bot

Online: OpenAI's model answers, and the turns go to your own server (``scripts/serve``) when
``VOICE_CONTEXT_URL`` names it:

    OPENAI_API_KEY=sk-... VOICE_CONTEXT_URL=ws://127.0.0.1:8765/v1 python examples/pipecat_bot.py

Needs ``pip install 'voice-context[pipecat,openai]'`` (``scripts/example`` sets up the examples' extras).
"""

# --- quick start ---
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.workers.runner import WorkerRunner

from voice_context.integrations.pipecat import VoiceContextProcessor


async def call(url: str, caller: FrameProcessor) -> None:
    settings = OpenAILLMService.Settings(
        model="gpt-4.1-mini", system_instruction="You are Nova, a travel agent."
    )
    llm = OpenAILLMService(settings=settings)  # the bot's prompt
    memory = VoiceContextProcessor(url, session="call-7", budget_chars=2000)
    aggregators = LLMContextAggregatorPair(LLMContext())
    pipeline = Pipeline(
        [
            caller,  # a voice bot: transport.input(), stt
            aggregators.user(),
            memory.around(llm),  # what the LLM sees: the remembered context
            aggregators.assistant(),  # a voice bot: tts, transport.output() before it
        ]
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(PipelineWorker(pipeline))
    await runner.run()


# --- end ---

CALLER = [
    "Hi, this is Ana. My booking code is QX7-ALPHA, keep it handy.",
    *(f"On day {day} we visit museum number {day} in the old town." for day in range(1, 31)),
    "What was my booking code again?",
]


def main() -> None:
    """The call, against the stand-ins or the services the environment names (see above)."""
    import sys

    import anyio
    from loguru import logger

    from voice_context.testing.offline import openai_stand_in, voice_context_url
    from voice_context.testing.pipecat_caller import Caller

    logger.remove()  # pipecat logs every frame at DEBUG: its warnings only
    logger.add(sys.stderr, level="WARNING")

    async def run() -> None:
        async with voice_context_url() as url, openai_stand_in():
            await call(url, Caller(CALLER, echo=True))

    anyio.run(run)


if __name__ == "__main__":
    main()
