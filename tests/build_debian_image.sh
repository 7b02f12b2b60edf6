#!/bin/sh
# Makes debian:bookworm-slim on a machine that cannot pull it (CI, offline): Debian 12's minimal base
# (bash, coreutils, grep, sed, tar ...) from debootstrap and Debian's own mirror, then `docker import`.
# The Harbor tests and data/harbor_example/ build their task images FROM it. Idempotent and cached by
# tag: an image of that name already here (pulled or made before) is left alone, so CI pays about a
# minute once per machine.
set -eu

TAG=${TAG:-debian:bookworm-slim}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

if docker image inspect "$TAG" >/dev/null 2>&1; then
    exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    echo "build_debian_image.sh: debootstrap not found (apt-get install debootstrap)" >&2
    exit 1
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || {
    tail -n 20 "$root.log" >&2
    rm -f "$root.log"
    exit 1
}
rm -f "$root.log"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -cf - . | docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' - "$TAG" >/dev/null
echo "built $TAG"
