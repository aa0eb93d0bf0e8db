"""The examples with a key: each calls the provider, played here by a local server at the URL the
provider's environment names (``OPENAI_BASE_URL``, ``REALTIME_URL``, ``GOOGLE_GEMINI_BASE_URL``),
with that key, and stores the call in the voice-context server ``VOICE_CONTEXT_URL`` names.
(Offline, in ``test_examples.py``.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from serving import TIMEOUT, running, settings
from test_examples import FACT, ROOT, environment, exchanges, run

from voice_context.client import Client
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.testing.answers import answer, answer_chat
from voice_context.testing.gemini_live_server import GeminiLiveServer, Prompt
from voice_context.testing.openai_server import OpenAIServer, ReplyWith
from voice_context.testing.realtime_server import StandInRealtime, User


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["client_bot.py", "pipecat_bot.py", "livekit_agent.py"])
async def test_with_a_key_an_example_asks_the_provider_with_it_and_stores_the_call_where_told(
    name: str,
) -> None:
    async with (
        running(settings(), summarizer=DeterministicSummarizer()) as server,
        OpenAIServer(default=ReplyWith(answer_chat)) as provider,
    ):
        printed = await run(
            ROOT / "examples" / name,
            OPENAI_API_KEY="sk-test",
            OPENAI_BASE_URL=provider.base_url,
            VOICE_CONTEXT_URL=server.url,
        )
        async with Client(server.url) as client:
            state = await (await client.open("call-7")).state()
    caller, bot = exchanges(printed)
    asked = provider.completions
    assert len(asked) == len(caller)
    assert {r.headers["authorization"] for r in asked} == {"Bearer sk-test"}
    assert {r.json["model"] for r in asked} == {"gpt-4.1-mini"}
    assert state["turns"] == 2 * len(caller), "each line and each reply stored in the server named"
    assert FACT in bot[-1]


@pytest.mark.asyncio
async def test_with_a_key_the_realtime_example_joins_the_call_named_over_its_sideband() -> None:
    said = ["My booking code is QX7-ALPHA.", "What was my booking code again?"]
    realtime = StandInRealtime(timeout=TIMEOUT)
    call = realtime.call("rtc_u1_9c65", [User(line, answer) for line in said])
    async with running(settings(), summarizer=DeterministicSummarizer()) as server, realtime:
        printed = await run(
            ROOT / "examples" / "openai_realtime.py",
            OPENAI_API_KEY="sk-test",
            REALTIME_CALL_ID="rtc_u1_9c65",
            REALTIME_URL=realtime.url,
            VOICE_CONTEXT_URL=server.url,
        )
        async with Client(server.url) as client:
            state = await (await client.open("call-7")).state()
    assert call.path == "/v1/realtime?call_id=rtc_u1_9c65"
    assert call.headers["Authorization"] == "Bearer sk-test"
    assert call.errors == []
    assert exchanges(printed) == (said, ["Noted.", "From memory: My booking code is QX7-ALPHA."])
    assert state["turns"] == 4


def test_with_a_key_and_no_call_the_realtime_example_says_what_it_needs() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openai_realtime.py")],
        env=environment(OPENAI_API_KEY="sk-test"),
        capture_output=True,
        text=True,
        timeout=TIMEOUT * 6,
        check=False,
    )
    assert done.returncode == 1
    assert "REALTIME_CALL_ID" in done.stderr


@pytest.mark.asyncio
async def test_with_a_key_the_gemini_live_example_calls_the_live_api_with_it(tmp_path: Path) -> None:
    def remembers(prompt: Prompt) -> str:  # Gemini's model has the conversation of its session
        return answer(
            "\n".join([prompt.system_instruction, *(text for _, text in prompt.history)]), prompt.heard
        )

    async with (
        running(settings(), summarizer=DeterministicSummarizer()) as server,
        GeminiLiveServer(model=remembers) as live_api,
    ):
        (tmp_path / "live-api.pem").write_bytes(live_api.certificate)
        printed = await run(
            ROOT / "examples" / "gemini_live.py",
            GEMINI_API_KEY="gemini-test",
            GOOGLE_GEMINI_BASE_URL=live_api.base_url,
            SSL_CERT_FILE=str(tmp_path / "live-api.pem"),
            VOICE_CONTEXT_URL=server.url,
        )
        async with Client(server.url) as client:
            state = await (await client.open("call-7")).state()
    caller, bot = exchanges(printed)
    (connection,) = live_api.connections
    assert connection.api_key == "gemini-test"
    assert connection.setup["model"] == "models/gemini-live-2.5-flash-preview"
    assert len(connection.replies) == len(caller)
    assert state["turns"] == 2 * len(caller), "each line and each reply stored in the server named"
    assert FACT in bot[-1]
