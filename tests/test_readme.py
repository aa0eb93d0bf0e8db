"""The README's examples are code a new user will paste first: each must run, and say what it claims."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from serving import TIMEOUT, clean_env

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)


def test_the_library_example_runs_folds_the_first_batch_and_prints_only_what_it_says() -> None:
    example = next(block for block in python_blocks() if "SessionManager(" in block)
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
    bot = next(block for block in python_blocks() if "Client(URL)" in block)
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
