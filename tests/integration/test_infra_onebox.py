"""Static checks of the one-machine service files in infra/onebox: the systemd unit verifies and
keeps the agents it started through a restart; install.sh parses, passes shellcheck, refuses to
run without root, and its dry run (into a temporary root) says what it would install and changes
nothing; every option the unit passes is one ``runplane serve`` takes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.test_infra_ami import tool, unit_sections

ONEBOX = ROOT / "infra" / "onebox"
UNIT = ONEBOX / "runplane.service"
INSTALL = ONEBOX / "install.sh"
BINARY = "/opt/runplane/bin/runplane"


def values(key: str) -> list[str]:
    return [v for entries in unit_sections(UNIT.read_text()).values() for k, v in entries if k == key]


def test_unit_passes_systemd_analyze_verify(tmp_path):
    stub = tmp_path / "runplane"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    assert UNIT.read_text().count(BINARY) == 1
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(BINARY, str(stub)))
    (tmp_path / "docker.service").write_text(f"[Unit]\nDescription=stub\n[Service]\nExecStart={stub}\n")
    proc = subprocess.run([tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True, timeout=60)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert [line for line in output.splitlines() if UNIT.name in line] == [], output


def test_unit_serves_the_state_directory_and_a_restart_leaves_the_agents_running():
    assert set(unit_sections(UNIT.read_text())) == {"Unit", "Service", "Install"}
    (exec_start,) = values("ExecStart")
    argv = exec_start.split()
    assert argv[:2] == [BINARY, "serve"]
    assert argv[argv.index("--state-dir") + 1] == "/var/lib/runplane"
    help_text = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "runplane"), "serve", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for flag in [a for a in argv[2:] if a.startswith("--")]:
        assert flag in help_text, flag
    assert values("Type") == ["simple"]
    assert values("KillMode") == ["process"]  # only the service: its agents and their runs go on
    assert values("Restart") == ["on-failure"]
    assert values("RestartPreventExitStatus") == ["2"]  # a usage error (runplane's exit code 2)
    assert values("StateDirectory") == ["runplane"]
    assert values("StateDirectoryMode") == ["0700"]
    assert values("UMask") == ["0077"]
    assert "docker.service" in values("Requires")
    assert values("WantedBy") == ["multi-user.target"]
    # the agents mount their work dirs where dockerd sees them: no mount namespace of the service's own
    for key in ("PrivateTmp", "ProtectSystem", "ProtectHome", "PrivateDevices", "ReadWritePaths", "PrivateMounts"):
        assert values(key) in ([], ["no"]), key
    assert "AF_UNIX" in values("RestrictAddressFamilies")[0].split()  # the Docker socket


def test_install_sh_parses_and_passes_shellcheck():
    assert subprocess.run(["bash", "-n", str(INSTALL)], capture_output=True, timeout=30).returncode == 0
    proc = subprocess.run([tool("shellcheck"), str(INSTALL)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def dry_run(root, *args: str) -> str:
    proc = subprocess.run(
        ["bash", str(INSTALL), "--dry-run", "--root", str(root), *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_a_dry_run_into_a_root_says_what_it_installs_and_changes_nothing(tmp_path):
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools: []\n")
    root = tmp_path / "root"
    root.mkdir()

    said = dry_run(root, "--listen", "0.0.0.0:8443", "--pools", str(pools))

    assert list(root.iterdir()) == []
    assert f"+ python3 -m venv {root}/opt/runplane" in said
    assert f"+ ln -sfn {BINARY} {root}/usr/local/bin/runplane" in said  # on sudo's PATH
    assert f"-m pip install -q --disable-pip-version-check --upgrade {ROOT}\\[local\\]" in said  # this checkout
    assert f"{UNIT} {root}/etc/systemd/system/runplane.service" in said
    assert f"{pools} {root}/etc/runplane/pools.yaml" in said
    assert "RUNPLANE_SERVE_ARGS=--listen 0.0.0.0:8443 --pools /etc/runplane/pools.yaml" in said
    assert f"+ write {root}/etc/runplane/serve.env (0600):" in said  # it may hold a token
    assert "--listen 0.0.0.0:8443 is not loopback: add --tls-cert FILE --tls-key FILE" in said
    assert f"+ systemctl --root={root} enable runplane.service" in said


def test_a_second_run_keeps_the_settings_unless_told_and_installs_a_version_with_the_extra(tmp_path):
    (tmp_path / "etc" / "runplane").mkdir(parents=True)
    (tmp_path / "etc" / "runplane" / "serve.env").write_text("RUNPLANE_SERVE_ARGS=--listen 127.0.0.1:9000\n")

    said = dry_run(tmp_path, "--package", "runplane==0.2.0")

    assert "keeping " in said and "RUNPLANE_SERVE_ARGS=" not in said
    assert f"+ chmod 0600 {tmp_path}/etc/runplane/serve.env" in said  # an older install's 0644
    assert "is not loopback" not in said
    assert "--upgrade runplane\\[local\\]==0.2.0" in said
    said = dry_run(tmp_path, "--listen", "0.0.0.0:8080")
    assert "sed -i s\\|\\^RUNPLANE_SERVE_ARGS=.\\*\\|RUNPLANE_SERVE_ARGS=--listen\\ 0.0.0.0:8080\\|" in said


def test_a_second_run_given_pools_keeps_the_other_options_and_the_link(tmp_path):
    env = tmp_path / "etc" / "runplane" / "serve.env"
    env.parent.mkdir(parents=True)
    kept = (
        "--listen 0.0.0.0:8443 --tls-cert /etc/runplane/a&b.pem --tls-key /etc/runplane/key.pem "
        "--public-url=https://gpu1.lab:8443"
    )
    env.write_text(f"# the lab's\nRUNPLANE_SERVE_ARGS={kept}\n")
    env.chmod(0o600)
    (tmp_path / "usr" / "local" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "local" / "bin" / "runplane").symlink_to(BINARY)
    pools = tmp_path / "new.yaml"
    pools.write_text("pools: []\n")

    said = dry_run(tmp_path, "--pools", str(pools))

    assert " ln " not in said  # the link is there already
    (command,) = [line for line in said.splitlines() if line.startswith("+ sed -i ")]
    script = subprocess.run(
        ["bash", "-c", f"printf %s {command.removeprefix('+ sed -i ').rsplit(' ', 1)[0]}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    subprocess.run(["sed", "-i", script, str(env)], check=True)  # what it would do, done on the file
    assert env.read_text() == f"# the lab's\nRUNPLANE_SERVE_ARGS={kept} --pools /etc/runplane/pools.yaml\n"
    assert f"(was: RUNPLANE_SERVE_ARGS={kept})" in said
    assert "is not loopback" not in said  # it has TLS

    env.write_text(f"RUNPLANE_SERVE_ARGS={kept} --pools /etc/runplane/pools.yaml\n")
    said = dry_run(tmp_path, "--listen", "10.0.0.5:443")
    assert (
        f"RUNPLANE_SERVE_ARGS={kept.replace('0.0.0.0:8443', '10.0.0.5:443')} --pools /etc/runplane/pools.yaml in"
        in said
    )


def test_a_binary_of_another_runplane_in_usr_local_bin_is_left_alone(tmp_path):
    (tmp_path / "usr" / "local" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "local" / "bin" / "runplane").write_text("#!/bin/sh\n")
    said = dry_run(tmp_path)
    assert " ln " not in said and f"{tmp_path}/usr/local/bin/runplane is not runplane's link: left as it is" in said


@pytest.mark.skipif(os.path.exists("/var/lib/runplane/state.db"), reason="this machine has a runplane service")
def test_the_first_installs_hint_for_more_tokens_works(tmp_path):
    """The installer's hint for more admin tokens, run as printed (on a state directory of the test's)."""
    proc = subprocess.run(["bash", str(INSTALL), "--dry-run", "--no-start"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (hint,) = [line for line in proc.stdout.splitlines() if "makes another admin's" in line]
    command = hint.split("`")[1].replace("/var/lib/runplane", str(tmp_path / "state")).replace("NAME", "bob")
    runplane = str(ROOT / ".venv" / "bin" / "runplane")
    first = [runplane, "token", "create", "--direct", "--state-dir", str(tmp_path / "state"), "--init", "admin"]
    subprocess.run(first, capture_output=True, check=True, timeout=120)

    made = subprocess.run([runplane, *command.split()[1:]], capture_output=True, text=True, timeout=120)

    assert made.returncode == 0, made.stderr
    assert "rp_" in made.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [(["--listen", "nowhere"], "give ADDR:PORT"), (["--pools", "/nonexistent.yaml"], "no such file")],
)
def test_bad_options_are_refused(tmp_path, args, said):
    proc = subprocess.run(
        ["bash", str(INSTALL), "--dry-run", "--root", str(tmp_path), *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert said in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root to run as another user")
def test_it_refuses_to_install_without_root():
    # a copy another user can read: the checkout may sit in a directory only root may enter
    where = Path(tempfile.mkdtemp(prefix="runplane-onebox-"))
    try:
        where.chmod(0o755)
        script = where / "install.sh"
        shutil.copyfile(INSTALL, script)
        script.chmod(0o644)
        proc = subprocess.run(
            ["runuser", "-u", "nobody", "--", "bash", str(script)], capture_output=True, text=True, timeout=60
        )
    finally:
        shutil.rmtree(where)
    assert proc.returncode == 1, proc.stderr
    assert "run it as root" in proc.stderr
