//! The OCI bundle of one execution: `config.json` plus the program's files.
//!
//! The root filesystem is the runtime's tree, read-only. runsc creates the mount points
//! of the spec's mounts that the tree lacks inside the root it is given, on the host,
//! and in a shared tree they would outlive the run and change what every later run of
//! any tenant sees (a file named `main.rb/x` would leave a directory where every cold
//! Ruby run needs its `main.rb`). So a run sees the tree itself only when every mount
//! point is already there ([`mount_points_in`]: a cold run's `/workspace`, `/tmp`,
//! `/proc`, a networked run's `/etc/resolv.conf`, a session step's `/memory`), and
//! otherwise through a per-run overlay ([`mount_root`]) whose upper directory takes what
//! runsc makes, removed with the run; so does a sandbox whose root is writable (in
//! gVisor's memory) and a run with the start frame's program copied in. Either way the
//! shared tree is never written. `/tmp` is a tmpfs of gVisor's
//! capped at the run's memory. `/workspace` (the working directory) is a host tmpfs of
//! the run's own, as large, mounted at `dir/files` ([`write_files`]) and bound in: the
//! program's files are written there owned by root (files 0644, directories 0755, the
//! top 1777 with the sticky bit), so the program can add files but never change,
//! remove or rename the ones it was given (a pooled sandbox gets its files from its
//! harness instead, into gVisor's own tmpfs: see `sandbox::warm`). Not one bind per
//! file: gVisor lists a file bound over a mount point it made itself as a directory
//! (`d_type` `DT_DIR`), and Go 1.24's `go build .`, Python's `os.scandir` and `os.walk`
//! then see no files at all. The process runs as uid 65534 with no capabilities,
//! `noNewPrivileges`, and RLIMIT_NPROC = `pids` (gVisor enforces it inside the sandbox).
//! A session step instead gets its session's workspace filesystem bound read-write.

use super::SandboxError;
use crate::sandbox::plan::ExecPlan;
use serde_json::{json, Value};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Unprivileged uid/gid of every sandboxed program.
pub const SANDBOX_UID: u32 = crate::sys::NOBODY;

/// What the process inside runs.
pub struct ProcessSpec<'a> {
    /// argv.
    pub args: Vec<String>,
    /// Environment.
    pub env: &'a [String],
}

/// Writes the program's files under `dir/files`, creating `dir` fresh (mode 0700). With
/// `workspace_bytes`, `dir/files` is first a tmpfs of that size (the run's `/workspace`,
/// mode 1777), unmounted by [`remove_run_dir`].
///
/// # Errors
/// [`SandboxError::Bundle`] on any I/O error, or a tmpfs that cannot be mounted or is
/// too small for the files.
pub fn write_files(
    dir: &Path,
    files: &[(String, Vec<u8>)],
    workspace_bytes: Option<u64>,
) -> Result<PathBuf, SandboxError> {
    let wrap = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SandboxError::Bundle { path, source }
    };
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(wrap(dir))?;
    let src = dir.join("files");
    fs::create_dir(&src).map_err(wrap(&src))?;
    if let Some(bytes) = workspace_bytes {
        crate::sys::loopdev::mount(
            Path::new("tmpfs"),
            &src,
            "tmpfs",
            libc::MS_NOSUID | libc::MS_NODEV,
            // An inode per 4 KiB of the cap, as gVisor's own tmpfs would allow at most.
            &format!(
                "size={bytes},mode=0755,nr_inodes={}",
                (bytes / 4096).clamp(4096, 1 << 20)
            ),
        )
        .map_err(wrap(&src))?;
    }
    for (name, content) in files {
        // Names were validated (relative, no `..`); the directory is ours and fresh.
        let path = src.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(wrap(parent))?;
        }
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(wrap(&path))?;
        f.write_all(content).map_err(wrap(&path))?;
    }
    // The sandbox user must be able to read the tree; the run dir itself stays 0700 root.
    set_tree_readable(&src).map_err(wrap(&src))?;
    if workspace_bytes.is_some() {
        // New files are the program's; the sticky bit keeps the given ones from being
        // removed or renamed.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&src, fs::Permissions::from_mode(0o1777)).map_err(wrap(&src))?;
    }
    Ok(src)
}

