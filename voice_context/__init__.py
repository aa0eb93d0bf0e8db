"""voice-context: long-session memory for realtime voice bots."""

__version__ = "0.1.0"
