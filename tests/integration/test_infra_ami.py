"""Static checks of the worker machine files in infra/ami and the agent image's Dockerfile: the
systemd unit verifies, the user-data is valid cloud-config, install.sh parses and passes
shellcheck, and every setting they use is something the agent or the stack reads."""

import re
import shutil
import subprocess

import pytest
import yaml

from runplane.adapters.names import TABLES
from runplane.settings import StackSettings
from tests.conftest import ROOT
from worker_agent.settings import AgentSettings, env_name

AMI = ROOT / "infra" / "ami"
UNIT = AMI / "runplane-agent.service"
INSTALL = AMI / "install.sh"
USER_DATA = AMI / "user-data.yaml"
DOCKERFILE = ROOT / "infra" / "agent-image" / "Dockerfile"
AGENT_KEYS = {env_name(name) for name in AgentSettings.model_fields}
STACK_KEYS = {"RUNPLANE_" + name.upper() for name in StackSettings.model_fields}
AGENT_BINARY = "/opt/runplane/bin/runplane-agent"


def tool(name: str) -> str:
    """A command the setup installs (scripts/setup.sh --test); cloud-init may be its unpacked copy."""
    local = ROOT / ".venv" / "bin" / name
    found = shutil.which(name) or (str(local) if local.exists() else None)
    if found is None:
        pytest.fail(f"{name} is missing; run scripts/setup.sh --test")
    return found


def unit_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = []
        else:
            key, _, value = line.partition("=")
            sections[current].append((key.strip(), value.strip()))
    return sections


def unit_values(key: str) -> list[str]:
    return [v for entries in unit_sections(UNIT.read_text()).values() for k, v in entries if k == key]