/// Writes a warm-pool preload harness as `dir/warm/<file>` (bound at /opt/isobox-warm).
///
/// # Errors
/// [`SandboxError::Bundle`] on any I/O error.
pub fn write_preload(
    dir: &Path,
    preload: crate::sandbox::warm::Preload,
) -> Result<(), SandboxError> {
    let (file, code) = (preload.file, preload.code);
    let d = dir.join("warm");
    let wrap = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SandboxError::Bundle { path, source }
    };
    fs::create_dir(&d).map_err(wrap(&d))?;
    fs::write(d.join(file), code).map_err(wrap(&d))?;
    set_tree_readable(&d).map_err(wrap(&d))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(d.join(file), fs::Permissions::from_mode(0o644)).map_err(wrap(&d))
}

use std::os::unix::fs::DirBuilderExt;

fn set_tree_readable(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            set_tree_readable(&e.path())?;
        }
    }
    Ok(())
}

/// Whether a run of `config` may have the runtime's tree `lower` itself as its root
/// (read-only, with no overlay): runsc makes a mount's missing mount point on the host,
/// in the root it is given, so only when every mount of `config` already has its mount
/// point in `lower` (reached through real directories, no symbolic link) as a directory,
/// or as a regular file for a bind of a file. Then runsc writes nothing into the shared
/// tree, and the run saves an overlay's mount and unmount (see [`mount_root`]).
pub fn mount_points_in(lower: &Path, config: &Value) -> bool {
    let Some(mounts) = config["mounts"].as_array() else {
        return false;
    };
    // A writable root would be overlaid by runsc with a file store in the tree itself
    // (`--overlay2=root:self`, its default); runsc also makes the working directory.
    if config["root"]["readonly"] != true {
        return false;
    }
    let cwd = json!({"destination": config["process"]["cwd"], "type": "cwd"});
    mounts.iter().chain(std::iter::once(&cwd)).all(|m| {
        let Some(dest) = m["destination"].as_str() else {
            return false;
        };
        let file = m["type"] == "bind"
            && m["source"]
                .as_str()
                .is_some_and(|src| fs::metadata(src).is_ok_and(|md| md.is_file()));
        let mut at = lower.to_path_buf();
        let parts: Vec<_> = Path::new(dest).components().skip(1).collect();
        if !dest.starts_with('/') || parts.is_empty() {
            return false;
        }
        parts.iter().enumerate().all(|(i, part)| {
            let std::path::Component::Normal(part) = part else {
                return false;
            };
            at.push(part);
            match fs::symlink_metadata(&at) {
                Ok(md) if i + 1 == parts.len() && file => md.is_file(),
                Ok(md) => md.is_dir(),
                Err(_) => false,
            }
        })
    })
}

/// The per-run root of `dir`: an overlay mounted at `dir/root` with the runtime's tree
/// `lower` below (never written) and `dir/upper` above, where only runsc's mount points
/// land (the sandbox's own view of the root stays read-only, or, for a long-lived
/// sandbox, writes into its memory overlay inside gVisor). Unmounted by [`remove_run_dir`].
///
/// # Errors
/// [`SandboxError::Bundle`] when a directory cannot be made, the tree's path cannot be
/// named in overlay options (`,` `:` `\\`), or the mount fails (no overlayfs, or a data
/// directory on a filesystem overlayfs cannot use as its upper layer).
pub fn mount_root(dir: &Path, lower: &Path) -> Result<PathBuf, SandboxError> {
    let err = |path: &Path, source: std::io::Error| SandboxError::Bundle {
        path: path.to_path_buf(),
        source,
    };
    let (upper, work, root) = (dir.join("upper"), dir.join("work"), dir.join("root"));
    for d in [&upper, &work, &root] {
        fs::create_dir(d).map_err(|e| err(d, e))?;
    }
    // The run's /workspace starts empty whatever the tree holds there: an opaque
    // directory hides the lower one, so names a run before this fix (or anything else)
    // left in a shared tree's /workspace cannot stand where this run's files go.
    if lower.join("workspace").is_dir() {
        let ws = upper.join("workspace");
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&ws)
            .map_err(|e| err(&ws, e))?;
        crate::sys::loopdev::set_xattr(&ws, "trusted.overlay.opaque", b"y")
            .map_err(|e| err(&ws, e))?;
    }
    let named = |p: &Path| {
        p.to_str()
            .filter(|s| !s.contains([',', ':', '\\']))
            .map(str::to_string)
            .ok_or_else(|| {
                err(
                    p,
                    std::io::Error::other("cannot be named in overlay options (`,` `:` `\\`)"),
                )
            })
    };
    let data = format!(
        "lowerdir={},upperdir={},workdir={}",
        named(lower)?,
        named(&upper)?,
        named(&work)?
    );
    crate::sys::loopdev::mount(
        Path::new("overlay"),
        &root,
        "overlay",
        libc::MS_NOSUID | libc::MS_NODEV,
        &data,
    )
    .map_err(|e| {
        err(
            &root,
            std::io::Error::new(
                e.kind(),
                format!("mount overlay of {}: {e}", lower.display()),
            ),
        )
    })?;
    Ok(root)
}

