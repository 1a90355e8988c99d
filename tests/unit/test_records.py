"""The bounds of a run's record (runplane.domain.records) and the stores' errors, which carry our
words (and the store's error code) and never the store's own words."""

import json

import pytest
from azure.core.exceptions import HttpResponseError
from boto3.exceptions import S3UploadFailedError
from botocore.exceptions import ClientError

from runplane.adapters.aws.dynamodb import translate
from runplane.adapters.aws.s3 import _failed as s3_failed
from runplane.adapters.azure.blob import BlobObjectStore
from runplane.adapters.azure.tables import MAX_RUN_CHARS, failure
from runplane.domain.errors import BackendError, BadRequest, PayloadTooLarge
from runplane.domain.records import (
    MAX_MESSAGE_CHARS,
    MAX_RUN_EVENTS,
    MAX_SPEC_BYTES,
    STORE_ITEM_BYTES,
    add_event,
    bound_changes,
    check_spec,
    clip,
    json_size,
    largest_member,
    largest_run_bytes,
    largest_timeline_bytes,
)
from runplane.domain.runs import Event, Failure, RunSpec
from runplane.domain.states import FailureReason
from runplane.domain.sweeps import SweepSpec


def test_the_largest_record_fits_every_store_with_room_to_spare():
    largest = largest_run_bytes()
    assert largest > MAX_SPEC_BYTES + MAX_RUN_EVENTS * MAX_MESSAGE_CHARS
    assert largest < 0.85 * STORE_ITEM_BYTES
    assert largest < 0.75 * MAX_RUN_CHARS
    # a write that replaces a full timeline, counted with the old one and the new (moto's DynamoDB)
    assert largest + largest_timeline_bytes() < STORE_ITEM_BYTES


@pytest.mark.parametrize("char", ["a", '"', "\n", "\u00e9", "\u4e2d", "\U0001f600"])
def test_clip_keeps_a_message_within_its_escaped_size(char):
    short = char * 10
    assert clip(short) == short
    cut = clip(char * 5000)
    assert cut.endswith("\u2026") and cut[:-1] == char * (len(cut) - 1)
    assert MAX_MESSAGE_CHARS - 12 < json_size(cut) - 2 <= MAX_MESSAGE_CHARS
    exact = "a" * MAX_MESSAGE_CHARS
    assert clip(exact) == exact and clip(exact + "b") != exact + "b"


def test_a_timeline_keeps_its_first_event_and_the_latest():
    events = [Event(at=float(i), message=f"e{i}") for i in range(MAX_RUN_EVENTS)]
    assert add_event(events[:5], events[5]) == events[:6]
    full = add_event(events, Event(at=1000.0, message="x" * 5000))
    assert len(full) == MAX_RUN_EVENTS
    assert full[0] == events[0] and full[1:-1] == events[2:]
    assert full[-1].at == 1000.0 and json_size(full[-1].message) - 2 <= MAX_MESSAGE_CHARS


def test_changes_are_bounded_before_they_are_written():
    long = "y" * 10_000
    bounded = bound_changes(
        {
            "failure": Failure(reason=FailureReason.AGENT_ERROR, message=long),
            "waiting_reason": long,
            "kill_reason": long,
            "events": [Event(at=float(i), message=long) for i in range(MAX_RUN_EVENTS + 7)],
            "attempt": 3,
        }
    )
    assert bounded["attempt"] == 3
    assert bounded["failure"].reason == FailureReason.AGENT_ERROR
    for text in (bounded["failure"].message, bounded["waiting_reason"], bounded["kill_reason"]):
        assert len(text) <= MAX_MESSAGE_CHARS and text.endswith("\u2026")
    assert len(bounded["events"]) == MAX_RUN_EVENTS and bounded["events"][0].at == 0.0


def test_a_spec_is_measured_as_escaped_json():
    base = RunSpec(command="echo", env={"PAD": ""})
    room = MAX_SPEC_BYTES - json_size(base.model_dump(mode="json"))
    check_spec(base.model_copy(update={"env": {"PAD": "x" * room}}))
    with pytest.raises(
        PayloadTooLarge, match=f"the run's spec is {MAX_SPEC_BYTES + 1} bytes .* at most {MAX_SPEC_BYTES}"
    ):
        check_spec(base.model_copy(update={"env": {"PAD": "x" * (room + 1)}}))
    with pytest.raises(PayloadTooLarge, match="the run's spec is"):  # 6 characters each as stored
        check_spec(base.model_copy(update={"env": {"PAD": "\u00e9" * (room // 6 + 1)}}))


def test_a_sweeps_largest_member_has_each_parameter_at_its_longest_value():
    sweep = SweepSpec.model_validate(
        {
            "name": "grid",
            "run": {"command": "echo", "env": {"A": "1"}},
            "parameters": {"P": ["s", "l" * 900, 7], "Q": [True]},
        }
    )
    member = largest_member(sweep)
    assert member.env == {"A": "1", "P": "l" * 900, "Q": "true"}
    assert member.name == "grid[10000]"
    assert member.command == "echo"


def test_dynamodb_errors_carry_no_store_text():
    said = "Item size has exceeded the maximum allowed size; table t-runs key r-1"
    refused = ClientError({"Error": {"Code": "ValidationException", "Message": said}}, "UpdateItem")
    error = translate(refused, "update run")
    assert isinstance(error, BadRequest) and error.message == "update run: the store refused the request"
    failed = ClientError({"Error": {"Code": "InternalServerError", "Message": said}}, "UpdateItem")
    error = translate(failed, "update run")
    assert isinstance(error, BackendError) and error.message == "update run failed: InternalServerError"
    assert "t-runs" not in json.dumps([str(error), error.message])


def test_table_storage_errors_carry_no_store_text():
    said = "The property value exceeds the maximum allowed size (64KB). RequestId:1234 account devstoreaccount1"
    for code, kind, message in (
        ("PropertyValueTooLarge", PayloadTooLarge, "update run: the record is too large for Table storage"),
        ("InternalError", BackendError, "update run failed: InternalError"),
    ):
        answer = HttpResponseError(message=said)
        answer.error_code = code
        error = failure(answer, "update run")
        assert isinstance(error, kind) and error.message == message


def test_object_store_errors_carry_their_code_and_no_store_text():
    said = "Access Denied for arn:aws:s3:::lab-secret-bucket/key RequestId 1234"
    denied = ClientError({"Error": {"Code": "AccessDenied", "Message": said}}, "GetObject")
    error = s3_failed(denied, "download", "runs/r-1/x")
    assert error.message == "download runs/r-1/x: AccessDenied"
    try:  # the transfer manager wraps the client's error in one of its own
        try:
            raise denied
        except ClientError as e:
            raise S3UploadFailedError(f"Failed to upload: {said}") from e
    except S3UploadFailedError as wrapped:
        assert s3_failed(wrapped, "upload", "k").message == "upload k: AccessDenied"
    answer = HttpResponseError(message="Server failed to authenticate the request. account devstoreaccount1")
    answer.error_code = "AuthenticationFailed"
    blob = BlobObjectStore("outputs", client=None)  # type: ignore[arg-type]
    assert blob._fail(answer, "download", "runs/r-1/x").message == "download runs/r-1/x: AuthenticationFailed"
