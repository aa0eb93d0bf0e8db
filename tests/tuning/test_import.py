"""Importing public transcript datasets: tiny inputs of the same shape, written here, never the data."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from voice_context.cli import main
from voice_context.tuning.importers import (
    MEETING_START,
    import_ami,
    import_files,
    import_locomo,
    import_qmsum,
)
from voice_context.tuning.replay import parse_recording, read_recording
from voice_context.tuning.scoring import read_probes

LOCOMO: dict[str, Any] = {
    "speaker_a": "Ana",
    "speaker_b": "Ben",
    "session_1_date_time": "1:56 pm on 8 May, 2023",
    "session_1": [
        {"speaker": "Ana", "dia_id": "D1:1", "text": "Hi Ben! I went to a pottery class yesterday."},
        {
            "speaker": "Ben",
            "dia_id": "D1:2",
            "text": "Cool! Look at my new bike.",
            "img_url": ["https://example.invalid/bike.jpg"],
            "blip_caption": "a photo of a red bicycle leaning on a wall",
            "query": "red bike",
        },
    ],
    "session_2_date_time": "9:00 am on 12 May, 2023",
    "session_2": [
        {"speaker": "Ana", "dia_id": "D2:1", "text": "My pot cracked in the kiln."},
        {"speaker": "Ben", "dia_id": "D2:2", "text": "Oh no! Try again next week."},
        {"speaker": "Ana", "dia_id": "D2:3", "text": "I will, the class is on Thursdays."},
    ],
    "session_3_date_time": "10:00 am on 20 May, 2023",  # dated, but no session_3: iteration stops
    "qa": [
        {
            "question": "When did Ana go to pottery?",
            "answer": "7 May 2023",
            "evidence": ["D1:1"],
            "category": 2,
        },
        {"question": "What colour is Ben's bike?", "answer": 1, "evidence": ["D:1:2"], "category": 4},
        {"question": "What broke?", "answer": "her pot", "evidence": ["D2:01; D1:1"], "category": 1},
        {"question": "Which day is class?", "answer": "Thursday", "evidence": ["D"], "category": 4},
        {
            "question": "What did Ben sell?",
            "adversarial_answer": "his bike",
            "evidence": ["D1:2"],
            "category": 5,
        },
    ],
}


def messages(imported: Any) -> list[dict[str, Any]]:
    return list(imported.messages)


def test_a_locomo_conversation_becomes_a_recording_with_dated_turns_and_session_checkpoints() -> None:
    out = import_locomo(LOCOMO, "locomo-tiny", request_every=0)
    kinds = [m["type"] for m in out.messages]
    assert kinds == [
        "session.open",
        "turn.append",
        "turn.append",
        "context.get",
        "turn.append",
        "turn.append",
        "turn.append",
        "context.get",
        "session.close",
    ]
    first = out.messages[1]["turn"]
    assert first == {
        "speaker": "Ana",
        "role": "user",
        "text": "Hi Ben! I went to a pottery class yesterday.",  # the raw text: dates resolve later
        "at": datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp(),
        "id": "D1:1",
    }
    assert out.messages[4]["turn"]["at"] == datetime(2023, 5, 12, 9, 0, tzinfo=UTC).timestamp()
    assert [m["id"] for m in out.messages if m["type"] == "context.get"] == [
        "checkpoint-session-1",
        "checkpoint-session-2",
    ]
    assert out.meta["checkpoints"] == ["checkpoint-session-1", "checkpoint-session-2"]
    assert out.meta["speakers"] == ["Ana", "Ben"]


def test_a_locomo_conversation_is_streamed_as_the_retention_yardstick_streams_it() -> None:
    # a replay of the import must serve the contexts a server gives the yardstick's stream: a shared
    # photo is said in its turn (as a screen note, its room went to recall and the replayed
    # contexts scored above the served ones), and turns follow each other 30 s apart
    out = import_locomo(LOCOMO, "locomo-tiny", request_every=0)
    first, second = (m["turn"] for m in out.messages[1:3])
    assert second == {
        "speaker": "Ben",
        "role": "user",
        "text": "Cool! Look at my new bike. [shares a photo: a photo of a red bicycle leaning on a wall]",
        "at": first["at"] + 30,
        "id": "D1:2",
    }
    assert not any(m["type"] == "note.append" for m in out.messages)


def test_locomo_questions_become_probes_with_repaired_evidence_and_no_adversarial_ones() -> None:
    out = import_locomo(LOCOMO, "locomo-tiny")
    assert [(p["answer"], p["evidence"]) for p in out.probes] == [
        ("7 May 2023", ["D1:1"]),
        ("1", ["D1:2"]),  # an int answer is read as text; "D:1:2" is repaired
        ("her pot", ["D2:1", "D1:1"]),  # "D2:01; D1:1" is split and repaired
    ]  # "D" names no turn, and category 5 has no gold answer: both are left out
    assert out.probes[0] == {
        "kind": "qa",
        "id": "q1",
        "question": "When did Ana go to pottery?",
        "answer": "7 May 2023",
        "evidence": ["D1:1"],
        "category": 2,
    }


def test_a_bot_asks_for_context_every_few_turns_and_a_checkpoint_replaces_a_request_at_that_moment() -> None:
    out = import_locomo(LOCOMO, "locomo-tiny", request_every=2)
    ids = [m["id"] for m in out.messages if m["type"] == "context.get"]
    assert ids == ["checkpoint-session-1", "ctx-4", "checkpoint-session-2"]


AMI: dict[str, Any] = {
    "meeting_id": "XY1001a",
    "corpus": "AMI",
    "speakers": ["A", "B"],
    "speaker_roles": {
        "A": {"role": "Project Manager", "overlap": 1.0},
        "B": {"role": "Marketing", "overlap": 1.0},
    },
    "utterances": [
        {"idx": 0, "id": "x.0", "speaker": "A", "start": 3.5, "end": 4.0, "da_type": "Stall", "text": "Okay"},
        {
            "idx": 1,
            "id": "x.1",
            "speaker": "B",
            "start": 5.0,
            "end": 9.0,
            "da_type": "Inform",
            "text": "It should sell for twenty five Euro.",
        },
        {
            "idx": 2,
            "id": "x.2",
            "speaker": "A",
            "start": 9.5,
            "end": 12.0,
            "da_type": "Inform",
            "text": "Agreed, twenty five.",
        },
        {
            "idx": 3,
            "id": "x.3",
            "speaker": "B",
            "start": 12.5,
            "end": 13.0,
            "da_type": "Inform",
            "text": "  ",
        },
        {
            "idx": 4,
            "id": "x.4",
            "speaker": "A",
            "start": 14.0,
            "end": 17.0,
            "da_type": "Inform",
            "text": "I will draft the   design.",
        },
    ],
    "summary": {
        "abstract": [{"id": "s1", "text": "They met.", "evidence": [0]}],
        "decisions": [{"id": "s2", "text": "The remote will sell for 25 Euro.", "evidence": [1, 2]}],
        "actions": [
            {"id": "s3", "text": "The project manager will draft the design.", "evidence": [4]},
            {"id": "s4", "text": "Nobody said this.", "evidence": []},
        ],
        "problems": [{"id": "s5", "text": "Batteries.", "evidence": [1]}],
    },
}


def test_an_ami_meeting_keeps_roles_times_and_its_decisions_and_actions_as_probes() -> None:
    out = import_ami(AMI, "ami-XY1001a", every=2, request_every=0)
    turns = [m["turn"] for m in out.messages if m["type"] == "turn.append"]
    assert [(t["speaker"], t["text"], t["at"], t["id"]) for t in turns] == [
        ("Project Manager", "Okay", MEETING_START + 3.5, "u0"),
        ("Marketing", "It should sell for twenty five Euro.", MEETING_START + 5.0, "u1"),
        ("Project Manager", "Agreed, twenty five.", MEETING_START + 9.5, "u2"),
        ("Project Manager", "I will draft the design.", MEETING_START + 14.0, "u4"),  # the blank one is gone
    ]
    assert out.meta["checkpoints"] == ["checkpoint-turn-2", "checkpoint-turn-4"]
    assert [(p["kind"], p["answer"], p["evidence"]) for p in out.probes] == [
        ("decision", "The remote will sell for 25 Euro.", ["u1", "u2"]),
        ("action", "The project manager will draft the design.", ["u4"]),
    ]


def test_a_qmsum_meeting_loses_its_markup_and_keeps_its_query_spans_as_evidence() -> None:
    meeting = {
        "meeting_transcripts": [
            {"speaker": "Project Manager", "content": "So {disfmarker} let's start ."},
            {"speaker": "Marketing", "content": "{vocalsound}"},
            {"speaker": "Marketing", "content": "Users want fewer buttons ."},
            {"speaker": "Industrial Designer", "content": "And a rubber case ."},
        ],
        "specific_query_list": [
            {"query": "What do users want?", "answer": "Fewer buttons.", "relevant_text_span": [["2", "3"]]},
            {"query": "Nothing?", "answer": "Nothing.", "relevant_text_span": [["x", "y"]]},
        ],
        "general_query_list": [{"query": "Summarize.", "answer": "A meeting."}],
    }
    out = import_qmsum(meeting, "qmsum-tiny", every=0, request_every=0)
    turns = [m["turn"] for m in out.messages if m["type"] == "turn.append"]
    assert [(t["text"], t["id"]) for t in turns] == [
        ("So let's start .", "t0"),
        ("Users want fewer buttons .", "t2"),
        ("And a rubber case .", "t3"),
    ]
    assert [(p["kind"], p["evidence"]) for p in out.probes] == [("query", ["t2", "t3"])]
    assert turns[2]["at"] == MEETING_START + 3 * 20.0


def test_the_import_command_writes_recordings_the_replay_reader_accepts(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "7.json").write_text(json.dumps(LOCOMO), encoding="utf-8")
    (tmp_path / "meetings.jsonl").write_text(
        json.dumps(AMI) + "\n" + json.dumps({**AMI, "meeting_id": "XY1001b"}) + "\n", encoding="utf-8"
    )
    assert main(["import", "locomo", str(tmp_path / "7.json"), "--out", str(tmp_path / "out")]) == 0
    assert (
        main(
            [
                "import",
                "ami",
                str(tmp_path / "meetings.jsonl"),
                "--out",
                str(tmp_path / "out"),
                "--only",
                "XY1001b",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "locomo-7: 5 turns, 2 checkpoints, 3 probes" in printed
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "ami-XY1001b.jsonl",
        "ami-XY1001b.probes.jsonl",
        "locomo-7.jsonl",
        "locomo-7.probes.jsonl",
    ]
    recording = read_recording(tmp_path / "out" / "locomo-7.jsonl")
    assert recording.skipped == []
    assert (
        recording.messages
        == parse_recording(
            (tmp_path / "out" / "locomo-7.jsonl").read_text(encoding="utf-8").splitlines()
        ).messages
    )
    probes = read_probes(tmp_path / "out" / "locomo-7.probes.jsonl")
    assert probes.checkpoints == {"checkpoint-session-1", "checkpoint-session-2"}
    assert [p.answer for p in probes.probes] == ["7 May 2023", "1", "her pot"]


def test_import_refuses_a_missing_file(tmp_path: Path, capsys: Any) -> None:
    assert main(["import", "qmsum", str(tmp_path / "nope.json"), "--out", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert import_files("qmsum", [], tmp_path) == []