/// Makes each of `dests` (absolute paths inside the sandbox) a real directory in the
/// run's root `root` (so in its upper layer), with any missing parents, before runsc
/// starts: a bind's mount point that runsc would have to make up itself reads as
/// `EINVAL` inside gVisor, and so would the directories above it. Never follows a
/// symbolic link; a component that exists and is no directory is an error.
///
/// # Errors
/// [`SandboxError::Bundle`] naming the path that could not be made.
pub fn make_mount_points(root: &Path, dests: &[&str]) -> Result<(), SandboxError> {
    for dest in dests {
        let mut at = root.to_path_buf();
        for part in Path::new(dest.trim_start_matches('/')).components() {
            let std::path::Component::Normal(part) = part else {
                return Err(SandboxError::Bundle {
                    path: PathBuf::from(dest),
                    source: std::io::Error::other("not a plain absolute path"),
                });
            };
            at.push(part);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(SandboxError::Bundle {
                        path: at,
                        source: std::io::Error::other("exists and is not a directory"),
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&at)
                    .map_err(|e| SandboxError::Bundle {
                        path: at.clone(),
                        source: e,
                    })?,
                Err(e) => {
                    return Err(SandboxError::Bundle {
                        path: at,
                        source: e,
                    })
                }
            }
        }
    }
    Ok(())
}

/// Puts the run's own copy of `isobox-start` ([`super::start::BINARY`], when this build
/// has it) at [`super::start::PATH`] in its mounted `root` (a link would share one inode
/// with every run, and a writable root could change it for all). Its directories are
/// made as a mount point's are ([`make_mount_points`]: a tree whose `/opt` is not a
/// directory is refused).
///
/// # Errors
/// [`SandboxError::Bundle`] when a directory or the file cannot be made.
pub fn install_start(root: &Path) -> Result<(), SandboxError> {
    let Some(bin) = super::start::BINARY else {
        return Ok(());
    };
    let path = Path::new(super::start::PATH);
    if let Some(dir) = path.parent().and_then(Path::to_str) {
        make_mount_points(root, &[dir])?;
    }
    let at = root.join(super::start::PATH.trim_start_matches('/'));
    let err = |source| SandboxError::Bundle {
        path: at.clone(),
        source,
    };
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o555)
        .open(&at)
        .map_err(err)?;
    f.write_all(bin).map_err(err)
}

/// The FIFO in a run's bundle directory that its poststart hook signals
/// (`start.rs`): beside `config.json`, outside the root and the workspace, so nothing in
/// the sandbox can reach it.
pub const STARTED_FIFO: &str = "started";

/// Names `hook` as `config`'s one poststart hook, signalling `fifo` (`start.rs`). runsc
/// executes it on the host once the program has started, with the empty environment
/// given here (without one it would pass on its own).
pub fn add_start_hook(config: &mut Value, hook: &Path, fifo: &Path) {
    config["hooks"] = json!({
        "poststart": [{"path": hook, "args": ["isobox-started", fifo], "env": []}]
    });
}

