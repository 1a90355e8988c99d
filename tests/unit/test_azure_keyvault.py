"""The Key Vault sealer and opener (runplane/adapters/azure/keyvault.py) against the stateful fake of
the Key Vault keys data plane (tests/fakes/key_vault.py) as their azure-core transport: no Key
Vault emulator exists. The fake wraps and unwraps with real RSA keys and grants each identity's
token only the data actions its roles hold: the API's may wrap, the workers' may unwrap."""

from __future__ import annotations

import base64

import pytest

from runplane.adapters.azure.keyvault import API_VERSION, KeyUrl, KeyVaultKey, key_vault_keys
from runplane.domain.errors import BackendError, Misconfigured
from runplane.domain.secrets import SecretUnavailable, context
from tests.fakes.key_vault import UNWRAP, WRAP, FakeKeyVault, FakeKeyVaultTransport, Identity

CTX = context("user:alice", "wandb")


@pytest.fixture
def vault() -> FakeKeyVault:
    vault = FakeKeyVault()
    vault.create_key("secrets")
    vault.grant("api", WRAP)  # what the template's roles give the Function App's identity
    vault.grant("nodes", UNWRAP)  # and the Batch nodes'
    return vault


def keys(vault: FakeKeyVault, identity: str, url: str | None = None):
    return key_vault_keys(url or f"{vault.url}/keys/secrets", Identity(identity), FakeKeyVaultTransport(vault))


def test_the_api_seals_and_only_the_workers_open(vault):
    api_sealer, api_opener = keys(vault, "api")
    nodes_sealer, nodes_opener = keys(vault, "nodes")
    sealed = api_sealer.seal(b"s3cr3t-value", CTX)
    assert sealed.key_id == f"{vault.url}/keys/secrets/{vault.current['secrets']}"
    assert b"s3cr3t-value" not in base64.b64decode(sealed.ciphertext)
    assert nodes_opener.open(sealed, CTX) == b"s3cr3t-value"
    # the wire: RSA-OAEP-256, api-version, a token for the vault's audience
    wrap = next(r for r in vault.requests if r.path.endswith("/wrapkey"))
    assert wrap.body["alg"] == "RSA-OAEP-256" and wrap.query["api-version"] == API_VERSION
    assert wrap.token == "https://vault.azure.net|api"

    with pytest.raises(SecretUnavailable, match=r"403 Forbidden \(ForbiddenByRbac\).*unwrap/action"):
        api_opener.open(sealed, CTX)
    with pytest.raises(Misconfigured, match=r"refused to wrap.*403 Forbidden \(ForbiddenByRbac\).*wrap/action"):
        nodes_sealer.seal(b"x", CTX)


def test_a_value_opens_only_for_its_own_scope_and_name(vault):
    sealer, _ = keys(vault, "api")
    _, opener = keys(vault, "nodes")
    sealed = sealer.seal(b"value", CTX)
    for other in (context("user:bob", "wandb"), context("user:alice", "other")):
        with pytest.raises(SecretUnavailable, match="not sealed for this secret"):
            opener.open(sealed, other)
    tampered = sealed.model_copy(update={"wrapped_key": base64.b64encode(b"\x00" * 256).decode()})
    with pytest.raises(SecretUnavailable, match="400 BadParameter"):
        opener.open(tampered, CTX)


def test_values_sealed_before_a_new_key_version_still_open(vault):
    sealer, _ = keys(vault, "api")
    _, opener = keys(vault, "nodes")
    before = sealer.seal(b"old", CTX)
    vault.create_key("secrets")  # rotated: the versionless URL now wraps with the new version
    after = sealer.seal(b"new", CTX)
    assert before.key_id != after.key_id and after.key_id.endswith(vault.current["secrets"])
    assert (opener.open(before, CTX), opener.open(after, CTX)) == (b"old", b"new")


def test_the_opener_sends_no_token_for_a_key_it_was_not_given(vault):
    sealer, _ = keys(vault, "api")
    _, opener = keys(vault, "nodes")
    sealed = sealer.seal(b"value", CTX)
    sent = len(vault.requests)
    elsewhere = [
        sealed.key_id.replace(vault.url, "https://attacker.vault.azure.net"),
        sealed.key_id.replace("/keys/secrets/", "/keys/other/"),
        "file:0123456789abcdef",
    ]
    for key_id in elsewhere:
        with pytest.raises(SecretUnavailable, match="sealed under another key"):
            opener.open(sealed.model_copy(update={"key_id": key_id}), CTX)
    assert len(vault.requests) == sent


def test_a_missing_key_or_an_identity_the_vault_does_not_know_is_a_clear_misconfiguration(vault):
    sealer, _ = keys(vault, "api", f"{vault.url}/keys/nosuchkey")
    with pytest.raises(Misconfigured, match=r"keys/nosuchkey refused to wrap.*404 KeyNotFound"):
        sealer.seal(b"x", CTX)
    stranger, _ = keys(vault, "stranger")
    with pytest.raises(Misconfigured, match=r"401 Unauthorized.*managed identity"):
        stranger.seal(b"x", CTX)


