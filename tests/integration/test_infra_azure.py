"""infra/azure/azuredeploy.json agrees with the code it deploys.

No Azure tool runs offline here, so the template is checked statically: it is valid JSON whose
parameters are all used and whose references all resolve, and its names, evaluated with a small
interpreter of the ARM expressions it uses, are those ``provision()`` creates on Azurite; its app
settings are those StackSettings and the function app's bindings read; its Batch pool is
infra/azure/batch's; its Blob lifecycle rule deletes the uploads the retention sweep would. The
staged Functions package (``make azure-package``) is indexed as the host would index it.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from functions.azure import function_app
from runplane.adapters.azure.provision import AzureNames
from runplane.adapters.azure.queues import events_queue_name, poison_queue_name, pool_queue_name
from runplane.adapters.azure.relay import EVENTS_PATH
from runplane.domain.retention import Retention
from runplane.domain.uploads import UPLOADS_PREFIX
from runplane.settings import StackSettings
from tests.fakes.key_vault import UNWRAP, WRAP

ROOT = Path(__file__).resolve().parents[2]
AZURE = ROOT / "infra" / "azure"
TEMPLATE = json.loads((AZURE / "azuredeploy.json").read_text())
POOLS = ["default", "gpu-a100"]


# ---- a small interpreter of ARM template expressions -------------------------------------------


class Arm:
    """Evaluates ``[...]`` expressions of a template for given parameters (and one copy index).

    Knows the functions this template uses; ``reference()`` yields an object whose properties
    read back as ``<reference:...>`` placeholders, and ``uniqueString`` a stable 13-character hash.
    """

    TOKEN = re.compile(r"(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+)|(?P<name>[A-Za-z_]\w*)|(?P<punct>[(),.\[\]])")

    def __init__(self, template: dict[str, Any], parameters: dict[str, Any]) -> None:
        self.template = template
        self.parameters = parameters
        self.index: int | None = None

    def value(self, raw: Any, index: int | None = None) -> Any:
        """``raw`` with every expression in it evaluated (strings, lists and objects alike)."""
        self.index = index
        return self._deep(raw)

    def _deep(self, raw: Any) -> Any:
        if isinstance(raw, dict):
            return {self._deep(k): self._deep(v) for k, v in raw.items()}
        if isinstance(raw, list):
            return [self._deep(v) for v in raw]
        if isinstance(raw, str) and raw.startswith("[") and not raw.startswith("[["):
            return self.expression(raw[1:-1])
        return raw

    def expression(self, text: str) -> Any:
        saved = getattr(self, "tokens", []), getattr(self, "at", 0)  # variables() evaluates while parsing
        self.tokens, self.at = [], 0
        at = 0
        while at < len(text):
            if text[at].isspace():
                at += 1
                continue
            token = self.TOKEN.match(text, at)
            assert token is not None, f"cannot read {text[at:]!r}"
            self.tokens.append(token)
            at = token.end()
        result = self._expr()
        assert self.at == len(self.tokens), f"trailing tokens in {text!r}"
        self.tokens, self.at = saved
        return result

    def _peek(self) -> str | None:
        return self.tokens[self.at].group() if self.at < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> re.Match[str]:
        token = self.tokens[self.at]
        if expected is not None:
            assert token.group() == expected, f"expected {expected!r}, got {token.group()!r}"
        self.at += 1
        return token

    def _expr(self) -> Any:
        token = self._take()
        if token.group("str") is not None:
            value: Any = token.group("str")[1:-1].replace("''", "'")
        elif token.group("num") is not None:
            value = int(token.group("num"))
        else:
            name = token.group("name")
            assert name is not None, f"unexpected {token.group()!r}"
            self._take("(")
            args = []
            while self._peek() != ")":
                args.append(self._expr())
                if self._peek() == ",":
                    self._take(",")
            self._take(")")
            value = self.call(name, args)
        while self._peek() in (".", "["):
            if self._take().group() == ".":
                value = value[self._take().group("name")]
            else:
                key = self._expr()
                self._take("]")
                value = value[key]
        return value

    def call(self, name: str, args: list[Any]) -> Any:
        name = name.lower()
        if name == "parameters":
            spec = self.template["parameters"][args[0]]
            return self._deep(self.parameters.get(args[0], spec.get("defaultValue")))
        if name == "variables":
            return self._deep(self.template["variables"][args[0]])
        if name == "copyindex":
            assert self.index is not None, "copyIndex() outside a copy loop"
            return self.index + (args[-1] if args and isinstance(args[-1], int) else 0)
        if name == "reference":
            return _Placeholder(f"reference:{args[0]}")
        if name == "listkeys":
            return _Placeholder(f"listKeys:{args[0]}")
        simple = {
            "concat": lambda *a: "".join(a) if all(isinstance(x, str) for x in a) else [x for part in a for x in part],
            "format": lambda f, *a: re.sub(r"\{(\d+)\}", lambda m: str(a[int(m.group(1))]), f),
            "tolower": str.lower,
            "replace": lambda s, old, new: s.replace(old, new),
            "take": lambda s, n: s[:n],
            "length": len,
            "empty": lambda v: len(v) == 0,
            "if": lambda c, a, b: a if c else b,
            "greater": lambda a, b: a > b,
            "union": lambda *a: {k: v for part in a for k, v in part.items()},
            "string": lambda v: v if isinstance(v, str) else json.dumps(v, separators=(",", ":")),
            "createarray": lambda *a: list(a),
            "createobject": lambda *a: dict(zip(a[::2], a[1::2], strict=True)),
            "uniquestring": lambda *a: hashlib.sha256("|".join(a).encode()).hexdigest()[:13],
            "guid": lambda *a: hashlib.sha256("|".join(map(str, a)).encode()).hexdigest()[:32],
            "resourcegroup": lambda: {"id": "/subscriptions/s/resourceGroups/rg", "location": "westeurope"},
            "subscription": lambda: {"id": "/subscriptions/s", "subscriptionId": "s", "tenantId": "t"},
            "resourceid": lambda kind, *names: f"id:{kind}/{'/'.join(names)}",
            "subscriptionresourceid": lambda kind, *names: f"subid:{kind}/{'/'.join(names)}",
        }
        return simple[name](*args)


class _Placeholder(dict):  # type: ignore[type-arg]
    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def __missing__(self, key: str) -> Any:
        return _Placeholder(f"{self.path}.{key}")

    def __str__(self) -> str:
        return f"<{self.path}>"


# ---- the template as resources -------------------------------------------------------------------


def expressions(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [e for k, v in node.items() for e in expressions(k) + expressions(v)]
    if isinstance(node, list):
        return [e for v in node for e in expressions(v)]
    if isinstance(node, str) and node.startswith("[") and not node.startswith("[["):
        return [node]
    return []


def instances(arm: Arm, kind: str) -> list[dict[str, Any]]:
    """Every resource of ``kind``, evaluated (one per copy index)."""
    out = []
    for resource in TEMPLATE["resources"]:
        if resource["type"] != kind:
            continue
        count = arm.value(resource["copy"]["count"]) if "copy" in resource else None
        for index in range(count) if count is not None else [None]:
            out.append(arm.value({k: v for k, v in resource.items() if k != "copy"}, index))
    return out


def leaf_names(arm: Arm, kind: str) -> set[str]:
    return {r["name"].rsplit("/", 1)[-1] for r in instances(arm, kind)}


@pytest.fixture
def arm():
    return Arm(TEMPLATE, {"prefix": "runplane", "poolNames": POOLS})


def site(arm):
    (app,) = instances(arm, "Microsoft.Web/sites")
    return app


TABLE_CONTRIBUTOR = "0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3"
QUEUE_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
BLOB_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
QUEUE_SENDER = "c6a89b2d-59bc-44d0-9896-0f6e12d7b80a"
TABLE_READER = "76199698-9eea-4c19-bc75-cec21354c6b6"
# Storage Queue Data Contributor's data actions (Azure's built-in role definition).
QUEUE_MESSAGE_ACTIONS = {
    "Microsoft.Storage/storageAccounts/queueServices/queues/messages/delete",
    "Microsoft.Storage/storageAccounts/queueServices/queues/messages/read",
    "Microsoft.Storage/storageAccounts/queueServices/queues/messages/write",
    "Microsoft.Storage/storageAccounts/queueServices/queues/messages/process/action",
    "Microsoft.Storage/storageAccounts/queueServices/queues/messages/add/action",
}


def role_assignments(arm) -> set[tuple[str, str, str]]:
    """(principal, role definition id, scope) of every role assignment."""
    return {
        (r["properties"]["principalId"].path, r["properties"]["roleDefinitionId"].rsplit("/", 1)[-1], r["scope"])
        for r in instances(arm, "Microsoft.Authorization/roleAssignments")
    }


def app_principal(arm) -> str:
    return f"reference:id:Microsoft.Web/sites/{site(arm)['name']}.identity.principalId"


def nodes_principal(arm) -> str:
    identity = arm.value("[variables('nodesIdentityName')]")
    return f"reference:id:Microsoft.ManagedIdentity/userAssignedIdentities/{identity}.principalId"


def defined(arm, scope: str) -> bool:
    """Whether the template defines the resource a scope ``NS/type/name[/type/name...]`` names."""
    namespace, *parts = scope.split("/")
    kind = "/".join([namespace, *parts[0::2]])
    name = "/".join(parts[1::2])
    return any(r["name"] == name for r in instances(arm, kind))


# ---- the tests -----------------------------------------------------------------------------------


def test_is_an_arm_deployment_template():
    assert TEMPLATE["$schema"].endswith("/deploymentTemplate.json#")
    assert set(TEMPLATE) <= {"$schema", "contentVersion", "metadata", "parameters", "variables", "resources", "outputs"}
    assert TEMPLATE["parameters"]
    for name, spec in TEMPLATE["parameters"].items():
        assert spec["type"] in {"string", "int", "bool", "array", "object", "securestring"}, name
        assert spec.get("metadata", {}).get("description"), f"parameter {name} is not described"


def test_every_parameter_and_variable_is_used_and_every_reference_resolves():
    text = json.dumps(TEMPLATE)
    used_params = set(re.findall(r"parameters\('(\w+)'\)", text))
    used_vars = set(re.findall(r"variables\('(\w+)'\)", text))
    assert used_params == set(TEMPLATE["parameters"])
    assert used_vars == set(TEMPLATE["variables"])
    defined = {r["type"].lower() for r in TEMPLATE["resources"]}
    targets = re.findall(r"resourceId\('([\w./]+)'", text)
    assert targets, "the template references no resource?"
    for target in targets:
        assert target.lower() in defined, f"resourceId of {target}, which the template does not define"
    scopes = re.findall(r"format\('(Microsoft\.[\w.]+/[\w]+)/\{0\}'", text)
    assert scopes, "the template scopes no role assignment?"
    for scope in scopes:
        assert scope.lower() in defined, f"a role assignment scoped to {scope}, which the template does not define"


def test_every_expression_evaluates(arm):
    evaluated = 0
    for resource in TEMPLATE["resources"]:
        count = arm.value(resource["copy"]["count"]) if "copy" in resource else None
        for index in range(count) if count is not None else [None]:
            for expression in expressions(resource):
                arm.value(expression, index)  # asserts it can read every token, raises on what it does not know
                evaluated += 1
    assert evaluated > len(TEMPLATE["resources"])
    assert TEMPLATE["outputs"]
    for output in TEMPLATE["outputs"].values():
        assert arm.value(output["value"]) is not None


def test_dependencies_name_resources_of_the_template(arm):
    ids = set()
    for resource in TEMPLATE["resources"]:
        for item in instances(arm, resource["type"]):
            ids.add(f"id:{resource['type']}/{item['name']}")
    dependencies = [
        (item["name"], dependency)
        for resource in TEMPLATE["resources"]
        for item in instances(arm, resource["type"])
        for dependency in item.get("dependsOn", [])
    ]
    assert dependencies, "no resource depends on another?"
    assert [(name, dependency) for name, dependency in dependencies if dependency not in ids] == []


@pytest.mark.parametrize("prefix", ["runplane", "rp-dev1"])
def test_tables_queues_and_container_are_what_provision_creates(prefix):
    arm = Arm(TEMPLATE, {"prefix": prefix, "poolNames": POOLS})
    names = AzureNames(prefix)
    assert leaf_names(arm, "Microsoft.Storage/storageAccounts/tableServices/tables") == set(names.tables)
    assert leaf_names(arm, "Microsoft.Storage/storageAccounts/queueServices/queues") == set(names.queues(POOLS))
    containers = leaf_names(arm, "Microsoft.Storage/storageAccounts/blobServices/containers")
    assert names.container in containers


def test_app_settings_are_what_the_code_reads(arm):
    settings = {s["name"]: s["value"] for s in site(arm)["properties"]["siteConfig"]["appSettings"]}
    runplane = {name.removeprefix("RUNPLANE_").lower() for name in settings if name.startswith("RUNPLANE_")}
    assert runplane <= set(StackSettings.model_fields), runplane - set(StackSettings.model_fields)
    assert settings["RUNPLANE_CLOUD"] == "azure"
    assert settings["RUNPLANE_PREFIX"] == "runplane"
    assert settings["RUNPLANE_AZURE_STORAGE_ACCOUNT"] == settings["AzureWebJobsStorage__accountName"]
    assert "RUNPLANE_AZURE_STORAGE_CONNECTION_STRING" not in settings  # the managed identity, no key
    # every setting a binding names: %SETTING% expressions, and identity-based connections
    read, connections = [], []
    for function in function_app.make_app().get_functions():
        for binding in json.loads(function.get_function_json())["bindings"]:
            read += [
                (function.get_function_name(), n) for v in binding.values() for n in re.findall(r"%(\w+)%", str(v))
            ]
            connections += [binding["connection"]] if "connection" in binding else []
    assert read and connections
    assert [(reader, name) for reader, name in read if name not in settings] == []
    assert [c for c in connections if f"{c}__queueServiceUri" not in settings] == []
    assert settings["RunplaneEventsQueue"] == events_queue_name("runplane")


def test_the_function_app_is_linux_python_311_with_an_identity_that_may_use_storage(arm):
    app = site(arm)
    assert app["kind"] == "functionapp,linux"
    assert app["properties"]["functionAppConfig"]["runtime"] == {"name": "python", "version": "3.11"}
    assert app["identity"]["type"] == "SystemAssigned"
    (plan,) = instances(arm, "Microsoft.Web/serverfarms")
    assert plan["sku"] == {"tier": "FlexConsumption", "name": "FC1"} and plan["properties"]["reserved"] is True
    roles = role_assignments(arm)
    storage = "Microsoft.Storage/storageAccounts/" + arm.value("[variables('storageAccountName')]")
    app_identity = f"reference:id:Microsoft.Web/sites/{app['name']}.identity.principalId"
    assert {(app_identity, TABLE_CONTRIBUTOR, storage), (app_identity, QUEUE_CONTRIBUTOR, storage)} <= roles


@pytest.mark.parametrize("prefix", ["runplane", "rp-dev1"])
def test_batch_nodes_may_use_only_what_the_agent_uses(prefix):
    """The agent's identity: table data on the runs, workers, quotas and sessions tables, blob data on the data
    container, its pool queues' messages, sending to the poison and events queues; reading the
    secrets table and unwrapping with the secrets key. Never the account, the tokens or pools
    tables, or the Functions' package container."""
    arm = Arm(TEMPLATE, {"prefix": prefix, "poolNames": POOLS})
    names = AzureNames(prefix)
    account = "Microsoft.Storage/storageAccounts/" + arm.value("[variables('storageAccountName')]")
    queue_role = arm.value("[variables('workerQueueRole')]")
    vault, key = arm.value("[variables('keyVaultName')]"), arm.value("[variables('secretsKeyName')]")
    pool_queues = [pool_queue_name(prefix, pool) for pool in POOLS]
    expected = {
        (TABLE_CONTRIBUTOR, f"{account}/tableServices/default/tables/{names.runs_table}"),
        (TABLE_CONTRIBUTOR, f"{account}/tableServices/default/tables/{names.workers_table}"),
        (TABLE_CONTRIBUTOR, f"{account}/tableServices/default/tables/{names.quotas_table}"),
        (TABLE_CONTRIBUTOR, f"{account}/tableServices/default/tables/{names.sessions_table}"),
        (BLOB_CONTRIBUTOR, f"{account}/blobServices/default/containers/{names.container}"),
        (TABLE_READER, f"{account}/tableServices/default/tables/{names.secrets_table}"),
        (arm.value("[variables('secretsUnwrapRole')]"), f"Microsoft.KeyVault/vaults/{vault}/keys/{key}"),
        (QUEUE_SENDER, f"{account}/queueServices/default/queues/{events_queue_name(prefix)}"),
        *((queue_role, f"{account}/queueServices/default/queues/{q}") for q in pool_queues),
        *((QUEUE_SENDER, f"{account}/queueServices/default/queues/{poison_queue_name(q)}") for q in pool_queues),
    }
    nodes = {(role, scope) for principal, role, scope in role_assignments(arm) if principal == nodes_principal(arm)}
    assert nodes == expected
    for _, scope in nodes:
        assert defined(arm, scope), f"a role assignment scoped to {scope}, which the template does not define"
    scopes = " ".join(scope for _, scope in nodes)
    assert names.tokens_table not in scopes and names.pools_table not in scopes
    assert arm.value("[variables('deploymentContainer')]") not in scopes


