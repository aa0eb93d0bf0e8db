"""The README's example is code a new user will paste first: it must run, and say what it claims."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from serving import clean_env

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_example_runs_and_folds_the_first_batch(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert blocks, "the README has a python example"
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "__main__"})
    printed = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\d+ ", line)]
    assert printed[0] == "0 True"
    assert printed[-1].startswith("10 [")  # the summary's first line, dated


def test_the_readme_names_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first, second = re.findall(r"^scripts/(\w+)", text, re.MULTILINE)[:2]
    assert (first, second) == ("serve", "test")
    assert (README.parent / ".ci" / "run").read_text().strip().endswith("exec scripts/test")


def test_the_readme_bot_example_talks_to_a_real_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    bot = next(block for block in blocks if "voice_context.client" in block)
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
