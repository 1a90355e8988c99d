#!/usr/bin/env bash
# Build the worker agent's container image with no container registry, in two steps:
#   runplane/python-base:bookworm  Debian 12 minbase with python3 + venv + CA certificates,
#                                  made with debootstrap and `docker import`
#   runplane/agent:local           infra/agent-image/Dockerfile on that base (pip from PyPI)
# Idempotent: the base is kept once built; the agent image is kept while it was built from the
# same sources (a hash of pyproject.toml, README.md, runplane/, worker_agent/, functions/ and
# the Dockerfile, stored as the image label io.runplane.source-hash).
#
# Usage: scripts/build-agent-image.sh [--force] [--force-agent] [--no-host-cas]
#   --force        rebuild both images, the agent's without Docker's layer cache
#   --force-agent  rebuild the agent image only, without Docker's layer cache
#   --no-host-cas  do not copy this host's local CAs (/usr/local/share/ca-certificates) into the
#                  base image (they are what lets pip reach PyPI behind a TLS-inspecting proxy)
# Environment: RUNPLANE_BASE_IMAGE, RUNPLANE_AGENT_IMAGE (tags), DEBIAN_MIRROR (default: this
# host's apt mirror, else http://deb.debian.org/debian).
# Needs root (debootstrap), a running Docker engine, the Debian mirror and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${RUNPLANE_BASE_IMAGE:-runplane/python-base:bookworm}
AGENT_IMAGE=${RUNPLANE_AGENT_IMAGE:-runplane/agent:local}
SUITE=bookworm
DOCKERFILE=infra/agent-image/Dockerfile
force_base=0
force_agent=0
host_cas=1
for arg in "$@"; do
  case $arg in
    --force) force_base=1; force_agent=1 ;;
    --force-agent) force_agent=1 ;;
    --no-host-cas) host_cas=0 ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "build-agent-image: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done

t_start=$SECONDS
mkdir -p /run/lock
exec 8>/run/lock/runplane-build-agent-image.lock
flock 8 # one build at a time: a second waits, then finds the images built
say() { echo "build-agent-image: $*"; }
have_image() { docker image inspect "$1" >/dev/null 2>&1; }

docker info >/dev/null 2>&1 || { say "the Docker engine does not answer (scripts/start-docker.sh starts one)"; exit 1; }

debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
      /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $2 ~ /^https?:/ && $2 !~ /security/ && $3 == "'"$SUITE"'" { print $2; exit }' \
      /etc/apt/sources.list)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

# Unmount whatever debootstrap left mounted under $1 (it mounts /proc, /sys and, in a
# container, device nodes), deepest first.
unmount_under() {
  local mnt
  while read -r mnt; do
    umount -l "$mnt" 2>/dev/null || true
  done < <(awk -v r="$1" 'index($2, r "/") == 1 { print $2 }' /proc/mounts | sort -r)
}

# Remove a build root without ever descending into a mount.
remove_root() {
  [ -d "$1" ] || return 0
  unmount_under "$1"
  rm -rf --one-file-system "$1"
}

