"""Runnable examples; ``examples.tinytrainer`` is importable from the repository root."""
