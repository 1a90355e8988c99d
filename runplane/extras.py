"""The optional extras of ``pip install 'runplane[...]'`` (pyproject.toml) and the one-line error of
a command that needs one that is not installed. ``pip install runplane`` is the client alone (CLI
and SDK); the stack, the agent, the functions and the backends come with extras. Modules are looked
up without being imported, so a check costs the CLI's start next to nothing."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence

# Per extra, a module of each distribution it brings that a command of it imports.
EXTRAS: dict[str, tuple[str, ...]] = {
    "agent": ("docker", "requests", "boto3", "yaml"),
    "aws": ("boto3", "aws_lambda_powertools", "yaml"),
    "local": ("moto", "docker", "boto3", "aws_lambda_powertools", "yaml"),
    "azure": (
        "azure.core",
        "azure.data.tables",
        "azure.storage.queue",
        "azure.storage.blob",
        "azure.identity",
        "azure.functions",
        "aws_lambda_powertools",
        "yaml",
    ),
    "kubernetes": ("kubernetes", "yaml"),
    "azure-batch": ("azure.core",),
}


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing (azure.data.tables without azure)
        return False


def missing(extras: Sequence[str]) -> list[str]:
    """The extras among ``extras`` with a module that is not installed."""
    return [extra for extra in extras if not all(_found(module) for module in EXTRAS[extra])]


def requirement(command: str, extras: Sequence[str]) -> str | None:
    """None when ``extras`` are installed, else the line saying that ``command`` needs them (all
    of them, so that the pip command given installs what it runs on)."""
    if not missing(extras):
        return None
    names = " and ".join(extras)
    plural = "s" if len(extras) > 1 else ""
    return f"{command} needs the {names} extra{plural}: pip install 'runplane[{','.join(extras)}]'"


def _option(argv: Sequence[str], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.partition("=")[2]
    return None


def _after_global_options(argv: Sequence[str]) -> list[str]:
    """``argv`` from the command on: without ``runplane``'s own options (``--profile NAME``)."""
    words = list(argv)
    while words and words[0].startswith("-"):
        del words[: 2 if words[0] == "--profile" else 1]
    return words


def cli_needs(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, tuple[str, ...]] | None:
    """For ``runplane ARGV``: (the command, the extras it needs), or None for a command that needs
    only the client. ``runplane dev`` runs the stack: ``local``, and ``azure`` on Azure terms
    (``--cloud azure``, or an Azure connection string without ``--cloud``, as runplane/cli/dev.py
    reads its options); ``runplane serve`` runs it too (``serve backup`` copies files: nothing);
    ``runplane token create --direct`` writes to the store of RUNPLANE_CLOUD's
    stack (``aws`` or ``azure``; ``local`` with ``--state-dir``). Help needs no extra."""
    if "--help" in argv:
        return None
    argv = _after_global_options(argv)
    if argv[:1] == ["dev"]:
        cloud = _option(argv, "--cloud")
        if cloud is None and (_option(argv, "--azure-connection") or environ.get("RUNPLANE_AZURE_CONNECTION")):
            cloud = "azure"
        if cloud == "azure":
            return "runplane dev --cloud azure", ("local", "azure")
        return "runplane dev", ("local",)
    if argv[:1] == ["serve"] and argv[1:2] != ["backup"]:
        return "runplane serve", ("local",)
    if argv[:2] == ["token", "create"] and ("--direct" in argv or _option(argv, "--state-dir") is not None):
        if _option(argv, "--state-dir") is not None or environ.get("RUNPLANE_CLOUD") == "local":
            return "runplane token create --direct", ("local",)
        return "runplane token create --direct", ("azure",) if environ.get("RUNPLANE_CLOUD") == "azure" else ("aws",)
    return None


def cli_requirement(argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """The line naming the extras that ``runplane ARGV`` needs and lacks (``cli_needs``), or None."""
    needs = cli_needs(argv, environ)
    return requirement(*needs) if needs else None
