#!/usr/bin/env bash
# Checks that the installed runsc is the version isobox was measured and tested with.
# A different version is reported, not refused: the daemon's self-probe is the real test.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
want="$(cat "$here/VERSION")"
have="$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || echo none)"
if [[ "$have" != "$want" ]]; then
    echo "vendor-runsc: runsc $have installed, isobox is pinned to $want (see vendor-runsc/README.md)" >&2
    exit 1
fi
arch="$(dpkg --print-architecture)"
if grep -q " $arch $want\$" "$here/SHA256SUMS"; then
    sum="$(sha256sum /usr/bin/runsc | cut -d' ' -f1)"
    grep -q "^$sum  /usr/bin/runsc  $arch $want\$" "$here/SHA256SUMS" || { echo "vendor-runsc: /usr/bin/runsc checksum $sum does not match SHA256SUMS" >&2; exit 1; }
fi
echo "vendor-runsc: runsc $have ok"
