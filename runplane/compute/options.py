"""What the backends' option checks share: which environment names hold credentials (never
passed to workers as plain values) and absolute paths."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from pydantic import AfterValidator

CREDENTIAL_NAMES = frozenset(
    {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AZURE_CLIENT_SECRET",
        "AZURE_CLIENT_CERTIFICATE_PASSWORD",
        "AZURE_PASSWORD",
        "AZURE_STORAGE_KEY",
        "AZURE_STORAGE_CONNECTION_STRING",
        "RUNPLANE_AZURE_STORAGE_CONNECTION_STRING",
        "RUNPLANE_AZURE_BATCH_ACCOUNT_KEY",
    }
)


def credentials_in(names: Iterable[str]) -> list[str]:
    """The credential names among ``names``, sorted (empty when there are none)."""
    return sorted(CREDENTIAL_NAMES & set(names))


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{path!r} is not an absolute path")
    return path


AbsolutePath = Annotated[str, AfterValidator(_absolute)]
