"""What every command module shares: the two consoles and the error a command raises for a
one-line message."""

from __future__ import annotations

from rich.console import Console

out = Console()
err = Console(stderr=True)


class CliError(Exception):
    """A usage error, said in one line (exit 2)."""
