"""The Azure Functions app (Python v2 programming model): the HTTP API, the dispatcher and the
reaper, one blueprint each, on one FunctionApp. The host indexes ``app`` in this file at the
app's root.

Settings are app settings: RUNPLANE_* (read by runplane.bootstrap.stack() on the first call, never
at import) and the bindings' RunplaneStorage, RunplaneEventsQueue and RunplaneSchedule.
"""

import azure.functions as func

from functions.azure import api, dispatcher, reaper


def make_app() -> func.FunctionApp:
    """A FunctionApp with the three blueprints. Each app can be indexed (``get_functions``) once,
    as the host does; the local host and the tests index fresh ones."""
    app = func.FunctionApp(http_auth_level=func.AuthLevel.ANONYMOUS)
    for blueprint in (api.bp, dispatcher.bp, reaper.bp):
        app.register_functions(blueprint)
    return app


app = make_app()