def test_the_pool_queue_role_handles_messages_and_nothing_else(arm):
    """A custom role, because no built-in one both receives and updates messages without also
    managing the queue (Storage Queue Data Contributor may delete it)."""
    (role,) = [
        r
        for r in instances(arm, "Microsoft.Authorization/roleDefinitions")
        if r["name"] == arm.value("[variables('workerQueueRole')]")
    ]
    props = role["properties"]
    assert props["type"] == "customRole"
    assert props["assignableScopes"] == [arm.value("[resourceGroup().id]")]
    (permissions,) = props["permissions"]
    assert permissions["actions"] == [] and permissions["notActions"] == []
    assert set(permissions["dataActions"]) == QUEUE_MESSAGE_ACTIONS
    assigned = [
        r
        for r in instances(arm, "Microsoft.Authorization/roleAssignments")
        if r["properties"]["roleDefinitionId"].endswith(role["name"])
    ]
    assert len(assigned) == len(POOLS)
    for assignment in assigned:
        assert f"id:Microsoft.Authorization/roleDefinitions/{role['name']}" in assignment["dependsOn"]


def test_batch_pool_is_infra_azure_batch_pool(arm):
    formula = (AZURE / "batch" / "autoscale.formula").read_text()
    reference = json.loads((AZURE / "batch" / "pool.json").read_text())
    (pool,) = instances(arm, "Microsoft.Batch/batchAccounts/pools")
    props = pool["properties"]
    assert props["scaleSettings"]["autoScale"]["formula"] == formula == reference["autoScaleFormula"]
    vm = props["deploymentConfiguration"]["virtualMachineConfiguration"]
    ref_vm = reference["virtualMachineConfiguration"]
    assert vm["imageReference"] == ref_vm["imageReference"]
    assert vm["nodeAgentSkuId"] == ref_vm["nodeAgentSKUId"]  # the REST API spells it so
    assert props["vmSize"] == reference["vmSize"]
    assert pool["name"].endswith("/" + reference["id"])
    assert props["taskSlotsPerNode"] == reference["taskSlotsPerNode"]
    assert props["startTask"]["commandLine"] == reference["startTask"]["commandLine"]
    job = json.loads((AZURE / "batch" / "job.json").read_text())
    assert job["poolInfo"]["poolId"] == reference["id"]


