#!/usr/bin/env bash
# Make sure a Docker engine answers. If none runs, start one without the default bridge
# network (containers get only loopback unless they use host networking).
set -euo pipefail
if docker info >/dev/null 2>&1; then exit 0; fi
command -v dockerd >/dev/null || { echo "start-docker: dockerd missing; run scripts/setup.sh"; exit 1; }
echo "start-docker: starting dockerd (--bridge=none --iptables=false)"
mkdir -p /var/log
nohup dockerd --bridge=none --iptables=false >/var/log/runplane-dockerd.log 2>&1 &
for _ in $(seq 1 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "start-docker: dockerd did not answer within 30 s; see /var/log/runplane-dockerd.log"
tail -n 20 /var/log/runplane-dockerd.log
exit 1
