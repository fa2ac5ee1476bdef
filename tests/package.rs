//! The Debian package (`make deb`, `deb/build.sh`): its contents are what the README
//! says, lintian finds nothing, systemd accepts the unit, and what it installs runs.

mod common;
use common::Daemon;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Builds the package from this build's binaries into a scratch directory.
fn build(scratch: &Path) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bins = Path::new(env!("CARGO_BIN_EXE_isoboxd")).parent().unwrap();
    let (code, out, err) = run(Command::new(manifest.join("deb/build.sh"))
        .arg(scratch.join("out"))
        .env("ISOBOX_DEB_BIN_DIR", bins));
    assert_eq!(code, 0, "deb/build.sh: {out}{err}");
    let deb = PathBuf::from(out.trim());
    assert!(deb.exists(), "{out}");
    deb
}

#[test]
fn test_the_package_holds_what_the_readme_says_and_passes_lintian_and_systemd() {
    let scratch = PathBuf::from(format!("/tmp/isobox-pkg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let deb = build(&scratch);
    let name = deb.file_name().unwrap().to_str().unwrap().to_string();
    let version = format!("{}+git", env!("CARGO_PKG_VERSION"));
    assert!(
        name.starts_with(&format!("isobox_{version}")) && name.ends_with("_amd64.deb"),
        "{name}"
    );

    // Every file with its mode and owner; directories are root's 0755.
    let (code, listing, err) = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    assert_eq!(code, 0, "{err}");
    let mut files = BTreeSet::new();
    for l in listing.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (mode, owner, path) = (f[0], f[1], f[5]);
        assert_eq!(owner, "root/root", "{l}");
        if mode.starts_with('d') {
            assert_eq!(mode, "drwxr-xr-x", "{l}");
        } else {
            files.insert(format!("{mode} {}", path.trim_start_matches('.')));
        }
    }
    let mut want: BTreeSet<String> = [
        "-rw-r--r-- /etc/isobox/isoboxd.env",
        "-rw-r--r-- /lib/systemd/system/isobox.service",
        "-rw-r--r-- /lib/systemd/system/isobox.slice",
        "-rwxr-xr-x /usr/bin/isoboxd",
        "-rwxr-xr-x /usr/libexec/isobox/isobox-init",
        "-rwxr-xr-x /usr/libexec/isobox/isobox-wasm",
        "-rwxr-xr-x /usr/sbin/isobox-runtimes",
        "-rw-r--r-- /usr/share/doc/isobox/README.md.gz",
        "-rw-r--r-- /usr/share/doc/isobox/changelog.gz",
        "-rw-r--r-- /usr/share/doc/isobox/copyright",
        "-rwxr-xr-x /usr/share/isobox/rootfs/build.sh",
        "-rw-r--r-- /usr/share/lintian/overrides/isobox",
        "-rw-r--r-- /usr/share/man/man8/isobox-runtimes.8.gz",
        "-rw-r--r-- /usr/share/man/man8/isoboxd.8.gz",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rootfs = Path::new(env!("CARGO_MANIFEST_DIR")).join("runtimes/rootfs");
    for e in std::fs::read_dir(&rootfs).unwrap() {
        let n = e.unwrap().file_name().into_string().unwrap();
        if n.ends_with(".packages") || n.ends_with(".postinst") || n.ends_with(".fetch") {
            want.insert(format!("-rw-r--r-- /usr/share/isobox/rootfs/{n}"));
        }
    }
    assert_eq!(files, want);

    // Control fields.
    let (_, fields, _) = run(Command::new("dpkg-deb").args(["-f"]).arg(&deb).args([
        "Package",
        "Version",
        "Architecture",
        "Depends",
    ]));
    assert!(fields.contains("Package: isobox\n"), "{fields}");
    assert!(fields.contains(&format!("Version: {version}")), "{fields}");
    let depends = fields
        .lines()
        .find_map(|l| l.strip_prefix("Depends: "))
        .unwrap();
    for d in [
        "libc6 (>= ",
        "runsc (>= 0.0~20240729.0)",
        "nftables",
        "e2fsprogs",
        "erofs-utils",
        "debootstrap",
        "ca-certificates",
        "curl",
    ] {
        assert!(depends.contains(d), "{d} in {depends}");
    }
    let (_, conffiles, _) = run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(&deb)
        .arg("conffiles"));
    assert_eq!(conffiles, "/etc/isobox/isoboxd.env\n");

    // lintian: no error and no warning (pedantic tags shown too).
    let (code, out, err) = run(Command::new("lintian")
        .args(["--fail-on", "error,warning", "--pedantic"])
        .arg(&deb));
    assert_eq!(code, 0, "lintian:\n{out}{err}");
    assert!(
        !out.lines()
            .any(|l| l.starts_with("E:") || l.starts_with("W:")),
        "{out}"
    );

    // systemd accepts the unit as installed: the package's tree, with the host's own
    // units (the targets it names) and kill (ExecReload) beside it.
    let root = scratch.join("root");
    let (code, _, err) = run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
    assert_eq!(code, 0, "{err}");
    let units = root.join("lib/systemd/system");
    for e in std::fs::read_dir("/lib/systemd/system").unwrap() {
        let e = e.unwrap();
        let to = units.join(e.file_name());
        if !to.exists() && e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/kill", root.join("bin/kill")).unwrap();
    let (code, out, err) = run(Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", root.display()))
        .arg("isobox.service"));
    assert_eq!((code, out.as_str(), err.as_str()), (0, "", ""));
    let unit = std::fs::read_to_string(units.join("isobox.service")).unwrap();
    for l in [
        "ExecStart=/usr/bin/isoboxd",
        "EnvironmentFile=-/etc/isobox/isoboxd.env",
        "Slice=isobox.slice",
        "KillMode=mixed",
        "NoNewPrivileges=yes",
        "WantedBy=multi-user.target",
    ] {
        assert!(unit.lines().any(|u| u == l), "{l} in the unit");
    }
    // The stop timeout leaves the daemon its shutdown grace (10 s) and then some.
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(stop >= 30, "{stop}");

    // What it installs runs: the daemon says its version, the runtimes' build finds
    // its scripts beside itself and knows every runtime of this checkout.
    let (code, v, _) = run(Command::new(root.join("usr/bin/isoboxd")).arg("--version"));
    let (_, v_built, _) = run(Command::new(env!("CARGO_BIN_EXE_isoboxd")).arg("--version"));
    assert_eq!((code, v), (0, v_built));
    let (code, help, _) = run(Command::new(root.join("usr/sbin/isobox-runtimes")).arg("--help"));
    assert_eq!(code, 0, "{help}");
    let listed = help
        .lines()
        .find_map(|l| l.strip_prefix("runtimes: "))
        .unwrap();
    let mut listed: Vec<&str> = listed.split(' ').collect();
    listed.sort_unstable();
    let mut names: Vec<String> = want
        .iter()
        .filter_map(|f| f.strip_suffix(".packages"))
        .filter_map(|f| f.rsplit('/').next())
        .map(str::to_string)
        .collect();
    names.sort_unstable();
    assert_eq!(listed, names);
    let (code, _, err) = run(Command::new(root.join("usr/sbin/isobox-runtimes")).arg("nosuch"));
    assert_eq!(code, 2);
    assert!(err.contains("unknown runtime nosuch"), "{err}");
    // The packaged build is this checkout's, byte for byte, so a tree built by `make
    // runtimes` is up to date for it (same stamp): shown on a scratch tree holding only
    // that stamp, so the real one is never touched.
    for e in std::fs::read_dir(&rootfs).unwrap() {
        let e = e.unwrap();
        let packaged = root.join("usr/share/isobox/rootfs").join(e.file_name());
        assert_eq!(
            std::fs::read(e.path()).unwrap(),
            std::fs::read(&packaged).unwrap(),
            "{}",
            packaged.display()
        );
    }
    let trees = scratch.join("rootfs");
    std::fs::create_dir_all(trees.join("python-slim/.isobox")).unwrap();
    std::fs::copy(
        "/var/lib/isobox/rootfs/python-slim/.isobox/stamp",
        trees.join("python-slim/.isobox/stamp"),
    )
    .unwrap();
    let (code, out, err) = run(Command::new(root.join("usr/sbin/isobox-runtimes"))
        .arg("python-slim")
        .env("ISOBOX_ROOTFS_DIR", &trees));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains(&format!("up to date: {}/python-slim", trees.display())),
        "{err}"
    );
    // A newer version: the list's name and -forky (the tree `make newer-runtimes` built).
    std::fs::create_dir_all(trees.join("python-slim-forky/.isobox")).unwrap();
    std::fs::copy(
        "/var/lib/isobox/rootfs/python-slim-forky/.isobox/stamp",
        trees.join("python-slim-forky/.isobox/stamp"),
    )
    .unwrap();
    let (code, out, err) = run(Command::new(root.join("usr/sbin/isobox-runtimes"))
        .arg("python-slim-forky")
        .env("ISOBOX_ROOTFS_DIR", &trees));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        err.contains(&format!(
            "up to date: {}/python-slim-forky",
            trees.display()
        )),
        "{err}"
    );
    let (code, _, err) =
        run(Command::new(root.join("usr/sbin/isobox-runtimes")).arg("nosuch-forky"));
    assert_eq!(code, 2);
    assert!(err.contains("unknown runtime nosuch-forky"), "{err}");
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// The unit's `NoNewPrivileges=yes`, which every process of the service inherits: the
/// daemon under `setpriv --no-new-privs` passes its self-probe, runs code, keeps a
/// long-lived sandbox with a command in it and a session with its workspace mounted,
/// and leaves nothing behind.
#[test]
fn test_the_daemon_works_without_new_privileges() {
    let d = Daemon::start_wrapped(&["setpriv", "--no-new-privs"], &[]);
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap();
    assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
    d.wait_ready();
    let r = d.execute(json!({"language": "python-slim", "network": false, "code": "print(6*7)"}));
    assert_eq!(
        (r["run"]["stdout"].as_str(), r["run"]["exitCode"].as_i64()),
        (Some("42\n"), Some(0)),
        "{r}"
    );
    let id = d.wbx_sandbox();
    let ex = d.wbx_exec(&id, "echo hi from $(id -u); exit 3");
    assert_eq!(
        (ex["stdout"].as_str(), ex["exit_code"].as_i64()),
        (Some("hi from 1000\n"), Some(3)),
        "{ex}"
    );
    let s = common::session::Session::create(&d, &json!({"runtime": "python-slim"}));
    let step = s.exec(
        &d,
        &json!({"code": "open('f.txt','w').write('kept')", "network": false}),
    );
    assert_eq!(step.status, 200, "{}", step.text());
    let f = s.request(&d, "GET", "/fs?path=f.txt", &[], b"");
    assert_eq!((f.status, f.text().as_str()), (200, "kept"));
    assert_eq!(
        d.request("DELETE", &format!("/wbx/v1/sandboxes/{id}"), &[], b"")
            .status,
        204
    );
    assert_eq!(s.request(&d, "DELETE", "", &[], b"").status, 204);
    d.stop();
}
