#!/usr/bin/env bash
# Start Azurite (the Azure Storage emulator: Blob, Queue, Table) on 127.0.0.1 unless it already
# answers, installing it with npm into .azurite/ first if it is missing. Prints the storage
# connection string on its last line. The data lives in memory: a restart starts empty.
# Usage: scripts/start-azurite.sh [--install] [STATE_DIR]   (default: .azurite/run-BLOBPORT)
#   --install   only install Azurite (scripts/setup.sh --test calls this), do not start it.
# Ports: AZURITE_BLOB_PORT, AZURITE_QUEUE_PORT, AZURITE_TABLE_PORT (10000, 10001, 10002).
# The work is runplane/devstack/azurite.py's, which `runplane dev --cloud azure` runs too; it needs
# only the standard library, so any Python 3.11 runs it from the checkout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=python3
[ -x "$root/.venv/bin/python" ] && py=$root/.venv/bin/python
PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH} exec "$py" -m runplane.devstack.azurite --prefix "$root/.azurite" "$@"
