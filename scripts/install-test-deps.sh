#!/usr/bin/env bash
# Install the Debian packages hafo's tests need, when they are missing:
#   chromium  - the dashboard test (tests/e2e/test_dashboard.py) drives a real headless browser
#   fonts-liberation - chromium's recommended fonts (not pulled in without recommends), so its
#               screenshots show text
#   systemd   - systemd-analyze verifies the shipped unit files (only if systemd-analyze is absent)
#   openssl   - TLS test certificates
#   haproxy   - hafo lb haproxy's integration test (tests/integration/test_lb_haproxy.py) drives
#               a real HAProxy
#   prometheus - the monitoring tests (tests/e2e/test_monitoring_*.py): promtool checks and
#               unit-tests the shipped alerting rules, and a real Prometheus server scrapes a
#               local cluster and fires the node-down alert
#   systemd-container, debootstrap, openssh-client, iproute2 - the machine tests (tests/hosts/)
#               boot Debian machines with systemd as PID 1 (systemd-nspawn) from a root made by
#               debootstrap, on a bridge (ip), and deploy onto them with Ansible over SSH
# Idempotent and quick when everything is present: apt-get runs only when something is missing.
# Runs as root, or through sudo when it exists.
set -euo pipefail

missing=()
need() {  # need PACKAGE COMMAND
    if command -v "$2" >/dev/null 2>&1; then
        echo "install-test-deps: $1 present ($(command -v "$2"))"
    else
        echo "install-test-deps: $1 missing (no $2): will install"
        missing+=("$1")
    fi
}

need_pkg() {  # need_pkg PACKAGE: a package without a command of its own
    if dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; then
        echo "install-test-deps: $1 present"
    else
        echo "install-test-deps: $1 missing: will install"
        missing+=("$1")
    fi
}

need chromium chromium
need_pkg fonts-liberation
need systemd systemd-analyze
need openssl openssl
need haproxy haproxy
need prometheus promtool
need nodejs node  # the Grafana dashboard type check (tests/e2e/test_monitoring_rules.py)
need npm npm
need systemd-container systemd-nspawn
need debootstrap debootstrap
need openssh-client ssh
need iproute2 ip

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-test-deps: nothing to install"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-test-deps: apt-get not found; install by hand: ${missing[*]}" >&2
    exit 1
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        echo "install-test-deps: not root and no sudo; as root run:" \
             "apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi

echo "install-test-deps: apt-get update"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
echo "install-test-deps: apt-get install ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-test-deps: installed ${missing[*]}"
