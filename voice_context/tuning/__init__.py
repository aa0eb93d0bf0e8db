"""The tuning tools: replay recorded sessions offline or against a server, import datasets into
recordings, score what the contexts kept, sweep settings and audit dates.

Nothing here is loaded by ``voice-context serve`` or by a bot's client: the commands ``replay``,
``score`` and ``import`` load it when they run. Their reports (plots, tables, progress) use the
``report`` extra (``pip install 'voice-context[report]'``).
"""
