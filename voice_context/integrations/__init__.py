"""Adapters for the voice stacks people build on; each imports its framework lazily."""
