"""Where the SDK finds its URL and token: the config file's profiles (written 0600, atomically,
keeping the rest), the environment, a running ``runplane dev``'s dev.json, and the order in which
they win. Every test has a HOME and environment of its own."""

from __future__ import annotations

import json
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runplane.client import ApiError, Client, config_path, list_profiles, load_profile, save_profile
from runplane.client.config import DEFAULT_URL, Profile, resolve


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in ("RUNPLANE_API_URL", "RUNPLANE_TOKEN", "RUNPLANE_PROFILE", "RUNPLANE_CONFIG", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    yield home


def write_dev_json(home: Path, url: str, token: str) -> None:
    (home / ".runplane").mkdir(exist_ok=True)
    (home / ".runplane" / "dev.json").write_text(json.dumps({"api_url": url, "token": token}))


def test_config_path_follows_the_environment(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert config_path() == home / ".config" / "runplane" / "config.toml"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "runplane" / "config.toml"
    monkeypatch.setenv("RUNPLANE_CONFIG", str(tmp_path / "mine.toml"))
    assert config_path() == tmp_path / "mine.toml"


def test_a_saved_profile_is_private_and_keeps_the_others(home: Path) -> None:
    first = save_profile("work", "https://work.example.com", "rp_work")
    assert first == home / ".config" / "runplane" / "config.toml"
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.parent.stat().st_mode) == 0o700
    save_profile("home", "http://127.0.0.1:9090", "rp_home")
    save_profile("work", "https://work2.example.com", "rp_work2")  # replaced in place
    assert list_profiles() == [
        Profile("work", "https://work2.example.com", "rp_work2"),
        Profile("home", "http://127.0.0.1:9090", "rp_home"),
    ]
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    assert [p.name for p in first.parent.iterdir()] == ["config.toml"]  # no temporary file left


def test_what_a_person_added_to_the_file_survives_a_save(home: Path) -> None:
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text(
        '# mine\ndefault_profile = "work"\ncolor = false\n\n[profiles.work]\nurl = "https://w"\ntoken = "a"\n'
        'note = "keep me"\n\n[other]\nlist = [1, 2]\nwhen = 2026-01-02T03:04:05Z\n'
    )
    save_profile("home", "https://h", "b")
    data = tomllib.loads(path.read_text())
    assert data["default_profile"] == "work" and data["color"] is False
    assert data["profiles"]["work"] == {"url": "https://w", "token": "a", "note": "keep me"}
    assert data["profiles"]["home"] == {"url": "https://h", "token": "b"}
    assert data["other"]["list"] == [1, 2] and data["other"]["when"].year == 2026


@pytest.mark.parametrize(
    "token",
    ['quo"te', "back\\slash", "ünïcødé ☃ 🚀", "new\nline\ttab", "ctrl\x01\x7f", "'single'", "[profiles.x]\n"],
)
def test_strings_round_trip(token: str) -> None:
    save_profile("odd", 'https://example.com/a b?c="d"', token)
    assert load_profile("odd") == Profile("odd", 'https://example.com/a b?c="d"', token)


def test_a_lone_surrogate_cannot_be_saved() -> None:
    with pytest.raises(ValueError, match="surrogate"):
        save_profile("odd", "https://x", "bad\ud800")
    assert not config_path().exists()


@pytest.mark.parametrize("name", ["", "-lead", "has space", "a.b", "x" * 65, "é"])
def test_a_profile_name_is_checked(name: str) -> None:
    with pytest.raises(ValueError, match="profile name"):
        save_profile(name, "https://x", "t")


def test_resolution_order(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = resolve(None, None, None)
    assert (got.url, got.token, got.profile) == (DEFAULT_URL, None, None)
    write_dev_json(home, "http://127.0.0.1:7001", "dev-token")
    assert resolve(None, None, None).url == "http://127.0.0.1:7001"
    save_profile("default", "http://127.0.0.1:7002/", "profile-token")
    got = resolve(None, None, None)
    assert (got.url, got.token, got.profile) == ("http://127.0.0.1:7002", "profile-token", "default")
    monkeypatch.setenv("RUNPLANE_API_URL", "http://127.0.0.1:7003")
    got = resolve(None, None, None)  # each of the two on its own: the token still comes from the profile
    assert (got.url, got.token) == ("http://127.0.0.1:7003", "profile-token")
    monkeypatch.setenv("RUNPLANE_TOKEN", "env-token")
    got = resolve(None, None, None)
    assert (got.url, got.token, got.profile) == ("http://127.0.0.1:7003", "env-token", None)
    with Client("http://127.0.0.1:7004/", "arg-token") as client:
        assert (client.url, client.token, client.profile) == ("http://127.0.0.1:7004", "arg-token", None)


def test_a_profile_fills_what_dev_json_would(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_dev_json(home, "http://127.0.0.1:7001", "dev-token")
    save_profile("default", "https://only-url", "")
    with Client() as client:  # the profile has no token: dev.json gives it
        assert (client.url, client.token) == ("https://only-url", "dev-token")


def test_the_named_profile_wins_over_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    save_profile("default", "https://default", "d")
    save_profile("work", "https://work", "w")
    with Client(profile="work") as client:
        assert (client.url, client.token, client.profile) == ("https://work", "w", "work")
    monkeypatch.setenv("RUNPLANE_PROFILE", "work")
    with Client() as client:
        assert (client.url, client.profile) == ("https://work", "work")
    with Client(profile="default") as client:  # the argument over the environment
        assert client.url == "https://default"


def test_default_profile_in_the_file() -> None:
    save_profile("work", "https://work", "w")
    path = config_path()
    path.write_text('default_profile = "work"\n' + path.read_text())
    assert load_profile() == Profile("work", "https://work", "w")


def test_an_unknown_named_profile_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    save_profile("work", "https://work", "w")
    with pytest.raises(ValueError, match=r"no profile 'nope' in .*config\.toml \(profiles there: work\)"):
        Client(profile="nope")
    monkeypatch.setenv("RUNPLANE_PROFILE", "nope")
    with pytest.raises(ValueError, match="no profile 'nope'"):  # needed and missing: never silently ignored
        Client()
    # URL and token given another way: the profile is not needed (`RUNPLANE_PROFILE=new runplane
    # login URL` makes it)
    monkeypatch.setenv("RUNPLANE_API_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("RUNPLANE_TOKEN", "t")
    assert (Client().url, Client().profile) == ("http://127.0.0.1:1", None)
    monkeypatch.delenv("RUNPLANE_PROFILE")
    assert load_profile() is None  # "default" was not asked for by name: missing is fine


def test_broken_toml_names_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text('[profiles.work\nurl = "x"\n')
    with pytest.raises(ValueError, match=rf"^the runplane config file {path} is not valid TOML: "):
        Client()
    with pytest.raises(ValueError, match=str(path)):
        save_profile("home", "https://h", "t")
    assert path.read_text() == '[profiles.work\nurl = "x"\n'  # left as it was
    monkeypatch.setenv("RUNPLANE_API_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("RUNPLANE_TOKEN", "t")
    with Client() as client:  # nothing is needed from the file: it is not read
        assert client.url == "http://127.0.0.1:1"


def test_a_profile_of_the_wrong_shape_names_the_file() -> None:
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text("[profiles.default]\nurl = 3\n")
    with pytest.raises(ValueError, match=rf"{path}: profiles.default.url must be a string"):
        load_profile()


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://x", "file:///etc/passwd"])
def test_a_url_must_be_http(url: str) -> None:
    with pytest.raises(ValueError, match="must start with http:// or https://"):
        Client(url, "t")


def test_a_broken_dev_json_is_ignored(home: Path) -> None:
    (home / ".runplane").mkdir()
    (home / ".runplane" / "dev.json").write_text('{"api_url": ')
    with Client() as client:
        assert (client.url, client.token) == (DEFAULT_URL, None)


UNREACHABLE = "http://127.0.0.1:9"
"""A URL the client is never let reach (the transport refuses every connection, as a stack that is
down does; a port closed now could be someone else's open one a moment later)."""


def _unreachable(url: str | None = None, token: str | None = "rp_x", profile: str | None = None) -> Client:
    return Client(url, token, profile, retries=0, transport=httpx.MockTransport(_refuse))


@pytest.mark.parametrize(
    ("source", "hint"),
    [
        ("environment", "(the URL is RUNPLANE_API_URL's: is the stack there up"),
        ("profile", "(the URL is profile lab's: is the stack there up?"),
        ("dev", "(the URL is the one `runplane dev` wrote to ~/.runplane/dev.json: is it still running?)"),
        ("argument", "(is runplane's API up at this URL?)"),
    ],
)
def test_an_unreachable_api_is_explained_by_where_its_url_came_from(
    home: Path, monkeypatch: pytest.MonkeyPatch, source: str, hint: str
) -> None:
    """`runplane dev` is named only when the URL is the default or the one it wrote down; a URL set
    by hand or by a profile (a `runplane serve`, a cloud stack) points at that setting instead."""
    url = UNREACHABLE
    if source == "environment":
        monkeypatch.setenv("RUNPLANE_API_URL", url)
    elif source == "profile":
        save_profile("lab", url, "rp_lab")
        monkeypatch.setenv("RUNPLANE_PROFILE", "lab")
    elif source == "dev":
        write_dev_json(home, url, "rp_dev")
    with _unreachable(url if source == "argument" else None) as api, pytest.raises(ApiError) as caught:
        api.me()
    assert caught.value.message.startswith(f"cannot reach {url}: ")
    assert hint in caught.value.message
    assert ("runplane dev" in caught.value.message) == (source == "dev")


def test_an_unreachable_default_url_names_both_local_stacks(home: Path) -> None:
    assert resolve(None, None, None).url == DEFAULT_URL
    with _unreachable() as api, pytest.raises(ApiError) as caught:
        api.me()
    assert "is `runplane dev` or `runplane serve` running on this machine?" in caught.value.message
    assert "RUNPLANE_API_URL" in caught.value.message


def test_a_profile_named_on_the_command_line_is_where_its_url_came_from(home: Path) -> None:
    save_profile("lab", UNREACHABLE, "rp_lab")
    found = load_profile("lab")
    assert found is not None
    with _unreachable(found.url, found.token, "lab") as api, pytest.raises(ApiError) as caught:
        api.me()  # how `runplane --profile lab` makes its client: the profile's URL over the environment's
    assert "(the URL is profile lab's:" in caught.value.message


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)
