#!/usr/bin/env python3
"""Check isobox runtime descriptors against their built root filesystems.

    runtimes/check.py [--rootfs-dir /var/lib/isobox/rootfs] [--extras] [LANGUAGE...]

For every runtimes/<language>.toml (or the languages named) this

  * validates the descriptor the way the daemon parses it (exact key set,
    types, limits),
  * checks that the rootfs tree exists, is stamped, and that its
    .isobox/versions has the descriptor's version_key,
  * writes a hello-world program as `source_file` into a fresh /workspace,
    runs `build` (compiled runtimes) and then `run` + args with stdin, as uid
    and gid 65534, with the descriptor's env only, chrooted into the tree
    mounted read-only, /tmp and /workspace writable, /proc mounted,
  * compares the output, and prints timings and peak RSS.

With --extras it also runs per-language extra programs (python: matplotlib Agg
+ the bundled libraries; node: a process.exit() flush test; ...).

Everything happens in a private mount namespace (unshare -m): no mount
outlives the check. Needs root, util-linux (unshare), coreutils (chroot), /usr/bin/time
(package time).
Exit status: 0 when every check passed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
UID = GID = 65534

# ---------------------------------------------------------------- descriptor

FIELDS = {
    "language": str,
    "aliases": list,
    "version_forms": list,
    "rootfs": str,
    "version_key": str,
    "compiled": bool,
    "source_file": str,
    "build": list,
    "run": list,
    "env": list,
    "limits": dict,
}
# Optional keys.
OPTIONAL = {"extra_rootfs": list, "writable_root": bool}
LIMIT_FIELDS = {"memory_bytes": int, "cpus": (int, float), "wall_time_ms": int}


def validate(path: Path) -> tuple[dict, list[str]]:
    errs: list[str] = []
    with path.open("rb") as f:
        d = tomllib.load(f)
    for k in d:
        if k not in FIELDS and k not in OPTIONAL:
            errs.append(f"unknown key {k!r}")
    for k, t in OPTIONAL.items():
        if k in d and not isinstance(d[k], t):
            errs.append(f"{k!r} must be {t.__name__}")
    for k, t in FIELDS.items():
        if k not in d:
            errs.append(f"missing key {k!r}")
        elif not isinstance(d[k], t):
            errs.append(f"{k!r} must be {t.__name__}")
    if errs:
        return d, errs
    for k in ("aliases", "version_forms", "build", "run", "env", "extra_rootfs"):
        if not all(isinstance(x, str) for x in d.get(k, [])):
            errs.append(f"{k!r} must be an array of strings")
    if d["language"] != path.stem:
        errs.append(f"language {d['language']!r} != file name {path.stem!r}")
    if not (HERE / "rootfs" / f"{d['rootfs']}.packages").is_file():
        errs.append(f"no runtimes/rootfs/{d['rootfs']}.packages")
    if d["compiled"] != bool(d["build"]):
        errs.append("compiled must be true exactly when build is non-empty")
    if not d["run"] or not d["run"][0].startswith("/"):
        errs.append("run[0] must be an absolute path")
    if d["build"] and not d["build"][0].startswith("/"):
        errs.append("build[0] must be an absolute path")
    if "/" in d["source_file"]:
        errs.append("source_file must be a plain file name")
    for e in d["env"]:
        if "=" not in e or e.startswith("="):
            errs.append(f"env entry {e!r} is not NAME=VALUE")
    lim = d["limits"]
    for k in lim:
        if k not in LIMIT_FIELDS:
            errs.append(f"unknown key limits.{k}")
    for k, t in LIMIT_FIELDS.items():
        if k not in lim:
            errs.append(f"missing key limits.{k}")
        elif not isinstance(lim[k], t) or isinstance(lim[k], bool) or lim[k] <= 0:
            errs.append(f"limits.{k} must be a positive number")
    return d, errs


# ---------------------------------------------------------------- programs

ARGS = ["a", "b c", "ünï"]
STDIN = "first line\nsecond line\n"
EXPECTED = "hello from {lang}\nargs=a|b c|ünï\nstdin lines=2 first=first line\n"

HELLO = {
    "python": """\
import sys
print("hello from python")
print("args=" + "|".join(sys.argv[1:]))
lines = sys.stdin.read().splitlines()
print(f"stdin lines={len(lines)} first={lines[0] if lines else ''}")
""",
    "javascript": """\
