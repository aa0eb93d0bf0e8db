"""Replaying recordings offline: logical time, the batch rule, byte-identical outputs, a live server."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import ROOT
from serving import TIMEOUT, clean_env, http_get, running, serve_process

from voice_context.cli import main
from voice_context.codec import TurnAppend
from voice_context.config import Settings
from voice_context.core.config import SessionConfig
from voice_context.errors import ConfigError
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.summarizers.fakes import FailingSummarizer, ScriptedSummarizer
from voice_context.tuning.replay import (
    OfflineReplay,
    Recording,
    parse_assignments,
    parse_recording,
    read_contexts,
    replay_live,
    replay_realtime,
)

FIXTURES = ROOT / "fixtures"
T0 = 1714572187.0


def line(obj: dict[str, Any]) -> str:
    return json.dumps(obj)


#: The first line of a recording of room-1: a server records nothing of a session before it.
OPEN = json.dumps({"type": "session.open", "session": "room-1"})


def turn(i: int, session: str = "room-1") -> str:
    speaker = ("Alice", "Bob")[i % 2]
    body = {
        "speaker": speaker,
        "role": "user",
        "text": f"turn {i} about Porto",
        "at": T0 + 10 * i,
        "id": f"u{i}",
    }
    return line({"type": "turn.append", "session": session, "turn": body})


def get(request_id: str, session: str = "room-1", **extra: Any) -> str:
    return line(
        {"type": "context.get", "session": session, "id": request_id, "format": "instructions", **extra}
    )


def recording(*lines: str) -> Recording:
    return parse_recording(lines, "room-1")


def replay(rec: Recording, summarizer: Any = None, **kwargs: Any) -> Any:
    engine = OfflineReplay(summarizer or ScriptedSummarizer(), **kwargs)
    return anyio.run(engine.run, rec)


def test_the_reader_skips_what_it_cannot_use_and_says_so() -> None:
    rec = parse_recording(
        [
            line({"type": "session.open", "session": "room-1"}),
            "",
            "[1, 2]",
            line({"type": "ping"}),
            line({"session": "room-1"}),
            line({"type": "turn.spoken", "session": "room-1"}),
            turn(0),
        ]
    )
    assert [m["type"] for m in rec.messages] == ["session.open", "turn.append"]
    assert [type(m).__name__ for m in rec.decoded] == ["SessionOpen", "TurnAppend"]
    assert rec.skipped == [
        "line 3: bad_request: a message must be a JSON object",
        "line 4: ping is never recorded",
        "line 5: bad_request: type is required",
        "line 6: unknown_type: unknown message type 'turn.spoken'",
    ]


def test_a_replay_sees_exactly_what_a_server_accepts() -> None:
    """Lines a server would have refused are not replayed: the codec reads recordings too."""
    refused = {
        "a time in milliseconds": {"speaker": "Alice", "role": "user", "text": "hi", "at": T0 * 1000},
        "a role nobody knows": {"speaker": "Alice", "role": "narrator", "text": "hi", "at": T0},
        "no text": {"speaker": "Alice", "role": "user", "at": T0},
        "a text too long": {"speaker": "Alice", "role": "user", "text": "x" * 9000, "at": T0},
    }
    lines = [line({"type": "turn.append", "session": "room-1", "turn": body}) for body in refused.values()]
    rec = recording(OPEN, *lines, turn(0), "not json")
    assert [m.turn.text for m in rec.decoded if isinstance(m, TurnAppend)] == ["turn 0 about Porto"]
    reasons = [skip.split(": ", 2)[1:] for skip in rec.skipped]
    assert [code for code, _ in reasons] == [
        "bad_request",
        "bad_request",
        "bad_request",
        "too_large",
        "bad_request",
    ]
    assert "milliseconds" in reasons[0][1] and "not valid JSON" in reasons[4][1]
    result = replay(recording(OPEN, *lines, turn(0), get("cp")))
    assert result.contexts[0]["state"]["turns"] == 1
    assert parse_recording([OPEN, *lines[3:]], max_text_chars=10_000).skipped == [], "the server's own limit"


def test_compactions_start_where_the_batch_rule_says_and_land_before_the_next_event() -> None:
    summarizer = ScriptedSummarizer(["Alice and Bob planned Porto.", "They booked the flights."])
    lines = [line({"type": "session.open", "session": "room-1"})]
    lines += [turn(i) for i in range(61)] + [get("at-61")]
    lines += [get("again-61")]
    lines += [turn(i) for i in range(61, 70)] + [get("at-70")]
    lines += [turn(70), get("at-71")]
    result = replay(recording(*lines), summarizer)

    at61, again, at70, at71 = result.contexts
    # 61 turns from cursor 0: fold 0..9, but this reply is built before it lands
    assert (at61["turn_index"], at61["at"], at61["response"]["cursor"]) == (60, T0 + 600, 0)
    assert (at61["response"]["in_flight"], at61["response"]["summary"]) == (True, "")
    # the next event sees the new summary and the moved cursor
    assert (again["response"]["cursor"], again["response"]["summary"]) == (10, "Alice and Bob planned Porto.")
    assert again["response"]["in_flight"] is False
    assert at70["response"]["cursor"] == 10  # 60 turns from cursor 10: below the threshold
    assert (at71["response"]["in_flight"], at71["state"]["cursor"]) == (True, 10)
    assert [(c["start"], c["end"], c["turn_index"], c["outcome"]) for c in result.compactions] == [
        (0, 10, 60, "applied"),
        (10, 20, 70, "applied"),
    ]
    assert [len(r.turns) for r in summarizer.requests] == [10, 10]
    assert summarizer.requests[1].previous_summary == "Alice and Bob planned Porto."


def test_each_checkpoint_carries_its_request_response_turn_index_and_time() -> None:
    request = get("cp-1", budget_chars=300, base_instructions="You are Nova.", facts=["Alice is vegan."])
    result = replay(recording(OPEN, turn(0), turn(1), request))
    (record,) = result.contexts
    assert record["seq"] == 3 and record["session"] == "room-1" and record["request_id"] == "cp-1"
    assert (record["turn_index"], record["at"]) == (1, T0 + 10)
    assert record["request"] == json.loads(request)
    response = record["response"]
    assert (response["type"], response["id"], response["budget_chars"]) == ("context", "cp-1", 300)
    assert response["instructions"] == (
        "You are Nova.\n\nDurable facts:\n- Alice is vegan.\n\n"
        "Recent conversation:\nAlice: turn 0 about Porto\nBob: turn 1 about Porto"
    )
    assert record["state"] == {
        "turns": 2,
        "cursor": 0,
        "summary_chars": 0,
        "compactions": 0,
        "summarizer_calls": 0,
        "chars_sent": 0,
    }


def test_settings_apply_defaults_then_the_recordings_own_then_the_callers() -> None:
    open_with = line(
        {"type": "session.open", "session": "room-1", "config": {"recent_window": 5, "batch_size": 2}}
    )
    lines = [open_with, *(turn(i) for i in range(8)), get("x")]
    recorded = replay(recording(*lines))
    assert [(c["start"], c["end"]) for c in recorded.compactions] == [(0, 2)]  # 8 > 5 + 2
    overridden = replay(recording(*lines), overrides={"batch_size": 4})
    assert overridden.compactions == []  # 8 is not more than 5 + 4


def test_a_setting_only_the_server_sets_applies_when_the_caller_sets_it() -> None:
    """A client may not shorten the retry backoff; the replay's caller is the operator, and may."""
    lines = [OPEN, *(turn(i) for i in range(61)), get("a"), get("b"), turn(61), get("c")]
    result = replay(recording(*lines), FailingSummarizer(), overrides={"retry_base_seconds": 5})
    assert [c["turn_index"] for c in result.compactions] == [60, 61], "retried 5 s on, as the caller set"
    assert result.skipped == []


