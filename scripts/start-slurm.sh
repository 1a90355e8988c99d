#!/usr/bin/env bash
# Start a one-node Slurm on this machine unless it answers: munged, slurmctld, slurmd, and its
# REST API twice, as user slurm: slurmrestd with JWT auth on 127.0.0.1:PORT and slurmrestd with
# local auth on a unix socket (jobs submitted there run as user slurm). Installs the Debian
# packages if missing; a second call finds everything running and only renews the token.
# Writes next to the conf, for tests and the local stack:
#   DIR/rest.url        http://127.0.0.1:PORT
#   DIR/rest-unix.url   unix:DIR/rest/slurmrestd.sock
#   DIR/rest.token      a JWT for user root (mode 0600), made by `scontrol token` on every call
# Prints the SLURM_CONF to use as its last line.
# Usage: scripts/start-slurm.sh [DIR]   (default: /var/lib/runplane-slurm; port: $RUNPLANE_SLURM_REST_PORT or 6820)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-/var/lib/runplane-slurm}
port=${RUNPLANE_SLURM_REST_PORT:-6820}
conf=$dir/etc/slurm.conf
key=$dir/etc/jwt_hs256.key
rest=$dir/rest
socket=$rest/slurmrestd.sock
token_lifespan=$((7 * 24 * 3600))
export SLURM_CONF=$conf
packages=(slurm-wlm slurm-client slurm-wlm-jwt-plugin slurmrestd munge curl)
if ! dpkg -s "${packages[@]}" >/dev/null 2>&1; then
  echo "start-slurm: installing ${packages[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${packages[@]}" >/dev/null
fi
mkdir -p "$dir/etc" "$dir/log"
# one caller at a time: test sessions may start side by side (daemons get the lock's fd closed)
exec 9>"$dir/.start.lock"
flock 9

# The JWT signing key: made once, readable by slurm only (slurmctld runs as root here).
if [ ! -s "$key" ]; then (umask 077 && head -c 32 /dev/urandom >"$key.new" && mv "$key.new" "$key"); fi
chown slurm:slurm "$key" && chmod 0600 "$key"

cpus=$(nproc)
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
{
  sed -e "s#@DIR@#$dir#g" -e "s#@CPUS@#$cpus#g" -e "s#@MEMORY@#$memory#g" "$here/slurm/slurm.conf.in"
  echo "# JWT as a second way in, for slurmrestd (munge stays the default)"
  echo "AuthAltTypes=auth/jwt"
  echo "AuthAltParameters=jwt_key=$key"
} >"$conf.new"

node_up() { sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|alloc'; }
# stop_pid FILE: end the daemon whose pid FILE holds, and wait until it is gone.
stop_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$1"
}
# alive FILE NAME: the pid in FILE is a running NAME (not a zombie nobody reaped).
alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] &&
    ! grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}

if cmp -s "$conf.new" "$conf" && node_up; then
  rm -f "$conf.new"
else
  mv "$conf.new" "$conf"
  # a new configuration: every daemon starts over with it
  stop_pid "$rest/jwt.pid"; stop_pid "$rest/unix.pid"
  stop_pid "$dir/slurmd.pid"; stop_pid "$dir/slurmctld.pid"
  rm -rf "$dir/spool"; mkdir -p "$dir/spool/ctld" "$dir/spool/d"
  mkdir -p /run/munge /var/log/munge && chown munge:munge /run/munge /var/log/munge
  [ -f /etc/munge/munge.key ] || { /usr/sbin/mungekey -c; chown munge:munge /etc/munge/munge.key; }
  pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged 9>&-
  /usr/sbin/slurmctld -f "$conf" 9>&-
  /usr/sbin/slurmd -f "$conf" -N localhost 9>&-
  for _ in $(seq 1 100); do node_up && break; sleep 0.1; done
  if ! node_up; then
    echo "start-slurm: the node did not come up; see $dir/log" >&2
    tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    exit 1
  fi
fi

# A fresh token on every call (tests read it; it lives a week).
token=$(scontrol token username=root lifespan=$token_lifespan)
token=${token#SLURM_JWT=}
(umask 077 && printf '%s\n' "$token" >"$dir/rest.token.new" && mv "$dir/rest.token.new" "$dir/rest.token")

# ping URL [TOKEN]: slurmrestd answers, and with a token slurmctld accepts the JWT too
# (curl -f: an HTTP error status, as a refused token gets, is a failure).
ping() {
  local args=(-fsS -o /dev/null --max-time 5) target=$1/slurm/v0.0.38/ping
  if [[ $1 == unix:* ]]; then args+=(--unix-socket "${1#unix:}"); target=http://localhost/slurm/v0.0.38/ping; fi
  if [ -n "${2:-}" ]; then args+=(-H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $2"); fi
  curl "${args[@]}" "$target" 2>/dev/null
}
tcp_url=http://127.0.0.1:$port
jwt_ok() { ping "$tcp_url" "$token"; }
unix_ok() { ping "unix:$socket"; }

# slurmrestd refuses to run as root: it runs as user slurm, its own process (setpriv execs).
# One that runs but does not answer (on its way out, say) is replaced.
mkdir -p "$rest" && chown slurm:slurm "$rest" && chmod 0750 "$rest"
if ! { alive "$rest/jwt.pid" slurmrestd && jwt_ok; }; then
  stop_pid "$rest/jwt.pid"
  setsid setpriv --reuid=slurm --regid=slurm --init-groups -- env SLURM_CONF="$conf" SLURM_JWT=daemon \
    /usr/sbin/slurmrestd -a rest_auth/jwt -s openapi/v0.0.38 "127.0.0.1:$port" \
    >"$dir/log/slurmrestd-jwt.log" 2>&1 </dev/null 9>&- &
  echo $! >"$rest/jwt.pid"
fi
if ! { alive "$rest/unix.pid" slurmrestd && unix_ok; }; then
  stop_pid "$rest/unix.pid"
  rm -f "$socket"
  setsid setpriv --reuid=slurm --regid=slurm --init-groups -- env SLURM_CONF="$conf" \
    /usr/sbin/slurmrestd -a rest_auth/local -s openapi/v0.0.38 "unix:$socket" \
    >"$dir/log/slurmrestd-unix.log" 2>&1 </dev/null 9>&- &
  echo $! >"$rest/unix.pid"
fi
for _ in $(seq 1 100); do
  jwt_ok && unix_ok && break
  sleep 0.1
done
if ! jwt_ok || ! unix_ok; then
  echo "start-slurm: slurmrestd does not answer on $tcp_url and unix:$socket; see $dir/log" >&2
  tail -n 20 "$dir/log/slurmrestd-jwt.log" "$dir/log/slurmrestd-unix.log" >&2 || true
  exit 1
fi
echo "$tcp_url" >"$dir/rest.url"
echo "unix:$socket" >"$dir/rest-unix.url"
echo "$conf"