const fs = require("fs");
console.log("hello from javascript");
console.log("args=" + process.argv.slice(2).join("|"));
const lines = fs.readFileSync(0, "utf8").split("\\n").filter((l) => l.length > 0);
console.log(`stdin lines=${lines.length} first=${lines[0] ?? ""}`);
""",
    "typescript": """\
import * as fs from "fs";
const greet = (who: string): string => `hello from ${who}`;
console.log(greet("typescript"));
console.log("args=" + process.argv.slice(2).join("|"));
const lines: string[] = fs.readFileSync(0, "utf8").split("\\n").filter((l) => l.length > 0);
console.log(`stdin lines=${lines.length} first=${lines[0] ?? ""}`);
""",
    "ruby": """\
puts "hello from ruby"
puts "args=" + ARGV.join("|")
lines = $stdin.read.lines.map(&:chomp)
puts "stdin lines=#{lines.size} first=#{lines.first}"
""",
    "go": """\
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

func main() {
	fmt.Println("hello from go")
	fmt.Println("args=" + strings.Join(os.Args[1:], "|"))
	sc := bufio.NewScanner(os.Stdin)
	n, first := 0, ""
	for sc.Scan() {
		if n == 0 {
			first = sc.Text()
		}
		n++
	}
	fmt.Printf("stdin lines=%d first=%s\\n", n, first)
}
""",
    "rust": """\
use std::io::Read;

// async fn only compiles with edition >= 2018: proves --edition is passed.
#[allow(dead_code)]
async fn edition_check() {}

fn main() {
    println!("hello from rust");
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("args={}", args.join("|"));
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).unwrap();
    let lines: Vec<&str> = s.lines().collect();
    println!("stdin lines={} first={}", lines.len(), lines.first().unwrap_or(&""));
}
""",
}
HELLO["python-slim"] = HELLO["python"].replace("hello from python", "hello from python-slim")

# (name, source, expected stdout substring)
EXTRAS: dict[str, list[tuple[str, str, str]]] = {
    "python": [
        ("matplotlib-agg", """\
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2])
plt.savefig("/tmp/x.png")
import os
print("png-bytes>0", os.path.getsize("/tmp/x.png") > 0, matplotlib.get_backend().lower())
""", "png-bytes>0 True agg"),
        ("matplotlib-font-list-prebuilt", """\
import logging, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
import matplotlib.pyplot
print("cached", os.listdir(os.path.expanduser("~/.cache/matplotlib")))
""", "cached ['fontlist-v"),
        ("libraries", """\
import requests, httpx, bs4, lxml, pandas, numpy, yt_dlp
from yt_dlp.version import __version__ as ytv
df = pandas.DataFrame({"a": [1, 2, 3]})
soup = bs4.BeautifulSoup("<p>hi</p>", "lxml")
print("libs", soup.p.text, int(df.a.sum()), int(numpy.arange(4).sum()), requests.__version__, httpx.__version__, ytv)
""", "libs hi 6 6"),
        ("ssl-trust-store", "import ssl; c = ssl.create_default_context(); print('ca-certs', c.cert_store_stats()['x509_ca'] > 100)\n",
         "ca-certs True"),
    ],
    "python-slim": [
        ("sandbox-layout", """\
import errno, os
def w(p):
    try:
        with open(p, "a") as f:
            f.write("x")
        return "rw"
    except OSError as e:
        return errno.errorcode[e.errno]
print("layout", os.getuid(), os.getgid(), os.getcwd(), os.path.expanduser("~"),
      "main.py:" + w("main.py"), "new:" + w("new.txt"), "tmp:" + w("/tmp/x"), "etc:" + w("/etc/x"))
""", "layout 65534 65534 /workspace /tmp main.py:EROFS new:rw tmp:rw etc:EROFS"),
        ("stdlib", "import ssl, sqlite3, json, zlib, decimal, ctypes; print('stdlib ok', ssl.OPENSSL_VERSION.split()[0])\n",
         "stdlib ok OpenSSL"),
        ("no-numpy", "try:\n    import numpy\n    print('numpy present')\nexcept ImportError:\n    print('numpy absent')\n",
         "numpy absent"),
    ],
    "javascript": [
        ("error-exit", "console.log('before');\nthrow new Error('boom');\n", "before"),
        ("is-main", "console.log('main=' + (require.main === module), require('path').basename(__filename));\n", "main=true main.js"),
        ("exit-flush", "process.stdout.write('x'.repeat(1 << 20) + '\\n'); process.stdout.write('END\\n'); process.exit(3);\n",
         "END"),
    ],
    "typescript": [
        ("type-error-fails-build", "const n: number = 'not a number';\nconsole.log(n);\n", "<build-fails>"),
    ],
    "ruby": [
        ("file-is-main", "puts \"main=#{__FILE__ == $0} file=#{File.basename(__FILE__)}\"\nputs \"utf8=#{\"ünï\".encoding} #{Encoding.default_external}\"\n", "main=true file=main.rb\nutf8=UTF-8 UTF-8"),
        ("error-exit", "$stdout.puts 'before'\nraise 'boom'\n", "before"),
    ],
    "go": [
        ("net-http-import", """\
