#!/usr/bin/env bash
# Install the runplane worker agent on a stock Ubuntu 22.04/24.04 or Amazon Linux 2023 machine
# (GPU AMIs included), as root:
#   - Docker (docker.io / docker), nftables and Python >= 3.11 with venv, when missing;
#   - /etc/runplane/host-firewall.nft: host rules that keep runs on the agent's bridge
#     (runplane-runs, device rp-runs0) from the cloud's metadata services and this host, loaded
#     now and by the unit at each start; a second layer under the agent's per-run rules;
#   - /opt/runplane: a venv with `pip install runplane` (or the wheel or version you name);
#   - /etc/runplane/agent.env: the agent's settings (kept and merged on re-runs);
#   - runplane-agent.service (from beside this script), enabled, and started once a pool is set;
#   - on a machine with nvidia-smi: NVIDIA's container toolkit, only if the configured package
#     repositories have it (otherwise it says what to do), and only version 1.17.8 or newer: with
#     an older one it stops with an error and says what to do (CVE-2025-23266: an image's own
#     LD_PRELOAD runs as root on the host through the toolkit's hook).
# The agent runs as root: it needs the Docker socket, which is root-equivalent anyway, and it
# must read and remove whatever files runs leave in their output directories.
#
# Usage: install.sh [options] [KEY=VALUE ...]
#   --package SPEC          what pip installs: runplane==0.2.0, a path to a wheel (e.g.
#                           /root/runplane-0.2.0-py3-none-any.whl) or runplane, the default when
#                           nothing is installed yet (else what is installed is kept)
#                                                             [env RUNPLANE_PACKAGE]
#   --reinstall             run pip again even if the same SPEC was installed before
#   --pool NAME             pool to serve                     (RUNPLANE_AGENT_POOL)
#   --prefix PREFIX         the stack's resource prefix       (RUNPLANE_PREFIX)
#   --region REGION         the stack's region                (RUNPLANE_AWS_REGION; default on EC2:
#                           this instance's region)
#   --pools FILE|TEXT       the stack's pools config (YAML or JSON), stored as
#                           /etc/runplane/pools.yaml          (RUNPLANE_POOLS)
#   --slots N               runs at the same time             (RUNPLANE_AGENT_SLOTS)
#   --work-dir DIR          default /var/lib/runplane         (RUNPLANE_AGENT_WORK_DIR)
#   --lease-seconds S       default 30                        (RUNPLANE_AGENT_LEASE_SECONDS)
#   --heartbeat-seconds S   default 5                         (RUNPLANE_AGENT_HEARTBEAT_SECONDS)
#   --preemption-watch W    ec2 (default on EC2), azure, an http(s) URL, or none
#   --no-start              install and enable, but do not start or restart the agent (baking)
#   KEY=VALUE               any other setting: RUNPLANE_AGENT_<FLAG> (see runplane-agent --help),
#                           a stack setting (RUNPLANE_BUCKET, ...) or e.g. HTTPS_PROXY
# Variables RUNPLANE_AGENT_* and the stack's RUNPLANE_* settings in the environment count like
# KEY=VALUE. Precedence: options and KEY=VALUE, then the environment, then agent.env as it is.
# RUNPLANE_INSTALL_ON_EC2=yes|no overrides the EC2 detection (DMI vendor "Amazon EC2"), which
# sets the defaults --preemption-watch ec2 and the region from instance metadata.
set -euo pipefail

ENV_DIR=/etc/runplane
ENV_FILE=$ENV_DIR/agent.env
POOLS_FILE=$ENV_DIR/pools.yaml
VENV=/opt/runplane
UNIT_NAME=runplane-agent.service
UNIT_PATH=/etc/systemd/system/$UNIT_NAME
SHARE=/usr/local/share/runplane
STACK_KEYS="RUNPLANE_PREFIX RUNPLANE_RUNS_TABLE RUNPLANE_WORKERS_TABLE RUNPLANE_TOKENS_TABLE RUNPLANE_POOLS_TABLE RUNPLANE_QUOTAS_TABLE RUNPLANE_SECRETS_TABLE RUNPLANE_SESSIONS_TABLE
RUNPLANE_BUCKET RUNPLANE_AWS_REGION RUNPLANE_AWS_ENDPOINT_URL RUNPLANE_POOLS"

