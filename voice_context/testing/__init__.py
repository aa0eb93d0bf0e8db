"""Helpers for testing voice-context and the bots built on it."""
