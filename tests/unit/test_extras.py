"""runplane/extras.py: which extras a command line needs, and that its table of extras says what
pyproject.toml installs (tests/integration/test_packaging.py runs the installs themselves)."""

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

from runplane.extras import EXTRAS, cli_needs, cli_requirement

ROOT = Path(__file__).resolve().parents[2]
DEV = ("runplane dev", ("local",))
DEV_AZURE = ("runplane dev --cloud azure", ("local", "azure"))


@pytest.mark.parametrize(
    ("argv", "environ", "needs"),
    [
        (["dev"], {}, DEV),
        (["dev", "--port", "9090", "--cloud", "aws"], {}, DEV),
        (["dev", "--cloud", "azure"], {}, DEV_AZURE),
        (["dev", "--cloud=azure", "--port", "9090"], {}, DEV_AZURE),
        (["--profile", "dev", "dev", "--cloud", "azure"], {}, DEV_AZURE),
        (["dev", "--azure-connection", "AccountName=x"], {}, DEV_AZURE),
        (["dev"], {"RUNPLANE_AZURE_CONNECTION": "AccountName=x"}, DEV_AZURE),
        (["dev", "--cloud", "aws"], {"RUNPLANE_AZURE_CONNECTION": "AccountName=x"}, DEV),
        (["dev", "--aws-endpoint", "http://127.0.0.1:5000"], {}, DEV),
        (["dev", "--help"], {}, None),
        (["token", "create", "alice", "--direct"], {}, ("runplane token create --direct", ("aws",))),
        (
            ["token", "create", "alice", "--direct"],
            {"RUNPLANE_CLOUD": "azure"},
            ("runplane token create --direct", ("azure",)),
        ),
        (
            ["token", "create", "ops", "--state-dir", "/var/lib/runplane"],
            {},
            ("runplane token create --direct", ("local",)),
        ),
        (
            ["token", "create", "ops", "--direct"],
            {"RUNPLANE_CLOUD": "local"},
            ("runplane token create --direct", ("local",)),
        ),
        (["token", "create", "alice"], {}, None),
        (["run", "--", "runplane", "dev"], {}, None),
        (["ls"], {}, None),
        ([], {}, None),
    ],
)
def test_the_extras_a_command_line_needs(argv: list[str], environ: dict[str, str], needs: object) -> None:
    assert cli_needs(argv, environ) == needs


def _distributions(extras: dict[str, list[str]], extra: str) -> set[str]:
    """The distributions ``extra`` names, through its references to runplane's other extras."""
    names = set()
    for requirement_text in extras[extra]:
        name, brackets = re.match(r"([A-Za-z0-9._-]+)(?:\[([^\]]*)\])?", requirement_text).groups()  # type: ignore[union-attr]
        if name == "runplane":
            for other in brackets.split(","):
                names |= _distributions(extras, other.strip())
        else:
            names.add(name.lower().replace("_", "-"))
    return names


def _provides(distribution: str, module: str) -> bool:
    path = module.replace(".", "/")
    return any(
        str(f) == f"{path}.py" or str(f).startswith(f"{path}/")
        for f in importlib.metadata.distribution(distribution).files or []
    )


def test_this_venv_has_every_extra() -> None:
    # scripts/setup.sh --test installs runplane[test], which holds them all
    assert cli_requirement(["dev", "--cloud", "azure"], {}) is None


def test_each_extra_checks_a_module_of_what_it_installs() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) == set(extras) - {"all", "test"}
    for extra, modules in EXTRAS.items():
        distributions = _distributions(extras, extra)
        for module in modules:
            assert any(_provides(d, module) for d in distributions), f"{extra}: {module} comes with none of it"
    assert _distributions(extras, "all") == set().union(*(_distributions(extras, e) for e in EXTRAS))
