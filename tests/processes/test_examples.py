"""The examples (``examples/*.py``) are the programs a new user runs first, each in one command:
every one runs offline and its bot remembers; with a key, each calls the provider (played here by
a local server at the URL the provider's environment names) with that key; and the README shows
each one's quick start as it is in the file.

What every example does, so that a new one slots in: it plays the same call (``CALLER``: the
booking code said first, then enough turns to push it out of the context's budget, then the
question about it), prints each line as ``caller: ...`` and each reply as ``bot: ...``, and marks
the part the README shows between ``# --- quick start ---`` and ``# --- end ---``. Offline, its
model's words come from a stand-in that quotes what its prompt held
(``voice_context.testing.answers``), so the last reply names the code only if the memory kept it.
"""

from __future__ import annotations

import builtins
import re
import symtable
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import ROOT
from serving import TIMEOUT, clean_env

from voice_context.testing.answers import answer, answer_chat

EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
README = ROOT / "README.md"
FACT = "QX7-ALPHA"
QUICK_START = re.compile(r"^# --- quick start ---\n(.*?)^# --- end ---$", re.MULTILINE | re.DOTALL)
EXCERPT = re.compile(r"<!-- excerpt: (examples/[\w.]+) -->\n```python\n(.*?)```", re.DOTALL)
#: what an example is run with: the providers' and voice-context's settings are the test's to give
PROVIDERS = (
    *("OPENAI_API_KEY", "OPENAI_BASE_URL", "REALTIME_CALL_ID", "REALTIME_URL"),
    *("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL", "GEMINI_LIVE_MODEL"),
)


def environment(**values: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if k not in PROVIDERS}
    return env | {"PYTHONUNBUFFERED": "1"} | values


async def run(example: Path, **env: str) -> list[str]:
    """Run ``example`` to its end in a process of its own; the lines it printed."""
    with anyio.fail_after(TIMEOUT * 24):
        done = await anyio.run_process(
            [sys.executable, str(example)], env=environment(**env), cwd=ROOT, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().splitlines()


_offline: dict[Path, list[str]] = {}


async def offline(example: Path) -> list[str]:
    """The lines ``example`` printed offline: run once for this file, however many tests read them."""
    if example not in _offline:
        _offline[example] = await run(example)
    return _offline[example]


def exchanges(printed: list[str]) -> tuple[list[str], list[str]]:
    """What the caller said and what the bot answered, in order."""
    caller = [line.removeprefix("caller: ") for line in printed if line.startswith("caller: ")]
    bot = [line.removeprefix("bot: ") for line in printed if line.startswith("bot: ")]
    return caller, bot


def quick_start(example: Path) -> str:
    (part,) = QUICK_START.findall(example.read_text(encoding="utf-8"))
    return textwrap.dedent(part).strip() + "\n"


def test_the_stand_in_model_answers_a_question_with_what_its_prompt_held() -> None:
    prompt = "You are Nova.\n- [1 May 2024, 14:03] user: My code is QX7-ALPHA, keep it.\nuser: Day 3 museum."
    assert answer(prompt, "user: What was my code again?") == "From memory: My code is QX7-ALPHA, keep it."
    assert answer("You are Nova.\nuser: Day 3 museum.", "What was my code again?") == "Noted."
    assert answer(prompt, "My code is QX7-ALPHA.") == "Noted."  # not a question
    request = {"messages": [{"role": "system", "content": prompt}, {"role": "user", "content": "My code?"}]}
    assert answer_chat(request) == "From memory: My code is QX7-ALPHA, keep it."


@pytest.mark.asyncio
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
async def test_each_example_runs_offline_and_its_last_reply_carries_what_was_said_first(
    example: Path,
) -> None:
    printed = await offline(example)
    caller, bot = exchanges(printed)
    assert FACT in caller[0] and caller[-1].endswith("?")
    assert len(bot) == len(caller) > 20, "every line answered, in a call long enough to fold"
    assert FACT not in " ".join(bot[:-1])
    assert FACT in bot[-1], f"the bot forgot: {bot[-1]!r}"


@pytest.mark.asyncio
async def test_the_gemini_live_example_answers_on_a_later_connection_and_stores_every_turn() -> None:
    printed = await offline(ROOT / "examples" / "gemini_live.py")  # the run the test above made
    caller, _ = exchanges(printed)
    connections, go_aways, resumed = figures(printed, "gemini live: {} connections, {} goAways, {} resumed")
    assert connections > 1 and go_aways >= connections - 1 and resumed >= 1
    (answered_on,) = figures(printed, "the Live API stand-in: the question answered on connection {}")
    assert answered_on > 1, "the question came after the first connection was gone"
    stored, said = figures(printed, "voice-context: {} of the {} turns said stored")
    assert stored == said == 2 * len(caller), "every line and every reply stored"


def figures(printed: list[str], line: str) -> tuple[int, ...]:
    """The numbers in the one printed line that reads as ``line`` with a number for each ``{}``."""
    pattern = re.compile(re.escape(line).replace(r"\{\}", r"(\d+)"))
    (found,) = [m for m in map(pattern.fullmatch, printed) if m is not None]
    return tuple(map(int, found.groups()))


# -- the README's quick starts


def readme_excerpts() -> list[tuple[str, str]]:
    return EXCERPT.findall(README.read_text(encoding="utf-8"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_each_examples_quick_start_uses_only_names_it_defines_or_imports(example: Path) -> None:
    assert undefined(quick_start(example)) == set()


def test_every_excerpt_in_the_readme_is_its_examples_quick_start_with_the_command_that_runs_it() -> None:
    excerpts = readme_excerpts()
    assert excerpts, "the README shows the examples' quick starts"
    text = README.read_text(encoding="utf-8")
    for path, shown in excerpts:
        assert shown == quick_start(ROOT / path), f"the README's excerpt of {path} is not its quick start"
        command = f"scripts/example {Path(path).stem}"
        assert command in text, f"the README does not say how to run {path}"


def test_the_readme_shows_the_quick_start_of_every_example() -> None:
    assert sorted(path for path, _ in readme_excerpts()) == [f"examples/{e.name}" for e in EXAMPLES]


def undefined(source: str) -> set[str]:
    """The names ``source`` uses that it neither defines nor imports (nor are builtins)."""
    table = symtable.symtable(source, "quick start", "exec")
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
    used: set[str] = set()

    def walk(scope: Any) -> None:
        for symbol in scope.get_symbols():
            if symbol.is_referenced() and (symbol.is_global() or scope is table):
                used.add(symbol.get_name())
        for child in scope.get_children():
            walk(child)

    walk(table)
    return used - bound - set(dir(builtins))
