"""``voice-context serve`` as a real process: it says where it listens, serves, stops cleanly on a signal."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import anyio
import orjson
import pytest
from anyio.abc import Process
from serving import TIMEOUT, Wire, clean_env, http_get, serve_process
from websockets.asyncio.client import connect

from voice_context.cli import build_parser
from voice_context.commands.serve import settings_from


async def stderr_of(process: Process) -> str:
    assert process.stderr is not None
    chunks = []
    with anyio.move_on_after(TIMEOUT):
        async for chunk in process.stderr:
            chunks.append(chunk)
    return b"".join(chunks).decode()


@pytest.mark.asyncio
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_serve_listens_then_shuts_down_gracefully_on_a_signal(signum: int, tmp_path: Path) -> None:
    async with serve_process("--store", "memory", "--record", str(tmp_path / "rec")) as running:
        health = await http_get(running.port, "/healthz")
        assert health.json()["status"] == "ok"
        async with connect(running.url, open_timeout=TIMEOUT) as ws:
            bot = Wire(ws)
            assert (await bot.open("room-1"))["type"] == "session.opened"
            assert (await bot.append("room-1", 0))["index"] == 0
            running.process.send_signal(signum)
            assert await bot.closed_with() == 1001
        with anyio.fail_after(TIMEOUT * 2):
            code = await running.process.wait()
        logs = [orjson.loads(line) for line in (await stderr_of(running.process)).splitlines() if line]
        assert code == 0
    events = [entry["event"] for entry in logs]
    assert "voice_context_shutdown_finished" in events
    assert events[-1] == "voice_context_server_stopped"
    recorded = (tmp_path / "rec" / "room-1.jsonl").read_text().splitlines()
    assert [orjson.loads(line)["type"] for line in recorded] == ["session.open", "turn.append"]


@pytest.mark.asyncio
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names are read from /proc")
@pytest.mark.parametrize("reads", ["loop", "thread"])
async def test_a_served_process_s_store_threads_go_by_their_own_names(tmp_path: Path, reads: str) -> None:
    """``top -H`` and ``/proc`` tell a server's threads apart (what ``scripts/load`` prints,
    each thread's CPU): the store's writer and reader by name, beside the event loop's. With
    the reads on the event loop's thread (the default), a context starts no reader."""
    store = f"sqlite:///{tmp_path / 'vc.db'}"
    env = {"VOICE_CONTEXT_STORE_SQLITE_READS": reads}
    async with serve_process("--store", store, "--log-level", "warning", env=env) as running:
        async with connect(running.url, open_timeout=TIMEOUT) as ws:
            bot = Wire(ws)
            assert (await bot.open("room-1"))["type"] == "session.opened"
            assert (await bot.append("room-1", 0))["index"] == 0
            assert (await bot.request("context.get", session="room-1"))["type"] == "context"
        names = thread_names(running.process.pid)
    assert "sqlite-writer" in names.values()
    assert ("sqlite-reader" in names.values()) == (reads == "thread")
    assert names[running.process.pid] not in {"sqlite-writer", "sqlite-reader", "fold"}  # the event loop's


def thread_names(pid: int) -> dict[int, str]:
    """Each thread of process ``pid`` by its id, with the name the system keeps for it."""
    tasks = Path(f"/proc/{pid}/task")
    return {int(task.name): task.joinpath("comm").read_text().strip() for task in tasks.iterdir()}


@pytest.mark.asyncio
@pytest.mark.parametrize("preload", ["true", "false"])
async def test_the_tokenizer_is_read_before_listening_unless_told_to_wait_for_a_token_budget(
    preload: str,
) -> None:
    env = {"VOICE_CONTEXT_SERVER_PRELOAD_TOKENIZER": preload}
    async with serve_process("--store", "memory", "--log-level", "info", env=env) as running:
        async with connect(running.url, open_timeout=TIMEOUT) as ws:
            bot = Wire(ws)
            await bot.open("room-1")
            await bot.append("room-1", 0)
            reply = await bot.request("context.get", session="room-1", format="messages", budget_tokens=500)
            assert reply["type"] == "context" and reply["messages"]
        running.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(TIMEOUT * 2):
            assert await running.process.wait() == 0
        logs = [orjson.loads(line) for line in (await stderr_of(running.process)).splitlines() if line]
    events = [entry["event"] for entry in logs]
    assert events.count("voice_context_tokenizer_loaded") == 1  # once for the process, whenever it is
    loaded, listening = (
        events.index("voice_context_tokenizer_loaded"),
        events.index("voice_context_server_listening"),
    )
    assert (loaded < listening) == (preload == "true")


@pytest.mark.asyncio
async def test_serve_says_where_the_inspector_is_on_the_line_after_where_it_listens() -> None:
    command = [sys.executable, "-m", "voice_context", "serve", "--port", "0", "--store", "memory"]
    async with await anyio.open_process(command, env=clean_env()) as process:
        try:
            assert process.stdout is not None
            printed = b""
            with anyio.fail_after(TIMEOUT * 2):
                while printed.count(b"\n") < 2:
                    printed += await process.stdout.receive()
            listening, inspector = printed.decode().splitlines()[:2]
            assert listening.startswith("listening on ws://127.0.0.1:"), listening
            port = int(listening.rsplit(":", 1)[1].removesuffix("/v1"))
            assert inspector == f"inspector at http://127.0.0.1:{port}/inspector"
            page = await http_get(port, "/inspector")
            assert page.status == 200 and b"voice-context inspector" in page.body
        finally:
            process.kill()
            with anyio.move_on_after(TIMEOUT):
                await process.wait()


