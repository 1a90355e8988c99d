#!/usr/bin/env bash
# Install `runplane serve` as a systemd service on a Debian 12+ or Ubuntu 22.04+ machine, as root:
#   - Docker (docker.io) and Python 3.11+ with venv, when missing;
#   - /opt/runplane: a venv with `pip install 'runplane[local]'` from the checkout this script is
#     in, a wheel, or the package index (--package); its `runplane` linked as /usr/local/bin/runplane
#     (on sudo's PATH), unless another runplane is there;
#   - /etc/runplane/serve.env (0600, root's alone: it may hold RUNPLANE_SERVE_TOKEN): the service's
#     options (RUNPLANE_SERVE_ARGS; kept on re-runs: --listen or --pools given again replaces that
#     option alone, the others there, --tls-cert, --public-url..., stay) and /etc/runplane/pools.yaml;
#   - runplane.service (from beside this script) as /etc/systemd/system/runplane.service, enabled,
#     and (re)started: a restart keeps queued runs queued and running runs running;
#   - on the first install (no /var/lib/runplane/state.db yet): an admin token, printed here once.
# Running it again is safe: it upgrades the package, keeps the settings and the state.
#
# Usage: install.sh [options]
#   --package SPEC     what pip installs: a wheel (runplane-0.2.0-py3-none-any.whl), a checkout
#                      directory, or a version (runplane==0.2.0); default: the checkout this script
#                      is in, else runplane from the package index
#   --listen ADDR:PORT where the API listens (default 127.0.0.1:8080; behind a reverse proxy, keep it)
#   --pools FILE       the pools file (YAML/JSON), copied to /etc/runplane/pools.yaml
#   --no-start         install and enable, but do not start or restart the service
#   --root DIR         write under DIR instead of / (no packages, no token, no start; `systemctl
#                      --root` enables the unit there): to see what it installs, with --dry-run
#   --dry-run          print what it would do, and do nothing
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=""
DRY=0
START=1
package=""
listen=""
pools=""

say() { echo "runplane-install: $*"; }
die() {
  echo "runplane-install: error: $*" >&2
  exit 1
}
# run CMD...: run it, or print it under --dry-run
run() {
  if [ $DRY -eq 1 ]; then
    printf '+'
    printf ' %q' "$@"
    printf '\n'
  else
    "$@"
  fi
}
# put MODE SOURCE DEST: install a file (its directory made 0755)
put() {
  run install -D -m "$1" "$2" "$3"
}

while [ $# -gt 0 ]; do
  case $1 in
    --package) package=${2:?--package needs a value}; shift 2 ;;
    --listen) listen=${2:?--listen needs ADDR:PORT}; shift 2 ;;
    --pools) pools=${2:?--pools needs a file}; shift 2 ;;
    --no-start) START=0; shift ;;
    --root) ROOT=${2:?--root needs a directory}; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (install.sh --help)" ;;
  esac
done

[ $DRY -eq 1 ] || [ "$(id -u)" -eq 0 ] || die "run it as root (sudo $0 ...), or with --dry-run to see what it does"
[ -z "$ROOT" ] || [ -d "$ROOT" ] || die "--root $ROOT: no such directory"
[ -z "$pools" ] || [ -f "$pools" ] || die "--pools $pools: no such file"
if [ -n "$listen" ] && ! [[ $listen =~ ^(\[[0-9A-Fa-f:.]+\]|[0-9A-Za-z.:-]+):[0-9]+$ ]]; then
  die "--listen $listen: give ADDR:PORT, e.g. 127.0.0.1:8080"
fi

VENV=$ROOT/opt/runplane
ETC=$ROOT/etc/runplane
ENV_FILE=$ETC/serve.env
UNIT=$ROOT/etc/systemd/system/runplane.service
STATE=$ROOT/var/lib/runplane