def test_unit_passes_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart's binary exists and is executable, and /opt/runplane is not
    # installed here: point it at a stub. docker.service (Requires=) is stubbed beside the unit,
    # since verify also searches the unit's directory, so the check does not need docker.io.
    stub = tmp_path / "runplane-agent"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    text = UNIT.read_text()
    assert text.count(AGENT_BINARY) == 2  # ExecStart, and ExecStartPre's --prepare-work-dir
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace(AGENT_BINARY, str(stub)))
    (tmp_path / "docker.service").write_text(f"[Unit]\nDescription=stub\n[Service]\nExecStart={stub}\n")
    proc = subprocess.run([tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True, timeout=60)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    # unknown keys and bad values are only warnings: none may mention this unit
    assert [line for line in output.splitlines() if UNIT.name in line] == [], output


def test_unit_verify_catches_a_mistake(tmp_path):
    """The check above is not vacuous: a missing ExecStart binary fails it."""
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(AGENT_BINARY, str(tmp_path / "missing")))
    (tmp_path / "docker.service").write_text("[Unit]\nDescription=stub\n[Service]\nExecStart=/bin/true\n")
    proc = subprocess.run([tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "is not executable" in proc.stdout + proc.stderr


def test_unit_runs_the_agent_as_a_stable_worker_that_passes_runs_down():
    sections = unit_sections(UNIT.read_text())
    assert set(sections) == {"Unit", "Service", "Install"}
    (exec_start,) = unit_values("ExecStart")
    argv = exec_start.split()
    assert argv[0] == AGENT_BINARY
    assert argv[argv.index("--id") + 1] == "%H"  # the host name: a restarted agent hands back its runs
    assert "--pass-down-termination" in argv
    flags = [arg[2:] for arg in argv[1:] if arg.startswith("--")]
    assert "pass-down-termination" in flags
    assert {flag.replace("-", "_") for flag in flags} <= set(AgentSettings.model_fields), flags
    assert unit_values("EnvironmentFile") == ["/etc/runplane/agent.env"]
    assert "docker.service" in unit_values("Requires")
    assert any("docker.service" in v.split() for v in unit_values("After"))
    assert unit_values("Restart") == ["on-failure"]
    assert unit_values("KillSignal") == ["SIGTERM"]
    (timeout,) = unit_values("TimeoutStopSec")
    assert int(timeout) >= 60
    assert unit_values("WantedBy") == ["multi-user.target"]
    # hardening must leave the agent the Docker socket (AF_UNIX), GPU devices and its work dir
    assert "AF_UNIX" in unit_values("RestrictAddressFamilies")[0].split()
    assert unit_values("PrivateDevices") in ([], ["no"])
    assert unit_values("ProtectSystem") in ([], ["full"], ["yes"])  # not strict: /var/lib stays writable


def test_user_data_is_valid_cloud_config():
    proc = subprocess.run(
        [tool("cloud-init"), "schema", "--config-file", str(USER_DATA)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Valid cloud-config" in proc.stdout


def test_cloud_init_schema_catches_a_mistake(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("#cloud-config\nwrite_files:\n  - path: 3\n    content: x\nruncmd: 7\n")
    proc = subprocess.run(
        [tool("cloud-init"), "schema", "--config-file", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "runcmd" in proc.stdout + proc.stderr


def user_data_env() -> list[str]:
    config = yaml.safe_load(USER_DATA.read_text())
    (env_file,) = [f for f in config["write_files"] if f["path"] == "/etc/runplane/agent.env"]
    return env_file["content"].splitlines()


def test_user_data_writes_the_agent_env_and_runs_install():
    assert USER_DATA.read_text().startswith("#cloud-config\n")
    config = yaml.safe_load(USER_DATA.read_text())
    keys = [line.split("=", 1)[0] for line in user_data_env() if line and not line.startswith("#")]
    assert "RUNPLANE_AGENT_POOL" in keys
    assert {"RUNPLANE_PREFIX", "RUNPLANE_AWS_REGION", "RUNPLANE_BUCKET", "RUNPLANE_POOLS"} <= set(keys)
    script = "\n".join(" ".join(c) if isinstance(c, list) else c for c in config["runcmd"])
    assert "install.sh" in script
    assert "runplane-install" in script
    # every placeholder is documented at the top
    header = USER_DATA.read_text().split("\nwrite_files:")[0]
    placeholders = sorted(set(re.findall(r"__[A-Z_]+__", USER_DATA.read_text())))
    assert placeholders
    assert [p for p in placeholders if f"#   {p}" not in header] == []


def env_keys(text: str) -> set[str]:
    return set(re.findall(r"\bRUNPLANE_[A-Z0-9_]+", text))


def test_every_setting_used_is_an_agent_flag_or_a_stack_setting():
    installer_only = {"RUNPLANE_PACKAGE", "RUNPLANE_INSTALL_ON_EC2"}
    sources = {
        "user-data.yaml": USER_DATA.read_text(),
        "install.sh": INSTALL.read_text(),
        "runplane-agent.service": UNIT.read_text(),
        "README.md": (AMI / "README.md").read_text(),
        "Dockerfile": DOCKERFILE.read_text(),
    }
    for name, text in sources.items():
        keys = env_keys(text) - installer_only
        # prefixes in prose ("RUNPLANE_AGENT_<FLAG>", "RUNPLANE_AGENT_*") are not keys
        keys = {k for k in keys if not k.endswith("_")}
        unknown = sorted(k for k in keys if k not in AGENT_KEYS and k not in STACK_KEYS)
        assert unknown == [], f"{name} uses settings nothing reads: {unknown}"
    # the keys install.sh accepts from the environment are the stack's settings
    (stack_keys,) = re.findall(r'STACK_KEYS="([^"]*)"', INSTALL.read_text())
    assert set(stack_keys.split()) <= STACK_KEYS


def test_install_sh_passes_every_table_of_the_stack() -> None:
    """The tables are named once (runplane/adapters/names.py): install.sh hands the agent each
    table's setting, as template.yaml names each table."""
    (stack_keys,) = re.findall(r'STACK_KEYS="([^"]*)"', INSTALL.read_text())
    tables = {f"RUNPLANE_{field.upper()}" for field in TABLES}
    assert tables <= set(stack_keys.split())


def test_install_sh_options_map_to_agent_flags():
    text = INSTALL.read_text()
    options = re.findall(r"--([a-z-]+)\) arg_key (RUNPLANE_[A-Z_]+)", text)
    assert [(option, key) for option, key in options if key not in AGENT_KEYS | STACK_KEYS] == []
    agent_options = [(option, key) for option, key in options if key.startswith("RUNPLANE_AGENT_")]
    assert agent_options, "install.sh maps no option to an agent flag"
    assert [(option, key) for option, key in agent_options if key != env_name(option)] == []


def test_install_sh_parses():
    proc = subprocess.run(["bash", "-n", str(INSTALL)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", [INSTALL, ROOT / "scripts" / "build-agent-image.sh"], ids=lambda p: p.name)
def test_shellcheck(script):
    proc = subprocess.run(
        [tool("shellcheck"), "--shell=bash", "--severity=style", str(script)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_install_sh_help_lists_its_options():
    proc = subprocess.run(["bash", str(INSTALL), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    options = re.findall(r"^\s+(--[a-z-]+)(?:\s|\))", INSTALL.read_text(), re.MULTILINE)
    assert options
    assert [option for option in options if option not in proc.stdout] == []


def test_dockerfile_builds_the_agent_from_the_sources():
    text = DOCKERFILE.read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "ARG BASE=runplane/python-base:bookworm"
    assert lines[1] == "FROM ${BASE}"
    for package in ("runplane", "worker_agent", "functions"):
        assert re.search(rf"^COPY {package} ", text, re.MULTILINE), package
        assert (ROOT / package).is_dir()
    assert 'ENTRYPOINT ["/opt/runplane/bin/runplane-agent"]' in text
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv*"} <= set(ignored)
    # nothing the image needs is excluded from the build context
    copied = {"pyproject.toml", "README.md", "runplane", "worker_agent", "functions"}
    assert not copied & set(ignored)


def test_host_firewall_is_valid_nftables_for_the_agents_bridge(tmp_path):
    """The host rules install.sh writes parse (nft's check mode changes nothing) and name the bridge
    device and the metadata addresses the agent uses; the unit loads them and leaves the agent what
    it needs to install a run's own rules (worker_agent/network.py)."""
    from worker_agent.netcheck import BRIDGE_DEVICE
    from worker_agent.netrules import METADATA

    text = INSTALL.read_text()
    rules = text.split("<<'NFT'\n", 1)[1].split("\nNFT\n", 1)[0]
    (tmp_path / "host.nft").write_text(rules + "\n")
    proc = subprocess.run([tool("nft"), "-c", "-f", str(tmp_path / "host.nft")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f'iifname "{BRIDGE_DEVICE}"' in rules
    assert all(address in rules for address in METADATA)
    assert "command -v nft >/dev/null || pkg_install nftables" in text
    assert "-/usr/sbin/nft -f /etc/runplane/host-firewall.nft" in unit_values("ExecStartPre")
    (caps,) = unit_values("CapabilityBoundingSet")
    assert {"CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE"} <= set(caps.split())
    assert unit_values("RestrictNamespaces") == ["net"]


def test_unit_makes_the_work_dirs_nosuid_mounts_outside_its_sandbox():
    """The sandboxed agent (its own mount namespace) cannot make a mount dockerd sees: a "+"
    ExecStartPre, outside the sandbox, does it for the same worker id before each start."""
    pre = [v for v in unit_values("ExecStartPre") if "--prepare-work-dir" in v]
    assert pre == [f"+{AGENT_BINARY} --id %H --prepare-work-dir"]
    assert AgentSettings.model_fields["prepare_work_dir"].annotation is bool


def nvidia_setup() -> str:
    """install.sh's NVIDIA section: what it defines, from its heading to the call of setup_nvidia."""
    section = INSTALL.read_text().split("# -- GPUs: NVIDIA container toolkit", 1)[1]
    return section.split("\n", 1)[1].split("\nsetup_nvidia\n", 1)[0]


@pytest.mark.parametrize(
    ("version", "accepted"),
    [
        ("1.17.7", False),  # the last vulnerable release
        ("1.9.0", False),  # older, though "9" > "1" as text
        ("", False),  # a version nobody can tell
        ("1.17.8", True),
        ("1.17.10", True),
        ("1.18.0", True),
    ],
)
def test_install_sh_refuses_an_nvidia_toolkit_older_than_1_17_8(tmp_path, version, accepted):
    """CVE-2025-23266: before 1.17.8 the toolkit's hook runs with an image's own LD_PRELOAD, as root
    on the host. install.sh's own NVIDIA setup, run with stand-ins for nvidia-smi and nvidia-ctk
    (which record how they are called), configures only a fixed toolkit and otherwise stops with
    what to do."""
    tools, calls = tmp_path / "bin", tmp_path / "calls"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    banner = f"NVIDIA Container Toolkit CLI version {version}\\ncommit: 0000000\\n" if version else ""
    (tools / "nvidia-ctk").write_text(
        f'#!/bin/sh\necho "$*" >>"{calls}"\n[ "$1" = --version ] && printf "{banner}"\nexit 0\n'
    )
    for stub in tools.iterdir():
        stub.chmod(0o755)
    harness = "\n".join(
        [
            "set -euo pipefail",
            'say() { echo "runplane-install: $*"; }',
            'die() { echo "runplane-install: error: $*" >&2; exit 1; }',
            "pkg_available() { return 1; }",
            "pkg_install() { exit 99; }",
            "systemd_running=0",
            nvidia_setup(),
            "setup_nvidia",
            "echo configured",
        ]
    )
    proc = subprocess.run(
        ["bash", "-c", harness], env={"PATH": f"{tools}:/usr/bin:/bin"}, capture_output=True, text=True, timeout=30
    )
    asked = calls.read_text().splitlines()
    if accepted:
        assert (proc.returncode, proc.stdout.splitlines()[-1]) == (0, "configured"), proc.stderr
        assert f"NVIDIA container toolkit {version} (at least 1.17.8: CVE-2025-23266 fixed)" in proc.stdout
    else:
        assert proc.returncode == 1 and "configured" not in proc.stdout, proc.stdout
        assert f"nvidia-container-toolkit {version or 'of unknown version'} is older than 1.17.8" in proc.stderr
        assert "CVE-2025-23266" in proc.stderr
        assert "apt-get install --only-upgrade nvidia-container-toolkit" in proc.stderr  # what to do
        assert asked == ["--version"]  # never "runtime configure"
