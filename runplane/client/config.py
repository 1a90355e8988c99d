"""Where the client finds the API's URL and a token: arguments, environment, profiles in a config
file, and what a running ``runplane dev`` wrote down.

The config file (``config_path()``) is TOML::

    default_profile = "work"          # optional: the profile used when none is named

    [profiles.work]
    url = "https://runplane.example.com"
    token = "rp_..."

It holds secrets, so ``save_profile`` writes it 0600 in a 0700 directory, whole and atomically.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_PROFILE = "default"
PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


@dataclass(frozen=True)
class Profile:
    """A named pair of API URL and token (either may be missing from the file)."""

    name: str
    url: str | None
    token: str | None


@dataclass(frozen=True)
class Resolved:
    """What a client uses: the URL (no trailing slash), the token, the profile it came from, and
    where the URL came from (``url_from``: one of ``URL_FROM``; ``url_profile``: the profile's name)."""

    url: str
    token: str | None
    profile: str | None
    url_from: str = "default"
    url_profile: str | None = None


URL_FROM = ("argument", "environment", "profile", "dev", "default")
"""Where a client's URL came from: the argument, RUNPLANE_API_URL, a profile, what a running
``runplane dev`` wrote down, or ``DEFAULT_URL``."""


def config_path() -> Path:
    """``$RUNPLANE_CONFIG``, else ``$XDG_CONFIG_HOME/runplane/config.toml``, else
    ``~/.config/runplane/config.toml`` (read when called: nothing is fixed at import)."""
    explicit = os.environ.get("RUNPLANE_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".config"
    return base / "runplane" / "config.toml"


def dev_file() -> Path:
    """What a running ``runplane dev`` writes: ``{"api_url", "token"}``."""
    return Path.home() / ".runplane" / "dev.json"


def check_profile_name(name: str) -> str:
    """``name`` if it may name a profile; raises ValueError otherwise."""
    if not PROFILE_NAME.fullmatch(name):
        raise ValueError(
            f"profile name {name[:80]!r} is not valid: use letters, digits, '-' and '_' (at most 64, not first)"
        )
    return name


def _read(path: Path) -> dict[str, Any]:
    """The parsed file ({} when it does not exist). Raises ValueError naming the file for one that
    cannot be read or parsed, or whose profiles are not tables of strings."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the runplane config file {path}: {e}") from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"the runplane config file {path} is not valid TOML: {e}") from e
    profiles = data.get("profiles", {})
    if not isinstance(profiles, dict) or not all(isinstance(p, dict) for p in profiles.values()):
        raise ValueError(f"the runplane config file {path}: [profiles.<name>] must be tables")
    for name, table in profiles.items():
        for key in ("url", "token"):
            if not isinstance(table.get(key, ""), str):
                raise ValueError(f"the runplane config file {path}: profiles.{name}.{key} must be a string")
    default = data.get("default_profile")
    if default is not None and not isinstance(default, str):
        raise ValueError(f"the runplane config file {path}: default_profile must be a string")
    return data


def _profile(name: str, table: dict[str, Any]) -> Profile:
    return Profile(name, table.get("url") or None, table.get("token") or None)


def list_profiles() -> list[Profile]:
    """Every profile of the config file, in the file's order. Raises ValueError (see ``_read``)."""
    profiles: dict[str, Any] = _read(config_path()).get("profiles", {})
    return [_profile(name, table) for name, table in profiles.items()]


def load_profile(name: str | None = None) -> Profile | None:
    """The profile ``name``, else the one ``$RUNPLANE_PROFILE`` names, else the file's
    ``default_profile``, else "default". A profile that was named (any way but the last) and is not
    in the file raises ValueError naming it and the file; a missing "default" is None, as is a
    missing file."""
    path = config_path()
    data = _read(path)
    named = name or os.environ.get("RUNPLANE_PROFILE") or data.get("default_profile")
    chosen = check_profile_name(named) if named else DEFAULT_PROFILE
    profiles: dict[str, Any] = data.get("profiles", {})
    if chosen in profiles:
        return _profile(chosen, profiles[chosen])
    if named:
        known = ", ".join(sorted(profiles)) or "none"
        raise ValueError(f"no profile {chosen!r} in {path} (profiles there: {known}); add it with `runplane login`")
    return None


def save_profile(name: str, url: str, token: str) -> Path:
    """Store ``url`` and ``token`` as profile ``name`` (replacing it, keeping the others and the
    rest of the file) and return the file's path. The file is written whole to a temporary file
    (0600) beside it and renamed over it, so a reader sees the old file or the new one; a
    directory it has to make is made 0700. Raises ValueError for a bad name or a config file that
    cannot be parsed (it is left as it is), OSError when it cannot be written."""
    check_profile_name(name)
    path = config_path()
    data = _read(path)
    profiles = dict(data.get("profiles", {}))
    profiles[name] = {**profiles.get(name, {}), "url": url, "token": token}
    data["profiles"] = profiles
    text = dump_toml(data)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=path.parent)  # made 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        Path(temp).replace(path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def resolve(url: str | None, token: str | None, profile: str | None) -> Resolved:
    """URL and token, each from the first place that gives one: the argument; ``RUNPLANE_API_URL``
    / ``RUNPLANE_TOKEN``; the profile (``profile``, ``$RUNPLANE_PROFILE``, the file's
    ``default_profile`` or "default"); ``~/.runplane/dev.json``; for the URL, ``DEFAULT_URL``.
    Raises ValueError for a named profile that does not exist, a broken config file, or a URL that
    is not http(s)."""
    url_from = "argument" if url else "environment" if os.environ.get("RUNPLANE_API_URL") else "default"
    url = url or os.environ.get("RUNPLANE_API_URL") or None
    token = token or os.environ.get("RUNPLANE_TOKEN") or None
    used: str | None = None
    # A profile passed by name is read even when arguments and environment give both (one that does
    # not exist is an error, not something to ignore); otherwise (RUNPLANE_PROFILE included) the
    # file is read only when something is still missing, so that neither a broken file nor a
    # profile about to be made by `runplane login` stands in the way of explicit settings.
    found = load_profile(profile) if profile or url is None or token is None else None
    if found is not None and profile and url is not None and url == found.url:  # the profile's URL, passed on
        url_from = "profile"
    if found is not None and (url is None or token is None):
        used = found.name
        url_from = "profile" if url is None and found.url else url_from
        url, token = url or found.url, token or found.token
    if url is None or token is None:
        dev = _dev_settings()
        url_from = "dev" if url is None and dev.get("api_url") else url_from
        url, token = url or dev.get("api_url"), token or dev.get("token")
    final = (url or DEFAULT_URL).rstrip("/")
    if not final.startswith(("http://", "https://")):
        raise ValueError(f"the API URL must start with http:// or https://, got {final[:200]!r}")
    return Resolved(final, token, used, url_from, found.name if url_from == "profile" and found else None)


def _dev_settings() -> dict[str, str]:
    """``api_url`` and ``token`` from dev.json, each only if it is a string ({} for a missing or
    unreadable file: the local stack may have been stopped mid-write)."""
    try:
        data = json.loads(dev_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if k in ("api_url", "token") and isinstance(v, str) and v}


# --- writing TOML ---------------------------------------------------------------------------
# The standard library reads TOML but does not write it. The config file holds strings, and
# whatever else a person put there is written back as it was read.

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string. Raises ValueError for a lone surrogate (TOML holds only
    Unicode scalar values)."""
    out = []
    for ch in value:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError("a string in the config file cannot hold a lone surrogate")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else _special(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {type(value).__name__} to the config file")


def _special(value: float) -> str:
    return "nan" if value != value else ("inf" if value > 0 else "-inf")


def dump_toml(data: dict[str, Any], prefix: str = "") -> str:
    """``data`` (as ``tomllib`` reads it) as TOML text: plain values first, then each table as a
    ``[section]`` (nested tables as ``[a.b]``)."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    text = "\n".join(lines) + ("\n" if lines else "")
    for key, table in data.items():
        if isinstance(table, dict):
            name = f"{prefix}.{_key(key)}" if prefix else _key(key)
            body = dump_toml(table, name)
            has_values = any(not isinstance(v, dict) for v in table.values())
            header = f"[{name}]\n" if has_values or not table else ""
            text += ("\n" if text else "") + header + body
    return text