build_base() {
  if have_image "$BASE_IMAGE" && [ $force_base -eq 0 ]; then
    say "[base] $BASE_IMAGE exists, kept"
    return
  fi
  [ "$(id -u)" -eq 0 ] || { say "[base] debootstrap needs root"; exit 1; }
  if ! command -v debootstrap >/dev/null; then
    say "[base] installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq debootstrap debian-archive-keyring >/dev/null
  fi
  local t0=$SECONDS mirror root log
  mirror=$(debian_mirror)
  root=$(mktemp -d /var/tmp/runplane-base.XXXXXX)
  log=$(mktemp /var/tmp/runplane-base-log.XXXXXX)
  # shellcheck disable=SC2064 # expand now: the paths are local to this function
  trap "remove_root '$root'; rm -f '$log'" EXIT
  say "[base] debootstrap --variant=minbase $SUITE from $mirror (about a minute)"
  if ! debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$root" "$mirror" >"$log" 2>&1; then
    tail -n 30 "$log"
    say "[base] debootstrap failed (log above)"
    exit 1
  fi
  say "[base] debootstrap done in $((SECONDS - t0)) s"
  # venv must work in minbase: python3-venv brings ensurepip and its bundled pip wheel.
  chroot "$root" python3 -m venv /tmp/venv-check >/dev/null
  chroot "$root" /tmp/venv-check/bin/python -m pip --version >/dev/null
  rm -rf "$root/tmp/venv-check"
  if [ $host_cas -eq 1 ] && compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    say "[base] adding this host's local CAs: $(cd /usr/local/share/ca-certificates && echo ./*.crt)"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null 2>&1
  fi
  unmount_under "$root"
  rm -rf "${root:?}"/var/cache/apt/archives/*.deb "${root:?}"/var/lib/apt/lists/* "${root:?}"/tmp/* "${root:?}"/var/log/*.log
  say "[base] importing $(du -sh --one-file-system "$root" | cut -f1) as $BASE_IMAGE"
  tar --numeric-owner -C "$root" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'ENV LANG=C.UTF-8' \
    -c 'CMD ["/bin/bash"]' \
    -m "Debian $SUITE minbase with python3, python3-venv and ca-certificates" \
    - "$BASE_IMAGE" >/dev/null
  remove_root "$root"
  rm -f "$log"
  trap - EXIT
  say "[base] built $BASE_IMAGE in $((SECONDS - t0)) s"
}

source_hash() {
  {
    sha256sum pyproject.toml README.md "$DOCKERFILE"
    find runplane worker_agent functions -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 |
      sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
}

build_agent() {
  local hash current old="" t0=$SECONDS log cache=()
  hash=$(source_hash)
  have_image "$AGENT_IMAGE" && old=$(docker image inspect -f '{{ .Id }}' "$AGENT_IMAGE")
  if have_image "$AGENT_IMAGE" && [ $force_agent -eq 0 ]; then
    current=$(docker image inspect -f '{{ index .Config.Labels "io.runplane.source-hash" }}' "$AGENT_IMAGE" 2>/dev/null)
    if [ "$current" = "$hash" ]; then
      say "[agent] $AGENT_IMAGE is up to date (sources $hash), kept"
      return
    fi
    say "[agent] $AGENT_IMAGE was built from other sources (${current:-unknown}), rebuilding"
  fi
  # Without the buildx plugin, newer Docker CLIs need to be told to use the classic builder.
  if ! docker buildx version >/dev/null 2>&1; then export DOCKER_BUILDKIT=0; fi
  export BUILDKIT_PROGRESS=plain
  [ $force_agent -eq 1 ] && cache=(--no-cache)
  log=$(mktemp /var/tmp/runplane-agent-build.XXXXXX)
  say "[agent] docker build -f $DOCKERFILE -t $AGENT_IMAGE (pip install from PyPI)"
  if ! docker build "${cache[@]}" --network host --build-arg "BASE=$BASE_IMAGE" --label "io.runplane.source-hash=$hash" \
    -f "$DOCKERFILE" -t "$AGENT_IMAGE" . 2>&1 | tee "$log" |
    { grep --line-buffered -E '^(Step [0-9]+/[0-9]+ : |#[0-9]+ \[)' | sed -u 's/^/  /' || true; }; then
    tail -n 40 "$log"
    rm -f "$log"
    say "[agent] docker build failed (log above)"
    exit 1
  fi
  rm -f "$log"
  # The image it replaces would linger untagged (hundreds of MB a build): remove it.
  if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{ .Id }}' "$AGENT_IMAGE")" ]; then
    docker image rm "$old" >/dev/null 2>&1 || true
  fi
  say "[agent] built $AGENT_IMAGE in $((SECONDS - t0)) s ($(docker image inspect -f '{{ .Size }}' "$AGENT_IMAGE" |
    awk '{ printf "%d MB", $1 / 1e6 }'))"
}

build_base
build_agent
say "done in $((SECONDS - t_start)) s"
