"""runplane's Python SDK: submit runs, wait for them, follow their logs, download their outputs.

    from runplane.client import Client

    with Client() as client:
        run = client.submit("echo hello", memory="512m").wait()
        print(run.state, run.logs())

``Client`` blocks; ``AsyncClient`` is the same for asyncio. Both parse answers into the API's own
wire models (``RunView``, ``LogPage``, ...) and raise an ``ApiError`` subclass for every answer
that is not a success. See docs/sdk.md. This package imports nothing but pydantic, httpx and the
standard library (and runplane's wire models), so it is quick to import anywhere; the asyncio
half (``AsyncClient``, ``AsyncRun``, ``AsyncSweep``, and asyncio itself) loads when first named.
"""

from typing import TYPE_CHECKING, Any

from runplane.api.checkpoint_models import CheckpointFileView, CheckpointPage
from runplane.api.models import (
    ErrorBody,
    LogPage,
    OutputFile,
    OutputPage,
    PoolRetention,
    PoolSessions,
    PoolView,
    RetentionView,
    RunCheckpoint,
    RunFailure,
    RunPage,
    RunView,
    SweepRetried,
    SweepView,
    UploadView,
    WorkerView,
)
from runplane.api.session_models import RelayView, SessionAccess, SessionList, SessionView
from runplane.api.tenancy_models import (
    Me,
    QuotaUsage,
    QuotaView,
    SecretList,
    SecretView,
    Token,
    TokenCreated,
    UsageReport,
    UsageRow,
    UserView,
)
from runplane.client._core import RawResponse, RetryPolicy
from runplane.client._forward import PortForward
from runplane.client._options import RunOptions
from runplane.client._pack import PackError
from runplane.client._sync import Client
from runplane.client._sync_run import Run, Sweep
from runplane.client._uploads import Upload
from runplane.client.config import Profile, config_path, list_profiles, load_profile, save_profile
from runplane.client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    ConnectionFailed,
    DownloadFailed,
    Forbidden,
    InvalidRequest,
    LastAdminToken,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
    RateLimited,
    ServerError,
    Unauthorized,
    UploadFailed,
    WaitTimeout,
)
from runplane.client.sessions import ExecResult, NotJoined, SessionLost
from runplane.domain.asks import Resources, RetryRule
from runplane.domain.checkpoints import CheckpointRule
from runplane.domain.runs import RunSpec
from runplane.domain.states import RunState

if TYPE_CHECKING:
    from runplane.client._async import AsyncClient
    from runplane.client._async_run import AsyncRun, AsyncSweep

__all__ = [
    "ApiError",
    "AsyncClient",
    "AsyncRun",
    "AsyncSweep",
    "BadRequest",
    "CheckpointFileView",
    "CheckpointPage",
    "CheckpointRule",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "DownloadFailed",
    "ErrorBody",
    "ExecResult",
    "Forbidden",
    "InvalidRequest",
    "LastAdminToken",
    "LogPage",
    "Me",
    "NotFound",
    "NotJoined",
    "OutputFile",
    "OutputPage",
    "PackError",
    "PayloadTooLarge",
    "PoolRetention",
    "PoolSessions",
    "PoolView",
    "PortForward",
    "Profile",
    "QuotaExceeded",
    "QuotaUsage",
    "QuotaView",
    "RateLimited",
    "RawResponse",
    "RelayView",
    "Resources",
    "RetentionView",
    "RetryPolicy",
    "RetryRule",
    "Run",
    "RunCheckpoint",
    "RunFailure",
    "RunOptions",
    "RunPage",
    "RunSpec",
    "RunState",
    "RunView",
    "SecretList",
    "SecretView",
    "ServerError",
    "SessionAccess",
    "SessionList",
    "SessionLost",
    "SessionView",
    "Sweep",
    "SweepRetried",
    "SweepView",
    "Token",
    "TokenCreated",
    "Unauthorized",
    "Upload",
    "UploadFailed",
    "UploadView",
    "UsageReport",
    "UsageRow",
    "UserView",
    "WaitTimeout",
    "WorkerView",
    "config_path",
    "list_profiles",
    "load_profile",
    "save_profile",
]


def __getattr__(name: str) -> Any:
    """``AsyncClient``, ``AsyncRun`` and ``AsyncSweep``, imported when first asked for: a blocking
    client (the CLI) never loads asyncio."""
    if name == "AsyncClient":
        from runplane.client._async import AsyncClient

        return AsyncClient
    if name in ("AsyncRun", "AsyncSweep"):
        from runplane.client import _async_run

        return getattr(_async_run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
