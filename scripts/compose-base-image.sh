#!/usr/bin/env bash
# shellcheck disable=SC2086  # $docker and $sudo_cmd are commands of several words
# Make the Docker image the Dockerfile builds FROM, pdd-base:bookworm (or $PDD_BASE_IMAGE),
# without an image registry: a minimal Debian bookworm from debootstrap, imported into the
# running Docker engine. Nothing is done when the image is already there.
#   scripts/compose-base-image.sh            # needs root (or sudo), debootstrap and a Docker engine
# PDD_DEBIAN_MIRROR (default http://deb.debian.org/debian) is the mirror debootstrap and apt use,
# PDD_DEBIAN_SECURITY_MIRROR (default http://deb.debian.org/debian-security) the security one.
set -euo pipefail

image="${PDD_BASE_IMAGE:-pdd-base:bookworm}"
mirror="${PDD_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security="${PDD_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
docker="${DOCKER:-docker}"  # a command, maybe "sudo docker": used unquoted

if $docker image inspect "$image" >/dev/null 2>&1; then
    echo "base image: $image is there"
    exit 0
fi

sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
if ! command -v debootstrap >/dev/null 2>&1; then
    echo "base image: installing Debian's debootstrap"
    timeout 600 $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 600 $sudo_cmd apt-get install -y -qq debootstrap >/dev/null
fi

root="$(mktemp -d /tmp/pdd-base.XXXXXX)"
cleanup() { $sudo_cmd rm -rf --one-file-system "$root"; }
trap cleanup EXIT

echo "base image: debootstrap --variant=minbase bookworm ($mirror), log $root.log"
if ! timeout 1200 $sudo_cmd debootstrap --variant=minbase bookworm "$root/rootfs" "$mirror" \
        >"$root.log" 2>&1; then
    tail -n 20 "$root.log" >&2
    echo "base image: debootstrap failed (log: $root.log)" >&2
    exit 1
fi
# Updates and security fixes too; no package lists, caches or host files in the image.
$sudo_cmd tee "$root/rootfs/etc/apt/sources.list" >/dev/null <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
SOURCES
$sudo_cmd sh -c "rm -rf '$root'/rootfs/var/lib/apt/lists/* '$root'/rootfs/var/cache/apt/*.bin \
    '$root'/rootfs/var/cache/apt/archives/*.deb '$root'/rootfs/var/log/*.log \
    '$root'/rootfs/etc/resolv.conf '$root'/rootfs/etc/hostname"

echo "base image: importing as $image"
$sudo_cmd tar -C "$root/rootfs" --numeric-owner -c . \
    | timeout 600 $docker import --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
rm -f "$root.log"
echo "base image: $image ready ($($docker image inspect -f '{{.Size}}' "$image") bytes)"
