"""What the load harness's sessions say: by default each session its own texts, made of the
recordings' sentences, the same at the same turn in every run; with ``--verbatim-words`` the
recorded lines themselves, as every session said them before. And the settings its servers run
with: those a run names, never the shell's; and the gauge of the box it runs on."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from types import ModuleType

import pytest
from helpers import ROOT

SCRIPT = ROOT / "scripts" / "load.py"


@pytest.fixture(scope="module")
def load() -> ModuleType:
    """``scripts/load.py``, which is a script, not a module of the package."""
    spec = importlib.util.spec_from_file_location("voice_context_load_harness", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


def small_talk(load: ModuleType) -> list[object]:
    """Six lines of two or three sentences each, in a group's roles: a pool of 14 sentences."""
    Line = load.Line
    return [
        Line("Ana", "user", "We land at nine. The hotel is near the port."),
        Line("Ben", "user", "Can we walk there? It looks close on the map! Maybe twenty minutes."),
        Line("Nova", "assistant", "The walk is 1.5 km. A taxi costs about 12 euros."),
        Line("Ana", "user", "Then we walk. Bags first, though."),
        Line("Ben", "user", "Dinner is at eight? I booked the place by the river. It was the last table."),
        Line("Nova", "assistant", "Noted: dinner at eight by the river. Ana walks from the port."),
    ]


def talker(load: ModuleType, name: str, words: object, offset: int = 0) -> object:
    return load.Talker(name, None, offset, words=words)  # no connection: only its words are asked


def test_two_sessions_at_the_same_turn_of_the_same_line_say_different_texts(load: ModuleType) -> None:
    words = load.Words(small_talk(load), ["Scoreboard: 2-1"])
    ana, ben = talker(load, "voice-voice-0", words), talker(load, "voice-voice-1", words)
    for turn in range(30):
        assert ana.said(turn) != ben.said(turn), turn
    # on the project's recordings, a thousand sessions at one turn say hundreds of texts, not one
    said = {talker(load, f"voice-voice-{k}", load.WORDS).said(3).text for k in range(1000)}
    assert len(said) > 150


def test_a_session_says_the_same_text_at_the_same_turn_every_time(load: ModuleType) -> None:
    lines = small_talk(load)
    first = talker(load, "voice-voice-7", load.Words(lines, ["x"]), offset=2)
    again = talker(load, "voice-voice-7", load.Words(lines, ["x"]), offset=2)
    # whatever was asked before (a session resumed at turn 50 says at 50 what it would have)
    assert [first.said(n) for n in range(60)] == [again.said(n) for n in reversed(range(60))][::-1]
    assert first.said(4) == first.said(4)
    # not Python's salted hash(): the same in every process, so paired runs send the same words
    assert load.session_seed("voice-voice-7") == 927813988
    assert first.said(0).text == "Then we walk. It looks close on the map!"
    assert first.said(1).text == "It looks close on the map! Then we walk."


def test_a_turn_keeps_its_lines_speaker_role_and_sentences(load: ModuleType) -> None:
    lines = small_talk(load)
    words = load.Words(lines, ["x"])
    pool = set(words.pool)
    assert len(pool) == 14
    bot = talker(load, "group-3", words, offset=4)
    for turn in range(40):
        line, said = lines[(4 + turn) % len(lines)], bot.said(turn)
        assert (said.speaker, said.role) == (line.speaker, line.role)
        parts = load.SENTENCE_END.split(said.text)
        assert len(parts) == len(load.SENTENCE_END.split(line.text))
        assert set(parts) <= pool
    bot.turns = 9
    assert bot.line() == bot.said(9)


def test_the_sessions_say_about_as_many_chars_as_the_lines(load: ModuleType) -> None:
    lines = load.in_turn(load.LINES)
    words = load.Words(lines, load.NOTES)
    said = [
        talker(load, f"voice-voice-{k}", words, k * 38).said(n).text for k in range(50) for n in range(40)
    ]
    recorded = statistics.fmean(len(line.text) for line in lines)
    assert abs(statistics.fmean(map(len, said)) / recorded - 1) < 0.1


