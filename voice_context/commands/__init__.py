"""The subcommands of ``voice-context`` (one module each)."""
