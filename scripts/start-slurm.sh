#!/usr/bin/env bash
# Start a one-node Slurm (munged, slurmctld, slurmd) on this machine unless one answers.
# Installs the Debian packages if missing. Prints the SLURM_CONF to use.
# Usage: scripts/start-slurm.sh [DIR]   (default: /var/lib/runplane-slurm)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-/var/lib/runplane-slurm}
conf=$dir/etc/slurm.conf
export SLURM_CONF=$conf
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
  echo "start-slurm: installing slurm-wlm munge slurm-client" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq slurm-wlm munge slurm-client >/dev/null
fi
mkdir -p "$dir/etc" "$dir/log"
cpus=$(nproc)
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
sed -e "s#@DIR@#$dir#g" -e "s#@CPUS@#$cpus#g" -e "s#@MEMORY@#$memory#g" "$here/slurm/slurm.conf.in" >"$conf.new"
# Already up with this very configuration: nothing to do.
if cmp -s "$conf.new" "$conf" && sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|alloc'; then
  rm -f "$conf.new"; echo "$conf"; exit 0
fi
mv "$conf.new" "$conf"
pkill -x slurmd 2>/dev/null || true
pkill -x slurmctld 2>/dev/null || true
rm -rf "$dir/spool"; mkdir -p "$dir/spool/ctld" "$dir/spool/d"
mkdir -p /run/munge /var/log/munge && chown munge:munge /run/munge /var/log/munge
[ -f /etc/munge/munge.key ] || { /usr/sbin/mungekey -c; chown munge:munge /etc/munge/munge.key; }
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
/usr/sbin/slurmctld -f "$conf"
/usr/sbin/slurmd -f "$conf" -N localhost
for _ in $(seq 1 100); do
  if sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|alloc'; then echo "$conf"; exit 0; fi
  sleep 0.1
done
echo "start-slurm: the node did not come up; see $dir/log" >&2
tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
exit 1
