"""The Azure Functions app (Python v2 programming model): the HTTP API, the dispatcher, the
reaper and the sessions relay's event handler (Web PubSub's), one blueprint each, on one
FunctionApp. The host indexes ``app`` in this file at the app's root.

Settings are app settings: RUNPLANE_* (read by runplane.bootstrap.stack() on the first call, never
at import) and the bindings' RunplaneStorage, RunplaneEventsQueue and RunplaneSchedule.
"""

import azure.functions as func

from functions.azure import api, dispatcher, reaper, relay


def make_app() -> func.FunctionApp:
    """A FunctionApp with the four blueprints. Each app can be indexed (``get_functions``) once,
    as the host does; the local host and the tests index fresh ones."""
    app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)
    for blueprint in (relay.bp, api.bp, dispatcher.bp, reaper.bp):
        app.register_functions(blueprint)
    return app


app = make_app()