def test_a_screen_note_reads_its_own_numbers(load: ModuleType) -> None:
    notes = ["Scoreboard: round 1 won, 1-0, James 14 eliminations on Tokyo 2099", "the agenda"]
    words = load.Words(small_talk(load), notes)
    seen = set()
    for k in range(40):
        read = words.note(load.session_seed(f"voice-voice-{k}"), 12, 0)
        numbers = load.SCREEN_READING.findall(read)
        assert [len(n) for n in numbers] == [1, 1, 1, 2]
        assert (
            load.SCREEN_READING.sub("#", read)
            == "Scoreboard: round # won, #-#, James # eliminations on Tokyo 2099"
        )
        seen.add(read)
        assert words.note(load.session_seed(f"voice-voice-{k}"), 12, 1) == "the agenda"  # nothing to read
    assert len(seen) == 40


def test_verbatim_words_say_the_recorded_lines_as_every_session_did(load: ModuleType) -> None:
    lines, words = load.words_for(load.build_parser().parse_args(["--verbatim-words"]))
    assert words.verbatim and list(words.lines) == lines == load.in_turn(load.LINES)
    for k in (0, 1, 17):
        session = talker(load, f"voice-voice-{k}", words, offset=(k * 37) % len(lines))
        for turns in range(2 * len(lines) + 3):
            session.turns = turns
            assert session.line() is lines[(session.offset + turns) % len(lines)]
            assert (
                words.note(session.seed, turns, session.offset + turns)
                == load.NOTES[(session.offset + turns) % len(load.NOTES)]
            )
    _, default = load.words_for(load.build_parser().parse_args([]))
    assert not default.verbatim
    assert words.describe().startswith("verbatim") and default.describe().startswith("distinct")


def test_no_turn_is_said_empty_when_a_line_ends_in_a_space_after_its_stop(load: ModuleType) -> None:
    """The server refuses an empty turn (``bad_request``), and LoCoMo has lines like these."""
    words = load.Words(
        [load.Line("Ana", "user", "We land at nine. "), load.Line("Nova", "assistant", "Noted. ")], []
    )
    assert all(words.line(seed, turn, turn).text.strip() for seed in range(50) for turn in range(20))


def test_a_run_gives_its_servers_the_settings_it_names_as_their_environment(
    load: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--setting GROUP.FIELD=VALUE`` becomes the variable a server reads it from; the servers
    get none of the shell's own ``VOICE_CONTEXT_*`` (a run measures the settings it names)."""
    parser = load.build_parser()
    args = parser.parse_args(
        ["--setting", "server.gc_freeze_seconds=10", "--setting", "summarizer.base_url=http://x/v1?a=b"]
    )
    assert args.setting == [
        ("VOICE_CONTEXT_SERVER_GC_FREEZE_SECONDS", "10"),
        ("VOICE_CONTEXT_SUMMARIZER_BASE_URL", "http://x/v1?a=b"),
    ]
    assert parser.parse_args([]).setting == []
    for bad in ("gc_freeze_seconds=10", "server.gc_freeze_seconds", "server.=1", "server.two words=1"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--setting", bad])
        assert "--setting wants GROUP.FIELD=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the workers' CPU would go uncounted: --workers says it
        parser.parse_args(["--setting", "server.workers=2"])
    assert "--setting server.workers: the harness sets it (--workers)" in capsys.readouterr().err


def test_the_box_s_gauge_times_its_fixed_loop_in_a_process_of_its_own(load: ModuleType) -> None:
    """Before each step the harness times the same loop of pure Python, so that a reader can tell
    steps taken on a box slowed by its host's other work from steps taken on a quiet one."""
    gauge = load.box_gauge()
    assert 1.0 < gauge < 60_000.0  # ms: 2 million additions, in any interpreter on any box