say() { echo "runplane-install: $*"; }
die() { echo "runplane-install: error: $*" >&2; exit 1; }

# -- settings: KEY -> VALUE, in first-seen order --------------------------------------------
declare -A SETTINGS=()
ORDER=()
set_key() {
  [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "not a variable name: $1"
  [[ $2 != *$'\n'* ]] || die "$1: values cannot span lines"
  [[ -v SETTINGS[$1] ]] || ORDER+=("$1")
  SETTINGS[$1]=$2
}
del_key() {
  local k kept=()
  unset "SETTINGS[$1]"
  for k in "${ORDER[@]}"; do [ "$k" = "$1" ] || kept+=("$k"); done
  ORDER=("${kept[@]}")
}
has_key() { [[ -n ${SETTINGS[$1]:-} ]]; }

unquote() {
  local v=$1
  if [[ ${#v} -ge 2 && $v == \"*\" ]]; then
    v=${v:1:${#v}-2}
    v=${v//\\\"/\"}
    v=${v//\\\\/\\}
  elif [[ ${#v} -ge 2 && $v == \'*\' ]]; then
    v=${v:1:${#v}-2}
  fi
  printf '%s' "$v"
}

quote() {
  local v=$1
  if [[ $v =~ ^[A-Za-z0-9_./:,@%+=-]*$ ]]; then
    printf '%s' "$v"
  else
    v=${v//\\/\\\\}
    v=${v//\"/\\\"}
    printf '"%s"' "$v"
  fi
}

read_env_file() {
  local line
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%$'\r'}
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    if [[ $line =~ ^[[:space:]]*(export[[:space:]]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
      set_key "${BASH_REMATCH[2]}" "$(unquote "${BASH_REMATCH[3]}")"
    else
      say "ignoring a line of $1 that is not KEY=VALUE: $line"
    fi
  done <"$1"
}

# -- arguments ------------------------------------------------------------------------------
package=${RUNPLANE_PACKAGE:-}
reinstall=0
start=1
pools_arg=""
declare -A ARGS=()
ARG_ORDER=()
arg_key() { ARGS[$1]=$2; ARG_ORDER+=("$1"); }
while [ $# -gt 0 ]; do
  opt=$1
  case $opt in
    --package | --pool | --prefix | --region | --pools | --slots | --work-dir | --lease-seconds | \
      --heartbeat-seconds | --preemption-watch)
      [ $# -ge 2 ] || die "$opt needs a value"
      value=$2
      shift 2
      case $opt in
        --package) package=$value ;;
        --pool) arg_key RUNPLANE_AGENT_POOL "$value" ;;
        --prefix) arg_key RUNPLANE_PREFIX "$value" ;;
        --region) arg_key RUNPLANE_AWS_REGION "$value" ;;
        --pools) pools_arg=$value ;;
        --slots) arg_key RUNPLANE_AGENT_SLOTS "$value" ;;
        --work-dir) arg_key RUNPLANE_AGENT_WORK_DIR "$value" ;;
        --lease-seconds) arg_key RUNPLANE_AGENT_LEASE_SECONDS "$value" ;;
        --heartbeat-seconds) arg_key RUNPLANE_AGENT_HEARTBEAT_SECONDS "$value" ;;
        --preemption-watch) arg_key RUNPLANE_AGENT_PREEMPTION_WATCH "$value" ;;
      esac
      ;;
    --reinstall) reinstall=1; shift ;;
    --no-start) start=0; shift ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *=*) arg_key "${opt%%=*}" "${opt#*=}"; shift ;;
    *) die "unknown argument $opt (see --help)" ;;
  esac
done

[ "$(id -u)" -eq 0 ] || die "run as root"
mkdir -p /run/lock
exec 9>/run/lock/runplane-install.lock
flock 9

# -- the operating system -------------------------------------------------------------------
[ -r /etc/os-release ] || die "no /etc/os-release: unknown operating system"
# shellcheck disable=SC1091
. /etc/os-release
case " ${ID:-} ${ID_LIKE:-} " in
  *" debian "* | *" ubuntu "*) PM=apt ;;
  *" amzn "* | *" fedora "* | *" rhel "* | *" centos "*) PM=dnf ;;
  *) die "unsupported operating system ${PRETTY_NAME:-$ID} (Ubuntu, Debian or Amazon Linux 2023 expected)" ;;
esac
say "operating system: ${PRETTY_NAME:-$ID} (packages: $PM)"
systemd_running=0
[ -d /run/systemd/system ] && systemd_running=1

apt_updated=0
pkg_install() {
  say "installing packages: $*"
  if [ "$PM" = apt ]; then
    export DEBIAN_FRONTEND=noninteractive
    if [ $apt_updated -eq 0 ]; then apt-get update -qq; apt_updated=1; fi
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  else
    dnf install -y -q "$@" >/dev/null
  fi
}
pkg_available() {
  if [ "$PM" = apt ]; then
    export DEBIAN_FRONTEND=noninteractive
    if [ $apt_updated -eq 0 ]; then apt-get update -qq; apt_updated=1; fi
    local candidate
    candidate=$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2 }')
    [ -n "$candidate" ] && [ "$candidate" != "(none)" ]
  else
    dnf -q list --available "$1" >/dev/null 2>&1 || rpm -q "$1" >/dev/null 2>&1
  fi
}

