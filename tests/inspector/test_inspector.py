"""The inspector: what a session remembers and why a bot got its context, shown to people. Its
JSON views over plain HTTP, behind the server's tokens, and its page in a real headless browser
(Debian's chromium, driven by playwright) against a real server: a session followed live as
turns arrive and a fold lands, a stored session nobody holds open, a reply explained (its query,
what was recalled and why, what was left out and dropped, the budget part by part), the recent
contexts with what changed between them, a fold linked to the lines it made and the turns it
folded; and a page people can read: scores on a scale, a filter over a long list of sessions,
one way of writing a time, no request that fails, one document that scrolls and holds still
while nothing changes."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
from helpers import ROOT
from playwright.async_api import Browser, Page, async_playwright
from serving import T0, TIMEOUT, Wire, http_get, running, settings, wire

from voice_context.core.times import MONTHS, stamp
from voice_context.server import Server
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.deterministic import DeterministicSummarizer

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FIXTURES = ROOT / "fixtures"
WAIT = TIMEOUT * 1000  # playwright counts in milliseconds


@asynccontextmanager
async def browser() -> AsyncIterator[Browser]:
    assert CHROMIUM, "the browser test needs Debian's chromium (scripts/setup installs it)"
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


@asynccontextmanager
async def bot_and_browser() -> AsyncIterator[tuple[Server, Wire, Browser]]:
    """A real server folding with the deterministic summarizer, a bot connected to it, a browser."""
    async with (
        running(settings(), summarizer=DeterministicSummarizer()) as server,
        wire(server) as bot,
        browser() as b,
    ):
        yield server, bot, b


async def inspect(
    b: Browser,
    server: Server,
    session: str,
    token: str | None = None,
    *,
    timezone_id: str | None = None,
    failed: list[str] | None = None,
) -> Page:
    """The inspector in a new tab, showing ``session``; a browser in ``timezone_id`` (the
    machine's by default). Every request of the tab that fails, or is answered with an
    error, goes into ``failed`` as ``STATUS URL``."""
    page = await b.new_page(viewport={"width": 1400, "height": 1000}, timezone_id=timezone_id)
    page.set_default_timeout(WAIT)
    if failed is not None:
        page.on("requestfailed", lambda request: failed.append(f"failed {request.url}"))
        page.on(
            "response",
            lambda reply: failed.append(f"{reply.status} {reply.url}") if reply.status >= 400 else None,
        )
    await page.goto(f"http://127.0.0.1:{server.port}/inspector" + (f"?token={token}" if token else ""))
    await page.click(f"button[data-session='{session}']", timeout=WAIT)
    await page.wait_for_selector(f"#title:has-text('{session}')", timeout=WAIT)
    return page


async def replay(bot: Wire, recording: str) -> None:
    """Send a recorded session's messages as a bot would, each answered before the next."""
    for line in (FIXTURES / recording).read_text().splitlines():
        bot.ids += 1
        await bot.send({**orjson.loads(line), "id": bot.ids})
        answer = await bot.reply()
        assert answer["type"] != "error", answer


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
        assert detail["context"]["format"] == "instructions"
        assert detail["context"]["chars"] <= 500
        assert sum(s["chars"] for s in detail["context"]["sections"]) == detail["context"]["chars"]
        other = await http_get(server.port, "/inspector/api/sessions/room-a?token=beta")
        assert other.status == 404, "a token never sees another token's sessions"
        turns = await http_get(server.port, "/inspector/api/sessions/room-a/turns?start=0&end=3&token=beta")
        assert turns.status == 404, "nor their turns"
        page = await http_get(server.port, "/inspector?token=beta")
        assert page.status == 200 and page.headers["content-type"].startswith("text/html")


@pytest.mark.asyncio
async def test_the_page_follows_a_session_live_in_a_real_browser() -> None:
    async with bot_and_browser() as (server, bot, b):
        await bot.open("room-1")
        for k in range(5):
            await bot.append("room-1", k)
        page = await inspect(b, server, "room-1")
        await page.wait_for_selector("#verbatim li[data-index='4']", timeout=WAIT)
        assert await page.inner_text("#cursor") == "cursor 0"
        assert "No context yet" in await page.inner_text("#context")

        # while nothing changes the page holds still: it reads the session each second, and a
        # click pressed on a button the next reading replaced would be lost on its release
        await page.evaluate("document.querySelector('#verbatim li').dataset.seen = 'yes'")
        read = await page.evaluate("ticks")
        await page.wait_for_function(f"ticks >= {read + 2}", timeout=WAIT)
        assert await page.locator("#verbatim li[data-seen='yes']").count() == 1

        # more turns, a context that starts a fold: the page catches up on its own
        for k in range(5, 61):
            await bot.append("room-1", k)
        await bot.request("context.get", session="room-1", format="instructions", budget_chars=2000)
        await page.wait_for_function(
            "document.querySelector('#cursor').textContent === 'cursor 10'", timeout=WAIT
        )
        await page.wait_for_selector("#folds li[data-fold]", timeout=WAIT)
        assert "folded turns 0–9" in await page.inner_text("#folds")
        assert await page.locator("[data-seen]").count() == 0, "what changed is drawn anew"
        assert await page.locator("#verbatim li").count() == 51  # turns 10..60
        assert await page.locator("#verbatim li").first.get_attribute("data-index") == "10"
        head = await page.inner_text("#context-head")
        assert "instructions" in head and "turns 0–60 shown (61)" in head, head
        await page.click("#context-text summary")
        assert "Recent conversation:" in await page.inner_text("#context-text pre")


@pytest.mark.asyncio
async def test_a_stored_session_nobody_holds_open_is_listed_and_shown_to_its_own_token(
    tmp_path: Path,
) -> None:
    tokens = settings(auth_tokens=("alpha", "beta"))
    store = SQLiteStore(tmp_path / "voice-context.db")
    try:
        async with (
            running(tokens, summarizer=DeterministicSummarizer(), store=store) as first,
            wire(first, token="alpha") as bot,
        ):
            await replay(bot, "raid-night.jsonl")  # ends with session.close
        # a server started again over the same file holds no session open
        async with (
            running(tokens, summarizer=DeterministicSummarizer(), store=store) as server,
            browser() as b,
        ):
            page = await inspect(b, server, "raid-night", token="alpha")
            assert await page.get_attribute("button[data-session='raid-night']", "data-live") == "false"
            assert "stored" in await page.inner_text("#title")
            await page.wait_for_selector("#verbatim li[data-index='98']", timeout=WAIT)
            kept = await store.load("raid-night")
            assert kept is not None and await page.inner_text("#cursor") == f"cursor {kept.cursor}"
            assert await page.locator("#summary li").count() >= 2
            assert "Tom's still downloading the patch" in await page.inner_text("#summary")

            other = await b.new_page()
            await other.goto(f"http://127.0.0.1:{server.port}/inspector?token=beta")
            await other.wait_for_selector("#sessions h2", timeout=WAIT)
            assert await other.locator("button[data-session='raid-night']").count() == 0
            hidden = await http_get(server.port, "/inspector/api/sessions/raid-night?token=beta")
            assert hidden.status == 404, "a stored session is another token's too"

            assert server.manager.sessions == 0, "reading it opened nothing"
        record = await store.load("raid-night")
        assert record is not None and record.owner is not None and record.owner.startswith("token:")
    finally:
        await store.aclose()


@pytest.mark.asyncio
async def test_a_reply_shows_its_query_what_was_recalled_and_why_what_was_dropped_and_the_budget() -> None:
    async with bot_and_browser() as (server, bot, b):
        await replay(bot, "raid-night.jsonl")
        await bot.open("raid-night")  # resumed from the store
        reply = await bot.request(
            "context.get",
            session="raid-night",
            format="instructions",
            budget_chars=1500,
            query="When is Tom's birthday?",
        )
        page = await inspect(b, server, "raid-night")

        assert "When is Tom's birthday?" in await page.inner_text("#query")
        assert "birthday" in await page.inner_text("#query .note")
        recalled = [r for r in reply["recalled"] if r["kind"] == "turn"]
        assert recalled, reply["recalled"]
        rows = page.locator("#recalled tr[data-kind='turn']")
        assert await rows.count() == len(recalled)
        birthday = page.locator("#recalled tr", has_text="my birthday is next Friday")
        assert "holds the query's words birthday" in await birthday.locator(".why").inner_text()
        assert await birthday.locator("mark").count() >= 1, "the matched words are marked"
        dropped = await page.inner_text("#dropped")
        assert reply["dropped"] and all(part in dropped for part in reply["dropped"])
        for part in ("summary", "recall", "turns"):
            row = page.locator(f"#budget tr[data-section='{part}']")
            cells = await row.locator("td").all_inner_texts()
            assert cells[1].strip().isdigit() and cells[2].strip().isdigit(), cells  # used, and its share
        used = [int(cell.split()[0]) for cell in await page.locator("#budget td.used").all_inner_texts()]
        assert len(used) == 7 and sum(used) == reply["chars"] <= 1500, used


@pytest.mark.asyncio
async def test_the_recent_contexts_are_kept_with_what_changed_and_each_can_be_explained() -> None:
    async with bot_and_browser() as (server, bot, b):
        await bot.open("room-1")
        for k in range(25):
            await bot.append("room-1", k)
            await bot.request("context.get", session="room-1", format="instructions", budget_chars=800)
        page = await inspect(b, server, "room-1")

        history = page.locator("#history li")
        assert await history.count() == 20, "the newest 20 are kept"
        newest, oldest_kept = history.first, history.last
        assert "1 new turn since" in await newest.locator(".changes").inner_text()
        assert "the oldest kept" in await oldest_kept.inner_text()
        seq = await oldest_kept.get_attribute("data-seq")
        await oldest_kept.click()
        await page.wait_for_selector(f"#context-head:has-text('#{seq} ')", timeout=WAIT)
        assert "turns 0–5 shown (6)" in await page.inner_text("#context-head")
        assert await page.get_attribute(f"#history li[data-seq='{seq}']", "class") == "on"


@pytest.mark.asyncio
async def test_a_fold_is_linked_to_the_summary_lines_it_made_and_the_turns_it_folded() -> None:
    async with bot_and_browser() as (server, bot, b):
        await replay(bot, "offsite-planning.jsonl")
        await bot.open("offsite-planning")
        await bot.request("context.get", session="offsite-planning", format="instructions")
        page = await inspect(b, server, "offsite-planning")
        await page.wait_for_selector("#folds li[data-fold]", timeout=WAIT)

        fold = page.locator("#folds li.completed").last  # the first fold
        seq = await fold.get_attribute("data-fold")
        assert "folded turns 0–" in await fold.inner_text()
        lines = page.locator(f"#summary li[data-fold='{seq}']")
        assert await lines.count() >= 1, "the lines it made name it"
        link = await lines.first.locator("a.fold").inner_text()
        assert link.startswith(f"fold #{seq} · turns 0–"), link

        await lines.first.locator("a.fold").click()  # the fold and its lines light up together
        await page.wait_for_selector(f"#folds li.hl[data-fold='{seq}']", timeout=WAIT)
        assert await page.locator(f"#summary li.hl[data-fold='{seq}']").count() == await lines.count()

        await fold.locator("button.show-turns").click()  # and the turns it folded come from the store
        last = int(link.rsplit("–", 1)[1])
        await page.wait_for_selector(f".folded-turns li[data-index='{last}']", timeout=WAIT)
        assert await page.locator(".folded-turns li").count() == last + 1


async def a_long_talk(bot: Wire) -> None:
    """Session ``room-1``: 61 turns 90 s apart from T0, two screen notes between them, and a
    context too small to show them all, which recalls turn 7 and starts the first fold (turns 0-9)."""
    await bot.open("room-1")
    for k in range(61):
        said = {"text": "Let's book the Lisbon flight for May 3rd."} if k == 7 else {}
        await bot.append("room-1", k, at=T0 + 90 * k, **said)
        if k in (20, 40):
            note = {
                "text": f"scoreboard at turn {k}",
                "at": T0 + 90 * k + 30,
                "speaker": "Alice",
                "source": "game",
            }
            await bot.request("note.append", session="room-1", note=note)
    await bot.request(
        "context.get", session="room-1", format="instructions", budget_chars=800, query="the Lisbon flight"
    )


@pytest.mark.asyncio
async def test_each_passage_recall_offered_shows_its_score_against_the_best_ones_and_says_so() -> None:
    async with bot_and_browser() as (server, bot, b):
        await replay(bot, "raid-night.jsonl")
        await bot.open("raid-night")
        await bot.request(
            "context.get",
            session="raid-night",
            format="instructions",
            budget_chars=1500,
            query="When is Tom's birthday?",
        )
        page = await inspect(b, server, "raid-night")
        view = json.loads((await http_get(server.port, "/inspector/api/sessions/raid-night")).body)["context"]
        recalled, left_out = view["recalled"], view["left_out"]
        assert recalled and left_out, "passages shown, and passages left out for want of room"

        # turns and notes are one ranking, summary lines another: each is scaled by its own best
        for group in (
            [p for p in recalled + left_out if p["kind"] != "summary"],
            [p for p in recalled + left_out if p["kind"] == "summary"],
        ):
            if not group:
                continue
            best = max(p["score"] for p in group)
            assert [p["of_best"] for p in group if p["rank"] == 1] == [1.0]
            for p in group:
                assert p["of_best"] == pytest.approx(p["score"] / best, abs=0.01)  # scores rounded
            by_rank = sorted(group, key=lambda p: p["rank"])
            assert [p["of_best"] for p in by_rank] == sorted((p["of_best"] for p in group), reverse=True)

        # on the page, a passage shown and one left out alike: a rank, a bar and a percentage of
        # the best, and recall's own number when the pointer rests on it
        await page.wait_for_selector("#left-out tr[data-kind]", timeout=WAIT)
        for table, passages in (("#recalled", recalled), ("#left-out", left_out)):
            rows = page.locator(f"{table} tr[data-kind]")
            assert await rows.count() == len(passages)
            for k, p in enumerate(passages):
                row = rows.nth(k)
                share = math.floor(100 * p["of_best"] + 0.5)  # as the page rounds
                assert (await row.locator("td.num").first.inner_text()).strip() == str(p["rank"])
                assert (await row.locator("td.score").inner_text()).strip() == f"{share}%"
                assert str(p["score"]) in (await row.locator("td.score").get_attribute("title") or "")
                assert await row.locator("td.score .bar span").get_attribute("style") == f"width:{share}%"
        scale = await page.inner_text("#score-scale")
        assert "share of the best" in scale and "100% = the best" in scale, scale


@pytest.mark.asyncio
async def test_a_filter_over_the_session_list_keeps_showing_only_the_names_asked_for_as_it_refreshes() -> (
    None
):
    async with bot_and_browser() as (server, bot, b):
        for kind in ("raid", "standup", "lunch", "retro"):
            for k in range(4):
                await bot.open(f"{kind}-{k}")
        page = await inspect(b, server, "raid-0")
        shown = page.locator("#sessions button:visible")

        await page.fill("#filter", "RAID")  # case does not matter
        names = await shown.evaluate_all("buttons => buttons.map(b => b.dataset.session)")
        assert names == ["raid-0", "raid-1", "raid-2", "raid-3"]
        assert await page.locator("#sessions h2").first.text_content() == "held open here (4 of 16)"

        # the list is read again every 5 s: a session opened meanwhile shows only if it is named so
        await bot.open("raid-late")
        await bot.open("lunch-late")
        await page.wait_for_selector("button[data-session='raid-late']", state="visible", timeout=2 * WAIT)
        assert await page.locator("button[data-session='lunch-late']").is_hidden()
        assert await page.input_value("#filter") == "RAID"

        await page.fill("#filter", "karaoke")
        assert await shown.count() == 0
        assert "none named like “karaoke”" in await page.inner_text("#sessions")
        await page.fill("#filter", "")
        assert await shown.count() == 18


STAMP = (
    r"\b\d{1,2} (?:" + "|".join(MONTHS) + r") \d{4}, \d{2}:\d{2}\b"
)  # "8 May 2023, 13:56": how a context dates its lines


@pytest.mark.asyncio
async def test_every_time_on_the_page_is_session_time_in_utc_written_one_way() -> None:
    async with bot_and_browser() as (server, bot, b):
        await a_long_talk(bot)
        # a browser 5 h 30 min from UTC: a time in its own zone would show
        page = await inspect(b, server, "room-1", timezone_id="Asia/Kolkata")
        await page.wait_for_selector("#folds li[data-fold]", timeout=WAIT)
        await page.wait_for_selector("#recalled tr[data-kind]", timeout=WAIT)

        text = await page.inner_text("body")
        assert len(re.findall(STAMP, text)) >= 5, (
            text
        )  # the context, its history, the fold, the notes, recall
        assert not re.search(r"\d{4}-\d{2}-\d{2}|\b[AP]M\b", text), "no ISO time, no clock time"
        assert not re.search(r"\d:\d\d", re.sub(STAMP, "", text)), "every time is written as a stamp"
        newest = stamp(T0 + 90 * 60)  # the context and the fold are dated by the newest turn then
        assert newest in await page.inner_text("#context-head")
        assert newest in await page.inner_text("#folds li[data-fold]")
        assert newest in await page.inner_text("#history li")
        assert f"{stamp(T0 + 90 * 40 + 30)} Alice's screen (game): scoreboard at turn 40" in text


@pytest.mark.asyncio
async def test_every_request_the_page_makes_is_answered_and_it_has_an_icon() -> None:
    async with bot_and_browser() as (server, bot, b):
        await replay(bot, "offsite-planning.jsonl")
        await bot.open("offsite-planning")
        await bot.request("context.get", session="offsite-planning", format="instructions")
        await bot.request("context.get", session="offsite-planning", format="instructions", query="budget")
        failed: list[str] = []
        page = await inspect(b, server, "offsite-planning", failed=failed)

        # all the page does: explain an older context, pick a fold and read its turns, filter
        older = page.locator("#history li").last
        seq = await older.get_attribute("data-seq")
        await older.click()
        await page.wait_for_selector(f"#history li.on[data-seq='{seq}']", timeout=WAIT)
        link = page.locator("#summary a.fold").first
        await link.click()
        await page.wait_for_selector("#folds li.hl", timeout=WAIT)
        await page.locator("#folds li.hl button.show-turns").click()
        await page.wait_for_selector(".folded-turns li", timeout=WAIT)
        await page.fill("#filter", "offsite")
        icon = await page.evaluate("fetch(document.querySelector('link[rel=icon]').href).then(r => r.status)")
        assert icon == 200, "the icon the page names is served"
        assert failed == [], failed

        served = await http_get(server.port, "/favicon.ico")  # a browser asks on a JSON view too
        assert served.status == 200 and served.headers["content-type"] == "image/svg+xml"
        assert served.body.startswith(b"<svg")


# what scrolls inside the page, rather than with it: an element whose content overflows a box
# that scrolls
PANES_THAT_SCROLL = """[...document.querySelectorAll("body *")].filter(e => {
  const s = getComputedStyle(e);
  return (["auto", "scroll"].includes(s.overflowY) && e.scrollHeight > e.clientHeight)
      || (["auto", "scroll"].includes(s.overflowX) && e.scrollWidth > e.clientWidth);
}).map(e => e.tagName.toLowerCase() + (e.id ? "#" + e.id : ""))"""


@pytest.mark.asyncio
async def test_the_page_scrolls_as_one_document_and_no_pane_scrolls_inside_it() -> None:
    async with bot_and_browser() as (server, bot, b):
        await a_long_talk(bot)
        page = await inspect(b, server, "room-1")
        await page.wait_for_selector("#verbatim li[data-index='60']", timeout=WAIT)
        await page.wait_for_selector("#folds li[data-fold]", timeout=WAIT)

        height, width, viewport = await page.evaluate(
            "[document.scrollingElement.scrollHeight, document.scrollingElement.scrollWidth, innerWidth]"
        )
        assert height > 1000, "51 turns and the rest are taller than the window: the document is"
        assert width <= viewport, "and it does not scroll sideways"
        assert await page.evaluate(PANES_THAT_SCROLL) == []

        # scrolled to its end, the document shows the newest turn and the landmarks under it
        await page.evaluate("window.scrollTo(0, document.scrollingElement.scrollHeight)")
        await page.wait_for_function("scrollY + innerHeight >= document.scrollingElement.scrollHeight - 1")
        newest = await page.locator("#verbatim li[data-index='60']").bounding_box()
        assert newest is not None and 0 <= newest["y"] < 1000, newest
