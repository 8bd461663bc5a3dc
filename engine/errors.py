"""Errors that end a command with one sentence and exit code 2 (engine.cli turns them into that)."""


class UsageError(Exception):
    """Bad input: the message says what is wrong and what to do."""
