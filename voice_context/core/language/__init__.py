"""The text helpers that recall, the summarizers and the metric share, each module a subject:

- :mod:`~voice_context.core.language.words`: how a text is cut into words, stopwords and small
  talk, and what each informative word is worth;
- :mod:`~voice_context.core.language.small_talk`: filler (greetings, goodbyes, thanks, callouts),
  sentences of small talk alone, and a sentence shortened to what it says;
- :mod:`~voice_context.core.language.dates`: relative dates ("yesterday", "last Friday") found
  and made absolute against the time they were said;
- :mod:`~voice_context.core.language.numbers`: numbers said as words written as digits;
- :mod:`~voice_context.core.language.forms`: irregular forms ("won", "children") and their base.

Pure and synchronous, as the rest of the core: no clock, no I/O. The months' and weekdays' names
they go by are :mod:`voice_context.core.times`'s.
"""
