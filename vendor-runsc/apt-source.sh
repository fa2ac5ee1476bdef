#!/usr/bin/env bash
# The host change isobox's runsc needs on Debian 12 (issue 21): Debian's bookworm-backports
# as an apt source, with a pin so that runsc, and nothing else, comes from it.
#   vendor-runsc/apt-source.sh           add the source and the pin (idempotent), apt-get update
#   vendor-runsc/apt-source.sh --remove  take both away again, apt-get update
# Going back to Debian 12's own runsc after --remove:
#   apt-get install --allow-downgrades runsc=0.0~20221219.0-2+b3
# Another distribution than Debian 12 is left as it is (its own runsc is used).
set -euo pipefail
list=/etc/apt/sources.list.d/isobox-bookworm-backports.sources
pin=/etc/apt/preferences.d/isobox-runsc-backports
if [[ "${1:-}" == "--remove" ]]; then
    rm -f "$list" "$pin"
    apt-get update
    exit 0
fi
. /etc/os-release
if [[ "${ID:-}" != debian || "${VERSION_CODENAME:-}" != bookworm ]]; then
    echo "vendor-runsc: not Debian 12 (${PRETTY_NAME:-unknown}); no backports source added" >&2
    exit 0
fi
want_list="# Added by isobox (vendor-runsc/apt-source.sh): runsc from bookworm-backports.
# Remove with vendor-runsc/apt-source.sh --remove.
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"
want_pin="# Added by isobox (vendor-runsc/apt-source.sh): from bookworm-backports, runsc only.
Package: runsc
Pin: release n=bookworm-backports
Pin-Priority: 990

Package: *
Pin: release n=bookworm-backports
Pin-Priority: -1
"
changed=0
if [[ "$(cat "$list" 2>/dev/null)" != "${want_list%$'\n'}" ]]; then
    printf '%s' "$want_list" > "$list"
    changed=1
fi
if [[ "$(cat "$pin" 2>/dev/null)" != "${want_pin%$'\n'}" ]]; then
    printf '%s' "$want_pin" > "$pin"
    changed=1
fi
if [[ $changed == 1 || "${1:-}" == "--update" ]]; then
    apt-get update
fi