package main

import (
	"fmt"
	"net/http"
)

func main() { fmt.Println("status", http.StatusText(404)) }
""", "status Not Found"),
    ],
    "rust": [
        ("collections", """\
use std::collections::HashMap;
fn main() {
    let mut m = HashMap::new();
    for w in "a b a".split(' ') { *m.entry(w).or_insert(0) += 1; }
    println!("count a={}", m["a"]);
}
""", "count a=2"),
    ],
}

# ---------------------------------------------------------------- multi-file programs

# (name, {path: content} with the entry FIRST, expected stdout substring)
MULTI: dict[str, list[tuple[str, dict[str, str], str]]] = {
    "python": [
        ("multi-file", {
            "app.py": "from pkg.mod import f\nprint('multi', f())\n",
            "pkg/__init__.py": "",
            "pkg/mod.py": "def f():\n    return 42\n",
        }, "multi 42"),
    ],
    "javascript": [
        ("multi-file", {
            "src/app.js": "const u = require('../lib/u.js');\nconsole.log('multi', u.f(), require.main === module);\n",
            "lib/u.js": "exports.f = () => 42;\n",
        }, "multi 42 true"),
    ],
    "typescript": [
        ("multi-file", {
            "src/app.ts": 'import { twice } from "../lib/util";\nimport * as h from "../lib/helper.js";\n'
                          'import data from "../lib/data.json";\n'
                          'console.log("multi", twice(21), h.hi(), data.n, require.main === module);\n',
            "lib/util.ts": "export function twice(n: number): number { return n * 2; }\n",
            "lib/helper.js": "exports.hi = () => 'hi';\n",
            "lib/data.json": '{"n": 7}\n',
        }, "multi 42 hi 7 true"),
    ],
    "ruby": [
        ("multi-file", {
            "main.rb": "require_relative 'lib/u'\nputs \"multi #{U.f}\"\n",
            "lib/u.rb": "module U\n  def self.f = 42\nend\n",
        }, "multi 42"),
    ],
    "go": [
        ("multi-file", {
            "main.go": 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("multi", helper()) }\n',
            "helper.go": "package main\n\nfunc helper() int { return 42 }\n",
        }, "multi 42"),
        ("go.mod-module", {
            "main.go": 'package main\n\nimport (\n\t"fmt"\n\n\t"example.com/app/util"\n)\n\n'
                       'func main() { fmt.Println("module", util.X()) }\n',
            "go.mod": "module example.com/app\n\ngo 1.19\n",
            "util/u.go": "package util\n\nfunc X() int { return 42 }\n",
        }, "module 42"),
    ],
    "rust": [
        ("multi-file", {
            "main.rs": "mod util;\nfn main() { println!(\"multi {}\", util::f()); }\n",
            "util.rs": "pub fn f() -> i32 { 42 }\n",
        }, "multi 42"),
    ],
}

# ---------------------------------------------------------------- sandbox-ish runner

# Mirrors the daemon's bundle (src/sandbox/bundle.rs): the tree read-only as /,
# /workspace writable (a tmpfs there) with each top-level entry of the request's
# files bound read-only on top, /tmp writable, /proc, uid/gid 65534,
# RLIMIT_NOFILE 1024, only the descriptor's env (+ PATH, LANG, HOME).
DRIVER = r"""
set -eu
root="$1"; src="$2"; ws="$3"; tmp="$4"; upper="$5"; shift 5
if [ -n "$upper" ]; then
    # writable_root: the tree below an overlay whose upper layer is the program's own.
    mount -t overlay overlay -o "lowerdir=$root,upperdir=$upper/upper,workdir=$upper/work" "$upper/root"
    root="$upper/root"
else
    mount --bind "$root" "$root"
    mount -o remount,bind,ro "$root"
