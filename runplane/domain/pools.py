"""Loading pool configuration and choosing a pool for a run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from runplane.domain.errors import InvalidRequest, Unschedulable
from runplane.domain.models import Pool, PoolConfig, Resources


def load_pools(text_or_path: str) -> PoolConfig:
    """Read pools from a YAML/JSON file path or an inline YAML/JSON document.

    Raises ValueError with the file and the first problem when the config is not valid.
    """
    source = "inline pools"
    text = text_or_path
    if "\n" not in text_or_path and not text_or_path.lstrip().startswith(("{", "[")):
        path = Path(text_or_path).expanduser()
        source = str(path)
        try:
            text = path.read_text()
        except OSError as e:
            raise ValueError(f"cannot read pools file {path}: {e.strerror}") from e
    data: Any
    try:
        data = json.loads(text)  # what functions get in RUNPLANE_POOLS; no YAML parser needed
    except ValueError:
        import yaml  # only for YAML files: it costs the Lambda cold start otherwise

        try:
            data = yaml.load(text, Loader=_yaml_1_2_loader(yaml))  # noqa: S506 (a SafeLoader)
        except yaml.YAMLError as e:
            raise ValueError(f"{source}: not valid YAML/JSON: {e}") from e
    if isinstance(data, list):
        data = {"pools": data}
    try:
        return PoolConfig.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{source}: {where}: {first['msg']}") from e


def dump_pools(config: PoolConfig) -> str:
    return json.dumps(config.model_dump(mode="json"))


def _size_key(pool: Pool) -> tuple[int, float, int]:
    return (pool.gpus, pool.cpus, pool.memory)


def choose_pool(config: PoolConfig, resources: Resources, queue: str | None) -> Pool:
    """The named pool if the request fits it, else the smallest pool that fits.

    Raises InvalidRequest for an unknown queue and Unschedulable when nothing can fit,
    naming the largest pool shape so the user knows what to ask for.
    """
    if queue is not None:
        pool = config.get(queue)
        if pool is None:
            names = ", ".join(p.name for p in config.pools)
            raise InvalidRequest(f"unknown queue {queue!r}; pools are: {names}")
        why = pool.misfit(resources)
        if why:
            raise Unschedulable(f"no worker of pool {pool.shape()} can run this: {why}")
        return pool
    fitting = [p for p in config.pools if p.misfit(resources) is None]
    if not fitting:
        largest = max(config.pools, key=_size_key)
        raise Unschedulable(
            f"no pool can run this request ({largest.misfit(resources) or 'too large'}); "
            f"the largest pool is {largest.shape()}"
        )
    return min(fitting, key=_size_key)


def _yaml_1_2_loader(yaml: Any) -> Any:
    """A SafeLoader whose booleans are YAML 1.2's (true, false): PyYAML reads YAML 1.1, where
    ``on``, ``off``, ``yes`` and ``no`` are booleans too, so that a retry rule's key ``on:`` would
    come out as True. The pools' models read "yes" or "on" as true where they want a boolean."""

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        pass

    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    return Loader