# -- Docker ---------------------------------------------------------------------------------
if ! command -v dockerd >/dev/null; then
  if [ "$PM" = apt ]; then pkg_install docker.io; else pkg_install docker; fi
fi
if [ $systemd_running -eq 1 ]; then
  systemctl enable --now docker.service >/dev/null 2>&1 || systemctl enable --now docker >/dev/null
fi

# -- nftables: the agent closes each networked run's namespace off with nft ------------------
# Without nft the agent takes no runs that ask for a network (it says so in its worker record).
command -v nft >/dev/null || pkg_install nftables
FIREWALL_FILE=$ENV_DIR/host-firewall.nft
mkdir -p "$ENV_DIR"
cat >"$FIREWALL_FILE.tmp" <<'NFT'
# Written by runplane's install.sh; loaded by runplane-agent.service (ExecStartPre) at each start.
# A second layer under the rules the agent installs inside each networked run's own network
# namespace (the tested guarantee): traffic from runs on the agent's bridge (Docker network
# runplane-runs, device rp-runs0) never reaches the cloud's metadata services (nor any other
# link-local address), nor this host.
table inet runplane_host
delete table inet runplane_host
table inet runplane_host {
	chain forward {
		type filter hook forward priority filter - 10; policy accept;
		iifname "rp-runs0" ip daddr { 169.254.169.254, 169.254.170.2, 168.63.129.16 } reject with icmpx type admin-prohibited
		iifname "rp-runs0" ip daddr 169.254.0.0/16 reject with icmpx type admin-prohibited
		iifname "rp-runs0" ip6 daddr fd00:ec2::254 reject with icmpx type admin-prohibited
	}
	chain input {
		type filter hook input priority filter - 10; policy accept;
		iifname "rp-runs0" icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept
		iifname "rp-runs0" reject with icmpx type admin-prohibited
	}
}
NFT
mv "$FIREWALL_FILE.tmp" "$FIREWALL_FILE"
nft -f "$FIREWALL_FILE" 2>/dev/null || say "note: could not load $FIREWALL_FILE now; the agent's unit loads it at start"

