#!/bin/sh
# Builds the two tiny local images the Docker tests run in, from Debian's busybox-static, because CI
# cannot pull from Docker Hub. Idempotent: an image that already exists is left alone.
#   br-test-busybox:1  busybox only; /etc/br-image holds its name
#   br-test-busybox:2  the same plus WORKDIR /srv/two and /opt/only-in-2, so the two are told apart
#   br-test-busybox:nobody  image 1 run as USER nobody, for the non-root paths
set -eu

BUSYBOX=${BUSYBOX:-/bin/busybox}
[ -x "$BUSYBOX" ] || BUSYBOX=$(command -v busybox || true)
if [ -z "$BUSYBOX" ] || ! "$BUSYBOX" --list >/dev/null 2>&1; then
    echo "build_test_image.sh: busybox not found (apt-get install busybox-static)" >&2
    exit 1
fi
# A dynamically linked busybox would not run in an image without libc.
if command -v file >/dev/null 2>&1 && ! file -L "$BUSYBOX" | grep -q 'statically linked'; then
    echo "build_test_image.sh: $BUSYBOX is not static (apt-get install busybox-static)" >&2
    exit 1
fi

build() {
    tag=$1
    if docker image inspect "$tag" >/dev/null 2>&1; then
        return 0
    fi
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    mkdir -p "$root/bin" "$root/etc" "$root/root" "$root/tmp" "$root/proc" "$root/sys" "$root/dev"
    chmod 1777 "$root/tmp"
    cp "$BUSYBOX" "$root/bin/busybox"
    for applet in $("$BUSYBOX" --list); do
        [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    echo "$tag" >"$root/etc/br-image"
    set -- --change 'ENV PATH=/bin'
    if [ "$tag" = br-test-busybox:2 ]; then
        mkdir -p "$root/opt" "$root/srv/two"
        echo "only in image 2" >"$root/opt/only-in-2"
        set -- "$@" --change 'WORKDIR /srv/two'
    fi
    if [ "$tag" = br-test-busybox:nobody ]; then
        set -- "$@" --change 'USER nobody'
    fi
    tar -C "$root" -cf - . | docker import "$@" - "$tag" >/dev/null
    rm -rf "$root"
    trap - EXIT
    echo "built $tag"
}

build br-test-busybox:1
build br-test-busybox:2
build br-test-busybox:nobody
