#!/usr/bin/env bash
# Make a Docker-compatible container engine answer on loopback, with local
# etcd and moto images, so the waypost-fixtures fixtures can use
# testcontainers (see tests/README.md). For Debian bookworm machines where
# no image can be pulled and no Docker engine runs: podman + runc, images
# built from Debian's own packages.
#
#   scripts/containers-setup.sh [ENV_FILE]
#
# Idempotent and non-interactive: each step is skipped when its result is
# already there. Prints the `export ...` lines the tests need and, when
# ENV_FILE is given, writes them there too (for `source`). Steps are bounded
# in time; the whole run should be bounded by the caller as well (.ci/run
# uses `timeout`). Exits non-zero when the engine or the etcd image could
# not be made ready; the moto image is optional (REGISTRY_TEST_MOTO_IMAGE is
# only exported when it exists; set CONTAINERS_SETUP_MOTO=0 to skip it).
#
# Environment:
#   CONTAINERS_SETUP_MOTO=0       don't build the moto image
#   CONTAINERS_SETUP_MOTO_BUDGET  seconds the moto image may take (600)
#   CONTAINERS_SETUP_PORT=2375    loopback port for the Docker-compatible API
#   CONTAINERS_SETUP_REAP=1       remove leftover fixture containers (CI)
#   DEBOOTSTRAP_MIRROR=...        Debian mirror for the moto image's root
set -euo pipefail

env_file="${1:-}"
port="${CONTAINERS_SETUP_PORT:-2375}"
api="tcp://127.0.0.1:${port}"
etcd_image="localhost/registry-tests/etcd:local"
moto_image="localhost/registry-tests/moto:local"
state="/var/tmp/registry-containers"
mirror="${DEBOOTSTRAP_MIRROR:-http://deb.debian.org/debian}"
export DEBIAN_FRONTEND=noninteractive

log() { echo "containers-setup: $*" >&2; }
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }
t0=$(date +%s)
mkdir -p "$state"

# 1. Packages: podman with runc (crun fails here), debootstrap for moto.
need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v curl >/dev/null 2>&1 || need+=(curl)
if [ "${CONTAINERS_SETUP_MOTO:-1}" != 0 ]; then
    command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
