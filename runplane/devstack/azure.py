"""The local stack on Azure terms: Azurite for Table/Queue/Blob, and the function app of
functions/azure hosted as the Azure Functions host would (``FunctionsHost``): ``func.HttpRequest``s
to the HTTP function, the events queue to the dispatcher's queue trigger, timers on the schedule."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from functions.azure import function_app
from runplane import bootstrap
from runplane.adapters.azure.provision import provision
from runplane.adapters.azure.queues import events_queue_name
from runplane.adapters.azure.relay import EVENTS_PATH
from runplane.adapters.local.keyfile import KEY_FILE, KeyFileSealer
from runplane.bootstrap import Stack
from runplane.devstack import azurite
from runplane.devstack.cloud import Cloud, FrontRequest, FrontResponse
from runplane.devstack.functions_host import FunctionsHost, HostOptions
from runplane.devstack.webpubsub import WebPubSubFake
from runplane.settings import StackSettings

HOST_JSON = Path(function_app.__file__).with_name("host.json")


def start_azurite(timeout: float = 600) -> str:
    """Azurite on 127.0.0.1 (``runplane.devstack.azurite``: reused when its ports answer, else
    installed with npm if missing and started); returns its connection string. Raises ValueError
    with one line when npm is missing, with the reason and Azurite's log when it does not start."""
    try:
        return azurite.start_azurite(install_timeout=timeout)
    except azurite.NpmMissing:
        raise ValueError(
            "runplane dev --cloud azure needs Azurite: install Node.js and npm (apt-get install -y nodejs npm), "
            "or pass --azure-connection STRING"
        ) from None
    except azurite.AzuriteError as e:
        raise ValueError(f"Azurite did not start: {e}") from e


def ncrontab_every(seconds: float) -> str:
    """An NCRONTAB schedule (six fields, seconds first) firing about every ``seconds``."""
    whole = max(1, round(seconds))
    if whole < 60:
        return f"*/{whole} * * * * *"
    return f"0 */{max(1, min(59, whole // 60))} * * * *"


class AzureCloud(Cloud):
    services = "azurite"

    def __init__(self, connection_string: str | None, prefix: str, schedule_seconds: float, stack_dir: Path) -> None:
        self.connection_string = connection_string or ""
        self.prefix = prefix
        self.schedule_seconds = schedule_seconds
        self.key_file = stack_dir / KEY_FILE
        """Secrets are sealed under a key file in the stack's directory: there is no Key Vault here."""
        self._host: FunctionsHost | None = None
        self._app_settings: dict[str, str] = {}
        self.pubsub: WebPubSubFake | None = None
        """The sessions' relay: Web PubSub's stand-in, its hub's events sent to the front's /relay/events."""

    def start(self) -> dict[str, str]:
        if not self.connection_string:
            self.connection_string = start_azurite()
        self.endpoint = self.connection_string
        self.pubsub = WebPubSubFake().start()
        # the bindings' app settings (function_app.py), as the deployment sets them
        self._app_settings = {
            "RunplaneStorage": self.connection_string,
            "RunplaneEventsQueue": events_queue_name(self.prefix),
            "RunplaneSchedule": ncrontab_every(self.schedule_seconds),
            "FUNCTIONS_WORKER_RUNTIME": "python",
        }
        return dict(self._app_settings)

    def settings(self) -> dict[str, str]:
        return {
            "azure_storage_connection_string": self.connection_string,
            "secrets_key": f"file:{self.key_file}",
            "webpubsub_connection_string": self.pubsub.connection_string if self.pubsub is not None else "",
        }

    def build(self, settings: StackSettings) -> Stack:
        return bootstrap.build_stack(settings)

    def provision(self, stack: Stack) -> None:
        settings = stack.settings
        provision(
            bootstrap.azure_names(settings), [p.name for p in stack.pools.pools], bootstrap.azure_clients(settings)
        )
        if isinstance(stack.sealer, KeyFileSealer):
            stack.sealer.ready()  # made before any agent starts: agents open with it, never make it
        if self.pubsub is not None:  # the hub's event handler, as the hub's settings name it
            self.pubsub.handle(settings.webpubsub_hub, f"{self.public_url.rstrip('/')}{EVENTS_PATH}")
        # the host reads the app settings from the environment it is given, as the platform's does
        host_env = {**os.environ, **self._app_settings}
        self._host = FunctionsHost(function_app.make_app(), HostOptions.from_host_json(HOST_JSON), host_env)

    @property
    def host(self) -> FunctionsHost:
        if self._host is None:
            raise RuntimeError("the stack is not provisioned yet")
        return self._host

    def http(self, request: FrontRequest) -> FrontResponse:
        headers = {**request.headers, "X-Forwarded-For": request.client_ip}  # as Azure's front end adds
        url = f"http://{request.host}{request.path}" + (f"?{request.query}" if request.query else "")
        response = self.host.http(request.method, url, request.path, request.query, headers, request.body)
        out = {key.lower(): value for key, value in response.headers.items()}
        if "content-type" not in out and response.get_body():
            charset = f"; charset={response.charset}" if response.mimetype.startswith("text/") else ""
            out["content-type"] = response.mimetype + charset
        return FrontResponse(response.status_code, out, response.get_body())

    def poll_events(self, stop: threading.Event) -> None:
        self.host.poll_queues(stop.wait)

    def fire_schedule(self) -> None:
        self.host.fire_timers()

    def stop(self) -> None:
        """Azurite is left running: other stacks may share it, and its data lives in memory."""
        if self.pubsub is not None:
            self.pubsub.stop()
            self.pubsub = None
