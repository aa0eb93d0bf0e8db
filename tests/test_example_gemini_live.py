"""``examples/gemini_live.py`` is what a user copies first: offline, it runs in one command against the
project's stand-ins (an in-process voice-context server, the local Live API) and its last question is
answered from the memory a later connection was given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from serving import TIMEOUT, clean_env

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gemini_live.py"


def test_the_gemini_live_example_runs_offline_and_remembers_across_connections(tmp_path: Path) -> None:
    env = {k: v for k, v in clean_env().items() if k not in ("GEMINI_API_KEY", "GOOGLE_API_KEY")}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=TIMEOUT * 12,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("caller: Hi, I'd like to book a trip to Lisbon.")
    # the question comes after the first connection's time is up: a later connection answers it
    answer = lines[-2]
    assert answer.startswith("nova:   Your booking code is QX7-ALPHA.") and not answer.endswith(
        "(connection 1)"
    )
    assert lines[-1].endswith("12 of 12 turns stored")
