"""The date audit: each summary sentence a bot was shown, judged against the day it was said."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from voice_context.tuning.audit import Sources, audit_contexts, audit_summaries, dated_sentences
from voice_context.tuning.replay import parse_recording

#: Monday 26 June 2023, 18:00 UTC, and a second conversation thirteen days later
JUNE_26 = datetime(2023, 6, 26, 18, 0, tzinfo=UTC).timestamp()
JULY_9 = datetime(2023, 7, 9, 10, 0, tzinfo=UTC).timestamp()


def recording() -> list[str]:
    said = [
        ("Deborah", "I signed up for a pottery class in Lisbon.", JUNE_26),
        ("Jolene", "My snake Seraphim escaped twice this week.", JUNE_26 + 20),
        ("Deborah", "I started a running group with Anna.", JULY_9),
        ("Jolene", "We adopted a second snake called Susie.", JULY_9 + 20),
    ]
    lines = [json.dumps({"type": "session.open", "session": "s"})]
    for speaker, text, at in said:
        turn = {"speaker": speaker, "role": "user", "text": text, "at": at}
        lines.append(json.dumps({"type": "turn.append", "session": "s", "turn": turn}))
    note = {"text": "a photo of a snake on a rock", "at": JULY_9 + 20, "speaker": "Jolene", "source": "image"}
    lines.append(json.dumps({"type": "note.append", "session": "s", "note": note}))
    return lines


def sources() -> Sources:
    return Sources.from_recording(parse_recording(recording()), "s")


def test_a_sentence_under_the_day_it_was_said_passes_and_one_under_an_earlier_day_is_misdated() -> None:
    summary = (
        "[26 June 2023, 18:00] Deborah: I signed up for a pottery class in Lisbon. "
        "Deborah: I started a running group with Anna.\n"
        "[9 July 2023, 10:00] Jolene: We adopted a second snake called Susie. "
        "Jolene's screen (image): A snake on a rock."
    )
    audit = audit_summaries([summary], sources(), "s")
    assert (audit.judged, audit.misdated, audit.undated) == (4, 1, 0)
    (wrong,) = audit.examples
    assert wrong.sentence == "Deborah: I started a running group with Anna."
    assert (wrong.shown_under, wrong.said_on, wrong.days_off) == ("2023-06-26", ("2023-07-09",), 13)
    assert audit.share == 0.25


def test_a_line_headed_by_a_time_alone_is_read_under_the_date_above_it_and_with_none_it_is_undated() -> None:
    label = sources().label
    dated = dated_sentences(
        "[26 June 2023, 18:00] Deborah: Pottery in Lisbon.\n[18:05] Jolene: Seraphim escaped twice.", label
    )
    assert [(str(day), who) for day, who, _ in dated] == [("2023-06-26", "Deborah"), ("2023-06-26", "Jolene")]

    # a budget cut the dated line away: what is left has a time and no date
    audit = audit_summaries(["[10:00] Jolene: We adopted a second snake called Susie."], sources())
    assert (audit.judged, audit.misdated, audit.undated) == (1, 0, 1)


def test_a_paraphrase_no_source_holds_is_not_judged() -> None:
    audit = audit_summaries(["[9 July 2023, 10:00] Alice and Bob made small talk."], sources())
    assert (audit.judged, audit.unmatched) == (0, 1)
    assert audit.share is None


def test_a_replay_is_audited_once_per_distinct_sentence_whatever_the_replies_that_showed_it() -> None:
    summary = "[26 June 2023, 18:00] Jolene: My snake Seraphim escaped twice the week of 26 June 2023."
    contexts = [
        {"session": "s", "response": {"summary": summary}},
        {"session": "s", "response": {"summary": summary}},
        {"session": "s", "response": {"summary": ""}},
    ]
    audit = audit_contexts(contexts, parse_recording(recording()))
    assert (audit.judged, audit.misdated) == (1, 0)
    assert str(audit) == "dates: 1 summary sentences judged, 0 misdated, 0 undated (0.0%), 0 unmatched"