def test_staged_package_is_indexed_as_the_host_would(tmp_path):
    """``make azure-package`` lays out function_app.py and host.json at the root, beside the code."""
    stage = tmp_path / "app"
    done = subprocess.run(
        ["make", "-s", "azure-package", f"AZURE_PACKAGE={stage}"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert {"function_app.py", "host.json", "requirements.txt", "runplane", "functions"} <= {
        p.name for p in stage.iterdir()
    }
    assert not list(stage.rglob("__pycache__")) and not list(stage.rglob("local.settings.json*"))
    code = (
        "import function_app, runplane; print(runplane.__file__);"
        "print(' '.join(sorted(f.get_function_name() for f in function_app.app.get_functions())))"
    )
    # only the staged folder and the installed libraries: never this checkout
    env = {"PYTHONPATH": str(stage), "PYTHONSAFEPATH": "1", "PATH": "/usr/bin:/bin"}
    indexed = subprocess.run([sys.executable, "-c", code], cwd=stage, capture_output=True, text=True, env=env)
    assert indexed.returncode == 0, indexed.stderr
    where, names = indexed.stdout.splitlines()
    assert Path(where).is_relative_to(stage)
    assert names.split() == ["api", "dispatcher_events", "dispatcher_schedule", "reaper", "relay_events", "ui"]


def test_only_the_function_app_wraps_and_only_the_nodes_unwrap_with_the_secrets_key(arm):
    """Secrets are sealed by the API (wrap) and opened by the agents (unwrap): each identity gets a
    custom role of exactly one data action on the one key, and no one gets both, or any other role
    on the vault or the key. The fake Key Vault of the adapter's tests grants these very actions."""
    (vault,) = instances(arm, "Microsoft.KeyVault/vaults")
    assert vault["properties"]["enableRbacAuthorization"] is True
    assert vault["properties"]["enablePurgeProtection"] is True
    (key,) = instances(arm, "Microsoft.KeyVault/vaults/keys")
    key_name = arm.value("[variables('secretsKeyName')]")
    assert key["name"] == f"{vault['name']}/{key_name}"
    assert key["properties"]["kty"] == "RSA" and key["properties"]["keySize"] >= 2048
    assert set(key["properties"]["keyOps"]) == {"wrapKey", "unwrapKey"}

    roles = {r["name"]: r["properties"] for r in instances(arm, "Microsoft.Authorization/roleDefinitions")}
    actions = {name: {a for p in props["permissions"] for a in p["dataActions"]} for name, props in roles.items()}
    wrap, unwrap = arm.value("[variables('secretsWrapRole')]"), arm.value("[variables('secretsUnwrapRole')]")
    assert actions[wrap] == {WRAP} and actions[unwrap] == {UNWRAP}
    assert all(roles[r]["permissions"][0]["actions"] == [] for r in (wrap, unwrap))

    key_scope = f"Microsoft.KeyVault/vaults/{key['name'].replace('/', '/keys/')}"
    on_vault = {(p, role, scope) for p, role, scope in role_assignments(arm) if scope.startswith("Microsoft.KeyVault/")}
    assert on_vault == {(app_principal(arm), wrap, key_scope), (nodes_principal(arm), unwrap, key_scope)}
    # no other role of the template carries a Key Vault action
    assert sorted(a for acts in actions.values() for a in acts if a.startswith("Microsoft.KeyVault/")) == sorted(
        [WRAP, UNWRAP]
    )


def test_the_secrets_key_and_table_reach_the_function_app_and_through_it_the_nodes(arm):
    settings = {s["name"]: s["value"] for s in site(arm)["properties"]["siteConfig"]["appSettings"]}
    key = settings["RUNPLANE_SECRETS_KEY"]
    vault, name = arm.value("[variables('keyVaultName')]"), arm.value("[variables('secretsKeyName')]")
    assert (
        str(key) == f"<reference:id:Microsoft.KeyVault/vaults/keys/{vault}/{name}.keyUri>"
    )  # versionless: a new key version wraps from then on; values record the version that wrapped them
    assert "secrets_key" in StackSettings.model_fields
    # the dispatcher hands its RUNPLANE_* settings to the Batch tasks: the key URL is not a credential
    from runplane.compute.options import CREDENTIAL_NAMES

    assert "RUNPLANE_SECRETS_KEY" not in CREDENTIAL_NAMES
    # the Function App reads and writes the secrets table through its role on the whole account
    account = "Microsoft.Storage/storageAccounts/" + arm.value("[variables('storageAccountName')]")
    assert (app_principal(arm), TABLE_CONTRIBUTOR, account) in role_assignments(arm)
    assert AzureNames("runplane").secrets_table == arm.value("[variables('secretsTable')]")


def _policies(arm) -> list[dict[str, Any]]:
    """The storage account's lifecycle management policies the template deploys (its condition holding)."""
    return [
        p for p in instances(arm, "Microsoft.Storage/storageAccounts/managementPolicies") if p.get("condition", True)
    ]


def test_uploads_expire_by_a_blob_lifecycle_rule_only_when_a_retention_is_set():
    assert _policies(Arm(TEMPLATE, {"prefix": "runplane", "poolNames": POOLS})) == []  # kept for good, as before
    arm = Arm(TEMPLATE, {"prefix": "rp-dev1", "poolNames": POOLS, "uploadRetentionDays": 14})
    (policy,) = _policies(arm)
    account = arm.value("[variables('storageAccountName')]")
    assert policy["name"] == f"{account}/default"  # an account has one policy, named default
    assert f"id:Microsoft.Storage/storageAccounts/{account}" in policy["dependsOn"]
    (rule,) = policy["properties"]["policy"]["rules"]
    assert rule["enabled"] is True and rule["type"] == "Lifecycle"
    # the container/prefix of the upload keys the API writes (upload_key), and nothing else of the container
    assert rule["definition"]["filters"] == {
        "blobTypes": ["blockBlob"],
        "prefixMatch": [f"{AzureNames('rp-dev1').container}/{UPLOADS_PREFIX}"],
    }
    # from the last write or touch: a run naming an upload renews its Last-Modified (BlobObjectStore.touch)
    assert rule["definition"]["actions"] == {"baseBlob": {"delete": {"daysAfterModificationGreaterThan": 14}}}


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, Retention()),
        ({"retention": {"outputs": "30d", "runs": "180d"}}, Retention(outputs="30d", runs="180d")),
        (
            {"retention": {"logs": "7d", "uploads": "1d"}, "uploadRetentionDays": 14},
            Retention(logs="7d", uploads="14d"),
        ),
    ],
)
def test_the_retention_reaches_the_function_app_with_the_uploads_days_of_the_lifecycle_rule(parameters, expected):
    """The sweep reads RUNPLANE_RETENTION; its uploads are the lifecycle rule's days, so both delete alike."""
    settings = site(Arm(TEMPLATE, {"prefix": "runplane", "poolNames": POOLS, **parameters}))["properties"]
    value = {s["name"]: s["value"] for s in settings["siteConfig"]["appSettings"]}["RUNPLANE_RETENTION"]
    assert StackSettings(cloud="azure", retention=value).kept() == expected


