#!/usr/bin/env bash
# The Debian package of isobox, from this checkout's release build:
#
#   deb/build.sh [OUTDIR]        (default OUTDIR: target/deb; `make deb` builds first)
#
# Packs target/release/{isoboxd,isobox-init,isobox-wasm} (stripped), the systemd unit and slice,
# the environment file, the runtimes' build (isobox-runtimes and the package lists)
# and the manual pages with dpkg-deb, as root:root, and prints the .deb's path. The
# version is Cargo.toml's plus the commit (0.1.0+git20261203.1a2b3c4); the shared
# library dependencies come from dpkg-shlibdeps. No debhelper, no cargo-deb: the
# whole layout is this file.
set -euo pipefail
cd "$(dirname "$0")/.."
# The binaries: the release build, or ISOBOX_DEB_BIN_DIR (the tests' own build).
release="${ISOBOX_DEB_BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}"
out="${1:-target/deb}"
for b in isoboxd isobox-init isobox-wasm; do
    [[ -x "$release/$b" ]] || { echo "deb/build.sh: $release/$b missing: cargo build --release first" >&2; exit 1; }
done
cargo_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
commit=$(git rev-parse --short=7 HEAD 2>/dev/null || echo 0000000)
when=$(git log -1 --format=%cd --date=format:%Y%m%d 2>/dev/null || date -u +%Y%m%d)
version="${cargo_version}+git${when}.${commit}"
arch=$(dpkg --print-architecture)
# Whoever builds the package for distribution names themselves here.
maintainer="${ISOBOX_DEB_MAINTAINER:-isobox developers <maintainers@isobox.invalid>}"
stamp=$(git log -1 --format=%cD 2>/dev/null || date -uR)
export SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)

root=$(mktemp -d /tmp/isobox-deb.XXXXXX)
chmod 0755 "$root"
trap 'rm -rf "$root"' EXIT
umask 022

install -D -m 0755 "$release/isoboxd" "$root/usr/bin/isoboxd"
# Found by isoboxd in /usr/libexec/isobox when it is not beside the daemon.
install -D -m 0755 "$release/isobox-init" "$root/usr/libexec/isobox/isobox-init"
# The eryx face's WebAssembly worker, found there likewise.
install -D -m 0755 "$release/isobox-wasm" "$root/usr/libexec/isobox/isobox-wasm"
strip --strip-unneeded --remove-section=.comment --remove-section=.note \
    "$root/usr/bin/isoboxd" "$root/usr/libexec/isobox/isobox-init" \
    "$root/usr/libexec/isobox/isobox-wasm"
install -D -m 0755 deb/isobox-runtimes "$root/usr/sbin/isobox-runtimes"
install -D -m 0755 runtimes/rootfs/build.sh "$root/usr/share/isobox/rootfs/build.sh"
for f in runtimes/rootfs/*.packages runtimes/rootfs/*.postinst runtimes/rootfs/*.fetch; do
    install -m 0644 "$f" "$root/usr/share/isobox/rootfs/"
done
install -D -m 0644 deb/isobox.service "$root/lib/systemd/system/isobox.service"
install -D -m 0644 deb/isobox.slice "$root/lib/systemd/system/isobox.slice"
install -D -m 0644 deb/isoboxd.env "$root/etc/isobox/isoboxd.env"
for m in isoboxd isobox-runtimes; do
    install -D -m 0644 "deb/$m.8" "$root/usr/share/man/man8/$m.8"
    gzip -9n "$root/usr/share/man/man8/$m.8"
done
doc="$root/usr/share/doc/isobox"
install -D -m 0644 deb/copyright "$doc/copyright"
install -D -m 0644 deb/lintian-overrides "$root/usr/share/lintian/overrides/isobox"
install -m 0644 README.md "$doc/README.md" && gzip -9n "$doc/README.md"
printf 'isobox (%s) unstable; urgency=medium\n\n  * Built from commit %s.\n\n -- %s  %s\n' \
    "$version" "$(git rev-parse HEAD 2>/dev/null || echo unknown)" "$maintainer" "$stamp" > "$doc/changelog"
gzip -9n "$doc/changelog"

# Shared libraries the binaries link, as Debian package dependencies.
shl=$(mktemp -d /tmp/isobox-shlibs.XXXXXX)
mkdir "$shl/debian"
printf 'Source: isobox\n\nPackage: isobox\nArchitecture: any\n' > "$shl/debian/control"
shlibs=$(cd "$shl" && dpkg-shlibdeps -O "$root/usr/bin/isoboxd" "$root/usr/libexec/isobox/isobox-init" "$root/usr/libexec/isobox/isobox-wasm" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
rm -rf "$shl"
[[ -n "$shlibs" ]] || { echo "deb/build.sh: dpkg-shlibdeps found no libraries" >&2; exit 1; }

mkdir -p "$root/DEBIAN"
# The runsc isobox is tested with (vendor-runsc/VERSION) or newer: older ones lack
# two years of gVisor's security fixes (on Debian 12 it comes from bookworm-backports).
runsc_min=$(sed 's/-[^-]*$//' vendor-runsc/VERSION)
for s in postinst prerm postrm; do install -m 0755 "deb/$s" "$root/DEBIAN/$s"; done
echo /etc/isobox/isoboxd.env > "$root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: isobox
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Depends: $shlibs, runsc (>= $runsc_min), nftables, e2fsprogs, erofs-utils, debootstrap, ca-certificates, curl
Section: admin
Priority: optional
Description: run untrusted code in gVisor sandboxes over HTTP
 isoboxd is a daemon that runs untrusted and AI-generated code sent over HTTP
 inside gVisor sandboxes, each capped in memory, CPU, processes, output and
 wall time, with network limited to the public internet. It serves two APIs
 (isobox's own, long-lived sandboxes under /wbx) and documents them at
 /llms.txt and /openapi.yaml.
 .
 The package installs the daemon, a systemd unit (not enabled), its settings
 in /etc/isobox/isoboxd.env and isobox-runtimes, which builds the runtimes'
 root filesystems with debootstrap.
CONTROL
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums" "$root/DEBIAN/control" "$root/DEBIAN/conffiles"

mkdir -p "$out"
deb="$out/isobox_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
