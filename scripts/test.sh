#!/usr/bin/env bash
# test.sh: run dispatch's whole test suite, starting every real part it needs.
#
#   scripts/test.sh [PYTEST ARGS...]
#
# 1. installs dispatch and its test tools into ./.venv (scripts/install.sh);
# 2. starts the Slurm test cluster (scripts/slurm-cluster.sh start; needs root on Debian 12);
#    nats-server and the S3 servers (SeaweedFS, moto) are started by the tests themselves;
#    installs systemd-analyze and promtool, which check deploy/ (scripts/install-deploy-tools.sh);
# 3. runs ruff, mypy and pytest. A run that selects no test fails.
#
# Settings: DISPATCH_SKIP_INSTALL=1 skips step 1; DISPATCH_SKIP_SLURM=1 skips step 2 and
# deselects the tests marked `slurm` (for a machine without root; CI never sets it).
#
# Before pytest, the real-apiserver lane's binaries are provided (scripts/kube-apiserver.sh
# install: etcd from the venv, kube-apiserver 1.20.2 from $DISPATCH_KUBE_APISERVER or
# ../shared/tools, else built once from Debian's source); the tests start them.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
venv=${DISPATCH_VENV:-$top/.venv}
say() { printf '\n== test: %s\n' "$*"; }

if [ "${DISPATCH_SKIP_INSTALL:-0}" != 1 ]; then
    say "installing (scripts/install.sh)"
    bash scripts/install.sh
fi
markers=()
if [ "${DISPATCH_SKIP_SLURM:-0}" = 1 ]; then
    markers=(-m "not slurm")
    say "DISPATCH_SKIP_SLURM=1: not starting Slurm; tests marked slurm are deselected"
elif [ -x scripts/slurm-cluster.sh ]; then
    say "starting the Slurm test cluster (scripts/slurm-cluster.sh start)"
    bash scripts/slurm-cluster.sh start
fi
if [ "${DISPATCH_SKIP_INSTALL:-0}" != 1 ]; then
    say "installing systemd-analyze and promtool (scripts/install-deploy-tools.sh)"
    bash scripts/install-deploy-tools.sh
fi

say "lint: ruff check, ruff format --check"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
say "types: mypy (strict)"
"$venv/bin/mypy"

say "real-apiserver lane: binaries (scripts/kube-apiserver.sh install)"
DISPATCH_VENV=$venv bash scripts/kube-apiserver.sh install

say "tests: pytest"
export DISPATCH_REQUIRE_SERVICES=1
set +e
"$venv/bin/python" -m pytest "${markers[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "test: error: pytest selected no test; that is a failure, not a pass" >&2
    exit 1
fi
exit "$rc"