def test_a_turn_sent_again_with_its_id_is_stored_once_as_the_server_stores_it() -> None:
    result = replay(recording(OPEN, turn(0), turn(1), turn(1), turn(2), get("after")))
    (record,) = result.contexts
    assert (record["turn_index"], record["state"]["turns"]) == (2, 3)
    assert record["response"]["instructions"].count("turn 1 about Porto") == 1


def test_a_handoff_in_a_recording_asks_for_its_context_as_the_server_does() -> None:
    handoff = line({"type": "session.handoff", "session": "room-1", "id": "h", "limit_chars": 800})
    lines = [OPEN, *(turn(i) for i in range(61)), handoff, get("after")]
    result = replay(recording(*lines), DeterministicSummarizer())
    (fold,) = result.compactions
    assert (fold["seq"], fold["outcome"]) == (62, "applied"), "started by the handoff's context"
    (record,) = result.contexts
    assert record["state"]["cursor"] == record["response"]["cursor"] == fold["end"] > 0


def test_a_closed_session_opened_again_resumes_where_it_was() -> None:
    close = line({"type": "session.close", "session": "room-1"})
    reopen = line({"type": "session.open", "session": "room-1"})
    result = replay(recording(OPEN, turn(0), turn(1), close, reopen, turn(2), get("after")))
    assert result.contexts[0]["turn_index"] == 2
    assert result.contexts[0]["response"]["instructions"].count("about Porto") == 3