# -- packages: Docker, Python with venv --------------------------------------------------------
if [ -z "$ROOT" ]; then
  wanted=()
  command -v docker >/dev/null 2>&1 || wanted+=(docker.io)
  python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 ||
    wanted+=(python3 python3-venv)
  if [ ${#wanted[@]} -gt 0 ]; then
    run apt-get update -q
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${wanted[@]}"
  fi
fi

# -- the venv ------------------------------------------------------------------------------------
if [ -z "$package" ]; then
  checkout=$(cd "$HERE/../.." && pwd)
  if [ -f "$checkout/pyproject.toml" ] && grep -q '^name = "runplane"' "$checkout/pyproject.toml"; then
    package=$checkout
  else
    package=runplane
  fi
fi
if [ -e "$package" ]; then
  spec="$(readlink -f "$package")[local]" # a wheel or a checkout, with the extra of the stack
elif [[ $package == *==* ]]; then
  spec="${package%%==*}[local]==${package#*==}"
else
  spec="${package}[local]"
fi
[ -x "$VENV/bin/python" ] || run python3 -m venv "$VENV"
say "pip install '$spec' into $VENV"
run "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade "$spec"

LINK=$ROOT/usr/local/bin/runplane
if [ -L "$LINK" ] || [ ! -e "$LINK" ]; then
  [ -d "${LINK%/*}" ] || run install -d -m 0755 "${LINK%/*}"
  [ "$(readlink "$LINK" 2>/dev/null)" = /opt/runplane/bin/runplane ] || run ln -sfn /opt/runplane/bin/runplane "$LINK"
else
  say "warning: $LINK is not runplane's link: left as it is; this install's CLI is /opt/runplane/bin/runplane"
fi

# -- settings --------------------------------------------------------------------------------------
# replaced ARGS: ARGS (serve's options) with --listen and --pools set to those given now, the others kept
replaced() {
  local words=() out=() i=0 w name value
  read -ra words <<<"$1"
  local -A given=()
  [ -z "$listen" ] || given[--listen]=$listen
  [ -z "$pools" ] || given[--pools]=/etc/runplane/pools.yaml
  while [ $i -lt ${#words[@]} ]; do
    w=${words[$i]}
    name=${w%%=*}
    i=$((i + 1))
    if [ -n "${given[$name]+set}" ]; then
      [[ $w == *=* ]] || i=$((i + 1)) # its value, in the next word
      value=${given[$name]}
      [ -z "$value" ] || out+=("$name" "$value")
      given[$name]="" # said once
    else
      out+=("$w")
    fi
  done
  for name in --listen --pools; do
    [ -z "${given[$name]:-}" ] || out+=("$name" "${given[$name]}")
  done
  echo "${out[*]}"
}
if [ -n "$pools" ]; then
  put 0644 "$pools" "$ETC/pools.yaml"
fi
if [ ! -f "$ENV_FILE" ]; then
  args="--listen ${listen:-127.0.0.1:8080}"
  [ -z "$pools" ] && [ ! -f "$ETC/pools.yaml" ] || args="$args --pools /etc/runplane/pools.yaml"
  line="RUNPLANE_SERVE_ARGS=$args"
  say "writing $ENV_FILE"
  text="# runplane serve's options (runplane serve --help); RUNPLANE_AGENT_* lines reach its agents
$line
# How long runs, logs, outputs and uploads are kept (docs/retention.md): JSON in single quotes on a
# line of its own, never in RUNPLANE_SERVE_ARGS (split at spaces). Unset: kept for good.
#RUNPLANE_RETENTION='{\"outputs\": \"30d\", \"logs\": \"30d\", \"runs\": \"180d\", \"uploads\": \"14d\"}'"
  run install -d -m 0755 "$ETC"
  if [ $DRY -eq 1 ]; then
    printf '+ write %s (0600):\n%s\n' "$ENV_FILE" "$text"
  else
    (umask 077 && printf '%s\n' "$text" >"$ENV_FILE")
  fi
elif [ -n "$listen$pools" ]; then
  before=$(sed -n 's/^RUNPLANE_SERVE_ARGS=//p' "$ENV_FILE" | tail -n 1)
  args=$(replaced "$before")
  line="RUNPLANE_SERVE_ARGS=$args"
  say "setting $line in $ENV_FILE (was: RUNPLANE_SERVE_ARGS=$before)"
  run sed -i "s|^RUNPLANE_SERVE_ARGS=.*|$(printf '%s' "$line" | sed 's/[\\|&]/\\&/g')|" "$ENV_FILE"
else
  args=$(sed -n 's/^RUNPLANE_SERVE_ARGS=//p' "$ENV_FILE" | tail -n 1)
  say "keeping $ENV_FILE"
fi
if [ -f "$ENV_FILE" ] && [ "$(stat -c %a "$ENV_FILE")" != 600 ]; then
  run chmod 0600 "$ENV_FILE" # an older install's, 0644
fi
case ${listen:-127.0.0.1}/$args in
  127.* | "[::1]:"* | localhost:* | *--tls-cert* | *--insecure-http*) ;;
  *) say "warning: --listen $listen is not loopback: add --tls-cert FILE --tls-key FILE to RUNPLANE_SERVE_ARGS in $ENV_FILE (or --insecure-http, tokens in clear), else the service refuses to start" ;;
esac

# -- the unit --------------------------------------------------------------------------------------
put 0644 "$HERE/runplane.service" "$UNIT"
put 0644 "$HERE/README.md" "$VENV/share/onebox/README.md"
first=0
[ -f "$STATE/state.db" ] || first=1
if [ -n "$ROOT" ]; then
  run systemctl --root="$ROOT" enable runplane.service
  exit 0
fi
run systemctl daemon-reload
run systemctl enable runplane.service
if [ $first -eq 1 ]; then
  # the operator's way in, printed here rather than into the service's journal
  run install -d -m 0700 "$STATE"
  say "the admin token (shown only now; \`runplane token create --direct --state-dir /var/lib/runplane --scope admin NAME\` makes another admin's, without --scope admin a user's):"
  run "$VENV/bin/runplane" token create --direct --state-dir "$STATE" --init --scope admin admin
fi
if [ $START -eq 1 ]; then
  run systemctl restart runplane.service
  say "runplane is serving on ${listen:-127.0.0.1:8080}: systemctl status runplane, journalctl -u runplane"
else
  say "installed and enabled; start it with: systemctl start runplane"
fi
