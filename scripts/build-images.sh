#!/usr/bin/env bash
# Build the small local images from busybox, with no registry:
#   runplane/default:latest   the default image of the built-in pool
#   runplane/test-busybox:1   used by the tests
set -euo pipefail
bb=$(command -v busybox || echo /bin/busybox)
[ -x "$bb" ] || { echo "build-images: busybox missing; run scripts/setup.sh"; exit 1; }
build() {
  local tag=$1
  if docker image inspect "$tag" >/dev/null 2>&1; then return; fi
  local root; root=$(mktemp -d)
  mkdir -p "$root/bin" "$root/tmp" "$root/etc"
  cp "$bb" "$root/bin/busybox"
  for c in $("$bb" --list); do [ "$c" = busybox ] || ln -sf busybox "$root/bin/$c"; done
  echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
  echo 'nobody:x:65534:65534:nobody:/nonexistent:/bin/sh' >>"$root/etc/passwd"
  chmod 1777 "$root/tmp"
  tar -C "$root" -c . | docker import -c 'ENV PATH=/bin' - "$tag" >/dev/null
  rm -rf "$root"
  echo "build-images: built $tag"
}
build runplane/default:latest
build runplane/test-busybox:1