def test_a_failing_summarizer_backs_off_in_recorded_time() -> None:
    lines = [OPEN, *(turn(i) for i in range(61)), get("a"), get("b"), turn(61), get("c")]
    result = replay(recording(*lines), FailingSummarizer(), config=SessionConfig(retry_base_seconds=5))
    assert [(c["turn_index"], c["outcome"]) for c in result.compactions] == [
        (60, "failed:connection"),  # at T0+600; retry not before T0+605
        (61, "failed:connection"),  # turn 61 came at T0+610: the retry is due
    ]
    assert [c["state"]["cursor"] for c in result.contexts] == [0, 0, 0]


def test_the_same_recording_and_settings_give_byte_identical_outputs(tmp_path: Path) -> None:
    for out in ("one", "two"):
        settings = ["--set", "max_summary_chars=3000", "--budget", "2500"]
        code = main(["replay", str(FIXTURES), "--out", str(tmp_path / out), "--report", "none", *settings])
        assert code == 0
    for name in ("raid-night", "offsite-planning"):
        for kind in ("contexts.jsonl", "compactions.jsonl"):
            first = (tmp_path / "one" / f"{name}.{kind}").read_bytes()
            assert first == (tmp_path / "two" / f"{name}.{kind}").read_bytes()
            assert first  # something was written
    contexts = read_contexts(tmp_path / "one" / "raid-night.contexts.jsonl")
    assert contexts[-1]["request_id"] == "checkpoint-end"
    assert contexts[-1]["response"]["budget_chars"] == 2500
    assert contexts[-1]["state"]["compactions"] >= 3  # about a hundred turns: compaction happened
    assert "[21 June 2024, 19:" in contexts[-1]["response"]["summary"]  # every line shown, dated


def test_bad_settings_and_missing_recordings_are_refused(tmp_path: Path, capsys: Any) -> None:
    assert main(["replay", str(FIXTURES), "--set", "recent_window"]) == 2
    assert main(["replay", str(FIXTURES), "--set", "no_such_key=1"]) == 2
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "KEY=VALUE" in err and "no_such_key" in err and "missing.jsonl" in err
    with pytest.raises(ConfigError):
        parse_assignments(["budget="])
    assert parse_assignments(["recent_window=20,50", "summarizer.kind=openai"]) == {
        "session.recent_window": ["20", "50"],
        "summarizer.kind": ["openai"],
    }


