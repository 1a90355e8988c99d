"""A run's secrets as its worker reads them: after the claim, from the secrets store, opened with
the key only the workers may use (``SecretOpener``). Values go to the run's container and to the
log masker, never to the run record, an event, the queue or a log line of the agent's."""

from __future__ import annotations

import logging

from runplane.domain.errors import BackendError, RunplaneError
from runplane.domain.runs import Run
from runplane.domain.secrets import RegistryCredentials, SecretRef, SecretUnavailable, context
from runplane.domain.states import FailureReason, RunState
from runplane.ports import SecretOpener, SecretStore
from worker_agent.outcome import Outcome

log = logging.getLogger(__name__)


class SecretsUnreachable(Exception):
    """The secrets store or the key failed in a way that may pass (throttled, briefly down: a
    BackendError): the run's attempt is handed back to its queue, not ended. The message names
    the secret and what failed, never the store's own words (those are in the agent's log)."""


class RunSecrets:
    """Opens the secrets runs name. ``store`` and ``opener`` None: a stack without secrets, where a
    run naming one ends ``secret_unavailable``."""

    def __init__(self, store: SecretStore | None, opener: SecretOpener | None) -> None:
        self.store = store
        self.opener = opener

    def value(self, run: Run, ref_text: str) -> str:
        """The value of the secret ``ref_text`` names for ``run``: its owner's, or a group's the
        owner was in when the run was released. Raises SecretUnavailable with the reason (a missing
        secret and one the run may not use read alike, as at submit)."""
        try:
            ref = SecretRef.parse(ref_text)
        except ValueError as e:
            raise SecretUnavailable(str(e)) from None
        if ref.group is not None and ref.group not in run.owner_groups:
            raise SecretUnavailable(f"secret {ref} does not exist (or {run.owner} may not use it)")
        return self.opened(ref.scope(run.owner), ref.name, f"{ref} does not exist (or {run.owner} may not use it)")

    def opened(self, scope: str, name: str, missing: str) -> str:
        """The value of secret ``name`` of ``scope`` (a pool's registry login names a group's
        directly); ``missing`` says what a missing one is. Raises SecretUnavailable, or
        SecretsUnreachable when the store or the key failed in a way that may pass."""
        if self.store is None or self.opener is None:
            raise SecretUnavailable(f"secret {name}: this worker was started without the secrets store")
        try:
            record = self.store.get(scope, name)
        except BackendError as e:  # the store's own words stay in the agent's log
            log.warning("secret %s of %s: the secrets store could not be read, for now: %s", name, scope, e)
            raise SecretsUnreachable(f"secret {name}: the secrets store could not be read") from None
        except RunplaneError as e:
            log.warning("secret %s of %s: the secrets store could not be read: %s", name, scope, e)
            raise SecretUnavailable(f"secret {name}: the secrets store could not be read") from None
        if record is None:
            raise SecretUnavailable(f"secret {missing}")
        try:
            data = self.opener.open(record.sealed, context(scope, name))
        except SecretUnavailable as e:
            raise SecretUnavailable(f"secret {name} cannot be opened: {e}") from None
        except BackendError as e:
            log.warning("secret %s of %s: the key could not be reached, for now: %s", name, scope, e)
            raise SecretsUnreachable(f"secret {name} cannot be opened: the key could not be reached") from None
        except RunplaneError as e:
            log.warning("secret %s of %s: the key could not be reached: %s", name, scope, e)
            raise SecretUnavailable(f"secret {name} cannot be opened: the key could not be reached") from None
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise SecretUnavailable(f"secret {name} is not UTF-8 text") from None

    def environment(self, run: Run) -> dict[str, str]:
        """The variables of ``run.spec.secrets`` with their values."""
        return {env: self.value(run, ref) for env, ref in run.spec.secrets.items()}

    def for_container(self, run: Run) -> tuple[dict[str, str], Outcome | None]:
        """The variables of ``run.spec.secrets`` with their values, read now (by the worker that
        has just claimed the run: each attempt reads them afresh); or, when one cannot be given
        to the run, the Outcome that ends it ``secret_unavailable``, which names the secret and
        why, never a value. Raises SecretsUnreachable (the attempt is to be handed back)."""
        if not run.spec.secrets:
            return {}, None
        try:
            return self.environment(run), None
        except SecretUnavailable as e:
            return {}, Outcome(RunState.FAILED, FailureReason.SECRET_UNAVAILABLE, str(e))

    def registry_login(self, run: Run, ref_text: str, server: str | None) -> RegistryCredentials:
        """The registry credentials a run's ``image_pull_secret`` holds."""
        try:
            return RegistryCredentials.parse(self.value(run, ref_text), server)
        except ValueError as e:
            raise SecretUnavailable(f"secret {ref_text} {e}") from None