/// Removes a run's directory: its root overlay and its workspace tmpfs unmounted first
/// (detached, so a process that still holds one cannot keep the directory), then the
/// tree.
///
/// # Errors
/// The removal's error (a mount point that was not mounted is fine).
pub fn remove_run_dir(dir: &Path) -> std::io::Result<()> {
    for m in [dir.join("root"), dir.join("files")] {
        if let Err(e) = crate::sys::loopdev::umount2(&m, libc::MNT_DETACH) {
            // EINVAL: not a mount point (never mounted, or already gone); ENOENT: no dir.
            if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) {
                return Err(e);
            }
        }
    }
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Whether the sandbox of `plan` sees its root filesystem writable, into an overlay in
/// its own memory (runsc `--overlay2=root:memory`): a long-lived sandbox's, and a
/// runtime's that asks for it (`writable_root`).
pub fn writable_root(plan: &ExecPlan) -> bool {
    plan.long_lived.is_some() || plan.runtime.desc.writable_root
}

/// Whether a run of `plan` gets the program's files as its `/workspace` (then
/// [`write_files`] makes that a tmpfs): not a session step (its session's filesystem is
/// the workspace), nor a sandbox without files (a pooled one, a WBX sandbox).
pub fn files_are_workspace(plan: &ExecPlan) -> bool {
    plan.workspace.is_none() && !plan.files.is_empty()
}

/// Builds `config.json` for a run.
pub fn config(
    plan: &ExecPlan,
    proc_spec: &ProcessSpec<'_>,
    root: &Path,
    src_dir: &Path,
    cgroups_path: &str,
    net: Option<&crate::netfilter::NetLease>,
) -> Value {
    let mem = plan.limits.memory_bytes;
    let tmpfs = |dest: &str, size: u64| json!({"destination": dest, "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", format!("size={size}")]});
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        tmpfs("/tmp", mem),
    ];
    // The run's own host tmpfs with the program's files (see the module's doc).
    let program_files = |mounts: &mut Vec<Value>| {
        mounts.push(json!({"destination": "/workspace", "type": "bind", "source": src_dir, "options": ["rbind", "rw", "nosuid", "nodev"]}));
    };
    if let Some(init) = &plan.long_lived {
        // The init, read-only; the rest of the tree is the sandbox's own to write.
        mounts.push(json!({"destination": super::plan::INIT_PATH, "type": "bind", "source": init, "options": ["rbind", "ro", "nosuid", "nodev"]}));
        // Many inputs in one shared sandbox: the program's files, as a one-shot run
        // has them (a WBX sandbox has none).
        if !plan.files.is_empty() {
            program_files(&mut mounts);
        }
        for (src, dest) in &plan.ro_binds {
            mounts.push(json!({"destination": dest, "type": "bind", "source": src, "options": ["rbind", "ro", "nosuid", "nodev"]}));
        }
    } else if let Some(ws) = &plan.workspace {
        // A session step: the session's own filesystem, read-write. Its size is the
        // quota, so writes past it fail inside with ENOSPC.
        mounts.push(json!({"destination": "/workspace", "type": "bind", "source": ws.mount(), "options": ["rbind", "rw", "nosuid", "nodev"]}));
        if let Some(vol) = ws.volume_mount() {
            mounts.push(json!({"destination": "/memory", "type": "bind", "source": vol, "options": ["rbind", "rw", "nosuid", "nodev"]}));
        }
    } else if plan.files.is_empty() {
        // A pooled sandbox, booted before its program exists: its harness writes the
        // files into a tmpfs of gVisor's own (no bind over a made-up mount point there).
        mounts.push(tmpfs("/workspace", mem));
    } else {
        program_files(&mut mounts);
    }
    // A pooled node or ruby sandbox's preload harness, outside /workspace and /tmp (a
    // debootstrap tree's /opt is empty), so the program's own directories look as cold.
    if plan.preload.is_some() {
        if let Some(dir) = src_dir.parent() {
            mounts.push(json!({"destination": "/opt/isobox-warm", "type": "bind", "source": dir.join("warm"), "options": ["rbind", "ro", "nosuid", "nodev"]}));
        }
    }
    // A networked run joins the namespace built for it, with our resolvers; an offline
    // one gets a fresh namespace that runsc leaves empty (`--network=none`).
    let network = match net {
        Some(n) => {
            mounts.push(json!({"destination": "/etc/resolv.conf", "type": "bind", "source": n.resolv_conf(), "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}));
            json!({"type": "network", "path": n.ns_path()})
        }
        None => json!({"type": "network"}),
    };
    let mut env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_string(),
        "LANG=C.UTF-8".to_string(),
        "HOME=/tmp".to_string(),
    ];
    // A later setting of a name replaces an earlier one (in its place): programs
    // disagree on which duplicate wins.
    for e in proc_spec.env {
        let key = e.split('=').next().unwrap_or("");
        match env.iter_mut().find(|x| x.split('=').next() == Some(key)) {
            Some(slot) => slot.clone_from(e),
            None => env.push(e.clone()),
        }
    }
    // A long-lived sandbox's init runs as root inside it, with only what it needs to
    // start processes as the user, give the user a home, and signal them: the
    // processes it starts drop to the user and keep no capability (none is inheritable
    // or ambient). Every one-shot program runs as nobody with none at all.
    let (user, caps, cwd, nofile) = if plan.long_lived.is_some() {
        let caps: Vec<&str> = vec![
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FOWNER",
            "CAP_KILL",
            "CAP_SETGID",
            "CAP_SETUID",
        ];
        (
            json!({"uid": 0, "gid": 0}),
            json!({"bounding": caps, "effective": caps, "inheritable": [], "permitted": caps, "ambient": []}),
            "/",
            65536,
        )
    } else {
        (
            json!({"uid": SANDBOX_UID, "gid": SANDBOX_UID}),
            json!({"bounding": [], "effective": [], "inheritable": [], "permitted": [], "ambient": []}),
            "/workspace",
            1024,
        )
    };
    json!({
        "ociVersion": "1.0.0",
        "process": {
            "terminal": false,
            "user": user,
            "args": proc_spec.args,
            "env": env,
            "cwd": cwd,
            "capabilities": caps,
            "rlimits": [
                {"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile},
                {"type": "RLIMIT_NPROC", "hard": plan.limits.pids, "soft": plan.limits.pids},
                {"type": "RLIMIT_CORE", "hard": 0, "soft": 0}
            ],
            "noNewPrivileges": true
        },
        "root": {"path": root, "readonly": !writable_root(plan)},
        "hostname": "isobox",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, network, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
            "cgroupsPath": cgroups_path
        }
    })
}

/// How a run on a root image starts ([`on_image`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageStart {
    /// Its program, as the sandbox user: an offline pooled sandbox's harness.
    AsUser,
    /// `isobox-start --unpack` (a cold run) or `--boot` (a networked pooled sandbox) as
    /// root, which writes the files and drops; `resolv_conf`: it binds the run's
    /// resolvers first (a networked run).
    Loader {
        /// The run has a network.
        resolv_conf: bool,
    },
}

