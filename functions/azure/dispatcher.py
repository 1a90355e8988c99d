"""The dispatcher: one invocation per pool event on the events queue, and a timer.

A failing event raises, so the host makes the message visible again after host.json's
``visibilityTimeout`` and moves it to ``<queue>-poison`` after ``maxDequeueCount`` tries. Each
message is an invocation of its own (``batchSize`` 1): one event's failure is never another's, and
the work of each is bounded (``RUNPLANE_EVENT_CALLS``, the stack's ``event_calls``).
"""

import logging
from types import SimpleNamespace

import azure.functions as func

from runplane import bootstrap
from runplane.handlers import PoolDispatcher

bp = func.Blueprint()  # type: ignore[no-untyped-call]
log = logging.getLogger("runplane.dispatcher")


@bp.function_name("dispatcher_events")
@bp.queue_trigger(arg_name="msg", queue_name="%RunplaneEventsQueue%", connection="RunplaneStorage")
def dispatcher_events(msg: func.QueueMessage) -> None:
    decision = PoolDispatcher(bootstrap.stack().ports).record_handler()(SimpleNamespace(body=msg.get_body().decode()))
    if decision is not None:
        log.info("dispatched %s: %s", msg.id, decision.reason)


@bp.function_name("dispatcher_schedule")
@bp.timer_trigger(arg_name="timer", schedule="%RunplaneSchedule%")
def dispatcher_schedule(timer: func.TimerRequest) -> None:
    # pools first, then waiting runs and sweeps within a budget of calls, from where the last pass stopped
    log.debug("scheduled dispatch: %s", PoolDispatcher(bootstrap.stack().ports).schedule())