fi
if [ ${#need[@]} -gt 0 ]; then
    command -v apt-get >/dev/null 2>&1 || { log "no apt-get to install ${need[*]}"; exit 1; }
    log "installing ${need[*]} with apt-get"
    timeout 300 apt-get update -qq || log "apt-get update failed; trying the install anyway"
    timeout 600 apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
log "packages ready ($(elapsed))"

# 2. containers.conf: stock ulimits fail with `setrlimit ... Operation not
#    permitted`, crun with `cgroups in hybrid mode not supported`.
conf=/etc/containers/containers.conf
marker="# written by registry-toolkit scripts/containers-setup.sh"
if ! grep -qF "$marker" "$conf" 2>/dev/null; then
    mkdir -p /etc/containers
    [ -f "$conf" ] && cp "$conf" "$conf.before-registry-toolkit"
    cat > "$conf" <<CONF
$marker
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF
    log "wrote $conf"
fi

# 3. etcd image: Debian's etcd links only libc, so a scratch image with the
#    binary and the two libraries it needs is enough.
if ! podman image exists "$etcd_image"; then
    ctx="$state/etcd-image"
    rm -rf "$ctx" && mkdir -p "$ctx/rootfs"
    etcd_bin="$(command -v etcd)"
    # Copy the binary and every library ldd names (libc and the loader).
    for f in "$etcd_bin" $(ldd "$etcd_bin" | grep -o '/[^ ]*'); do
        mkdir -p "$ctx/rootfs$(dirname "$f")"
        cp -L "$f" "$ctx/rootfs$f"
    done
    mkdir -p "$ctx/rootfs/tmp" "$ctx/rootfs/var/lib/etcd"
    cat > "$ctx/Containerfile" <<CF
FROM scratch
COPY rootfs/ /
EXPOSE 2379 2380
ENTRYPOINT ["$etcd_bin"]
CF
    timeout 120 podman build -q -t "$etcd_image" -f "$ctx/Containerfile" "$ctx" >/dev/null
    log "built $etcd_image ($(elapsed))"
fi

# 4. The Docker-compatible API on loopback (not the unix socket: with it,
#    testcontainers takes the bridge gateway as host inside this container).
ping_api() { curl -fsS --max-time 2 "http://127.0.0.1:${port}/_ping" >/dev/null 2>&1; }
start_service() {
    log "starting podman system service on $api"
    nohup setsid podman system service --time=0 "$api" \
        >"$state/service.log" 2>&1 </dev/null &
    echo $! >"$state/service.pid"
    for _ in $(seq 1 100); do ping_api && break; sleep 0.1; done
    ping_api || { log "the API did not answer; see $state/service.log"; exit 1; }
}
# A container run through the API: a service that answers pings can still
# fail every start (seen after the disk filled up: "write child: broken
# pipe"), and then each fixture would fail instead of using processes.
smoke() {
    timeout 60 podman --remote --url "$api" run --rm "$etcd_image" --version \
        >"$state/smoke.log" 2>&1
}
if ! ping_api; then
    start_service
fi
if ! smoke; then
    log "the engine answers but cannot run a container ($(tail -n 1 "$state/smoke.log")); restarting it"
    if [ -f "$state/service.pid" ]; then
        kill "$(cat "$state/service.pid")" 2>/dev/null || true
    fi
    pkill -f "podman system service --time=0 $api" 2>/dev/null || true
    for _ in $(seq 1 50); do ping_api || break; sleep 0.1; done
    start_service
    smoke || { log "still cannot run a container; see $state/smoke.log"; exit 1; }
fi
log "engine answers on $api and runs containers ($(elapsed))"

write_env() {
    exports="export DOCKER_HOST=$api REGISTRY_TEST_ETCD_IMAGE=$etcd_image"
    if [ "$1" = 1 ]; then
        exports="$exports REGISTRY_TEST_MOTO_IMAGE=$moto_image REGISTRY_TEST_CONTAINERS=etcd,moto"
    else
        # No moto image here (none can be pulled): moto fixtures use processes.
        exports="$exports REGISTRY_TEST_CONTAINERS=etcd"
    fi
    if [ -n "$env_file" ]; then
        echo "$exports" >"$env_file.tmp" && mv "$env_file.tmp" "$env_file"
    fi
}
# etcd is ready: a caller that gives up during the moto image still has it.
write_env 0

# Fixture containers left by test processes that died without unwinding
# (only when asked: on a shared machine they may belong to running tests).
leftovers=""
if [ "${CONTAINERS_SETUP_REAP:-0}" = 1 ]; then
    leftovers="$(podman ps -aq --filter "label=org.registry-toolkit.fixture" || true)"
fi
if [ -n "$leftovers" ]; then
    log "removing leftover fixture containers: $(echo $leftovers)"
    podman rm -f $leftovers >/dev/null 2>&1 || true
fi

# 5. moto image (optional, 2-3 minutes here): a minbase Debian root with python3 and
#    pip-installed moto[server], imported as an image. Runs like the
#    upstream motoserver/moto image: moto_server -H 0.0.0.0 on port 5000.
moto_ok=0
moto_deadline=$(( $(date +%s) + ${CONTAINERS_SETUP_MOTO_BUDGET:-600} ))
left() { local l=$(( moto_deadline - $(date +%s) )); [ "$l" -gt 1 ] && echo "$l" || echo 1; }
if [ "${CONTAINERS_SETUP_MOTO:-1}" != 0 ]; then
    if podman image exists "$moto_image"; then
        moto_ok=1
    else
        root="$state/moto-root"
        rm -rf "$root" "$state"/moto-root.old.*
        if timeout "$(left)" debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates \
                bookworm "$root" "$mirror" >"$state/debootstrap.log" 2>&1; then
            # pip inside the root needs the host's CA bundle (and DNS).
            cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/host-ca.crt"
            cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
            chroot_bin="$(command -v chroot || echo /usr/sbin/chroot)"
            if timeout "$(left)" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root \
                    PIP_CERT=/etc/ssl/certs/host-ca.crt PIP_DEFAULT_TIMEOUT=120 \
                    "$chroot_bin" "$root" python3 -m pip install --quiet --no-cache-dir \
                    --break-system-packages --disable-pip-version-check 'moto[server]' \
                    >"$state/pip.log" 2>&1; then
                rm -f "$root/etc/ssl/certs/host-ca.crt"
                rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
                if tar -C "$root" -c . | timeout "$(left)" podman import --quiet \
                        --change 'ENTRYPOINT ["/usr/local/bin/moto_server", "-H", "0.0.0.0"]' \
                        --change 'EXPOSE 5000' \
                        --change 'ENV PYTHONUNBUFFERED=1' \
                        - "$moto_image" >/dev/null; then
                    moto_ok=1
                    log "built $moto_image ($(elapsed))"
                else
                    log "podman import of the moto root failed"
                fi
            else
                log "pip install moto[server] in the root failed; see $state/pip.log"
            fi
        else
            log "debootstrap failed; see $state/debootstrap.log"
        fi
        # Removing the root takes a while on overlay file systems: not
        # on the critical path.
        mv "$root" "$root.old.$$" && (nohup rm -rf "$root.old.$$" >/dev/null 2>&1 &)
    fi
fi

write_env "$moto_ok"
echo "$exports"
log "done in $(elapsed)"