fi
mount --bind "$ws" "$root/workspace"
for top in "$src"/* "$src"/.[!.]*; do
    [ -e "$top" ] || continue
    name="${top##*/}"
    if [ -d "$top" ]; then mkdir -p "$root/workspace/$name"; else : >"$root/workspace/$name"; fi
    mount --rbind "$top" "$root/workspace/$name"
    mount -o remount,bind,ro "$root/workspace/$name"
done
mount --bind "$tmp" "$root/tmp"
mount -t proc proc "$root/proc"
exec prlimit --nofile=1024:1024 chroot --userspec=65534:65534 --groups=65534 "$root" "$@"
"""


def phase(root: Path, scratch: Path, env: list[str], argv: list[str],
          stdin: bytes, timeout: float, writable_root: bool = False) -> dict:
    """Run argv in /workspace of the tree as 65534 with exactly env."""
    rss_file = scratch / "maxrss"
    full_env = ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/tmp", *env]
    cmd = ["/usr/bin/time", "-f", "%M", "-o", str(rss_file),
           "unshare", "--mount", "--propagation", "private", "--fork", "--",
           "/bin/sh", "-c", DRIVER, "driver", str(root),
           str(scratch / "src"), str(scratch / "ws"), str(scratch / "tmp"),
           str(scratch / "overlay") if writable_root else "",
           "/usr/bin/env", "-i", *full_env, "/bin/sh", "-c", 'cd /workspace && exec "$@"', "sh", *argv]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return {"rc": None, "out": out.decode(errors="replace"), "err": err.decode(errors="replace") + "\n<timeout>",
                "secs": time.monotonic() - t0, "maxrss_mb": 0.0}
    secs = time.monotonic() - t0
    # /usr/bin/time reports the peak RSS (KiB) of the largest process in the tree.
    try:
        rss = int(rss_file.read_text().split()[-1]) / 1024
    except (OSError, ValueError, IndexError):
        rss = 0.0
    return {"rc": p.returncode, "out": out.decode(errors="replace"), "err": err.decode(errors="replace"),
            "secs": secs, "maxrss_mb": rss}


def substitute(argv: list[str], source_file: str, entry: str) -> list[str]:
    """As the daemon does: argv elements equal to source_file become the entry."""
    return [entry if a == source_file else a for a in argv]


def run_program(d: dict, root: Path, files: dict[str, str], args: list[str], stdin: str,
                scratch: Path, timeout_factor: float, compile_timeout: float) -> dict:
    if scratch.exists():
        shutil.rmtree(scratch)
    for sub in ("src", "ws", "tmp", "overlay/upper", "overlay/work", "overlay/root"):
        (scratch / sub).mkdir(parents=True)
    os.chmod(scratch / "ws", 0o1777)
    os.chmod(scratch / "tmp", 0o1777)
    for rel, content in files.items():
        path = scratch / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    for dirpath, dirnames, filenames in os.walk(scratch / "src"):
        for n in dirnames:
            os.chmod(os.path.join(dirpath, n), 0o755)
        for n in filenames:
            os.chmod(os.path.join(dirpath, n), 0o644)
            # Owned by the sandbox user, so only the read-only mount stops writes.
            os.chown(os.path.join(dirpath, n), UID, GID)
    entry = next(iter(files))
    limit = d["limits"]["wall_time_ms"] / 1000 * timeout_factor
    res: dict = {"build": None}
    if d["build"]:
        argv = substitute(d["build"], d["source_file"], entry)
        res["build"] = phase(root, scratch, d["env"], argv, b"", compile_timeout,
                             d.get("writable_root", False))
        if res["build"]["rc"] != 0:
            return res
    argv = substitute(d["run"], d["source_file"], entry) + args
    res["run"] = phase(root, scratch, d["env"], argv, stdin.encode(), limit,
                       d.get("writable_root", False))
    return res


def short(s: str, n: int = 600) -> str:
    s = s.strip()
    return s if len(s) <= n else s[:n] + " ...[cut]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("languages", nargs="*")
    ap.add_argument("--rootfs-dir", default="/var/lib/isobox/rootfs", type=Path)
    ap.add_argument("--extras", action="store_true", help="also run the per-language extra programs")
    ap.add_argument("--timeout-factor", type=float, default=1.0,
                    help="multiply each descriptor's wall_time_ms by this (default 1)")
    ap.add_argument("--compile-timeout-ms", type=int, default=30000,
                    help="limit of the build step (the daemon's ISOBOX_COMPILE_TIMEOUT_MS, default 30000)")
    ap.add_argument("--validate-only", action="store_true", help="only check the descriptors' format")
    a = ap.parse_args()

    files = sorted(HERE.glob("*.toml"))
    if a.languages:
        files = [HERE / f"{l}.toml" for l in a.languages]
    failures = 0
    seen_names: dict[str, str] = {}
    scratch_base = Path(tempfile.mkdtemp(prefix="isobox-check-", dir="/var/tmp"))
    os.chmod(scratch_base, 0o755)
    try:
        for f in files:
            if not f.is_file():
                print(f"FAIL {f.stem}: no descriptor {f}")
                failures += 1
                continue
            d, errs = validate(f)
            for n in [d.get("language", "")] + list(d.get("aliases", [])):
                if n in seen_names:
                    errs.append(f"name {n!r} also used by {seen_names[n]}")
                seen_names[n] = f.stem
            if errs:
                print(f"FAIL {f.stem}: descriptor: " + "; ".join(errs))
                failures += 1
                continue
            if a.validate_only:
                print(f"ok   {f.stem}: descriptor")
                continue
            lang = d["language"]
            # The default tree must be built; each further version is checked when built.
            extra = [t for t in d.get("extra_rootfs", []) if (a.rootfs_dir / t / ".isobox" / "stamp").is_file()]
            for tree in [d["rootfs"]] + extra:
                failures += check_tree(a, d, lang, a.rootfs_dir / tree, scratch_base)
    finally:
        shutil.rmtree(scratch_base, ignore_errors=True)
    print(f"{len(files)} descriptors checked, {failures} failure(s)")
    return 1 if failures else 0


def check_tree(a, d: dict, lang: str, root: Path, scratch_base: Path) -> int:
    """Runs a descriptor's programs in one of its trees; the number of failures."""
    failures = 0
    versions = {}
    vf = root / ".isobox" / "versions"
    if not (root / ".isobox" / "stamp").is_file() or not vf.is_file():
        print(f"FAIL {lang}: rootfs {root} not built (runtimes/rootfs/build.sh {root.name} {root})")
        return failures + 1
    for line in vf.read_text().splitlines():
        k, _, v = line.partition("=")
        versions[k] = v
    if d["version_key"] not in versions:
        print(f"FAIL {lang}: {vf} has no {d['version_key']!r} line")
        return failures + 1
    if lang not in HELLO:
        print(f"FAIL {lang}: check.py has no hello-world program for it")
        return failures + 1
    sf = d["source_file"]
    cases = [("hello+args+stdin", {sf: HELLO[lang]}, ARGS, STDIN, EXPECTED.format(lang=lang), "exact")]
    if a.extras:
        cases += [(n, {sf: s}, [], "", e, "contains") for n, s, e in EXTRAS.get(lang, [])]
        cases += [(n, fs, [], "", e, "contains") for n, fs, e in MULTI.get(lang, [])]
    for name, srcs, args, stdin, expected, mode in cases:
        res = run_program(d, root, srcs, args, stdin, scratch_base / lang,
                          a.timeout_factor, a.compile_timeout_ms / 1000)
        b, r = res["build"], res.get("run")
        timing = (f"build {b['secs']:.2f}s/{b['maxrss_mb']:.0f}MiB, " if b else "") + (
            f"run {r['secs']:.2f}s/{r['maxrss_mb']:.0f}MiB" if r else "")
        if expected == "<build-fails>":
            ok = b is not None and b["rc"] not in (0, None)
            detail = short(b["out"] + b["err"], 200) if b else ""
        elif r is None:
            ok = False
            detail = f"build failed rc={b['rc']}: {short(b['out'] + b['err'])}"
        else:
            got = r["out"]
            ok = (got == expected) if mode == "exact" else (expected in got)
            if name.startswith("error-exit"):
                ok = ok and r["rc"] == 1 and "boom" in r["err"]
            elif name == "exit-flush":
                ok = ok and len(got) > (1 << 20) and r["rc"] == 3
            else:
                ok = ok and r["rc"] == 0
            detail = "" if ok else f"rc={r['rc']} stdout={short(got)!r} stderr={short(r['err'])!r}"
        status = "ok  " if ok else "FAIL"
        failures += 0 if ok else 1
        print(f"{status} {lang} [{name}] ({timing}) {versions[d['version_key']] if name.startswith('hello') else ''} {detail}".rstrip())
        sys.stdout.flush()
    return failures


if __name__ == "__main__":
    sys.exit(main())
