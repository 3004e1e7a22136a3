#!/usr/bin/env bash
# install-deploy-tools.sh: install the tools that check deploy/ (as root, Debian 12):
#   systemd-analyze (Debian's `systemd`)   verifies deploy/systemd's units
#   promtool        (Debian's `prometheus`) checks and unit-tests deploy/prometheus's rules
#
#   scripts/install-deploy-tools.sh          # idempotent: installs only what is missing
#
# scripts/test.sh runs it (CI runs as root). `prometheus` is ~19 MB to download (~95 MB
# installed, no recommends); only its promtool is used: package scripts are kept from starting
# the daemon (a temporary policy-rc.d when none exists), and no daemon runs here anyway since
# systemd is not PID 1.
set -euo pipefail
say() { printf 'install-deploy-tools: %s\n' "$*"; }
die() { printf 'install-deploy-tools: error: %s\n' "$*" >&2; exit 1; }

declare -A tool_pkg=([systemd-analyze]=systemd [promtool]=prometheus)
missing=()
for tool in "${!tool_pkg[@]}"; do
    command -v "$tool" > /dev/null || missing+=("${tool_pkg[$tool]}")
done
if [ "${#missing[@]}" -eq 0 ]; then
    say "systemd-analyze and promtool are installed"
    exit 0
fi
[ "$(id -u)" = 0 ] || die "missing ${missing[*]}; run as root (or: apt-get install --no-install-recommends ${missing[*]})"
command -v apt-get > /dev/null || die "missing packages ${missing[*]} and no apt-get (Debian 12 expected)"
say "installing ${missing[*]} from Debian packages"
log=$(mktemp /tmp/install-deploy-tools.XXXXXX)
own_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    own_policy=1
fi
trap '[ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
apt_install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >> "$log" 2>&1; }
if ! apt_install; then
    say "apt-get install failed; running apt-get update and retrying"
    DEBIAN_FRONTEND=noninteractive apt-get update -q >> "$log" 2>&1 && apt_install ||
        { tail -n 20 "$log" >&2; die "apt-get failed; full log: $log"; }
fi
rm -f "$log"
for tool in "${!tool_pkg[@]}"; do
    command -v "$tool" > /dev/null || die "'$tool' not found after installing ${tool_pkg[$tool]}"
done
say "installed ${missing[*]}"
