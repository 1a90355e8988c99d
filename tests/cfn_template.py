"""Reading template.yaml as data: short-form tags in long form, Fn::ForEach expanded, what is known
before deployment resolved. Shared by the template tests and the deployment security tests."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "template.yaml"


class CfnLoader(yaml.SafeLoader):
    """YAML loader for CloudFormation: a short-form tag (``!Ref X``) becomes its long form."""


def _construct_tag(loader: CfnLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    if suffix == "GetAtt" and isinstance(value, str):
        value = value.split(".", 1)
    return {"Ref" if suffix == "Ref" else f"Fn::{suffix}": value}


CfnLoader.add_multi_constructor("!", _construct_tag)


def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=CfnLoader)


def defaults(template: dict[str, Any]) -> dict[str, str]:
    return {name: str(p.get("Default", "")) for name, p in template["Parameters"].items()}


def resolve(value: Any, params: dict[str, str]) -> Any:
    """Resolve what is known before deployment: Refs to parameters and Subs of parameters."""
    if isinstance(value, dict) and len(value) == 1:
        ((key, arg),) = value.items()
        if key == "Ref" and arg in params:
            return params[arg]
        if key == "Fn::Sub" and isinstance(arg, str):
            out = re.sub(r"\$\{([A-Za-z0-9]+)\}", lambda m: params.get(m.group(1), m.group(0)), arg)
            # What is known only at deployment (${AWS::AccountId}, resource names) stays a Sub.
            return out if "${" not in out else {key: out}
        if key == "Fn::GetAtt":
            return {key: [resolve(a, params) for a in arg]}
    if isinstance(value, dict):
        return {k: resolve(v, params) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, params) for v in value]
    return value


def _replace_identifier(value: Any, ident: str, item: str) -> Any:
    """What Fn::ForEach does to its fragment: ${ident} -> item, &{ident} -> item without symbols."""
    if isinstance(value, str):
        return value.replace(f"${{{ident}}}", item).replace(f"&{{{ident}}}", re.sub(r"[^0-9A-Za-z]", "", item))
    if isinstance(value, dict):
        return {_replace_identifier(k, ident, item): _replace_identifier(v, ident, item) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_identifier(v, ident, item) for v in value]
    return value


def expanded_resources(template: dict[str, Any], pools: list[str], prefix: str | None = None) -> dict[str, Any]:
    """Resources with every Fn::ForEach over PoolNames expanded for ``pools`` and Subs resolved,
    with the Prefix parameter's default or ``prefix``."""
    params = {**defaults(template), "PoolNames": ",".join(pools)}
    if prefix is not None:
        params["Prefix"] = prefix
    out: dict[str, Any] = {}
    for key, value in template["Resources"].items():
        if key.startswith("Fn::ForEach::"):
            ident, collection, fragment = value
            assert collection == {"Ref": "PoolNames"}, f"{key} should loop over the PoolNames parameter"
            for pool in pools:
                for logical_id, resource in _replace_identifier(copy.deepcopy(fragment), ident, pool).items():
                    assert logical_id not in out, f"duplicate logical id {logical_id}"
                    out[logical_id] = resolve(resource, params)
        else:
            out[key] = resolve(value, params)
    return out


def functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {
        k: v
        for k, v in template["Resources"].items()
        if isinstance(v, dict) and v.get("Type") == "AWS::Serverless::Function"
    }
    assert set(found) == {"ApiFunction", "DispatcherFunction", "ReaperFunction", "RelayFunction"}
    return found


def statements(policies: list[Any]) -> list[dict[str, Any]]:
    """The IAM statements of a function's ``Policies`` or a role's (both branches of an
    ``Fn::If``). A SAM policy template (``DynamoDBCrudPolicy: ...``) comes back as
    ``{"Template": {...}}``."""
    out: list[dict[str, Any]] = []
    for policy in policies:
        if isinstance(policy, dict) and "Fn::If" in policy:
            _, *branches = policy["Fn::If"]
            out.extend(statements([b for b in branches if b != {"Ref": "AWS::NoValue"}]))
        elif isinstance(policy, dict) and "PolicyDocument" in policy:  # an AWS::IAM::Role's
            out.extend(policy["PolicyDocument"]["Statement"])
        elif isinstance(policy, dict) and "Statement" in policy:
            out.extend(policy["Statement"])
        else:
            out.append({"Template": policy})
    return out


def role_of(template: dict[str, Any], function: str) -> dict[str, Any] | None:
    """The AWS::IAM::Role of the template a function names as its ``Role`` (None: SAM makes one)."""
    role = functions(template)[function]["Properties"].get("Role")
    if role is None:
        return None
    assert role.get("Fn::GetAtt", [None, None])[1] == "Arn", f"{function}: Role is not a role of the template"
    resource: dict[str, Any] = template["Resources"][role["Fn::GetAtt"][0]]
    assert resource["Type"] == "AWS::IAM::Role"
    return resource


def function_statements(template: dict[str, Any], function: str) -> list[dict[str, Any]]:
    """Every IAM statement a function's role holds that the template writes: its ``Policies``, or
    those of the role it names."""
    role = role_of(template, function)
    if role is not None:
        return statements(role["Properties"].get("Policies", []))
    return statements(functions(template)[function]["Properties"].get("Policies", []))


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