@pytest.mark.asyncio
async def test_a_recording_replays_against_a_live_server(tmp_path: Path) -> None:
    path = tmp_path / "room-1.jsonl"
    path.write_text("\n".join([OPEN, *(turn(i) for i in range(3)), get("live", budget_chars=200)]) + "\n")
    async with running(Settings().with_values("server", {"host": "127.0.0.1", "port": 0})) as server:
        result = await replay_live(path, server.url, prefix="replay-")
    (record,) = result.contexts
    assert record["response"]["session"] == "replay-room-1"
    assert record["response"]["instructions"].endswith("Alice: turn 2 about Porto")
    assert (record["turn_index"], record["state"]["turns"]) == (2, 3)


def test_a_realtime_replay_runs_the_session_manager_and_lets_compactions_land_on_their_own() -> None:
    # gaps cut to 20 ms: a fold (in a worker thread) lands before the recording closes its session
    result = anyio.run(lambda: replay_realtime(FIXTURES / "offsite-planning.jsonl", Settings(), max_gap=0.02))
    assert [c["request_id"] for c in result.contexts][-1] == "checkpoint-end"
    assert result.contexts[-1]["state"]["turns"] == 102
    assert result.compactions and all(c["outcome"] == "applied" for c in result.compactions)
    # the newest lines the budget holds, each with its date
    assert result.contexts[-1]["response"]["summary"].startswith("[4 March 2024, 10:")


def test_the_deterministic_summarizer_gives_dated_lines_in_a_replay() -> None:
    lines = [OPEN, *(turn(i) for i in range(61)), get("a"), get("b")]
    result = replay(recording(*lines), DeterministicSummarizer())
    assert result.contexts[1]["response"]["summary"].startswith("[1 May 2024, 14:03] ")


def pin(index: int, **extra: Any) -> str:
    return line({"type": "landmark.pin", "session": "room-1", "index": index, "kind": "decision", **extra})


def unpin(index: int) -> str:
    return line({"type": "landmark.unpin", "session": "room-1", "index": index})


def overflow(request_id: str, limit_tokens: int) -> str:
    body = {"type": "context.overflow", "session": "room-1", "id": request_id, "limit_tokens": limit_tokens}
    return line({**body, "format": "instructions"})


LANDMARK_STORY = [
    OPEN,
    *(turn(i) for i in range(70)),
    pin(2, reason="the venue"),
    get("pinned", budget_chars=600),
    pin(999),
    unpin(2),
    get("unpinned", budget_chars=600),
]


def test_a_landmark_pinned_in_a_recording_shows_until_it_is_unpinned() -> None:
    result = replay(recording(*LANDMARK_STORY), DeterministicSummarizer())
    pinned, unpinned = (c["response"] for c in result.contexts)
    assert [lm["turn"] for lm in pinned["landmarks"]] == [2]
    assert "turn 2 about Porto" in pinned["instructions"] and pinned["first_turn"] > 2
    assert unpinned["landmarks"] == [] and "turn 2 about Porto" not in unpinned["instructions"]
    assert result.skipped == ["message 73: landmark.pin: session 'room-1' has no turn 999 (it has 70)"]


def test_a_context_overflow_in_a_recording_folds_at_once_and_answers_within_its_limit() -> None:
    result = replay(recording(OPEN, *(turn(i) for i in range(80)), overflow("too-long", 300)))
    (emergency,) = result.compactions
    assert emergency["emergency"] and emergency["outcome"] == "applied"
    (record,) = result.contexts
    response = record["response"]
    assert response["cursor"] == emergency["end"] > 0
    assert response["tokens"] <= 300 and response["budget_tokens"] == 300
    refused = replay(recording(OPEN, *(turn(i) for i in range(3)), overflow("hopeless", 2)))
    assert refused.contexts == [] and refused.skipped[0].startswith("message 4: context.overflow: the base")
    assert refused.skipped[0].endswith("take 10 tokens, over the limit of 2")  # as the server answers


