"""``voice-context serve`` at its file-descriptor limit: it refuses cleanly, logs little, and recovers.

The server is the real command line in its own process, its ``RLIMIT_NOFILE``
lowered once it is running; the bots are real websocket clients in this process.
"""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import orjson
import pytest
from serving import TIMEOUT, Wire, clean_env, http_get
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from voice_context.server.listener import bind

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="lowers a running process's limit")

LIMIT = 96


@pytest.fixture(params=["its own socket", "a socket given to it"])
def serve(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """The server on a socket it binds, or on one bound for it, as a worker of ``serve --workers``
    is (then it accepts one connection at a time, not asyncio)."""
    log = tmp_path / "serve.log"
    command = [
        sys.executable, "-m", "voice_context", "serve", "--port", "0",
        "--data-dir", str(tmp_path / "data"), "--log-format", "json",
    ]  # fmt: skip
    env = clean_env()
    fds: list[int] = []
    with contextlib.ExitStack() as given:
        if request.param == "a socket given to it":
            sock = given.enter_context(bind("127.0.0.1", 0))
            fds.append(sock.fileno())
            env["VOICE_CONTEXT_SERVER_LISTEN_FD"] = str(sock.fileno())
            command[command.index("--port") + 1] = str(sock.getsockname()[1])
        with log.open("w") as stderr:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, pass_fds=fds
            )
    try:
        resource.prlimit(process.pid, resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on "), (line, log.read_text()[-2000:])
        yield process, line.split()[-1], log
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


async def connect_until_refused(url: str, opened: list[Wire]) -> dict[str, object]:
    """Open connections one after another until a handshake is refused; the refusal's body."""
    for _ in range(LIMIT):
        try:
            with anyio.fail_after(TIMEOUT):
                ws = await connect(url, open_timeout=TIMEOUT)
        except InvalidStatus as refused:
            assert refused.response.status_code == 503
            body: dict[str, object] = orjson.loads(refused.response.body)
            return body
        opened.append(Wire(ws))
    raise AssertionError(f"{LIMIT} connections and no refusal")


async def knock(port: int) -> bytes:
    """A raw handshake that is never completed by this side: what the server answers, if anything."""
    request = (
        f"GET /v1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.EndOfStream, TimeoutError):
        with anyio.fail_after(TIMEOUT):
            async with await anyio.connect_tcp("127.0.0.1", port) as stream:
                await stream.send(request.encode())
                return await stream.receive()
    return b""


@pytest.mark.asyncio
async def test_at_the_descriptor_limit_the_server_refuses_cleanly_logs_little_and_recovers(
    serve: tuple[subprocess.Popen[str], str, Path],
) -> None:
    process, url, log = serve
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    opened: list[Wire] = []
    try:
        refusal = await connect_until_refused(url, opened)
        assert refusal == {
            "type": "error",
            "code": "rate_limited",
            "message": "the server is short of file descriptors: try again later",
            "limit": "descriptors",
        }
        assert 20 < len(opened) < LIMIT, len(opened)

        # sockets that never say a word hold the last descriptors (until the handshake times
        # out), and a flood of handshakes arrives: accept() itself fails
        silent = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(40)]
        answers: list[bytes] = []

        async def knock_and_keep(port: int) -> None:
            answers.append(await knock(port))

        async with anyio.create_task_group() as tg:
            for _ in range(300):
                tg.start_soon(knock_and_keep, port)
        # every one is answered: the flood waits in the listen queue (2,048 deep) for its turn,
        # where a queue of 100 overflowed and left some clients past the timeout
        assert not any(a.startswith(b"HTTP/1.1 101") for a in answers)
        refused = sum(a.startswith(b"HTTP/1.1 503") for a in answers)
        assert refused == len(answers), f"{len(answers) - refused} of {len(answers)} got no answer"
        for stream in silent:
            await stream.aclose()

        # the connections already served carry on, store writes included
        for n, bot in enumerate(opened[:5]):
            await bot.open(f"room-{n}")
            assert (await bot.append(f"room-{n}", 0))["type"] == "turn.appended"
        assert process.poll() is None
    finally:
        for bot in opened:
            await bot.ws.close()

    # and once they are gone, the server serves again
    with anyio.fail_after(TIMEOUT):
        while True:
            try:
                async with connect(url, open_timeout=TIMEOUT) as ws:
                    bot = Wire(ws)
                    assert (await bot.request("ping"))["type"] == "pong"
                    break
            except InvalidStatus:
                await anyio.sleep(0.05)

    metrics = (await http_get(port, "/metrics")).body.decode()
    refused = {
        how: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        for how in ("handshake", "accept")
        if line.startswith(f'voice_context_descriptors_refused_total{{how="{how}"}}')
    }
    assert refused["handshake"] >= 1 and refused["accept"] >= 1, refused
    text = await anyio.to_thread.run_sync(log.read_text)
    assert "Traceback" not in text
    told = [line for line in text.splitlines() if "voice_context_descriptors_exhausted" in line]
    assert 1 <= len(told) <= 3, "once per 10 s interval, however many were refused"
    assert len(text) < 100_000, len(text)
