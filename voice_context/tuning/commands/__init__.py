"""The tuning tools' commands (``replay``, ``score``, ``import``): see :mod:`voice_context.cli`."""
