#!/bin/sh
# What `make test-compose` needs before it starts the stack, on a Debian bookworm machine
# with no Docker engine and no image registry, as root. Idempotent: a step whose result
# exists is skipped, and podman's build cache makes an unchanged image a few seconds.
#
#   1. podman with runc, netavark and aardvark-dns (Debian packages), and its settings
#      (containers.conf beside this file)
#   2. a Debian bookworm base image: debootstrap (minbase) + podman import
#   3. local stand-ins for the public images of docker-compose.yml: python (the
#      Dockerfile's BASE_IMAGE), postgres, prometheus, postgres-exporter
#   4. tidemark's image from deploy/Dockerfile, unchanged, tagged tidemark:0.1.0 as the
#      compose file names it
#
# Never `podman image prune` after this: the Dockerfile's build stage is an untagged
# image, and pruning it makes the next build start from scratch.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
scratch=${TIDEMARK_PODMAN_SCRATCH:-/var/tmp/tidemark-podman}
t0=$(date +%s)
step() { echo "podman-setup [+$(( $(date +%s) - t0 ))s] $*"; }

if [ "$(id -u)" != 0 ]; then
    echo "podman-setup: run as root (rootful podman, apt-get, debootstrap)" >&2
    exit 2
fi
if ! command -v apt-get >/dev/null; then
    echo "podman-setup: needs a Debian machine (apt-get) to install podman" >&2
    exit 2
fi

if ! command -v podman >/dev/null || ! command -v runc >/dev/null \
    || ! command -v debootstrap >/dev/null || ! [ -x /usr/lib/podman/aardvark-dns ] \
    || ! [ -x /usr/bin/catatonit ]; then
    step "installing podman, runc, netavark, aardvark-dns, catatonit, debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        podman runc netavark aardvark-dns catatonit iptables uidmap debootstrap >/dev/null
fi

nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
want=$(sed "s/nofile=[0-9]*:[0-9]*/nofile=$nofile:$nofile/" "$here/containers.conf")
conf=/etc/containers/containers.conf
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
    step "writing $conf"
    mkdir -p /etc/containers
    printf '%s\n' "$want" > "$conf"
fi

# the same Debian mirror apt uses on this machine
mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
mirror=${mirror:-http://deb.debian.org/debian}
if ! podman image exists localhost/debian:bookworm; then
    step "debootstrap bookworm (minbase) from $mirror"
    rootfs="$scratch/rootfs"
    rm -rf "$rootfs"
    mkdir -p "$rootfs"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$scratch/debootstrap.log" 2>&1 \
        || { tail -20 "$scratch/debootstrap.log" >&2; exit 1; }
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
        "$mirror" "$mirror" "$mirror" > "$rootfs/etc/apt/sources.list"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*
    mkdir -p "$rootfs/var/lib/apt/lists/partial"
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
        'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
        'path-exclude /usr/share/locale/*' > "$rootfs/etc/dpkg/dpkg.cfg.d/container-nodoc"
    echo 'APT::Install-Recommends "false";' > "$rootfs/etc/apt/apt.conf.d/container-no-recommends"
    step "podman import localhost/debian:bookworm"
    tar -C "$rootfs" --numeric-owner -c . | podman import \
        --change 'CMD ["/bin/bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        - localhost/debian:bookworm >/dev/null
    rm -rf "$rootfs"
fi

# --format docker: in the OCI format buildah drops HEALTHCHECK.
build() {
    tag=$1
    shift
    step "image $tag"
    podman build --format docker -q -t "$tag" "$@" >/dev/null
}
build localhost/python:3.11-bookworm -f "$here/python.Containerfile" "$here"
build localhost/tidemark-postgres:15 -f "$here/postgres.Containerfile" "$here"
build localhost/tidemark-prometheus:2 -f "$here/prometheus.Containerfile" "$here"
build localhost/tidemark-postgres-exporter:0.11.1 -f "$here/postgres-exporter.Containerfile" "$here"
# pip behind a TLS-inspecting proxy trusts what the host trusts: the host's CA bundle is
# mounted over the image's own for the RUN steps (no layer keeps it; only here, where
# no step installs ca-certificates, which would try to replace the mounted file)
build localhost/tidemark:0.1.0 -f "$repo/deploy/Dockerfile" \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
    --build-arg BASE_IMAGE=localhost/python:3.11-bookworm "$repo"
step "done: $(podman image inspect --format '{{.Size}}' localhost/tidemark:0.1.0) bytes in tidemark:0.1.0"
