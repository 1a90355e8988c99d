"""The failure reasons a user can meet are the ones README.md documents: no documented reason that
nothing produces, no reason produced that the documentation leaves out."""

import re
from pathlib import Path

from runplane.api.openapi import openapi_document
from runplane.domain.models import FailureReason

ROOT = Path(__file__).resolve().parents[2]


def documented_reasons() -> set[str]:
    """The reasons named in README.md's list, "Failures carry `{reason, message}`: ..." up to the
    sentence's end (parenthesised remarks inside it left out)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("Failures carry `{reason, message}`:")
    sentence = text[start : text.index(". ", start)]
    listed = re.sub(r"\([^)]*\)", "", sentence.partition(":")[2])
    return set(re.findall(r"`([a-z_]+)`", listed))


def test_readme_documents_exactly_the_failure_reasons():
    documented = documented_reasons()
    assert len(documented) >= 10  # the list was found and read
    assert documented == {r.value for r in FailureReason}


def test_every_failure_reason_is_produced_somewhere():
    """A reason no code writes is one a user is promised but never meets."""
    sources = "\n".join(
        path.read_text() for package in ("runplane", "worker_agent") for path in (ROOT / package).rglob("*.py")
    )
    members = list(FailureReason)
    assert members
    unused = [r.value for r in members if not re.search(rf"FailureReason\.{r.name}\b", sources)]
    assert unused == []


def test_openapi_lists_the_failure_reasons():
    schemas = openapi_document()["components"]["schemas"]
    failure = schemas["RunView"]["properties"]["failure"]
    assert {"$ref": "#/components/schemas/RunFailure"} in failure["anyOf"]
    assert schemas["RunFailure"]["properties"]["reason"]["$ref"] == "#/components/schemas/FailureReason"
    assert set(schemas["FailureReason"]["enum"]) == {r.value for r in FailureReason}
