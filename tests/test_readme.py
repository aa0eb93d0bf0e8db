"""The README's example is code a new user will paste first: it must run, and say what it claims."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_example_runs_and_folds_the_first_batch(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert blocks, "the README has a python example"
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "__main__"})
    printed = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\d+ ", line)]
    assert printed[0] == "0 True"
    assert printed[-1].startswith("10 Earlier in this session: ")


def test_the_readme_names_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first, second = re.findall(r"^scripts/(\w+)", text, re.MULTILINE)[:2]
    assert (first, second) == ("serve", "test")
    assert (README.parent / ".ci" / "run").read_text().strip().endswith("exec scripts/test")