# -- Python >= 3.11 with venv ---------------------------------------------------------------
python_ok() { "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
find_python() {
  local c
  for c in python3.13 python3.12 python3.11 python3; do
    if command -v "$c" >/dev/null && python_ok "$(command -v "$c")"; then command -v "$c"; return 0; fi
  done
  return 1
}
if ! PY=$(find_python); then
  if [ "$PM" = apt ]; then
    if command -v python3 >/dev/null && python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      pkg_install python3-venv "python3.$(python3 -c 'import sys; print(sys.version_info[1])')-venv"
    else
      pkg_install python3.11 python3.11-venv # Ubuntu 22.04: universe
    fi
  else
    pkg_install python3.11 python3.11-pip
  fi
  PY=$(find_python) || die "no Python 3.11 or newer with venv after installing it"
fi
say "python: $PY ($("$PY" -c 'import platform; print(platform.python_version())'))"

# -- the agent in /opt/runplane -------------------------------------------------------------
marker=$VENV/.runplane-package
package_changed=0
if [ -z "$package" ] && [ $reinstall -eq 0 ] && [ -x $VENV/bin/runplane-agent ]; then
  say "keeping the runplane in $VENV ($(cat "$marker" 2>/dev/null || echo "installed before"))"
else
  package=${package:-runplane}
  want=$package
  if [ -f "$package" ]; then
    package=$(readlink -f "$package")
    want="$package $(sha256sum "$package" | cut -d' ' -f1)"
  fi
  if [ $reinstall -eq 1 ] || [ ! -x $VENV/bin/runplane-agent ] || [ "$(cat "$marker" 2>/dev/null)" != "$want" ]; then
    [ -x $VENV/bin/python ] || "$PY" -m venv $VENV
    say "pip install $package into $VENV"
    # "runplane[agent]": the agent's extra, for whichever runplane $package names (a version, a wheel)
    if ! $VENV/bin/python -m pip install -q --disable-pip-version-check --upgrade "$package" "runplane[agent]"; then
      die "pip install $package failed (name a wheel with --package PATH if runplane is not on your index)"
    fi
    printf '%s\n' "$want" >"$marker"
    package_changed=1
  else
    say "$package already installed in $VENV"
  fi
fi
$VENV/bin/runplane-agent --help >/dev/null || die "$VENV/bin/runplane-agent does not start"

# -- settings: /etc/runplane/agent.env ------------------------------------------------------
on_ec2() {
  case ${RUNPLANE_INSTALL_ON_EC2:-auto} in yes | 1 | true) return 0 ;; no | 0 | false) return 1 ;; esac
  grep -qs 'Amazon EC2' /sys/devices/virtual/dmi/id/sys_vendor /sys/devices/virtual/dmi/id/board_vendor ||
    grep -qsi '^ec2' /sys/hypervisor/uuid
}
imds() {
  local token
  token=$(curl -fsS -m 2 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' \
    http://169.254.169.254/latest/api/token 2>/dev/null) || token=""
  curl -fsS -m 2 ${token:+-H "X-aws-ec2-metadata-token: $token"} "http://169.254.169.254/latest/$1" 2>/dev/null
}

mkdir -p "$ENV_DIR"
chmod 0755 "$ENV_DIR"
# what the file sets, without comments: a rewrite that only adds comments changes nothing
settings_of() { grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$1" 2>/dev/null || true; }
old_env=$(settings_of "$ENV_FILE")
[ -f "$ENV_FILE" ] && read_env_file "$ENV_FILE"
for key in $STACK_KEYS $(compgen -e | grep '^RUNPLANE_AGENT_' || true); do
  [ -n "${!key:-}" ] && set_key "$key" "${!key}"
done
for key in "${ARG_ORDER[@]}"; do set_key "$key" "${ARGS[$key]}"; done
if [ -n "$pools_arg" ]; then
  if [ -f "$pools_arg" ]; then
    [ "$(readlink -f "$pools_arg")" = "$POOLS_FILE" ] || install -m 0644 "$pools_arg" "$POOLS_FILE"
  else
    printf '%s\n' "$pools_arg" >"$POOLS_FILE"
    chmod 0644 "$POOLS_FILE"
  fi
  set_key RUNPLANE_POOLS "$POOLS_FILE"
fi
has_key RUNPLANE_AGENT_WORK_DIR || set_key RUNPLANE_AGENT_WORK_DIR /var/lib/runplane
has_key RUNPLANE_AGENT_LEASE_SECONDS || set_key RUNPLANE_AGENT_LEASE_SECONDS 30
has_key RUNPLANE_AGENT_HEARTBEAT_SECONDS || set_key RUNPLANE_AGENT_HEARTBEAT_SECONDS 5
if on_ec2; then
  has_key RUNPLANE_AGENT_PREEMPTION_WATCH || set_key RUNPLANE_AGENT_PREEMPTION_WATCH ec2
  if ! has_key RUNPLANE_AWS_REGION && command -v curl >/dev/null; then
    region=$(imds meta-data/placement/region || true)
    [ -n "$region" ] && set_key RUNPLANE_AWS_REGION "$region"
  fi
fi
[ "${SETTINGS[RUNPLANE_AGENT_PREEMPTION_WATCH]:-}" = none ] && del_key RUNPLANE_AGENT_PREEMPTION_WATCH
has_key RUNPLANE_AGENT_ID && say "note: RUNPLANE_AGENT_ID is overridden by the unit's --id %H (the host name)"

# Keys the installed agent does not know are kept, with a warning.
help_text=$(COLUMNS=10000 $VENV/bin/runplane-agent --help 2>/dev/null || true)
for key in "${ORDER[@]}"; do
  if [[ $key == RUNPLANE_AGENT_* ]] && [[ $help_text != *"env $key]"* ]]; then
    say "warning: $key is not a flag of this runplane-agent (see runplane-agent --help)"
  fi
done

new_env="# runplane worker agent settings, read by $UNIT_NAME (written by install.sh; re-run it or edit,
# then: systemctl restart runplane-agent). RUNPLANE_AGENT_<FLAG> is the agent's --<flag>.
"
for key in "${ORDER[@]}"; do
  new_env+="$key=$(quote "${SETTINGS[$key]}")"$'\n'
done
umask 077
printf '%s' "$new_env" >"$ENV_FILE.tmp"
chmod 0640 "$ENV_FILE.tmp"
mv "$ENV_FILE.tmp" "$ENV_FILE"
umask 022
env_changed=0
[ "$old_env" = "$(settings_of "$ENV_FILE")" ] || env_changed=1
say "settings in $ENV_FILE: ${ORDER[*]}"
work_dir=${SETTINGS[RUNPLANE_AGENT_WORK_DIR]}
mkdir -p "$work_dir"
chmod 0755 "$work_dir"
case $work_dir in
  /tmp/* | /var/tmp/* | /home/*) say "warning: $work_dir is hidden from the Docker engine by the unit's PrivateTmp/ProtectHome" ;;
esac

# -- GPUs: NVIDIA container toolkit ---------------------------------------------------------
# Releases before 1.17.8 let an image's own ENV LD_PRELOAD reach host root through the toolkit's
# createContainer hook (CVE-2025-23266, NVIDIA security bulletin of July 2025): never configure one.
NVIDIA_TOOLKIT_MIN=1.17.8
version_at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }
check_nvidia_toolkit() {
  local version
  version=$(nvidia-ctk --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n 1) || version=""
  if [ -z "$version" ] || ! version_at_least "$version" "$NVIDIA_TOOLKIT_MIN"; then
    die "nvidia-container-toolkit ${version:-of unknown version} is older than $NVIDIA_TOOLKIT_MIN, whose hook lets an
  image's own LD_PRELOAD run as root on this host (CVE-2025-23266): not configuring it, and stopping
  before the agent's unit is installed or (re)started (an agent already running here keeps running:
  'systemctl stop runplane-agent' hands its runs back). Upgrade the toolkit from NVIDIA's repository
  ('apt-get install --only-upgrade nvidia-container-toolkit', or 'dnf upgrade nvidia-container-toolkit';
  add the repository as the Container Toolkit install guide shows if it is missing), restart Docker,
  then run this script again."
  fi
  NVIDIA_TOOLKIT_VERSION=$version
}
setup_nvidia() {
  command -v nvidia-smi >/dev/null || return 0
  if ! nvidia-smi -L >/dev/null 2>&1; then
    say "warning: nvidia-smi is here but does not list GPUs (driver not loaded?); runs cannot get GPUs yet"
  fi
  if ! command -v nvidia-ctk >/dev/null; then
    if pkg_available nvidia-container-toolkit; then
      pkg_install nvidia-container-toolkit
    else
      say "GPUs found, but nvidia-container-toolkit is not in this machine's package repositories."
      say "  Add NVIDIA's repository as its install guide shows (Container Toolkit, 'Installing with"
      say "  Apt' or 'with Yum or Dnf'), or use an AMI that ships it (AWS Deep Learning AMIs do), then"
      say "  run this script again. Until then GPU runs fail with reason gpu_unavailable."
      return 0
    fi
  fi
  check_nvidia_toolkit
  if ! grep -qs '"nvidia"' /etc/docker/daemon.json; then
    say "registering the NVIDIA runtime with Docker"
    nvidia-ctk runtime configure --runtime=docker >/dev/null
    if [ $systemd_running -eq 1 ]; then systemctl restart docker.service; fi
  fi
  say "NVIDIA container toolkit $NVIDIA_TOOLKIT_VERSION (at least $NVIDIA_TOOLKIT_MIN: CVE-2025-23266 fixed)"
}
setup_nvidia

# -- the systemd unit -----------------------------------------------------------------------
here=$(dirname "$(readlink -f "$0")")
[ -f "$here/$UNIT_NAME" ] || die "$UNIT_NAME must be beside this script ($here)"
mkdir -p "$SHARE"
if [ "$here" != "$SHARE" ]; then
  install -m 0644 "$here/$UNIT_NAME" "$SHARE/$UNIT_NAME"
  install -m 0755 "$here/install.sh" "$SHARE/install.sh"
fi
ln -sf "$SHARE/install.sh" /usr/local/sbin/runplane-install
unit_changed=0
if ! cmp -s "$SHARE/$UNIT_NAME" "$UNIT_PATH"; then
  install -m 0644 "$SHARE/$UNIT_NAME" "$UNIT_PATH"
  unit_changed=1
fi
if [ $systemd_running -eq 1 ]; then
  systemctl daemon-reload
fi
systemctl enable "$UNIT_NAME" >/dev/null 2>&1 || die "systemctl enable $UNIT_NAME failed"

if [ $systemd_running -eq 0 ]; then
  say "systemd is not running here: $UNIT_NAME is enabled for the next boot"
elif [ $start -eq 0 ]; then
  say "$UNIT_NAME enabled, not started (--no-start)"
elif ! has_key RUNPLANE_AGENT_POOL; then
  say "$UNIT_NAME enabled, not started: set RUNPLANE_AGENT_POOL in $ENV_FILE (or --pool), then"
  say "  systemctl start runplane-agent"
elif systemctl is-active --quiet "$UNIT_NAME"; then
  if [ $((package_changed + env_changed + unit_changed)) -gt 0 ]; then
    say "restarting $UNIT_NAME (its runs are handed back to their queues)"
    systemctl restart "$UNIT_NAME"
  else
    say "$UNIT_NAME is running and unchanged"
  fi
else
  systemctl reset-failed "$UNIT_NAME" >/dev/null 2>&1 || true
  systemctl start "$UNIT_NAME"
  say "started $UNIT_NAME as worker $(hostname) on pool ${SETTINGS[RUNPLANE_AGENT_POOL]}"
fi
say "done (logs: journalctl -u runplane-agent)"
