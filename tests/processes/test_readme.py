"""The README and the reference in docs/: the code a new user pastes first must run and say what it
claims (the library's example in docs/library.md, the bot's in docs/service.md; the quick starts are
the examples', see test_examples.py), and every link between them must reach its page and heading."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT
from serving import TIMEOUT, clean_env

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)


def test_the_library_example_runs_folds_the_first_batch_and_prints_only_what_it_says() -> None:
    example = next(
        block for block in python_blocks(ROOT / "docs" / "library.md") if "SessionManager(" in block
    )
    done = subprocess.run(
        [sys.executable, "-c", example],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=TIMEOUT * 6,
        check=True,
    )
    first, second = done.stdout.splitlines()  # and no log line between them
    assert first == "0 True"
    assert second.startswith("10 [")  # the summary's first line, dated


def test_the_readme_names_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first, second = re.findall(r"^scripts/(\w+)", text, re.MULTILINE)[:2]
    assert (first, second) == ("serve", "test")
    assert (README.parent / ".ci" / "run").read_text().strip().endswith("exec scripts/test")


def test_the_readme_bot_example_talks_to_a_real_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bot = next(block for block in python_blocks(ROOT / "docs" / "service.md") if "Client(URL)" in block)
    command = [sys.executable, "-m", "voice_context", "serve", "--port", "0", "--store", "memory"]
    env = clean_env()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path
    ) as server:
        try:
            assert server.stdout is not None
            line = server.stdout.readline().decode().strip()
            assert line.startswith("listening on ws://127.0.0.1:"), line
            url = line.removeprefix("listening on ")
            exec(
                compile(bot.replace("ws://127.0.0.1:8765/v1", url), "README.md", "exec"),
                {"__name__": "__main__"},
            )
        finally:
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\d+ ", line)]
    assert printed[0] == "0 True"
    assert printed[1].startswith("4 [")


def outside_fences(text: str) -> str:
    """``text`` without its fenced code blocks, where a ``#`` starts no heading."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them (a repeated one gets -1, -2, ...)."""
    made: set[str] = set()
    for heading in re.findall(r"^#+ (.*)$", outside_fences(page.read_text(encoding="utf-8")), re.MULTILINE):
        anchor = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        candidate, n = anchor, 0
        while candidate in made:
            n += 1
            candidate = f"{anchor}-{n}"
        made.add(candidate)
    return made


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_reaches_its_page_and_heading(page: Path) -> None:
    broken = []
    text = re.sub(r"`[^`\n]*`", "", outside_fences(page.read_text(encoding="utf-8")))  # code is no link
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == [], f"{page.name} links to what is not there"


def test_the_readme_points_to_every_page_of_the_reference() -> None:
    text = README.read_text(encoding="utf-8")
    assert [page.name for page in DOCS if f"](docs/{page.name}" not in text] == []
