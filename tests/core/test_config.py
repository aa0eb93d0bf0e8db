"""Settings: defaults, then a TOML file, then VOICE_CONTEXT_* variables; and the summary ceiling
each summarizer gets when nobody sets one."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from voice_context.config import Settings, load_settings, make_summarizer, session_defaults
from voice_context.core.config import MAX_SUMMARY_CHARS, SessionConfig
from voice_context.errors import ConfigError
from voice_context.manager import SessionManager
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.summarizers.fakes import ScriptedSummarizer
from voice_context.summarizers.fallback import FallbackSummarizer

#: a model summarizer says where its model is: the API root and the model's name
OPENAI = {
    "VOICE_CONTEXT_SUMMARIZER_KIND": "openai",
    "VOICE_CONTEXT_SUMMARIZER_BASE_URL": "http://127.0.0.1:8080/v1",
    "VOICE_CONTEXT_SUMMARIZER_MODEL": "gpt-4o-mini",
}


def test_a_file_then_the_environment_override_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "voice-context.toml"
    path.write_text('[server]\nport = 9000\nauth_tokens = ["a"]\n[session]\nrecent_window = 40\n')
    env = {"VOICE_CONTEXT_SESSION_RECENT_WINDOW": "30", "VOICE_CONTEXT_SERVER_AUTH_TOKENS": "x,y"}
    settings = load_settings(path, env=env)
    assert settings.server.port == 9000
    assert settings.server.auth_tokens == ("x", "y")
    assert settings.session.recent_window == 30
    assert settings.session_explicit == {"recent_window"}
    assert Settings().session == SessionConfig()
    assert Settings().recall.ahead == "first"
    assert load_settings(env={"VOICE_CONTEXT_RECALL_AHEAD": "every"}).recall.ahead == "every"
    assert Settings().server.gc_freeze_seconds == 1.0
    assert load_settings(env={"VOICE_CONTEXT_SERVER_GC_FREEZE_SECONDS": "0"}).server.gc_freeze_seconds == 0.0
    assert Settings().store.sqlite_reads == "loop"
    assert load_settings(env={"VOICE_CONTEXT_STORE_SQLITE_READS": "thread"}).store.sqlite_reads == "thread"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[nope]\nx = 1\n", r"unknown config section \[nope\]$"),
        ("[session]\nrecent_windw = 1\n", r"session.recent_windw \(did you mean 'recent_window'\?\)"),
        ("[sesion]\nrecent_window = 1\n", r"unknown config section \[sesion\] \(did you mean 'session'\?\)"),
        ("[[source]]\nname = 'cal'\n", r"unknown config section \[source\] \(did you mean 'sources'\?\)"),
        ("session = 3\n", r"config section \[session\] must be a table of settings, got 3"),
        ("[session]\nrecent_window = 0\n", "recent_window must be a positive integer"),
        ("[summarizer]\nkind = 'magic'\n", "summarizer.kind"),
        ("[summarizer]\ntimeout = 20\n", "3 attempts of timeout=20s .* outlast compaction_timeout=60s"),
        ("[summarizer]\ncompaction_timeout = 4\nmax_retries = 2\n", "leaves no time for 3 attempts"),
        ("[server\n", "cannot read config file"),
        ("[recall]\nahead = 'sometimes'\n", "recall.ahead must be first, every or off"),
        ("[server]\ngc_freeze_seconds = -1\n", "gc_freeze_seconds must not be negative"),
        ("[store]\nsqlite_reads = 'inline'\n", "store.sqlite_reads must be loop or thread"),
    ],
)
def test_a_bad_file_is_a_clear_config_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings(path, env={})


def test_a_misspelt_name_is_refused_with_the_name_it_was_likely_meant_to_be() -> None:
    with pytest.raises(ConfigError, match=r"session.recent_windw \(did you mean 'recent_window'\?\)"):
        load_settings(env={"VOICE_CONTEXT_SESSION_RECENT_WINDW": "30"})
    with pytest.raises(ConfigError, match=r"unknown settings group 'sesion' \(did you mean 'session'\?\)"):
        Settings().with_values("sesion", {"recent_window": 30})
    # a session's stored overrides and a library caller's go through with_overrides
    with pytest.raises(ConfigError) as refused:
        SessionConfig().with_overrides({"recent_windw": 30, "colour": "red"})
    assert str(refused.value) == (
        "unknown session config key(s): colour, recent_windw (did you mean 'recent_window'?)"
    ), "a name close to none is named alone"


def test_the_deterministic_summarizer_gets_its_larger_summary_ceiling_by_default() -> None:
    settings = load_settings(env={})
    summarizer = make_summarizer(settings.summarizer)
    assert isinstance(summarizer, DeterministicSummarizer)
    assert settings.session_config(summarizer).max_summary_chars == 12_000
    assert SessionManager(summarizer).config.max_summary_chars == 12_000


def test_a_model_summarizer_keeps_the_design_ceiling_and_an_explicit_value_always_wins() -> None:
    assert session_defaults(ScriptedSummarizer()).max_summary_chars == MAX_SUMMARY_CHARS == 1200
    paragraph = load_settings(env={**OPENAI, "VOICE_CONTEXT_SUMMARIZER_FOLD": "paragraph"})
    assert paragraph.session_config(make_summarizer(paragraph.summarizer)).max_summary_chars == 1200
    pinned = load_settings(env={"VOICE_CONTEXT_SESSION_MAX_SUMMARY_CHARS": "1200"})
    assert pinned.session_config(DeterministicSummarizer()).max_summary_chars == 1200
    explicit = SessionConfig(max_summary_chars=800)
    assert SessionManager(DeterministicSummarizer(), config=explicit).config.max_summary_chars == 800


def test_a_model_that_folds_by_lines_gets_the_deterministic_ceiling_through_its_fallback() -> None:
    lines = load_settings(env=OPENAI)
    assert lines.summarizer.fold == "lines"
    assert lines.session_config(make_summarizer(lines.summarizer)).max_summary_chars == 12_000


def test_each_attempt_gets_the_compaction_timeout_shared_among_the_attempts() -> None:
    # by default: 60 s for a compaction, 3 attempts, 2 s set aside before each retry
    assert Settings().summarizer.attempt_timeout == pytest.approx(56 / 3)
    # a CPU model: one long attempt, no retry queued behind abandoned work
    local = load_settings(
        env={
            "VOICE_CONTEXT_SUMMARIZER_COMPACTION_TIMEOUT": "300",
            "VOICE_CONTEXT_SUMMARIZER_MAX_RETRIES": "0",
        }
    )
    assert local.summarizer.attempt_timeout == 300
    # an explicit timeout that fits is kept, and is what the client gets
    chosen = load_settings(env={**OPENAI, "VOICE_CONTEXT_SUMMARIZER_TIMEOUT": "15"})
    assert chosen.summarizer.attempt_timeout == 15.0
    summarizer = make_summarizer(chosen.summarizer)
    assert isinstance(summarizer, FallbackSummarizer), "a failed fold is folded deterministically"
    assert summarizer.deadline == 59.0, "the compaction timeout less a second for the fallback"
    assert repr(summarizer.primary) == "<OpenAISummarizer model='gpt-4o-mini' timeout=15 max_retries=2>"
    bare = make_summarizer(replace(chosen.summarizer, fallback=False))
    assert repr(bare) == "<OpenAISummarizer model='gpt-4o-mini' timeout=15 max_retries=2>"


def test_a_summarizer_or_store_whose_extra_is_missing_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`pip install voice-context` has neither openai nor redis: asking for them says what to install."""
    from voice_context.store import open_store

    for package, module in (("openai", "summarizers.openai_compat"), ("redis", "store.redis")):
        monkeypatch.setitem(sys.modules, package, None)  # as if it were not installed
        monkeypatch.delitem(sys.modules, f"voice_context.{module}", raising=False)
    openai = load_settings(env=OPENAI).summarizer
    with pytest.raises(ConfigError, match=r"pip install 'voice-context\[openai\]'"):
        make_summarizer(openai)
    with pytest.raises(ConfigError, match=r"pip install 'voice-context\[redis\]'"):
        open_store("redis://127.0.0.1:6379/0")


def test_a_model_summarizer_that_does_not_say_where_its_model_is_is_refused_naming_what_is_missing(
    tmp_path: Path,
) -> None:
    """Nothing is guessed: with the OpenAI host and a default model every fold would fail over
    to the deterministic summarizer, and the service would start without a word."""
    bare = Settings().with_values("summarizer", {"kind": "openai"}).summarizer
    with pytest.raises(ConfigError, match=r"needs summarizer\.base_url and summarizer\.model"):
        make_summarizer(bare)
    no_model = replace(bare, base_url="http://127.0.0.1:8080/v1")
    with pytest.raises(ConfigError, match=r"needs summarizer\.model: "):
        make_summarizer(no_model)
    # the check comes once every layer is applied: the file names the kind, the environment the rest
    path = tmp_path / "voice-context.toml"
    path.write_text('[summarizer]\nkind = "openai"\n')
    env = {k: v for k, v in OPENAI.items() if k != "VOICE_CONTEXT_SUMMARIZER_KIND"}
    layered = load_settings(path, env=env).summarizer
    assert layered.endpoint() == ("http://127.0.0.1:8080/v1", "gpt-4o-mini")
    assert isinstance(make_summarizer(layered), FallbackSummarizer)
