"""``max_upload_bytes`` holds for what is stored, not only for what was offered: an Azure SAS
cannot bind the length of a PUT, so an archive stored larger than the limit (a body longer than
offered, under the SAS) is refused when a run names it, and is never "present" to an offer of
another size. On Azurite and on the one-machine stack's store, through the uploads service."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import urllib.request

import pytest

from runplane.bootstrap import make_ports
from runplane.domain.errors import PayloadTooLarge
from runplane.domain.runs import RunSpec
from runplane.domain.tenancy import Principal
from runplane.domain.uploads import upload_key
from runplane.services import uploads

ALICE = Principal(user="alice", scopes=["runs:read", "runs:write"])
LIMIT = 1000
OFFERED = b"a small archive" * 10
STORED = b"far more than was offered" * 100  # over LIMIT


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


@pytest.mark.parametrize("stack", ["azure_stack", "local_stack"])
def test_an_upload_stored_over_the_limit_is_refused_at_submit_and_never_present(request, stack):
    built = request.getfixturevalue(stack)
    base = make_ports(built)
    ports = dataclasses.replace(base, settings=base.settings.model_copy(update={"max_upload_bytes": LIMIT}))
    sha = hashlib.sha256(OFFERED).hexdigest()
    offer = uploads.offer(ports, ALICE, sha, len(OFFERED), _md5(OFFERED))
    assert offer.present is False and offer.url is not None
    if stack == "azure_stack":  # the SAS takes a body longer than offered, with a Content-MD5 of its own
        headers = {**(offer.headers or {}), "Content-MD5": _md5(STORED), "Content-Length": str(len(STORED))}
        put = urllib.request.Request(offer.url, data=STORED, method="PUT", headers=headers)
        with urllib.request.urlopen(put, timeout=30) as answer:
            assert answer.status == 201
    else:  # the local URL binds the length: an object stored otherwise (the limit lowered since)
        ports.objects.put_bytes(upload_key(ALICE.user, sha), STORED)
    info = ports.objects.head(upload_key(ALICE.user, sha))
    assert info is not None and info.size == len(STORED)

    spec = RunSpec.model_validate({"command": "true", "inputs": {"code": f"upload:{sha}"}})
    with pytest.raises(PayloadTooLarge) as refused:
        uploads.check_run(ports, ALICE, spec)
    assert str(LIMIT) in refused.value.message and "max_upload_bytes" in refused.value.message
    again = uploads.offer(ports, ALICE, sha, len(OFFERED), _md5(OFFERED))
    assert again.present is False and again.url is not None  # of another size than offered: not there

    uploads.check_run(make_ports(built), ALICE, spec)  # under the default limit the same object is accepted
