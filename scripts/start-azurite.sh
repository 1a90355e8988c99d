#!/usr/bin/env bash
# Start Azurite (the Azure Storage emulator: Blob, Queue, Table) on 127.0.0.1 unless it already
# answers, installing it with npm into .azurite/ first if it is missing. Prints the storage
# connection string on its last line. The data lives in memory: a restart starts empty.
# Usage: scripts/start-azurite.sh [--install] [STATE_DIR]   (default: .azurite/run-BLOBPORT)
#   --install   only install Azurite (scripts/setup.sh --test calls this), do not start it.
# Ports: AZURITE_BLOB_PORT, AZURITE_QUEUE_PORT, AZURITE_TABLE_PORT (10000, 10001, 10002).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# 3.35 is the newest release that runs on Debian 12's Node.js 18; later ones need Node 21+.
version=3.35.0
prefix=$root/.azurite
bin=$prefix/node_modules/.bin/azurite
install_only=""
if [ "${1:-}" = "--install" ]; then install_only=1; shift; fi
blob=${AZURITE_BLOB_PORT:-10000}
queue=${AZURITE_QUEUE_PORT:-10001}
table=${AZURITE_TABLE_PORT:-10002}
state=${1:-$prefix/run-$blob}
key="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="  # Azurite's well-known development key
account=devstoreaccount1
connection="DefaultEndpointsProtocol=http;AccountName=$account;AccountKey=$key;\
BlobEndpoint=http://127.0.0.1:$blob/$account;QueueEndpoint=http://127.0.0.1:$queue/$account;\
TableEndpoint=http://127.0.0.1:$table/$account;"

install() {
  [ -x "$bin" ] && grep -q "\"version\": \"$version\"" "$prefix/node_modules/azurite/package.json" 2>/dev/null && return 0
  if ! command -v npm >/dev/null; then
    echo "start-azurite: npm is missing; install it with: apt-get install -y nodejs npm" >&2
    exit 1
  fi
  echo "start-azurite: installing azurite $version into $prefix" >&2
  log=$(mktemp)
  if ! npm install --prefix "$prefix" --no-audit --no-fund --no-save "azurite@$version" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    echo "start-azurite: npm install failed" >&2
    exit 1
  fi
  rm -f "$log"
}

answers() {  # true when something listens on each of the three ports
  local port
  for port in "$blob" "$queue" "$table"; do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || return 1
  done
}

if [ -z "$install_only" ] && answers; then echo "$connection"; exit 0; fi
# One install or start at a time: a second call waits here, then finds the first one's work done.
mkdir -p "$prefix"
exec 9>"$prefix/.lock"
flock 9
install
[ -n "$install_only" ] && exit 0
if answers; then echo "$connection"; exit 0; fi
mkdir -p "$state"
# in memory: it writes nothing, but it runs in the state dir in case a version does
(cd "$state" && exec setsid "$bin" --silent --inMemoryPersistence --disableTelemetry --skipApiVersionCheck --loose \
  --blobHost 127.0.0.1 --blobPort "$blob" --queueHost 127.0.0.1 --queuePort "$queue" \
  --tableHost 127.0.0.1 --tablePort "$table" \
  </dev/null >"$state/azurite.log" 2>&1 9>&-) &
echo $! >"$state/azurite.pid"
pid=$(cat "$state/azurite.pid")
for _ in $(seq 1 200); do
  if answers; then echo "$connection"; exit 0; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
echo "start-azurite: Azurite did not come up; its log ($state/azurite.log):" >&2
tail -n 20 "$state/azurite.log" >&2 || true
exit 1