/// Makes `config` (a cold one-off run's or a pooled sandbox's, [`config`]) one whose
/// root is the runtime's EROFS `image` (`sandbox::image`), mounted inside gVisor with no
/// gofer: runsc is given an empty directory, `dir/root` (made here, removed with the
/// run's directory), as the root's path, and
/// `/workspace` is a tmpfs of gVisor's of `workspace_bytes` (mode 1777, root's, as the
/// host one is). With [`ImageStart::Loader`] (a cold run, a networked pooled sandbox)
/// the process starts as root with only what `isobox-start` needs to write the files
/// as root's and then drop to [`SANDBOX_UID`] with nothing left (setgid, setpcap to
/// empty the bounding set, setuid), and for a networked run to bind its resolvers over
/// the image's `/etc/resolv.conf` (sys_admin, given up before the files; the host bind
/// [`config`] put there goes); an offline pooled sandbox's stays [`SANDBOX_UID`]'s with
/// none. No bind mount stays, or runsc would start a gofer.
///
/// # Errors
/// [`SandboxError::Bundle`] when `dir/root` cannot be made.
pub fn on_image(
    config: &mut Value,
    image: &Path,
    dir: &Path,
    workspace_bytes: u64,
    start: ImageStart,
) -> Result<(), SandboxError> {
    let empty_root = dir.join("root");
    fs::create_dir(&empty_root).map_err(|source| SandboxError::Bundle {
        path: empty_root.clone(),
        source,
    })?;
    config["root"]["path"] = json!(empty_root);
    config["annotations"] = json!({
        "dev.gvisor.spec.rootfs.source": image,
        "dev.gvisor.spec.rootfs.type": "erofs",
    });
    if let Some(mounts) = config["mounts"].as_array_mut() {
        for m in mounts.iter_mut() {
            if m["destination"] == "/workspace" {
                *m = json!({"destination": "/workspace", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777", format!("size={workspace_bytes}")]});
            }
        }
        if start == (ImageStart::Loader { resolv_conf: true }) {
            mounts.retain(|m| m["destination"] != "/etc/resolv.conf");
        }
        debug_assert!(mounts.iter().all(|m| m["type"] != "bind"), "{mounts:?}");
    }
    let ImageStart::Loader { resolv_conf } = start else {
        return Ok(());
    };
    let caps: &[&str] = if resolv_conf {
        &["CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_ADMIN"]
    } else {
        &["CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID"]
    };
    config["process"]["user"] = json!({"uid": 0, "gid": 0});
    config["process"]["capabilities"] = json!({"bounding": caps, "effective": caps, "inheritable": [], "permitted": caps, "ambient": []});
    Ok(())
}

/// Writes `config.json` into `dir`.
///
/// # Errors
/// [`SandboxError::Bundle`] on I/O errors.
pub fn write_config(dir: &Path, config: &Value) -> Result<(), SandboxError> {
    let path = dir.join("config.json");
    let bytes = serde_json::to_vec_pretty(config).unwrap_or_default();
    fs::write(&path, bytes).map_err(|source| SandboxError::Bundle { path, source })
}

/// Replaces the descriptor's `source_file` with the plan's entry in an argv.
pub fn substitute(argv: &[String], source_file: &str, entry: &str) -> Vec<String> {
    argv.iter()
        .map(|a| {
            if a == source_file {
                entry.to_string()
            } else {
                a.clone()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_tree_itself_is_the_root_only_where_every_mount_point_is_there() {
        let base = std::env::temp_dir().join(format!("isobox-mount-points-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let lower = base.join("tree");
        for d in ["workspace", "tmp", "proc", "etc", "opt/real", "memory"] {
            fs::create_dir_all(lower.join(d)).unwrap();
        }
        fs::write(lower.join("etc/resolv.conf"), "").unwrap();
        std::os::unix::fs::symlink("real", lower.join("opt/link")).unwrap();
        let (src_dir, src_file) = (base.join("files"), base.join("resolv"));
        fs::create_dir_all(&src_dir).unwrap();
        fs::write(&src_file, "nameserver 192.0.2.1\n").unwrap();
        let bind =
            |src: &Path, dest: &str| json!({"destination": dest, "type": "bind", "source": src});
        let tmpfs = |dest: &str| json!({"destination": dest, "type": "tmpfs", "source": "tmpfs"});
        let cfg = |mounts: Vec<Value>| json!({"root": {"readonly": true}, "process": {"cwd": "/workspace"}, "mounts": mounts});
        let cold = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            tmpfs("/tmp"),
            bind(&src_dir, "/workspace"),
        ];
        // A cold run, a networked one, a session step with its volume.
        assert!(mount_points_in(&lower, &cfg(cold.clone())));
        let mut net = cold.clone();
        net.push(bind(&src_file, "/etc/resolv.conf"));
        assert!(mount_points_in(&lower, &cfg(net)));
        let mut step = cold.clone();
        step.push(bind(&src_dir, "/memory"));
        assert!(mount_points_in(&lower, &cfg(step)));
        assert!(mount_points_in(&lower, &cfg(vec![])));
        // Each way runsc would have to make something: a missing directory (or its
        // parent), a file's bind onto a directory or a directory's onto a file, a mount
        // point reached through a symbolic link (even one that stays inside).
        for (mount, why) in [
            (bind(&src_dir, "/opt/isobox-warm"), "missing"),
            (bind(&src_dir, "/nope/deeper"), "parent missing"),
            (tmpfs("/run/none"), "missing under a missing dir"),
            (bind(&src_file, "/workspace"), "a file onto a directory"),
            (
                bind(&src_dir, "/etc/resolv.conf"),
                "a directory onto a file",
            ),
            (bind(&src_dir, "/opt/link"), "a symbolic link"),
            (tmpfs("/etc/resolv.conf"), "a tmpfs onto a file"),
            (tmpfs("workspace"), "relative"),
            (tmpfs("/"), "the root itself"),
            (tmpfs("/workspace/../etc"), "a parent component"),
            (json!({"type": "tmpfs"}), "no destination"),
        ] {
            let mut m = cold.clone();
            m.push(mount);
            assert!(!mount_points_in(&lower, &cfg(m)), "{why}");
        }
        assert!(!mount_points_in(&lower, &json!({})), "no mounts at all");
        // A writable root, a working directory that is not there.
        let mut writable = cfg(cold.clone());
        writable["root"]["readonly"] = json!(false);
        assert!(!mount_points_in(&lower, &writable));
        let mut cwd = cfg(cold.clone());
        cwd["process"]["cwd"] = json!("/home/nobody");
        assert!(!mount_points_in(&lower, &cwd));
        cwd["process"]["cwd"] = json!("/");
        assert!(
            !mount_points_in(&lower, &cwd),
            "the root itself is no mount point"
        );
        assert!(!mount_points_in(&base.join("absent"), &cfg(cold)));
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn test_on_image_the_workspace_is_gvisors_and_only_a_networked_loader_gets_sys_admin() {
        let base = std::env::temp_dir().join(format!("isobox-on-image-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        fs::create_dir_all(&base).unwrap();
        let img = Path::new("/var/lib/isobox/images/t.erofs");
        let made = |start: ImageStart, net: bool| {
            let dir = base.join(
                format!("{start:?}-{net}").replace(|c: char| !c.is_ascii_alphanumeric(), "-"),
            );
            fs::create_dir(&dir).unwrap();
            let mut mounts = vec![
                json!({"destination": "/proc", "type": "proc", "source": "proc"}),
                json!({"destination": "/workspace", "type": "bind", "source": "/x/files"}),
            ];
            if net {
                mounts.push(json!({"destination": "/etc/resolv.conf", "type": "bind", "source": "/x/resolv"}));
            }
            let mut cfg = json!({"root": {"path": "/tree", "readonly": true}, "mounts": mounts,
                "process": {"user": {"uid": SANDBOX_UID, "gid": SANDBOX_UID}, "capabilities": {"bounding": []}}});
            on_image(&mut cfg, img, &dir, 1 << 20, start).unwrap();
            assert_eq!(cfg["root"]["path"], json!(dir.join("root")));
            assert!(dir.join("root").is_dir());
            assert_eq!(
                cfg["annotations"]["dev.gvisor.spec.rootfs.source"],
                json!(img)
            );
            assert_eq!(cfg["annotations"]["dev.gvisor.spec.rootfs.type"], "erofs");
            let dests: Vec<(String, String)> = cfg["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m["destination"].as_str().unwrap().into(),
                        m["type"].as_str().unwrap().into(),
                    )
                })
                .collect();
            assert_eq!(
                dests,
                [
                    ("/proc".to_string(), "proc".to_string()),
                    ("/workspace".into(), "tmpfs".into())
                ],
                "{cfg}"
            );
            cfg
        };
        let pooled = made(ImageStart::AsUser, false);
        assert_eq!(
            pooled["process"]["user"],
            json!({"uid": SANDBOX_UID, "gid": SANDBOX_UID})
        );
        assert_eq!(pooled["process"]["capabilities"]["bounding"], json!([]));
        let offline = made(ImageStart::Loader { resolv_conf: false }, false);
        assert_eq!(offline["process"]["user"], json!({"uid": 0, "gid": 0}));
        let three = json!(["CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID"]);
        for set in ["bounding", "effective", "permitted"] {
            assert_eq!(offline["process"]["capabilities"][set], three);
        }
        assert_eq!(offline["process"]["capabilities"]["ambient"], json!([]));
        let networked = made(ImageStart::Loader { resolv_conf: true }, true);
        let four = json!(["CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_ADMIN"]);
        for set in ["bounding", "effective", "permitted"] {
            assert_eq!(networked["process"]["capabilities"][set], four);
        }
        assert_eq!(
            networked["process"]["capabilities"]["inheritable"],
            json!([])
        );
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn test_substitute_entry() {
        let argv = vec!["/usr/bin/python3".to_string(), "main.py".to_string()];
        assert_eq!(
            substitute(&argv, "main.py", "app.py"),
            vec!["/usr/bin/python3", "app.py"]
        );
    }
}
