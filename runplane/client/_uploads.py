"""Uploads, the same for both drivers: the request that asks the stack for one (``start``), the PUT
of the archive's bytes to the URL it answers (``put_args``, ``check_put``), and the run options with
each upload named as an input (``with_uploads``). The drivers pack, send and count the bytes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from runplane.api.models import UploadView
from runplane.client._admin_plans import AdminPlans
from runplane.client._core import USER_AGENT, Plan, Progress, parse
from runplane.client._options import RunOptions
from runplane.client._pack import Packed
from runplane.client.errors import UploadFailed


@dataclass(frozen=True)
class Upload:
    """A directory uploaded: ``source`` is how a run names it in ``inputs`` (``upload:<sha256>``);
    ``sent`` False when the stack held the same archive already and nothing was sent."""

    directory: Path
    source: str
    sha256: str
    size: int
    sent: bool


def start(plans: AdminPlans, packed: Packed) -> Plan[UploadView]:
    """``POST /v1/uploads`` for ``packed``: there already, or where to PUT it."""
    body = {"sha256": packed.sha256, "size": packed.size, "md5": packed.md5}
    return parse(UploadView, (yield from plans.raw("POST", "/v1/uploads", body)))


def put_args(plans: AdminPlans, view: UploadView) -> tuple[str, dict[str, str]]:
    """The URL and headers of the PUT of an upload the stack does not hold. The URL the stack
    signed carries its own authority: the client's token is never sent with it. A path (the
    embedded stack may answer one) is the API's own."""
    if not view.url:
        raise UploadFailed(0, "invalid_response", "the API answered no URL to send the upload to")
    url = view.url
    if not urlsplit(url).scheme:
        url = plans.url + (url if url.startswith("/") else "/" + url)
    headers = {"User-Agent": USER_AGENT, "Content-Type": "application/gzip", **(view.headers or {})}
    return url, headers


def counted(packed: Packed, progress: Progress | None) -> Iterator[bytes]:
    """The archive's bytes, telling ``progress`` how many have gone."""
    sent = 0
    for chunk in packed.chunks():
        yield chunk
        sent += len(chunk)
        if progress is not None:
            progress(sent, packed.size)


def check_put(packed: Packed, status: int) -> None:
    """Raises UploadFailed for an answer to the PUT that is not a success (the store's own text is
    not shown: a wrong checksum reads as a refusal of the bytes)."""
    if status in (200, 201, 204):
        return
    why = "the store refused the bytes (they changed while sending?)" if status in (400, 403) else f"HTTP {status}"
    raise UploadFailed(status, "upload_failed", f"upload of {packed.directory} failed: {why}")


def uploaded(packed: Packed, view: UploadView) -> Upload:
    return Upload(packed.directory, view.source, view.sha256, view.size, not view.present)


def with_uploads(options: RunOptions, sources: Mapping[str, str]) -> RunOptions:
    """``options`` with each upload (``sources``: input name -> ``upload:<sha256>``) among its
    inputs. Raises ValueError for a name that is an input already."""
    inputs: dict[str, Any] = dict(options.get("inputs") or {})
    both = sorted(set(inputs) & set(sources))
    if both:
        raise ValueError(f"{', '.join(both)} is named by inputs and by uploads: name each input once")
    merged = dict(options)
    merged["inputs"] = {**inputs, **sources}
    return merged  # type: ignore[return-value]
