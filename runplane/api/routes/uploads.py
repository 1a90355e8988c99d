"""Uploads: the caller's archive of a directory, there already or to be PUT to a signed URL."""

from __future__ import annotations

from runplane.api.models import UploadView
from runplane.api.requests import UploadCreate
from runplane.api.routes.examples import UPLOAD_EXAMPLES
from runplane.api.routing import Answer, Call, operation
from runplane.api.views import upload_view
from runplane.domain import errors
from runplane.services import uploads


@operation(
    "POST",
    "/v1/uploads",
    operation_id="createUpload",
    summary="Offer an archive (gzip'd tar) of a directory for your runs: there already, or a URL to PUT it to; "
    "a run names it as an input upload:<sha256>",
    scope="runs:write",
    body=UploadCreate,
    examples=UPLOAD_EXAMPLES,
    answers={200: Answer(UploadView, "present: nothing to send; else the URL and headers to PUT the archive with")},
    raises=(errors.PayloadTooLarge,),
    valid_refusals={errors.PayloadTooLarge: "an archive larger than the stack's max_upload_bytes"},
)
def create_upload(call: Call, body: UploadCreate) -> UploadView:
    return upload_view(uploads.offer(call.ports, call.principal, body.sha256, body.size, body.md5))
