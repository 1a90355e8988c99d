"""RunQueue.notify contract: an event sent with a delay reaches the dispatcher's queue no sooner than
the delay, and does reach it after (a run's fallback timer)."""

import base64
import time

from runplane.adapters.aws.sqs import events_queue_name as sqs_events_queue
from runplane.adapters.azure.queues import events_queue_name as storage_events_queue
from runplane.domain.messages import DispatchEvent

DELAY = 2


def visible_events(stack):
    """The dispatcher events that a receive of the stack's events queue gets now (left there)."""
    queue, prefix = stack.queue, stack.settings.prefix
    if stack.settings.cloud == "local":
        return [DispatchEvent.model_validate_json(e.body) for e in queue.receive_events(32, 0, 0)]
    if stack.settings.cloud == "azure":
        peeked = queue.client.get_queue_client(storage_events_queue(prefix)).peek_messages(max_messages=32)
        return [DispatchEvent.model_validate_json(base64.b64decode(m.content)) for m in peeked]
    url = queue._url(sqs_events_queue(prefix))
    got = queue.client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=0)
    return [DispatchEvent.model_validate_json(m["Body"]) for m in got.get("Messages", [])]


def test_a_delayed_event_comes_after_its_delay(stack):
    sent = time.monotonic()
    stack.queue.notify(DispatchEvent(pool="default", reason="fallback", fallback="r-late", due=1.0), DELAY)
    stack.queue.notify(DispatchEvent(pool="default", reason="submitted"))
    assert [(e.reason, e.fallback) for e in visible_events(stack)] == [("submitted", None)]
    late = []
    while not late and time.monotonic() - sent < DELAY + 8:
        time.sleep(0.25)
        late = [e for e in visible_events(stack) if e.fallback == "r-late"]
    assert late, "the delayed event never came"
    assert time.monotonic() - sent >= DELAY - 0.2  # Azurite counts visibility in whole seconds
    assert late[0].due == 1.0
