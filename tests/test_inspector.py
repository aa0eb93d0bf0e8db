"""The inspector: what a session remembers, shown to people. Its JSON views over plain HTTP, behind
the server's tokens, and its page in a real headless browser (Debian's chromium, driven by
playwright) following a session live as turns arrive and a fold lands."""

from __future__ import annotations

import json
import shutil

import pytest
from playwright.async_api import async_playwright
from serving import TIMEOUT, http_get, running, settings, wire

from voice_context.summarizers.deterministic import DeterministicSummarizer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.asyncio
async def test_the_views_show_a_session_and_only_to_its_own_token() -> None:
    async with (
        running(settings(auth_tokens=("alpha", "beta")), summarizer=DeterministicSummarizer()) as server,
        wire(server, token="alpha") as alice,
        wire(server, token="beta") as bob,
    ):
        await alice.open("room-a")
        await bob.open("room-b")
        for k in range(3):
            await alice.append("room-a", k)
        await alice.request("context.get", session="room-a", format="instructions", budget_chars=500)

        assert (await http_get(server.port, "/inspector/api/sessions")).status == 401
        listed = await http_get(server.port, "/inspector/api/sessions?token=alpha")
        assert [s["session"] for s in json.loads(listed.body)] == ["room-a"]
        view = await http_get(
            server.port, "/inspector/api/sessions/room-a", [("Authorization", "Bearer alpha")]
        )
        detail = json.loads(view.body)
        assert [t["index"] for t in detail["verbatim"]] == [0, 1, 2]
        assert detail["last_context"]["format"] == "instructions"
        assert detail["last_context"]["chars"] <= 500
        other = await http_get(server.port, "/inspector/api/sessions/room-a?token=beta")
        assert other.status == 404, "a token never sees another token's sessions"
        page = await http_get(server.port, "/inspector?token=beta")
        assert page.status == 200 and page.headers["content-type"].startswith("text/html")


@pytest.mark.asyncio
async def test_the_page_follows_a_session_live_in_a_real_browser() -> None:
    assert CHROMIUM, "the browser test needs Debian's chromium (scripts/setup installs it)"
    async with (
        running(settings(), summarizer=DeterministicSummarizer()) as server,
        wire(server) as bot,
        async_playwright() as playwright,
    ):
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page()
            await bot.open("room-1")
            for k in range(5):
                await bot.append("room-1", k)
            await page.goto(f"http://127.0.0.1:{server.port}/inspector")
            await page.click("button[data-session='room-1']", timeout=TIMEOUT * 1000)
            await page.wait_for_selector("#verbatim li[data-index='4']", timeout=TIMEOUT * 1000)
            assert await page.inner_text("#cursor") == "cursor 0"
            assert await page.inner_text("#last-context") == "none yet"

            # more turns, a context that starts a fold: the page catches up on its own
            for k in range(5, 61):
                await bot.append("room-1", k)
            await bot.request("context.get", session="room-1", format="instructions", budget_chars=2000)
            await page.wait_for_function(
                "document.querySelector('#cursor').textContent === 'cursor 10'", timeout=TIMEOUT * 1000
            )
            events = await page.inner_text("#events")
            assert "folded turns 0–9" in events
            assert await page.locator("#verbatim li").count() == 51  # turns 10..60
            assert await page.locator("#verbatim li").first.get_attribute("data-index") == "10"
            context = await page.inner_text("#last-context")
            assert "instructions" in context and "Recent conversation:" in context
        finally:
            await browser.close()
