"""What the Lambda service would hand our handlers: API Gateway v2 events, SQS batches,
scheduled events and a context object. Used by the embedded local stack and the tests."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from runplane.api.gateway import http_event

__all__ = ["LambdaContext", "http_event", "scheduled_event", "sqs_event"]


@dataclass
class LambdaContext:
    function_name: str = "runplane-local"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:000000000000:function:runplane-local"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    timeout_seconds: float = 30
    _started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_seconds - (time.monotonic() - self._started)) * 1000))


def sqs_event(messages: list[dict[str, Any]], queue_arn: str, region: str = "us-east-1") -> dict[str, Any]:
    """The batch an SQS event source mapping passes to a function."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": {},
                "md5OfBody": m.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": region,
            }
            for m in messages
        ]
    }


def scheduled_event(rule: str, region: str = "us-east-1") -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "region": region,
        "resources": [f"arn:aws:events:{region}:000000000000:rule/{rule}"],
        "detail": {},
    }
