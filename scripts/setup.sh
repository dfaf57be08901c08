#!/usr/bin/env bash
# Prepares this machine for `make run` / `make test`: the venv with our requirements, and
# nginx, memcached and openssl (and, with `test`, the tools the tests run: chromium, curl,
# PostgreSQL) from Debian/Ubuntu packages when missing (as root; otherwise it prints the
# command). Safe to run again: it does only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.requirements.sha

need_pkgs=()
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
have nginx || need_pkgs+=(nginx-light)
have memcached || need_pkgs+=(memcached)
have openssl || need_pkgs+=(openssl)  # make run's self-signed certificate (HTTPS, HTTP/2)
# Headless Chromium for the status page's browser test (~115 MB download, ~415 MB on disk);
# DejaVu so the page's text renders on a machine without any other font.
if [ "${1:-}" = "test" ]; then
    have chromium || need_pkgs+=(chromium)
    have curl || need_pkgs+=(curl)  # the streaming test watches `curl -N` print events
    # The spend ledger's PostgreSQL tests run clusters of their own (runner/postgres.py):
    # Debian keeps initdb and postgres in /usr/lib/postgresql/<version>/bin, off PATH.
    have initdb || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need_pkgs+=(postgresql)
    [ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_pkgs+=(fonts-dejavu-core)
fi
# Another apt (unattended-upgrades, cloud-init, a second setup) may hold its locks: apt-get
# waits for dpkg's lock itself (DPkg::Lock::Timeout), but `update` fails at once on the
# package lists' lock (apt 2.6), so that failure is retried; both within APT_LOCK_WAIT_S.
APT_LOCK_WAIT_S=${APT_LOCK_WAIT_S:-300}
apt_get() {
    local deadline=$((SECONDS + APT_LOCK_WAIT_S)) said="" err
    while ! err=$(LC_ALL=C apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT_S" "$@" 2>&1 >/dev/null); do
        if [[ $err != *"Could not get lock"* ]] || [ "$SECONDS" -ge "$deadline" ]; then
            echo "$err" >&2
            return 1
        fi
        [ -n "$said" ] || echo "setup: another apt holds its lock; waiting up to ${APT_LOCK_WAIT_S} s"
        said=1
        sleep 2
    done
}
# Debian's packages start their services when installed; we run our own copies, so a
# policy-rc.d says no while we install. Whatever happens (a failed install under set -e,
# Ctrl-C), the machine's own policy-rc.d is put back, or ours removed. (POLICY_RC_D moves
# it for tests/integration/test_setup_script.py.)
POLICY_RC_D=${POLICY_RC_D:-/usr/sbin/policy-rc.d}
policy_saved=""
deny_service_starts() {
    if [ -e "$POLICY_RC_D" ]; then
        policy_saved=$(mktemp)
        cp -p "$POLICY_RC_D" "$policy_saved"
    fi
    trap allow_service_starts EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    printf '#!/bin/sh\nexit 101\n' > "$POLICY_RC_D" && chmod +x "$POLICY_RC_D"
}
allow_service_starts() {
    if [ -n "$policy_saved" ]; then
        mv -f "$policy_saved" "$POLICY_RC_D"
    else
        rm -f "$POLICY_RC_D"
    fi
}
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing ${need_pkgs[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt_get update -qq
        deny_service_starts
        apt_get install -y -qq --no-install-recommends "${need_pkgs[@]}"
        allow_service_starts
        trap - EXIT INT TERM
    else
        echo "setup: missing ${need_pkgs[*]}; install with: sudo apt-get install -y ${need_pkgs[*]}"
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt_get update -qq && apt_get install -y -qq python3-venv
            "$PY" -m venv "$VENV"
        else
            echo "setup: python3 -m venv failed; install with: sudo apt-get install -y python3-venv" >&2
            exit 1
        fi
    fi
fi
want=$(cat requirements.txt requirements-dev.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "setup: installing Python requirements into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -r requirements-dev.txt
    echo "$want" > "$STAMP"
fi