@pytest.mark.asyncio
async def test_a_bad_config_file_exits_2_with_the_reason(tmp_path: Path) -> None:
    config = tmp_path / "voice-context.toml"
    config.write_text("[server]\nport = 99999\n")
    command = [sys.executable, "-m", "voice_context", "serve", "--config", str(config)]
    with anyio.fail_after(TIMEOUT * 2):
        result = await anyio.run_process(command, env=clean_env(), check=False)
    assert result.returncode == 2
    assert b"server.port must be 0..65535" in result.stderr


@pytest.mark.asyncio
async def test_a_model_summarizer_without_its_url_and_model_exits_2_saying_what_to_set(
    tmp_path: Path,
) -> None:
    config = tmp_path / "voice-context.toml"
    config.write_text('[summarizer]\nkind = "openai"\n')
    command = [sys.executable, "-m", "voice_context", "serve", "--port", "0", "--store", "memory"]
    with anyio.fail_after(TIMEOUT * 2):
        result = await anyio.run_process([*command, "--config", str(config)], env=clean_env(), check=False)
    assert result.returncode == 2
    assert result.stdout == b"", "it never listened"
    assert b"summarizer.kind = 'openai' needs summarizer.base_url and summarizer.model" in result.stderr


def test_flags_override_the_file_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "voice-context.toml"
    config.write_text('[server]\nhost = "0.0.0.0"\nport = 9000\nauth_tokens = ["t1"]\n')
    monkeypatch.setenv("VOICE_CONTEXT_SERVER_PORT", "9100")
    monkeypatch.setenv("VOICE_CONTEXT_SESSION_RECENT_WINDOW", "30")
    args = build_parser().parse_args(
        ["serve", "--config", str(config), "--host", "127.0.0.1", "--store", "memory", "--record", "rec"]
    )
    settings = settings_from(args)
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 9100)
    assert settings.server.auth_tokens == ("t1",)
    assert settings.server.record_dir == "rec"
    assert settings.store.url == "memory"
    assert settings.session.recent_window == 30


@pytest.mark.asyncio
async def test_serve_loads_none_of_the_tuning_tools(tmp_path: Path) -> None:
    """The service imports what serving needs: not the replay, scoring, sweep, audit and import
    tools, nor what their reports draw with, nor an HTTP client it has nothing to ask with.
    Python itself lists every module a process imports (``-X importtime``), here while a bot
    opens a session, talks and asks for its context."""
    imports = tmp_path / "imports.txt"
    command = [sys.executable, "-X", "importtime", "-m", "voice_context", "serve", "--port", "0"]
    with imports.open("wb") as stderr:
        async with await anyio.open_process(
            [*command, "--store", "memory"], env=clean_env(), stderr=stderr
        ) as process:
            try:
                await talk_to(process)
            finally:
                process.send_signal(signal.SIGTERM)
                with anyio.fail_after(TIMEOUT):
                    await process.wait()
    loaded = {row.split("|")[-1].strip() for row in imports.read_text().splitlines() if "|" in row}
    assert "voice_context.server" in loaded, "the listing is the server's"
    tuning = sorted(m for m in loaded if m.startswith("voice_context.") and m.split(".")[-1] in TUNING)
    assert tuning == []
    assert sorted(m for m in loaded if m.split(".")[0] in REPORTS) == []
    assert "httpx" not in loaded, "no HTTP client without a context source or a model to ask"


def test_the_package_loads_each_public_name_s_module_when_the_name_is_first_used() -> None:
    """``import voice_context`` costs a process nothing it does not use: a served process, a
    script that needs a turn, a test, each loads its own part of the package."""
    probe = (
        "import sys, voice_context\n"
        "def loaded(): return sorted(m for m in sys.modules if m.startswith('voice_context.'))\n"
        "print(loaded())\n"
        "from voice_context import Turn\n"
        "print(loaded())\n"
        "print(sorted(n for n in voice_context.__all__ if getattr(voice_context, n, None) is None))\n"
        "print(sorted(set(voice_context.__all__) - set(dir(voice_context))))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT * 4
    )
    assert ran.returncode == 0, ran.stderr
    bare, for_a_turn, unresolved, unlisted = ran.stdout.splitlines()
    assert bare == "[]"
    assert for_a_turn == "['voice_context.core', 'voice_context.core.turns']"
    assert unresolved == unlisted == "[]"


async def talk_to(process: Process) -> None:
    """A bot's first exchange with a served process: open, a turn, its context."""
    assert process.stdout is not None
    with anyio.fail_after(TIMEOUT * 2):
        line = b""
        while not line.endswith(b"\n"):
            line += await process.stdout.receive()
    url = line.decode().split("\n")[0].removeprefix("listening on ").strip()
    async with connect(url) as ws:
        wire = Wire(ws)
        await wire.request("session.open", session="room-1")
        turn = {"speaker": "Ann", "role": "user", "text": "Book Lisbon for May 3rd.", "at": 1_700_000_000.0}
        assert (await wire.request("turn.append", session="room-1", turn=turn))["type"] == "turn.appended"
        context = await wire.request("context.get", session="room-1", budget_chars=900)
        assert "Lisbon" in str(context["messages"])


TUNING = {"tuning", "replay", "scoring", "sweep", "audit", "importers", "import_", "score"}
REPORTS = {"matplotlib", "tqdm"}  # what the reports draw with (rich comes with structlog where installed)
