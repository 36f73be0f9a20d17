#!/bin/sh
# tools/docker-base.sh - make sure the image debian:bookworm-slim exists in
# the local Docker Engine, so docker/Dockerfile builds without a registry.
#
# usage: sh tools/docker-base.sh
#
# In order, the first that works:
#   1. the image is already there (a pull or an earlier run of this script);
#   2. `docker pull debian:bookworm-slim` (a machine that reaches a registry);
#   3. a root filesystem tarball cached by an earlier run is imported;
#   4. debootstrap --variant=minbase bookworm from the Debian mirror this
#      machine's apt is configured with, trimmed the way Debian's own slim
#      images are (no documentation, man pages, locales, apt lists or
#      caches), packed into the cache, then imported.
# The cache lives in $HYSERVE_DOCKER_CACHE (default /var/cache/hyserve-docker).
# Needs root for debootstrap; installs debootstrap with apt when missing.
set -eu

IMAGE=debian:bookworm-slim
SUITE=bookworm
CACHE=${HYSERVE_DOCKER_CACHE:-/var/cache/hyserve-docker}
TARBALL=$CACHE/debian-$SUITE-slim.tar.gz

say() { echo "docker-base: $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE is present"
    exit 0
fi
# a registry that does not answer must not hold the script up for long
if timeout 120 docker pull -q "$IMAGE" >/dev/null 2>&1; then
    say "pulled $IMAGE"
    exit 0
fi
say "cannot pull $IMAGE: making it locally"

# The first URI of the configured apt sources that serves SUITE itself (not
# SUITE-security or SUITE-updates), and the one that serves SUITE-security.
# Reads both the one-line format (*.list) and deb822 (*.sources).
apt_uri() {
    want=$1
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk -v want="$want" '$1 == "deb" {
                i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                if ($(i + 1) == want) { print $i; exit }
            }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # one stanza per paragraph; print the URIs of a stanza of type deb
        # whose Suites name the wanted suite
        awk -v want="$want" 'BEGIN { RS = ""; FS = "\n" }
            {
                uris = ""; suites = ""; types = ""; enabled = "yes"
                for (j = 1; j <= NF; j++) {
                    if ($j ~ /^#/) continue
                    split($j, kv, ":[ \t]*")
                    k = tolower(kv[1]); v = substr($j, length(kv[1]) + 2); sub(/^[ \t]+/, "", v)
                    if (k == "uris") uris = v
                    else if (k == "suites") suites = " " v " "
                    else if (k == "types") types = " " v " "
                    else if (k == "enabled") enabled = tolower(v)
                }
                if (enabled != "no" && types ~ / deb / && suites ~ (" " want " ")) {
                    split(uris, u, " "); print u[1]; exit
                }
            }' "$f"
    done
}

MIRROR=$(apt_uri "$SUITE" | head -n 1)
SECURITY=$(apt_uri "$SUITE-security" | head -n 1)
: "${MIRROR:=http://deb.debian.org/debian}"
: "${SECURITY:=http://deb.debian.org/debian-security}"

if [ ! -s "$TARBALL" ]; then
    if [ "$(id -u)" != 0 ]; then
        say "building the base image needs root (debootstrap)"
        exit 1
    fi
    if ! command -v debootstrap >/dev/null 2>&1; then
        say "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null ||
            { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    fi
    mkdir -p "$CACHE"
    WORK=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    ROOT=$WORK/rootfs
    say "debootstrap --variant=minbase $SUITE from $MIRROR (a few minutes)"
    if ! debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
        tail -n 20 "$WORK/debootstrap.log" >&2
        [ -f "$ROOT/debootstrap/debootstrap.log" ] && tail -n 20 "$ROOT/debootstrap/debootstrap.log" >&2
        say "debootstrap failed"
        exit 1
    fi

    # -- apt sources: the same mirrors as this machine, in deb822 as Debian's images have them
    rm -f "$ROOT/etc/apt/sources.list"
    cat >"$ROOT/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF

    # -- what a container image wants from dpkg and apt (Debian's images
    #    carry the same settings): packages installed later leave out
    #    documentation, man pages and translations; apt keeps no downloaded
    #    .deb files, fetches no translations, and keeps its lists compressed
    cat >"$ROOT/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
# container image: leave out documentation and translations (copyright files stay)
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
    cat >"$ROOT/etc/apt/apt.conf.d/docker-slim" <<'EOF'
// container image: no cached .deb files, no translations, compressed lists,
// recommends and suggests are not kept by autoremove decisions
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
Acquire::GzipIndexes "true";
Apt::AutoRemove::SuggestsImportant "false";
EOF
    # services never start inside an image build (no init system there)
    printf '#!/bin/sh\n# no service starts while an image is built\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
    chmod 755 "$ROOT/usr/sbin/policy-rc.d"

    # -- trim what minbase already installed, as the dpkg rules above would have
    find "$ROOT/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
    find "$ROOT/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
    rm -rf "$ROOT/usr/share/man/"* "$ROOT/usr/share/groff/"* "$ROOT/usr/share/info/"* \
        "$ROOT/usr/share/lintian/"* "$ROOT/usr/share/linda/"* "$ROOT/usr/share/locale/"*
    rm -rf "$ROOT/var/lib/apt/lists/"* "$ROOT/var/cache/apt/"*.bin "$ROOT/var/cache/apt/archives/"*.deb \
        "$ROOT/var/cache/apt/archives/partial/"* "$ROOT/var/cache/debconf/"*-old \
        "$ROOT/var/lib/dpkg/"*-old "$ROOT/var/log/"*.log "$ROOT/var/log/apt/"* \
        "$ROOT/debootstrap" "$ROOT/tmp/"* "$ROOT/var/tmp/"*
    mkdir -p "$ROOT/var/lib/apt/lists/partial"
    # the build host's identity does not belong in an image
    : >"$ROOT/etc/hostname"
    rm -f "$ROOT/etc/resolv.conf" "$ROOT/etc/machine-id" "$ROOT/var/lib/dbus/machine-id"
    : >"$ROOT/etc/machine-id"

    tar --numeric-owner --xattrs -C "$ROOT" -czf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
    rm -rf "$WORK"
    trap - EXIT
    say "cached the root filesystem in $TARBALL ($(du -h "$TARBALL" | cut -f1))"
fi

docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase $SUITE, trimmed (tools/docker-base.sh)" \
    "$TARBALL" "$IMAGE" >/dev/null
say "imported $IMAGE from $TARBALL ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}'))"
