#!/usr/bin/env bash
# Start dynalite (DynamoDB's API in Node.js: like DynamoDB, and unlike moto, it applies each item's
# conditional writes atomically under concurrency) on 127.0.0.1 unless it already answers there,
# installing it with npm into .dynalite/ first if it is missing. Prints its endpoint URL on its last
# line. The data lives in memory: a restart starts empty.
# Usage: scripts/start-dynalite.sh [--install] [STATE_DIR]   (default: .dynalite/run-PORT)
#   --install   only install dynalite (scripts/setup.sh --test calls this), do not start it.
# Port: DYNALITE_PORT (default 4567, dynalite's own); 0 starts one more on a free port.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# 4.0.0 declares Node.js 20 or newer; it was seen working on Node.js 18 (Debian 12's) as well.
version=4.0.0
prefix=$root/.dynalite
bin=$prefix/node_modules/.bin/dynalite
install_only=""
if [ "${1:-}" = "--install" ]; then install_only=1; shift; fi
port=${DYNALITE_PORT:-4567}
[[ $port =~ ^[0-9]+$ ]] || { echo "start-dynalite: DYNALITE_PORT is not a port: $port" >&2; exit 1; }

install() {
  [ -x "$bin" ] && grep -q "\"version\": \"$version\"" "$prefix/node_modules/dynalite/package.json" 2>/dev/null && return 0
  if ! command -v npm >/dev/null; then
    echo "start-dynalite: npm is missing; install it with: apt-get install -y nodejs npm" >&2
    exit 1
  fi
  echo "start-dynalite: installing dynalite $version into $prefix" >&2
  log=$(mktemp)
  if ! npm install --prefix "$prefix" --no-audit --no-fund --no-save "dynalite@$version" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    echo "start-dynalite: npm install failed" >&2
    exit 1
  fi
  rm -f "$log"
}

listens() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

answers() {  # true when a DynamoDB endpoint answers on the port (its health check, GET /)
  local reply
  reply=$(
    exec 2>/dev/null 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    printf 'GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
    timeout 5 cat <&3
  ) || return 1
  [[ $reply == *"healthy: dynamodb"* ]]
}

endpoint() { echo "http://127.0.0.1:$port"; }

if [ -z "$install_only" ] && [ "$port" != 0 ] && answers; then endpoint; exit 0; fi
# One install or start at a time: a second call waits here, then finds the first one's work done.
mkdir -p "$prefix"
exec 9>"$prefix/.lock"
flock 9
install
[ -n "$install_only" ] && exit 0
if [ "$port" = 0 ]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
elif answers; then
  endpoint; exit 0
elif listens; then
  echo "start-dynalite: something that is not DynamoDB listens on 127.0.0.1:$port; set DYNALITE_PORT" >&2
  exit 1
fi
state=${1:-$prefix/run-$port}
mkdir -p "$state"
# Tables are ACTIVE at once (dynalite's default keeps them CREATING for half a second).
(cd "$state" && exec setsid "$bin" --host 127.0.0.1 --port "$port" \
  --createTableMs 0 --deleteTableMs 0 --updateTableMs 0 \
  </dev/null >"$state/dynalite.log" 2>&1 9>&-) &
echo $! >"$state/dynalite.pid"
pid=$(cat "$state/dynalite.pid")
for _ in $(seq 1 200); do
  if answers; then endpoint; exit 0; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
echo "start-dynalite: dynalite did not come up; its log ($state/dynalite.log):" >&2
tail -n 20 "$state/dynalite.log" >&2 || true
exit 1
