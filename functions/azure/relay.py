"""The Web PubSub hub's event handler: the service's ``connect``, ``connected`` and
``disconnected`` events for sessions' relay (runplane/adapters/azure/relay.py), at ``/relay/events``
(outside the API's ``/v1``: the service, not a user, calls it; its requests are signed)."""

import azure.functions as func

from runplane import bootstrap
from runplane.adapters.azure.relay import WebPubSubSessionRelay
from runplane.ports import SessionRelay

bp = func.Blueprint()  # type: ignore[no-untyped-call]


@bp.function_name("relay_events")
@bp.route(route="relay/events", methods=["POST", "OPTIONS"], auth_level=func.AuthLevel.ANONYMOUS)
def relay_events(req: func.HttpRequest) -> func.HttpResponse:
    return answer(req, bootstrap.stack().relay)


def answer(req: func.HttpRequest, relay: SessionRelay | None) -> func.HttpResponse:
    """``relay``'s answer to the event ``req``; 404 where the stack's relay is not Web PubSub."""
    if not isinstance(relay, WebPubSubSessionRelay):
        return func.HttpResponse(status_code=404)
    reply = relay.handle_event(req.method, dict(req.headers.items()), req.get_body())
    return func.HttpResponse(reply.body, status_code=reply.status, headers=reply.headers)