def test_the_sessions_hub_sends_its_events_to_the_function_apps_relay_route(arm):
    """The Web PubSub hub's event handler is the function app's /relay/events (the route of
    functions/azure/relay.py under host.json's empty prefix), with the system events the relay
    answers; the function app reaches the resource by its connection string and that hub."""
    (service,) = instances(arm, "Microsoft.SignalRService/webPubSub")
    (hub,) = instances(arm, "Microsoft.SignalRService/webPubSub/hubs")
    service_name, hub_name = hub["name"].split("/")
    assert service_name == service["name"]
    assert hub["properties"]["anonymousConnectPolicy"] == "deny"
    (handler,) = hub["properties"]["eventHandlers"]
    host = f"<reference:id:Microsoft.Web/sites/{site(arm)['name']}.defaultHostName>"
    assert handler["urlTemplate"] == f"https://{host}{EVENTS_PATH}"
    assert set(handler["systemEvents"]) == {"connect", "connected", "disconnected"}
    assert handler["userEventPattern"] == ""  # the sides publish to groups: no message event is asked for
    routes = {
        json.loads(f.get_function_json())["bindings"][0].get("route"): f.get_function_name()
        for f in function_app.make_app().get_functions()
    }
    host_json = json.loads((ROOT / "functions" / "azure" / "host.json").read_text())
    assert host_json["extensions"]["http"]["routePrefix"] == ""
    assert routes[EVENTS_PATH.lstrip("/")] == "relay_events"
    settings = {s["name"]: s["value"] for s in site(arm)["properties"]["siteConfig"]["appSettings"]}
    assert settings["RUNPLANE_WEBPUBSUB_HUB"] == hub_name
    connection = settings["RUNPLANE_WEBPUBSUB_CONNECTION_STRING"]
    resource = f"id:Microsoft.SignalRService/webPubSub/{service['name']}"
    assert connection.path == f"listKeys:{resource}.primaryConnectionString"
    assert resource in site(arm)["dependsOn"]
