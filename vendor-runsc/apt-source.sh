#!/usr/bin/env bash
# The host change isobox's runsc needs on Debian 12 (issue 21): Debian's bookworm-backports
# as an apt source, with a pin that takes the runsc of vendor-runsc/VERSION from it, and
# nothing else.
#   vendor-runsc/apt-source.sh           add the source and the pin (idempotent); apt-get
#                                        update when either changed
#   vendor-runsc/apt-source.sh --update  the same, and apt-get update in any case
#   vendor-runsc/apt-source.sh --remove  take both away again, apt-get update
# A host that lists bookworm-backports already keeps its own source and whatever it takes
# from there: only runsc's pin is added. Going back to Debian 12's own runsc after
# --remove: apt-get install --allow-downgrades runsc=0.0~20221219.0-2+b3
# Another distribution than Debian 12 is left as it is (its own runsc is used).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
list=/etc/apt/sources.list.d/isobox-bookworm-backports.sources
pin=/etc/apt/preferences.d/isobox-runsc-backports
case "${1:-}" in
    "" | --update) ;;
    --remove)
        rm -f "$list" "$pin"
        apt-get update
        exit 0
        ;;
    *)
        echo "usage: $0 [--update | --remove]" >&2
        exit 2
        ;;
esac
os_release=/etc/os-release
[[ -r $os_release ]] || os_release=/usr/lib/os-release
# shellcheck disable=SC1090
. "$os_release"
if [[ "${ID:-}" != debian || "${VERSION_CODENAME:-}" != bookworm ]]; then
    echo "vendor-runsc: not Debian 12 (${PRETTY_NAME:-unknown}); no backports source added" >&2
    exit 0
fi
version="$(cat "$here/VERSION")"
# The host's own bookworm-backports entries, if any (ours aside).
theirs="$(grep -rlsE '(^|[[:space:]])bookworm-backports([[:space:]]|$)' /etc/apt/sources.list /etc/apt/sources.list.d/ | grep -vxF "$list" || true)"
want_pin="# Added by isobox (vendor-runsc/apt-source.sh): runsc $version from bookworm-backports.
Package: runsc
Pin: version $version
Pin-Priority: 990
"
changed=0
if [[ -n "$theirs" ]]; then
    # Theirs already: no second entry (a different Signed-By would stop apt), and their
    # backports packages stay theirs.
    if [[ -e $list ]]; then
        rm -f "$list"
        changed=1
    fi
else
    want_list="# Added by isobox (vendor-runsc/apt-source.sh): runsc from bookworm-backports.
# Remove with vendor-runsc/apt-source.sh --remove.
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"
    want_pin="$want_pin
# Nothing else from the suite this file's source added.
Package: *
Pin: release n=bookworm-backports
Pin-Priority: -1
"
    if [[ "$(cat "$list" 2>/dev/null)" != "${want_list%$'\n'}" ]]; then
        printf '%s' "$want_list" >"$list"
        changed=1
    fi
fi
if [[ "$(cat "$pin" 2>/dev/null)" != "${want_pin%$'\n'}" ]]; then
    printf '%s' "$want_pin" >"$pin"
    changed=1
fi
if [[ $changed == 1 || "${1:-}" == "--update" ]]; then
    apt-get update
fi
