#!/usr/bin/env bash
# Build one isobox root filesystem from a Debian package list.
#
#   runtimes/rootfs/build.sh NAME DESTDIR
#
# NAME is LIST or LIST-SUITE: SUITE (trixie, forky) is the Debian release the tree
# is built from, trixie (Debian 13) when NAME names none, and LIST selects
# runtimes/rootfs/LIST.packages (one Debian package per line, '#' starts a
# comment); runtimes/rootfs/LIST-SUITE.packages wins when it exists. So `python`
# is the python list on trixie and `python-forky` the same list on forky. The
# tree is built in DESTDIR.tmp-$$:
#   debootstrap --variant=minbase SUITE, then inside it
#   apt-get install <packages> (no recommends) from SUITE, SUITE-updates
#   and SUITE-security (see "debootstrap" below for why not --include),
# then the optional hook runtimes/rootfs/LIST.postinst runs inside it, then it
# is trimmed (apt lists/caches, docs, man pages), hardened (no setuid/setgid
# files, nobody's HOME is /tmp, mount points /workspace /tmp /memory),
# versioned (.isobox/versions), stamped, and only then renamed to DESTDIR, so
# a half-built tree is never used.
#
# Optional runtimes/rootfs/LIST.fetch pins files from package registries (npm,
# PyPI) that Debian does not carry at a usable version: one "SHA256 URL" per
# line. Each is downloaded on the host with curl (https only), checked against
# its SHA-256, kept in ISOBOX_CACHE_DIR/fetch, and put in the tree's
# /tmp/isobox-fetch/ for the post-install hook, which installs it offline.
#
# Re-running is cheap: when DESTDIR/.isobox/stamp holds the sha256 of the
# package list + LIST.fetch + LIST.postinst + this script (+ the suite), nothing
# is done.
# Installed: DESTDIR/.isobox/{stamp,versions,packages,build-info}.
#
# Environment (all optional):
#   ISOBOX_FORCE=1            rebuild even if the stamp matches (e.g. to pick up
#                             new security updates)
#   ISOBOX_CACHE_DIR=DIR      persistent .deb cache (default /var/cache/isobox-debootstrap)
#   ISOBOX_MIRROR=URL         Debian mirror (default: read from the host's apt sources)
#   ISOBOX_SECURITY_MIRROR=URL  security mirror (default: read from the host's apt sources)
#   ISOBOX_NO_UPGRADE=1       use SUITE only (no SUITE-updates/-security)
#   ISOBOX_VERBOSE=1          stream debootstrap/apt output instead of only logging it
#   ISOBOX_OLD_TREE_GRACE=S   seconds before a replaced tree is deleted (default 120)
#
# Requires root, debootstrap, util-linux (unshare, flock, findmnt), coreutils.
# All mounts it makes (debootstrap's own /proc and /sys included) live in a
# private mount namespace (unshare -m) and vanish with it, so nothing is ever
# left mounted on the host, even when the build is killed.
set -euo pipefail

# The whole script is one compound command, so bash parses it completely
# before running it: editing (or `git pull`-ing) build.sh while a build is
# running cannot change what that build executes.
{
# The Debian releases a tree can be built from. trixie is Debian 13 (stable);
# forky is testing, for the newest version of each language.
SUITES="trixie forky"
DEFAULT_SUITE=trixie
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCRIPT_PATH="$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")"
CACHE_DIR="${ISOBOX_CACHE_DIR:-/var/cache/isobox-debootstrap}"
CHROOT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf 'isobox-rootfs[%s]: %s\n' "${NAME:-?}" "$*" >&2; }
die() {
    printf 'isobox-rootfs[%s]: ERROR: %s\n' "${NAME:-?}" "$*" >&2
    if [[ -n "${LIST:-}" ]]; then
        printf 'isobox-rootfs[%s]: (package list: %s)\n' "${NAME:-?}" "$LIST" >&2
    fi
    exit 1
}

usage() {
    echo "usage: $0 NAME DESTDIR   (builds runtimes/rootfs/NAME.packages into DESTDIR)" >&2
    exit 2
}

