"""Screenshots of the inspector for docs/inspector.md, taken from a real server.

Usage: scripts/inspector-screenshots [--out docs]

Starts ``voice-context serve`` on a free port with an SQLite store in a scratch directory,
replays the two recordings of ``fixtures/`` into it over the websocket as a bot would (each
ends by closing its session, so both are then only in the store), opens ``raid-night`` again
and asks for a context with a question as its query, then drives Debian's chromium (headless,
through playwright) over the inspector and saves three PNGs:

- ``inspector-reply.png``: the top of the page: the sessions, and why the bot got its context
  (the query, each recalled passage with its rank, its score against the best one's and why it
  ranked, the budget part by part, what was dropped, and the first passages recall offered that
  were left out);
- ``inspector-folds.png``: the recent contexts with what changed, the summary's lines with the
  fold that made each, a fold picked (its lines marked) and the turns it folded;
- ``inspector-stored.png``: a session nobody holds open, read from the store.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from playwright.async_api import Page, ViewportSize, async_playwright
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
QUESTION = "When is Tom's birthday, and what is he planning?"
VIEWPORT: ViewportSize = {"width": 1280, "height": 780}
TALL: ViewportSize = {"width": 1280, "height": 1200}
RECORDINGS = ("raid-night.jsonl", "offsite-planning.jsonl")
SHOTS = ("inspector-reply.png", "inspector-folds.png", "inspector-stored.png")


async def replay(url: str, lines: list[str]) -> None:
    """Send a recording's messages, each answered before the next (compaction pushes aside)."""
    async with connect(url) as ws:
        for k, line in enumerate(lines):
            await ws.send(json.dumps({**json.loads(line), "id": k + 1}))
            while True:
                answer = json.loads(await ws.recv())
                if not str(answer.get("type", "")).startswith("compaction."):
                    break
            if answer["type"] == "error":
                raise RuntimeError(f"{line}: {answer}")


@contextlib.asynccontextmanager
async def asking(url: str, session: str, question: str) -> AsyncIterator[None]:
    """Open a stored session again, ask for a context with ``question`` as its query, and hold
    the session open until the block ends."""
    async with connect(url) as ws:
        await ws.send(json.dumps({"type": "session.open", "session": session, "id": 1}))
        await ws.recv()
        await ws.send(
            json.dumps(
                {
                    "type": "context.get",
                    "session": session,
                    "id": 2,
                    "format": "instructions",
                    "budget_chars": 1500,
                    "query": question,
                    "base_instructions": "You are Nova, a friendly voice assistant in this call.",
                }
            )
        )
        await ws.recv()
        yield


async def show(page: Page, session: str) -> None:
    await page.click(f"button[data-session='{session}']")
    await page.wait_for_selector(f"#title:has-text('{session}')")


async def shoot(base: str, out: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs Debian's chromium (scripts/setup test installs it)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport=VIEWPORT)
            await page.goto(base + "/inspector")
            await show(page, "raid-night")
            await page.wait_for_selector("#recalled tr[data-kind]")
            await page.set_viewport_size(TALL)  # the top of the page, down to what was left out
            await page.screenshot(path=out / "inspector-reply.png")
            await page.set_viewport_size(VIEWPORT)

            # the oldest fold whose lines the summary still shows (a later fold may have rewritten
            # the first one's)
            line = page.locator("#summary li[data-fold]:has(a.fold)").first
            seq = await line.get_attribute("data-fold")
            fold = page.locator(f"#folds li[data-fold='{seq}']")
            await line.locator("a.fold").click()
            await page.wait_for_selector(f"#folds li.hl[data-fold='{seq}']")
            await fold.locator("button.show-turns").click()
            await page.wait_for_selector(".folded-turns li")
            # its last line at the top, the fold and the turns it folded under it
            await page.evaluate("[...document.querySelectorAll('#summary li.hl')].pop().scrollIntoView()")
            await page.wait_for_timeout(200)  # the next refresh has drawn it
            await page.screenshot(path=out / "inspector-folds.png")

            await show(page, "offsite-planning")
            await page.wait_for_selector("#verbatim li")
            await page.screenshot(path=out / "inspector-stored.png")
        finally:
            await browser.close()


async def drive(url: str, base: str, out: Path) -> None:
    for recording in RECORDINGS:
        await replay(url, (FIXTURES / recording).read_text().splitlines())
    async with asking(url, "raid-night", QUESTION):
        await shoot(base, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the PNGs go (default docs/)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vc-inspector-") as scratch:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VOICE_CONTEXT_")}
        env |= {"VOICE_CONTEXT_SERVER_TURNS_PER_SECOND": "1000", "VOICE_CONTEXT_SERVER_TURN_BURST": "1000"}
        command = [sys.executable, "-m", "voice_context", "serve", "--port", "0", "--log-level", "warning"]
        command += ["--store", f"sqlite://{scratch}/voice-context.db"]
        server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        try:
            assert server.stdout is not None
            url = server.stdout.readline().split()[-1]  # listening on ws://...
            base = server.stdout.readline().split()[-1].removesuffix("/inspector")  # inspector at http://...
            asyncio.run(drive(url, base, args.out))
        finally:
            server.terminate()
            server.wait(timeout=30)
    for name in SHOTS:
        print(f"{args.out / name}: {(args.out / name).stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
