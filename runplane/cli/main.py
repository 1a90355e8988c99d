"""The ``runplane`` command's entry point. ``runplane --version`` is answered here, before the
commands are loaded (runplane.cli.app, and with it the SDK, its models, typer and rich): it needs
none of them, and loading them is most of the time a short command takes."""

from __future__ import annotations

import sys

from runplane import __version__


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print(f"runplane {__version__}")
        return
    from runplane.cli.app import exit_without_extras, run_cli  # no circle: app never imports this module

    exit_without_extras()
    sys.exit(run_cli())