@pytest.mark.asyncio
async def test_landmarks_and_an_overflow_replay_the_same_against_a_live_server(tmp_path: Path) -> None:
    path = tmp_path / "room-1.jsonl"
    path.write_text("\n".join([*LANDMARK_STORY, overflow("too-long", 300)]) + "\n")
    offline = OfflineReplay(DeterministicSummarizer()).run
    expected = await offline(parse_recording(path.read_text().splitlines(), "room-1"))
    fast = {"host": "127.0.0.1", "port": 0, "turns_per_second": 1000, "turn_burst": 1000}  # all at once
    async with running(Settings().with_values("server", fast)) as server:
        result = await replay_live(path, server.url, prefix="replay-")
    assert len(result.contexts) == len(expected.contexts) == 3
    for live, offline_record in zip(result.contexts, expected.contexts, strict=True):
        got, want = live["response"], offline_record["response"]
        assert [lm["turn"] for lm in got["landmarks"]] == [lm["turn"] for lm in want["landmarks"]]
    assert result.contexts[-1]["response"]["tokens"] <= 300
    assert any("landmark.pin" in skip for skip in result.skipped)


async def replay_command(*args: str) -> tuple[int, str, str]:
    """``voice-context replay ARGS`` as a real process: its exit code, stdout and stderr."""
    command = [sys.executable, "-m", "voice_context", "replay", "--no-progress", *args]
    with anyio.fail_after(TIMEOUT * 12):
        done = await anyio.run_process(command, env=clean_env(), check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.asyncio
async def test_the_fixtures_replay_against_a_served_default_server_and_write_their_report(
    tmp_path: Path,
) -> None:
    """A default server takes 20 turns a second for a session: the client waits when it is told to."""
    # one recording of the fixtures is enough to be told: its 99 turns are over the burst of 40,
    # and each recording beyond it would only add its three seconds of waiting
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    for name in ("raid-night.jsonl", "raid-night.probes.jsonl"):
        (fixtures / name).write_bytes((FIXTURES / name).read_bytes())
    out_dir = tmp_path / "out"
    async with serve_process("--store", "memory", "--log-level", "warning") as served:
        code, out, err = await replay_command(str(fixtures), "--url", served.url, "--out", str(out_dir))
        metrics = (await http_get(served.port, "/metrics")).body.decode()
    assert (code, err) == (0, ""), err
    errors = {
        line.partition(" ")[0]: float(line.rpartition(" ")[2])
        for line in metrics.splitlines()
        if line.startswith("voice_context_errors_total{")
    }
    assert list(errors) == ['voice_context_errors_total{code="rate_limited"}'], "no other error"
    assert min(errors.values()) > 0, "the client was told to wait"
    assert "report: " in out
    assert (out_dir / "report" / "index.html").is_file()
    contexts = read_contexts(out_dir / "raid-night.contexts.jsonl")
    assert contexts[-1]["request_id"] == "checkpoint-end"
    recorded = parse_recording((FIXTURES / "raid-night.jsonl").read_text().splitlines())
    sent = [m for m in recorded.decoded if isinstance(m, TurnAppend)]
    assert contexts[-1]["state"]["turns"] == len(sent) == 99, "every turn stored, none refused"
    table = json.loads((out_dir / "report" / "sweep.json").read_text())
    assert table[0]["chars_sent"] is None, "a live server does not say what its summarizer was sent"


@pytest.mark.asyncio
async def test_a_file_that_is_not_a_recording_is_refused_with_why(tmp_path: Path) -> None:
    probes = FIXTURES / "raid-night.probes.jsonl"  # JSON lines, but questions, not messages
    code, out, err = await replay_command(str(probes))
    assert code == 2 and out == ""
    assert f"{probes} is not a recording: no line is a message a server takes: line 1: bad_request" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = await replay_command(str(empty))
    assert code == 2 and "is not a recording: it is empty" in err


# -- a recording the replay cannot follow ---------------------------------------------------------


def note(session: str = "room-1") -> str:
    body = {"text": "a seat map of an A320", "at": T0 + 5, "source": "screen"}
    return line({"type": "note.append", "session": session, "note": body})


#: Lines no server records, each with what the refusal says of it.
BAD_LINES = {
    "not JSON": ("this is not json", "bad_request: not valid JSON"),
    "not an object": ("[1, 2]", "bad_request: a message must be a JSON object"),
    "an unknown type": (line({"type": "turn.spoken", "session": "room-1"}), "unknown_type"),
    "a missing field": (line({"type": "turn.append", "session": "room-1"}), "bad_request: turn is required"),
    "a turn for a session never opened": (turn(1, session="ghost"), "session 'ghost', which no session.open"),
    "a note for a session never opened": (note("ghost"), "note.append for session 'ghost'"),
    "a context for a session never opened": (get("cp", session="ghost"), "context.get for session 'ghost'"),
    "a ping": (line({"type": "ping"}), "ping is never recorded"),
}


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("bad", list(BAD_LINES), ids=list(BAD_LINES))
def test_a_recording_with_a_line_the_replay_cannot_follow_is_refused_with_where_and_why(
    bad: str, tmp_path: Path, capsys: Any
) -> None:
    text, said = BAD_LINES[bad]
    path = write_lines(tmp_path / "room-1.jsonl", OPEN, turn(0), text, note(), get("end"))
    assert main(["replay", str(path), "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert out == "", "nothing replayed, no table"
    assert err.startswith(f"voice-context replay: {path}: line 3: ")
    assert said in err and "--skip-bad-lines" in err


def test_a_turn_for_a_session_never_opened_and_a_line_that_is_not_json_are_not_passed_over(
    tmp_path: Path, capsys: Any
) -> None:
    """What a hand-made recording got: exit 0, a table of zeros and not a word."""
    path = write_lines(tmp_path / "call.jsonl", turn(0, session="ghost"), "{oops", get("cp", session="ghost"))
    assert main(["replay", str(path), "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{path} is not a recording" in err
    assert "line 1: turn.append for session 'ghost', which no session.open before it opened" in err
    assert "(and 2 more)" in err


def test_skip_bad_lines_replays_the_rest_and_says_how_many_lines_it_skipped_and_which(
    tmp_path: Path, capsys: Any
) -> None:
    good = [OPEN, *(turn(i) for i in range(6)), note(), get("end")]
    bad = [text for text, _ in BAD_LINES.values()][:5]
    mixed = [good[0], bad[0], good[1], bad[1], *good[2:5], bad[2], bad[3], *good[5:], bad[4]]
    (tmp_path / "clean").mkdir()
    clean = write_lines(tmp_path / "clean" / "room-1.jsonl", *good)
    broken = write_lines(tmp_path / "room-1.jsonl", *mixed)
    assert (
        main(["replay", str(clean), "--no-progress", "--out", str(tmp_path / "a"), "--report", "none"]) == 0
    )
    capsys.readouterr()
    argv = ["replay", str(broken), "--no-progress", "--skip-bad-lines", "--out", str(tmp_path / "b")]
    assert main([*argv, "--report", "none"]) == 0
    out, err = capsys.readouterr()
    assert "contexts" in out, "the table"
    said, named = err.rstrip("\n").split(": skipped 5 bad lines: ")
    assert said == f"voice-context replay: {broken}"
    first, second, third, more = named.split("; ")
    assert first.startswith("line 2: bad_request: not valid JSON")
    assert second == "line 4: bad_request: a message must be a JSON object"
    assert third == "line 8: unknown_type: unknown message type 'turn.spoken'"
    assert more == "and 2 more"
    for kind in ("contexts.jsonl", "compactions.jsonl"):
        replayed = (tmp_path / "b" / f"room-1.{kind}").read_text()
        assert replayed == (tmp_path / "a" / f"room-1.{kind}").read_text(), "the good lines, as if alone"
    (context,) = read_contexts(tmp_path / "b" / "room-1.contexts.jsonl")
    assert (context["request_id"], context["state"]["turns"]) == ("end", 6)