def test_key_urls():
    key = KeyUrl.parse("https://MyVault.vault.azure.net/keys/runplane-secrets")
    assert (key.vault, key.name, key.version) == ("https://myvault.vault.azure.net", "runplane-secrets", "")
    assert key.scope == "https://vault.azure.net/.default"
    assert KeyUrl.parse("https://v.vault.azure.cn/keys/k/0123abcd").scope == "https://vault.azure.cn/.default"
    assert (
        str(KeyUrl.parse("https://v.vault.azure.net/keys/k/0123abcd/")) == "https://v.vault.azure.net/keys/k/0123abcd"
    )
    for bad in (
        "http://v.vault.azure.net/keys/k",
        "https://v.vault.azure.net/secrets/k",
        "https://v.vault.azure.net/keys/",
        "https://v.vault.azure.net/keys/k/v/x",
        "https://v.vault.azure.net/keys/k?x=1",
        "https://user@v.vault.azure.net/keys/k",
        "file:/tmp/key",
    ):
        with pytest.raises(ValueError, match="not a Key Vault key URL"):
            KeyUrl.parse(bad)
    with pytest.raises(Misconfigured, match="RUNPLANE_SECRETS_KEY"):
        key_vault_keys("https://v.vault.azure.net/nokeys")


def test_the_fake_vault_refuses_what_key_vault_refuses(vault):
    """The fake is strict where the service is: api-version, a token, the vault's audience."""
    transport = FakeKeyVaultTransport(vault)
    url = f"{vault.url}/keys/secrets/wrapkey"
    status, headers, body = vault.handle("POST", url, {"Authorization": "Bearer https://vault.azure.net|api"}, b"{}")
    assert (status, b"'api-version' query parameter is missing" in body) == (400, True)
    status, headers, body = vault.handle("POST", f"{url}?api-version=7.4", {}, b"{}")
    assert status == 401 and "WWW-Authenticate" in headers
    status, _, body = vault.handle(
        "POST", f"{url}?api-version=7.4", {"Authorization": "Bearer https://storage.azure.com|api"}, b"{}"
    )
    assert status == 401 and b"Invalid audience" in body
    # a key whose operations leave out unwrapKey unwraps for no one
    vault.create_key("wrap-only", key_ops=("wrapKey",))
    sealer, _ = key_vault_keys(f"{vault.url}/keys/wrap-only", Identity("api"), transport)
    _, opener = key_vault_keys(f"{vault.url}/keys/wrap-only", Identity("nodes"), transport)
    with pytest.raises(SecretUnavailable, match="KeyOperationForbidden"):
        opener.open(sealer.seal(b"v", CTX), CTX)
    assert isinstance(KeyVaultKey(f"{vault.url}/keys/secrets", transport=transport).url, KeyUrl)


def test_an_azure_stack_seals_with_the_key_its_settings_name(tmp_path):
    """A Key Vault key URL (a deployment), ``file:PATH`` (the azure dev stack: a key file), or
    none (secrets switched off: the API answers 503)."""
    from runplane.adapters.azure.keyvault import KeyVaultOpener, KeyVaultSealer
    from runplane.adapters.azure.secrets import TableSecretStore
    from runplane.adapters.local.keyfile import KeyFileOpener, KeyFileSealer
    from runplane.bootstrap import build_stack
    from runplane.settings import StackSettings

    def built(secrets_key: str):
        # the clients of a connection string are made without reaching the account
        connection = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;"
        return build_stack(
            StackSettings(cloud="azure", azure_storage_connection_string=connection, secrets_key=secrets_key)
        )

    vault = built("https://runplanetest.vault.azure.net/keys/secrets")
    assert isinstance(vault.secrets, TableSecretStore) and vault.secrets.table.table_name == "runplanesecrets"
    assert isinstance(vault.sealer, KeyVaultSealer) and isinstance(vault.opener, KeyVaultOpener)
    assert vault.sealer.key is vault.opener.key  # one client, made at the first call (no credential yet)

    key_file = tmp_path / "stack" / "secrets.key"
    local = built(f"file:{key_file}")
    assert isinstance(local.sealer, KeyFileSealer) and isinstance(local.opener, KeyFileOpener)
    sealed = local.sealer.seal(b"value", CTX)
    assert local.opener.open(sealed, CTX) == b"value" and key_file.stat().st_mode & 0o777 == 0o600

    none = built("")
    assert none.secrets is not None and none.sealer is None and none.opener is None
    with pytest.raises(Misconfigured, match="not a Key Vault key URL"):
        built("https://runplanetest.vault.azure.net/secrets/nope")


def test_throttling_is_waited_out_and_an_outage_is_a_retryable_error(vault):
    transport = FakeKeyVaultTransport(vault)
    url = f"{vault.url}/keys/secrets"
    sealer, _ = key_vault_keys(url, Identity("api"), transport)
    _, opener = key_vault_keys(url, Identity("nodes"), transport)
    vault.throttle(times=2, retry_after=3)
    sealed = sealer.seal(b"value", CTX)  # retried after the Retry-After Key Vault sent
    assert transport.slept == [3, 3]
    vault.outage(times=10)
    with pytest.raises(BackendError, match=r"could not wrap now.*503 ServiceUnavailable.*retry") as refused:
        sealer.seal(b"value", CTX)
    assert refused.value.retryable
    vault.faults.clear()
    vault.outage(times=10)
    with pytest.raises(SecretUnavailable, match="503 ServiceUnavailable"):
        opener.open(sealed, CTX)
    vault.faults.clear()
    assert opener.open(sealed, CTX) == b"value"
