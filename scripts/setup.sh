#!/usr/bin/env bash
# Prepares this machine for `make run` / `make test`: the venv with our requirements, and
# nginx, memcached and openssl (and, with `test`, the tools the tests run: chromium, curl) from
# Debian/Ubuntu packages when missing (as root; otherwise it prints the command). Safe to run
# again: it does only what is missing.
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
    [ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_pkgs+=(fonts-dejavu-core)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing ${need_pkgs[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # Debian's packages start their services by default; we run our own copies.
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
        apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
        rm -f /usr/sbin/policy-rc.d
    else
        echo "setup: missing ${need_pkgs[*]}; install with: sudo apt-get install -y ${need_pkgs[*]}"
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
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
