"""Lambda for the dispatcher: SQS batches of pool and sweep events (partial failures: a record that
fails, or is met too late, is tried again alone), and a schedule (every pool, then waiting runs and
unfinished sweeps within a budget of calls, going on where the previous pass stopped)."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response

from runplane import bootstrap
from runplane.handlers import PoolDispatcher

logger = Logger(service="runplane-dispatcher")


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    # a record met with too little time left fails alone (partial batch response): tried again
    dispatcher = PoolDispatcher(
        bootstrap.stack().ports, time_left=lambda: context.get_remaining_time_in_millis() / 1000
    )
    if "Records" not in event:  # the schedule: pools first, then waiting runs and sweeps within a budget
        return dispatcher.schedule()
    processor = BatchProcessor(event_type=EventType.SQS)
    response = process_partial_response(
        event=event, record_handler=dispatcher.record_handler(), processor=processor, context=context
    )
    return dict(response)
