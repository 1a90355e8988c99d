"""Lambda for the dispatcher: SQS batches of pool and sweep events (partial failures), and a schedule
(every pool, every unfinished sweep)."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response

from runplane import bootstrap
from runplane.handlers import PoolDispatcher

logger = Logger(service="runplane-dispatcher")


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    dispatcher = PoolDispatcher(bootstrap.stack())
    if "Records" not in event:  # the schedule
        waiting = dispatcher.all_waiting()  # first: runs it releases are dispatched in this pass
        return {"waiting": waiting, "pools": dispatcher.all_pools(), "sweeps": dispatcher.all_sweeps()}
    processor = BatchProcessor(event_type=EventType.SQS)
    response = process_partial_response(
        event=event, record_handler=dispatcher.record_handler(), processor=processor, context=context
    )
    return dict(response)