[[ $# -eq 2 ]] || usage
NAME="$1"
DEST_ARG="$2"
[[ "$NAME" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "invalid rootfs name '$NAME'"
BASE="$NAME"
SUITE="$DEFAULT_SUITE"
for s in $SUITES; do
    if [[ "$NAME" == *-"$s" ]]; then
        BASE="${NAME%-"$s"}"
        SUITE="$s"
    fi
done
LIST="$SCRIPT_DIR/$NAME.packages"
[[ -f "$LIST" ]] || LIST="$SCRIPT_DIR/$BASE.packages"
[[ -f "$LIST" ]] || { LIST_MISSING="$LIST"; LIST=""; die "package list $LIST_MISSING does not exist"; }
HOOK="$SCRIPT_DIR/$NAME.postinst"
[[ -f "$HOOK" ]] || HOOK="$SCRIPT_DIR/$BASE.postinst"
FETCH="$SCRIPT_DIR/$NAME.fetch"
[[ -f "$FETCH" ]] || FETCH="$SCRIPT_DIR/$BASE.fetch"
[[ "$(id -u)" -eq 0 ]] || die "must run as root (debootstrap, chroot and mount need it)"
for tool in debootstrap chroot unshare flock findmnt sha256sum; do
    command -v "$tool" >/dev/null 2>&1 || die "required tool '$tool' not found in PATH"
done

# Absolute, normalised destination (it may not exist yet).
[[ -n "$DEST_ARG" && "$DEST_ARG" != "/" ]] || die "refusing DESTDIR '$DEST_ARG'"
DEST="$(realpath -m -- "$DEST_ARG")"
[[ "$DEST" != "/" ]] || die "refusing DESTDIR '/'"

# ---------------------------------------------------------------- package list
# Strip comments and whitespace; one name per line; validate.
mapfile -t PKGS < <(sed -e 's/#.*$//' -e 's/[[:space:]]\+/\n/g' -- "$LIST" | sed '/^$/d' | sort -u)
[[ ${#PKGS[@]} -gt 0 ]] || die "package list is empty"
for p in "${PKGS[@]}"; do
    [[ "$p" =~ ^[a-z0-9][a-z0-9+.-]+(:[a-z0-9]+)?$ ]] || die "invalid Debian package name '$p'"
done

# ---------------------------------------------------------------- stamp check
STAMP="$( {
    printf 'suite=%s\n' "$SUITE"
    printf '%s\n' "--- $(basename "$LIST")"; cat -- "$LIST"
    if [[ -f "$FETCH" ]]; then printf '%s\n' "--- $(basename "$FETCH")"; cat -- "$FETCH"; fi
    if [[ -f "$HOOK" ]]; then printf '%s\n' "--- $(basename "$HOOK")"; cat -- "$HOOK"; fi
    printf '%s\n' "--- build.sh"; cat -- "$SCRIPT_PATH"
} | sha256sum | cut -d' ' -f1)"

stamp_matches() {
    [[ -f "$DEST/.isobox/stamp" ]] && [[ "$(cat "$DEST/.isobox/stamp")" == "$STAMP" ]]
}

if [[ "${ISOBOX_FORCE:-0}" != 1 ]] && stamp_matches; then
    log "up to date: $DEST (stamp $STAMP)"
    exit 0
fi

# One build per DESTDIR at a time.
mkdir -p "$CACHE_DIR" "$CACHE_DIR/apt-archives/partial" "$CACHE_DIR/locks" "$CACHE_DIR/logs"
LOCK="$CACHE_DIR/locks/$(printf '%s' "$DEST" | sha256sum | cut -c1-16).lock"
exec 9>"$LOCK"
if ! flock -n 9; then
    log "another build of $DEST is running; waiting for it"
    flock 9
fi
# Someone else may have finished the same build while we waited.
if [[ "${ISOBOX_FORCE:-0}" != 1 ]] && stamp_matches; then
    log "up to date: $DEST (stamp $STAMP)"
    exit 0
fi

# ---------------------------------------------------------------- mirrors
# Print "URI SUITE" for every enabled deb source with component main, from both
# the one-line (.list) and deb822 (.sources) formats.
apt_sources() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        awk '
            $1 == "deb" {
                i = 2
                if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                uri = $i; suite = $(i + 1); main = 0
                for (j = i + 2; j <= NF; j++) if ($j == "main") main = 1
                if (main) print uri, suite
            }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        awk '
            function flush(   u, s, nu, ns, a, b, k, l) {
                if (types ~ /(^| )deb( |$)/ && comps ~ /(^| )main( |$)/ && enabled != "no") {
                    nu = split(uris, a, " "); ns = split(suites, b, " ")
                    for (k = 1; k <= nu; k++) for (l = 1; l <= ns; l++) print a[k], b[l]
                }
                types = uris = suites = comps = ""; enabled = "yes"
            }
            BEGIN { enabled = "yes" }
            /^[[:space:]]*#/ { next }
            /^[[:space:]]*$/ { flush(); next }
            {
                key = tolower($1); sub(/:$/, "", key)
                val = $0; sub(/^[^:]*:[[:space:]]*/, "", val)
                if (key == "types") types = val
                else if (key == "uris") uris = val
                else if (key == "suites") suites = val
                else if (key == "components") comps = val
                else if (key == "enabled") enabled = tolower(val)
            }
            END { flush() }' "$f"
    done
}

mirror_for() { apt_sources | awk -v s="$1" '$2 == s { sub(/\/+$/, "", $1); print $1; exit }'; }

# One Debian mirror serves every release, so a host that lists only its own
# (bookworm on a Debian 12 host) lends its mirrors to a trixie or forky tree.
HOST_SUITE="$(. /etc/os-release 2>/dev/null && printf '%s' "${VERSION_CODENAME:-}")"
mirror_of() {  # the mirror for SUITE-part, else the host's own release's
    local m
    m="$(mirror_for "$SUITE$1")"
    [[ -n "$m" || -z "$HOST_SUITE" ]] || m="$(mirror_for "$HOST_SUITE$1")"
    printf '%s' "$m"
}
MIRROR="${ISOBOX_MIRROR:-$(mirror_of "")}"
[[ -n "$MIRROR" ]] || die "no Debian mirror for '$SUITE' (or the host's ${HOST_SUITE:-release}) found in /etc/apt/sources.list{,.d}; set ISOBOX_MIRROR"
SECURITY_MIRROR="${ISOBOX_SECURITY_MIRROR:-$(mirror_of -security)}"
UPDATES_MIRROR="$(mirror_of -updates)"
UPDATES_MIRROR="${UPDATES_MIRROR:-$MIRROR}"
# A debootstrap older than the release (Debian 12's knows trixie, not forky)
# builds it with the script of sid, which every later release follows.
SCRIPT=()
[[ -e "/usr/share/debootstrap/scripts/$SUITE" ]] || SCRIPT=(/usr/share/debootstrap/scripts/sid)

# ---------------------------------------------------------------- helpers
TMP="$DEST.tmp-$$"
LOGFILE="$CACHE_DIR/logs/$NAME.log"

cleanup() {
    local rc=$?
    if [[ -d "$TMP" ]]; then
        if findmnt -rn -o TARGET | grep -qF -- "$TMP"; then
            log "WARNING: something is still mounted under $TMP; leaving it in place"
        else
            rm -rf --one-file-system -- "$TMP"
        fi
    fi
    if [[ $rc -ne 0 ]]; then
        printf 'isobox-rootfs[%s]: build FAILED (exit %s) for package list %s; log: %s\n' \
            "$NAME" "$rc" "$LIST" "$LOGFILE" >&2
    fi
}
trap cleanup EXIT

# Run a command, logging its output (or streaming it with ISOBOX_VERBOSE=1).
# On failure show the end of the log and die with MESSAGE.
logged() {
    local msg="$1"; shift
    printf '\n==== %s: %s\n' "$(date -u +%FT%TZ)" "$*" >>"$LOGFILE"
    local rc=0
    if [[ "${ISOBOX_VERBOSE:-0}" == 1 ]]; then
        "$@" 2>&1 | tee -a "$LOGFILE" >&2 || rc=$?   # pipefail: rc is the command's
    else
        "$@" >>"$LOGFILE" 2>&1 || rc=$?
    fi
    if [[ $rc -ne 0 ]]; then
        echo "----- last lines of $LOGFILE -----" >&2
        tail -n 40 "$LOGFILE" >&2 || true
        [[ -f "$TMP/debootstrap/debootstrap.log" ]] && {
            echo "----- last lines of debootstrap.log -----" >&2
            tail -n 20 "$TMP/debootstrap/debootstrap.log" >&2
            cp -f "$TMP/debootstrap/debootstrap.log" "$CACHE_DIR/logs/$NAME.debootstrap.log" || true
        }
        die "$msg"
    fi
}

# Run a command chrooted into the tree inside a private mount namespace with
# /proc mounted and the persistent apt archive cache bind-mounted; the mounts
# disappear when the namespace does.
in_tree() {
    unshare --mount --propagation private --fork -- /bin/sh -ec '
        root="$1"; cache="$2"; shift 2
        mount -t proc proc "$root/proc"
        mkdir -p "$root/var/cache/apt/archives"
        mount --bind "$cache" "$root/var/cache/apt/archives"
        exec chroot "$root" /usr/bin/env -i PATH="'"$CHROOT_PATH"'" HOME=/root LANG=C.UTF-8 \
            DEBIAN_FRONTEND=noninteractive DEBCONF_NONINTERACTIVE_SEEN=true "$@"
    ' in_tree "$TMP" "$CACHE_DIR/apt-archives" "$@"
}

# Leftovers of builds that were killed (half-built trees, or an old tree that
# was being swapped out): we hold the lock, so nobody else uses them.
for stale in "$DEST".tmp-* "$DEST".old-*; do
    [[ -d "$stale" ]] || continue
    # An old tree still in its grace period (see "swap in") is left alone.
    if [[ "$stale" == "$DEST".old-* ]] &&
        [[ -z "$(find "$stale" -maxdepth 0 -cmin +$(( ${ISOBOX_OLD_TREE_GRACE:-120} / 60 + 2 )) 2>/dev/null)" ]]; then
        continue
    fi
    if findmnt -rn -o TARGET | grep -qF -- "$stale"; then
        die "stale build dir $stale has something mounted under it; unmount it first"
    fi
    log "removing stale $stale"
    rm -rf --one-file-system -- "$stale"
done

mkdir -p "$(dirname "$DEST")"
: >"$LOGFILE"
START=$(date +%s)
log "building $DEST from $LIST (${#PKGS[@]} packages, mirror $MIRROR); log: $LOGFILE"

# ---------------------------------------------------------------- debootstrap
# The Debian base (minbase: dpkg, apt, coreutils, ...). The package list is
# installed afterwards with apt rather than debootstrap --include: debootstrap's
# resolver always takes the first alternative of an "a | b" dependency, even
# when b is listed (python3-fonttools' "python3-scipy | python3-munkres" dragged
# scipy, pythran, g++ and boost, +550 MB, into the python tree), and it cannot
# resolve virtual packages (rustc depends on libc-dev). apt handles both and
# installs the SUITE-security versions directly.
logged "debootstrap of the $SUITE minbase system failed" \
    unshare --mount --propagation private --fork -- \
    debootstrap --variant=minbase --cache-dir="$CACHE_DIR" "$SUITE" "$TMP" "$MIRROR" "${SCRIPT[@]}"
log "debootstrap done after $(( $(date +%s) - START ))s"

# ---------------------------------------------------------------- apt config
# Never install docs/man pages, recommends or suggests; never start services.
mkdir -p "$TMP/etc/dpkg/dpkg.cfg.d" "$TMP/etc/apt/apt.conf.d"
cat >"$TMP/etc/dpkg/dpkg.cfg.d/01isobox-nodoc" <<'NODOC'
# isobox: keep the runtime trees small
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
NODOC
cat >"$TMP/etc/apt/apt.conf.d/01isobox" <<'APTCONF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
APT::Sandbox::User "root";
Acquire::Languages "none";
Dpkg::Options { "--force-confdef"; "--force-confold"; };
APTCONF
# forky is Debian testing: its Release files say they expire a week after they are
# signed, and a mirror or package registry that lags (the one this project is built
# against serves a month-old forky) makes apt refuse them. Testing has no timely
# security support anyway, so for it only, apt still checks every signature but not
# the expiry; build-info records it. Stable trees (trixie) keep the check.
VALID_UNTIL_CHECKED=yes
if [[ "$SUITE" == forky ]]; then
    VALID_UNTIL_CHECKED=no
    echo 'Acquire::Check-Valid-Until "false";' >"$TMP/etc/apt/apt.conf.d/02isobox-testing"
fi
printf '#!/bin/sh\nexit 101\n' >"$TMP/usr/sbin/policy-rc.d"
chmod 0755 "$TMP/usr/sbin/policy-rc.d"
{
    echo "deb $MIRROR $SUITE main"
    if [[ "${ISOBOX_NO_UPGRADE:-0}" != 1 ]]; then
        echo "deb $UPDATES_MIRROR $SUITE-updates main"
        if [[ -n "$SECURITY_MIRROR" ]]; then
            echo "deb $SECURITY_MIRROR $SUITE-security main"
        else
            log "WARNING: no $SUITE-security source found on the host; security updates are NOT applied"
        fi
    fi
} >"$TMP/etc/apt/sources.list"

# ---------------------------------------------------------------- packages
logged "apt-get update inside the tree failed (mirrors: $MIRROR ${SECURITY_MIRROR:-})" \
    in_tree apt-get -q update
# Name every unknown package instead of letting apt stop at the first one.
unknown=()
for p in "${PKGS[@]}"; do
    in_tree apt-cache show --no-all-versions "$p" >/dev/null 2>&1 || unknown+=("$p")
done
[[ ${#unknown[@]} -eq 0 ]] || die "not available in Debian $SUITE (main): ${unknown[*]}"
logged "apt-get dist-upgrade of the base system failed" in_tree apt-get -q -y dist-upgrade
logged "apt-get install of the package list failed (see which package apt complains about)" \
    in_tree apt-get -q -y install "${PKGS[@]}"
logged "the installed package set is inconsistent (dpkg --audit / apt-get check)" \
    in_tree sh -c 'dpkg --audit && apt-get -q check'
# Everything asked for must really be installed.
missing=()
for p in "${PKGS[@]}"; do
    status="$(chroot "$TMP" dpkg-query -W -f='${db:Status-Abbrev}' "${p%%:*}" 2>/dev/null || true)"
    [[ "$status" == ii* ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] || die "packages not installed after apt-get install: ${missing[*]}"
log "$(chroot "$TMP" dpkg-query -W | wc -l) packages installed after $(( $(date +%s) - START ))s"

# ---------------------------------------------------------------- pinned downloads
if [[ -f "$FETCH" ]]; then
    command -v curl >/dev/null 2>&1 || die "required tool 'curl' not found in PATH (for $FETCH)"
    mkdir -p "$CACHE_DIR/fetch" "$TMP/tmp/isobox-fetch"
    while read -r sum url rest; do
        [[ -n "${sum:-}" && "$sum" != \#* ]] || continue
        [[ -z "${rest:-}" && "$sum" =~ ^[0-9a-f]{64}$ && "$url" =~ ^https://[A-Za-z0-9./@_+%-]+$ ]] ||
            die "bad line in $FETCH: '$sum $url${rest:+ $rest}' (want: SHA256 https://URL)"
        file="${url##*/}"
        [[ "$file" =~ ^[A-Za-z0-9][A-Za-z0-9._+-]*$ ]] || die "bad file name '$file' in $FETCH"
        cached="$CACHE_DIR/fetch/$sum"
        if [[ ! -f "$cached" ]] || [[ "$(sha256sum <"$cached" | cut -d' ' -f1)" != "$sum" ]]; then
            logged "download of $url failed" \
                curl -fsSL --proto '=https' --retry 3 --max-filesize 268435456 -o "$cached.part" -- "$url"
            got="$(sha256sum <"$cached.part" | cut -d' ' -f1)"
            [[ "$got" == "$sum" ]] || { rm -f -- "$cached.part"; die "$url has SHA-256 $got, $FETCH pins $sum"; }
            mv -f -- "$cached.part" "$cached"
        fi
        cp -- "$cached" "$TMP/tmp/isobox-fetch/$file"
    done <"$FETCH"
    log "pinned downloads of $(basename "$FETCH") ready after $(( $(date +%s) - START ))s"
fi

# ---------------------------------------------------------------- post-install hook
# Optional runtimes/rootfs/NAME.postinst: a POSIX sh script run inside the tree
# as root (sh -eu, /proc mounted, writable) after the packages are installed,
# for what a package list cannot say (e.g. go.postinst precompiles the standard
# library for CGO_ENABLED=0). It is part of the stamp.
if [[ -f "$HOOK" ]]; then
    cp -- "$HOOK" "$TMP/tmp/isobox-postinst"
    logged "post-install hook $HOOK failed" in_tree /bin/sh -eu /tmp/isobox-postinst
    rm -f -- "$TMP/tmp/isobox-postinst"
    log "post-install hook $NAME.postinst done after $(( $(date +%s) - START ))s"
fi

# ---------------------------------------------------------------- trim
rm -f "$TMP/usr/sbin/policy-rc.d"
rm -rf "$TMP/var/lib/apt/lists/"* "$TMP/var/cache/apt/"*.bin "$TMP/var/cache/apt/archives" \
    "$TMP/var/cache/debconf/"*-old "$TMP/var/lib/dpkg/"*-old \
    "$TMP/usr/share/doc/"* "$TMP/usr/share/man/"* "$TMP/usr/share/info/"* \
    "$TMP/usr/share/lintian" "$TMP/usr/share/linda" "$TMP/usr/share/bug" \
    "$TMP/debootstrap"
mkdir -p "$TMP/var/cache/apt/archives/partial" "$TMP/var/lib/apt/lists/partial"
# Translations of messages; keep locale.alias (read by glibc).
find "$TMP/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} + 2>/dev/null || true
find "$TMP/var/log" -type f -delete
find "$TMP/tmp" "$TMP/var/tmp" -mindepth 1 -delete 2>/dev/null || true

# ---------------------------------------------------------------- identity / network files
grep -q '^nobody:[^:]*:65534:65534:' "$TMP/etc/passwd" || die "user nobody (65534:65534) missing from /etc/passwd"
sed -i -E 's#^(nobody:[^:]*:65534:65534:[^:]*):[^:]*:#\1:/tmp:#' "$TMP/etc/passwd"
grep -q '^nobody:[^:]*:65534:65534:[^:]*:/tmp:' "$TMP/etc/passwd" || die "could not set nobody's HOME to /tmp"
grep -q '^nogroup:[^:]*:65534:' "$TMP/etc/group" || die "group nogroup (65534) missing from /etc/group"
echo isobox >"$TMP/etc/hostname"
cat >"$TMP/etc/hosts" <<'EOF'
127.0.0.1	localhost isobox
::1	localhost ip6-localhost ip6-loopback
EOF
# debootstrap copied the build host's resolver; it means nothing in a sandbox.
# The daemon bind-mounts a resolv.conf when a sandbox gets a network.
printf '# isobox: provided by the daemon when the sandbox has a network\n' >"$TMP/etc/resolv.conf"

# ---------------------------------------------------------------- hardening
nsuid="$(find "$TMP" -xdev -type f -perm /6000 | wc -l)"
find "$TMP" -xdev -type f -perm /6000 -exec chmod ug-s {} +
[[ -z "$(find "$TMP" -xdev -type f -perm /6000 -print -quit)" ]] || die "setuid/setgid files remain"
log "stripped setuid/setgid bits from $nsuid files"

# Mount points for the daemon.
install -d -m 0755 "$TMP/workspace" "$TMP/memory"
install -d -m 1777 "$TMP/tmp" "$TMP/var/tmp"
chmod 1777 "$TMP/tmp" "$TMP/var/tmp"

# ---------------------------------------------------------------- python stdio
# Python's stdout to a pipe is block-buffered, so nothing would stream and a run killed
# at its wall time would lose what it printed. PYTHONUNBUFFERED is not the answer here:
# the 2022 gVisor could return a short write on a full host pipe (not re-checked on the
# pinned 2024 one), and unbuffered Python then
# drops the rest silently. Line buffering keeps the buffered writer (which retries
# short writes) and flushes at every newline.
if [[ -d "$TMP/usr/lib/python3/dist-packages" ]]; then
    cat >"$TMP/usr/lib/python3/dist-packages/00-isobox-linebuf.pth" <<'PTH'
import sys; [s.reconfigure(line_buffering=True) for s in (sys.stdout, sys.stderr) if s is not None and hasattr(s, "reconfigure")]
PTH
fi

# ---------------------------------------------------------------- versions
# <language>=<version> for every runtime whose binary this tree holds, obtained
# by running it inside the tree.
version_of() {  # KEY BINARY COMMAND...
    local key="$1" bin="$2"; shift 2
    [[ -e "$TMP$bin" || -L "$TMP$bin" ]] || return 0
    local out
    out="$(in_tree env HOME=/tmp "$@" 2>&1)" || die "'$*' failed inside the tree: $out"
    out="$(printf '%s' "$out" | head -n 1)"
    [[ -n "$out" ]] || die "'$*' printed no version inside the tree"
    printf '%s=%s\n' "$key" "$out"
}
mkdir -p "$TMP/.isobox"
{
    version_of python /usr/bin/python3 python3 -c 'import platform; print(platform.python_version())'
    version_of javascript /usr/bin/node node -e 'console.log(process.versions.node)'
    version_of typescript /usr/local/bin/tsc sh -c 'tsc --version | sed -n "s/^Version //p"'
    version_of ruby /usr/bin/ruby ruby -e 'puts RUBY_VERSION'
    version_of go /usr/bin/go sh -c 'GOCACHE=/tmp/gocache go env GOVERSION | sed "s/^go//"'
    version_of rust /usr/bin/rustc sh -c 'rustc --version | cut -d" " -f2'
} >"$TMP/.isobox/versions.new"
mv "$TMP/.isobox/versions.new" "$TMP/.isobox/versions"
find "$TMP/tmp" -mindepth 1 -delete 2>/dev/null || true

# Record what went in, for audits.
chroot "$TMP" dpkg-query -W -f='${Package}=${Version}\n' | sort >"$TMP/.isobox/packages"
{
    echo "name=$NAME"
    echo "suite=$SUITE"
    echo "mirror=$MIRROR"
    echo "security_mirror=${SECURITY_MIRROR:-none}"
    echo "upgraded=$([[ "${ISOBOX_NO_UPGRADE:-0}" == 1 ]] && echo no || echo yes)"
    echo "release_expiry_checked=$VALID_UNTIL_CHECKED"
    echo "built_at=$(date -u +%FT%TZ)"
    echo "debootstrap=$(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null || echo unknown)"
} >"$TMP/.isobox/build-info"
echo "$STAMP" >"$TMP/.isobox/stamp"
chmod -R go-w,a+rX "$TMP/.isobox"

# ---------------------------------------------------------------- swap in
# Two renames: DEST is absent for an instant but never half-built. Sandboxes
# already running on the old tree keep using it under its new name (runsc's
# gofer holds the directory open), so it is deleted only after a grace period
# (ISOBOX_OLD_TREE_GRACE seconds, default 120), by a background process; a
# later build removes it too if that process was killed.
OLD=""
if [[ -e "$DEST" || -L "$DEST" ]]; then
    OLD="$DEST.old-$$"
    mv -T -- "$DEST" "$OLD"
fi
mv -T -- "$TMP" "$DEST"
if [[ -n "$OLD" ]]; then
    grace="${ISOBOX_OLD_TREE_GRACE:-120}"
    [[ "$grace" =~ ^[0-9]+$ ]] || grace=120
    if [[ "$grace" -eq 0 ]]; then
        rm -rf --one-file-system -- "$OLD"
    else
        nohup setsid sh -c 'sleep "$1"; rm -rf --one-file-system -- "$2"' isobox-old-tree "$grace" "$OLD" \
            </dev/null >/dev/null 2>&1 &
        log "previous tree moved to $OLD; deleted in ${grace}s"
    fi
fi

SIZE="$(du -sh "$DEST" | cut -f1)"
log "built $DEST in $(( $(date +%s) - START ))s, $SIZE; versions: $(tr '\n' ' ' <"$DEST/.isobox/versions")"
exit 0
}
