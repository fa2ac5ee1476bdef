//! Spawning, killing and cleaning up `runsc run`. Runs on the worker pool (blocking).
//!
//! Recipe measured on our hosts (vendor-runsc/README.md): we create the run's cgroups
//! ourselves under the protective slice, write the limits, and point the spec's
//! `cgroupsPath` at them; runsc moves the sentry, gofer and ptrace stubs into them and
//! leaves them in place at exit, so the OOM counter can be read afterwards. `runsc run`
//! (not create/start/wait, whose `wait` polls for ~1.8 s), with `--network=none` for an
//! offline run and gVisor's own netstack on the run's namespace (`netfilter`) otherwise.

use super::backend::{wait_bounded, Backend, Cleanup, Spawned, Stdin};
use super::bundle::{self, ProcessSpec};
use super::image::ForRun;
use super::steps::{Step, STEPS};
use super::{host_pids_for, SandboxError, GVISOR_OVERHEAD_BYTES};
use crate::cgroup::{CgroupError, Hierarchy, HostLimits, RunCgroup, Usage, CPU_PERIOD_US};
use crate::sandbox::plan::ExecPlan;
use serde_json::json;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The gVisor backend: everything it needs, shared by the workers.
#[derive(Debug, Clone)]
pub struct Gvisor {
    /// runsc binary.
    pub runsc: PathBuf,
    /// gVisor platform.
    pub platform: String,
    /// `runsc --root`: container state of this instance.
    pub state_root: PathBuf,
    /// Per-run bundle directories.
    pub runs_dir: PathBuf,
    /// Instance name: cgroup slice and container-id prefix.
    pub instance: String,
    /// The cgroup hierarchy.
    pub cgroups: Option<Hierarchy>,
    /// Filtered egress, for runs that ask for a network.
    pub egress: Option<std::sync::Arc<crate::netfilter::Egress>>,
    /// `isobox-started`, the poststart hook that signals a cold run's start
    /// (`start::install_hook`); `None`: cold runs write the start frame instead.
    pub start_hook: Option<Arc<super::start::StartHook>>,
    /// The runtimes' EROFS images (`image`): `None` when they are off, `mkfs.erofs` is
    /// missing, or this build has no `isobox-start`.
    pub images: Option<Arc<super::image::RootImages>>,
    /// `isobox-start` in a sealed memfd: what runsc starts an image run from
    /// (`--exec-fd`, through a descriptor of its own per run).
    pub start_exec: Option<Arc<OwnedFd>>,
}

impl Gvisor {
    fn runsc_cmd(&self) -> Command {
        let mut c = Command::new(&self.runsc);
        c.arg("--root")
            .arg(&self.state_root)
            .arg(format!("--platform={}", self.platform));
        c.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        c
    }

    fn start(
        &self,
        id: &str,
        dir: &Path,
        cgroup: RunCgroup,
        net: Option<crate::netfilter::NetLease>,
        stdin: Stdin,
        root: RootKind,
    ) -> Result<Spawned, SandboxError> {
        let mut cmd = self.runsc_cmd();
        if matches!(root, RootKind::Writable) {
            // A long-lived sandbox (or a runtime that asks) writes its root filesystem
            // into an overlay in its own memory (inside its memory cap), discarded with
            // it.
            cmd.arg("--overlay2=root:memory");
        }
        // A sandbox on an image reads no host file but through the descriptors runsc
        // hands it: without directfs its host process runs as nobody in a user
        // namespace of its own, with no capability left after its set-up, instead of
        // as root of the host's with the file capabilities directfs needs and the
        // spec's own (an image run's loader's, which are meant for inside gVisor only).
        // The same CPU per run (`bench/README.md`).
        if matches!(root, RootKind::Image | RootKind::Loader(..)) {
            cmd.arg("--directfs=false");
        }
        // gVisor's netstack on the run's namespace (raw sockets stay off, the default),
        // or no network at all.
        cmd.arg(if net.is_some() {
            "--network=sandbox"
        } else {
            "--network=none"
        });
        cmd.arg("run");
        // An image run: isobox-start from its memfd, the workspace archive as its fd 3.
        if let RootKind::Loader(exec, archive) = &root {
            use std::os::fd::{AsFd, AsRawFd};
            cmd.arg(format!("--exec-fd={}", exec.as_raw_fd()))
                .arg(format!("--pass-fd={}:3", archive.as_raw_fd()));
            crate::sys::inherit_on_spawn(&mut cmd, &[exec.as_fd(), archive.as_fd()]);
        }
        cmd.arg("--bundle").arg(dir).arg(id);
        // gVisor imports a donated socket as a connected socket: both directions work.
        let ctl = match stdin {
            Stdin::Pipe => {
                cmd.stdin(Stdio::piped());
                None
            }
            Stdin::Control => {
                let (host, sandbox) = std::os::unix::net::UnixStream::pair().map_err(|source| {
                    SandboxError::Spawn {
                        runsc: self.runsc.clone(),
                        source,
                    }
                })?;
                cmd.stdin(Stdio::from(OwnedFd::from(sandbox)));
                Some(host)
            }
        };
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        if net.is_some() {
            crate::sys::die_with_parent_on_spawn_netstack(&mut cmd);
        } else {
            crate::sys::die_with_parent_on_spawn(&mut cmd);
        }
        let mut child = cmd.spawn().map_err(|source| SandboxError::Spawn {
            runsc: self.runsc.clone(),
            source,
        })?;
        // Our copy of the sandbox's end goes now, so its exit reads as EOF here; runsc
        // has its own copies of an image run's descriptors.
        drop(cmd);
        drop(root);
        let started = Instant::now();
        let pidfd = match crate::sys::pidfd_open(child.id()) {
            Ok(fd) => fd,
            Err(source) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SandboxError::Spawn {
                    runsc: self.runsc.clone(),
                    source,
                });
            }
        };
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let (Some(stdout), Some(stderr)) = (stdout, stderr) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SandboxError::Spawn {
                runsc: self.runsc.clone(),
                source: std::io::Error::other("stdio pipes missing"),
            });
        };
        Ok(Spawned {
            id: id.to_string(),
            child,
            stdin,
            stdout,
            stderr,
            pidfd,
            cgroup,
            dir: dir.to_path_buf(),
            started,
            net,
            ctl,
            warm: false,
            exit_ctl: None,
            start_signal: None,
            net_cuts: 0,
        })
    }

    /// `runsc delete --force`: idempotent, succeeds for a container already gone.
    /// Runs `runsc <verb> <id>` (pause, resume) and says what went wrong.
    fn verb(&self, verb: &'static str, id: &str) -> Result<(), SandboxError> {
        let out = self
            .runsc_cmd()
            .arg(verb)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| SandboxError::Verb {
                verb,
                id: id.to_string(),
                detail: e.to_string(),
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(SandboxError::Verb {
                verb,
                id: id.to_string(),
                detail: String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .chars()
                    .take(400)
                    .collect(),
            })
        }
    }

    fn runsc_delete(&self, id: &str) {
        let out = self
            .runsc_cmd()
            .arg("--network=none")
            .arg("delete")
            .arg("--force")
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => crate::error_limited!(
                "sandbox={id} op=delete err={}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => crate::error_limited!("sandbox={id} op=delete err={e}"),
        }
    }

    /// Whether runsc still records container `id` (`<id>_sandbox:<id>.state` in its
    /// root: a `runsc run` that was killed, or one still running).
    fn has_state(&self, id: &str) -> bool {
        let prefix = format!("{id}_sandbox:");
        let Ok(entries) = std::fs::read_dir(&self.state_root) else {
            // Unreadable: runsc decides.
            return true;
        };
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(&prefix) && name.ends_with(".state")
        })
    }

    /// runsc leaves `<id>_sandbox:<id>.lock` (and `.state` when its own process was
    /// killed) in its root even after `delete --force`, and the 2024 runsc its sandbox's
    /// control socket `runsc-<id>.sock` when the sandbox was killed under it; they are
    /// ours to remove.
    fn remove_state_files(&self, id: &str) {
        let prefixes = [format!("{id}_sandbox:"), format!("runsc-{id}.")];
        for e in std::fs::read_dir(&self.state_root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if prefixes.iter().any(|p| name.starts_with(p.as_str())) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// The root image a sandbox of `plan` (program `argv`) may have (`image`): a cold
    /// one-off interpreted run (its start heard; its files, and a networked run's
    /// resolvers, come through isobox-start), or a pooled sandbox booted before its
    /// program (no files: its harness writes them into gVisor's tmpfs; a networked
    /// one's resolvers come through isobox-start), whose every mount would be gVisor's
    /// own: no session workspace, no preload, no long-lived sandbox, no bind, a
    /// read-only root, a program named by an absolute path; a networked one only where
    /// the tree has a resolv.conf file to bind the run's over. The first
    /// such sandbox of a tree starts its image's build, on a thread of its own, and
    /// uses the tree meanwhile.
    fn image_for(&self, plan: &ExecPlan, argv: &[String], networked: bool) -> Option<PathBuf> {
        let images = self.images.as_ref()?;
        self.start_exec.as_ref()?;
        let pooled = !plan.signal_start && plan.files.is_empty();
        let eligible = (plan.signal_start || pooled)
            && plan.workspace.is_none()
            && plan.preload.is_none()
            && plan.long_lived.is_none()
            && plan.ro_binds.is_empty()
            && (!networked || resolv_conf_bindable(&plan.runtime.rootfs_path))
            && !bundle::writable_root(plan)
            && argv.first().is_some_and(|p| p.starts_with('/'));
        if !eligible {
            return None;
        }
        match images.for_run(&plan.runtime.rootfs_path) {
            ForRun::Ready(p) => Some(p),
            ForRun::Tree => None,
            ForRun::Build(ticket) => {
                let (g, images, rt) = (self.clone(), images.clone(), plan.runtime.clone());
                let busy = images.busy();
                // Ends in `.` as every container id of isoboxd does (runsc finds a
                // container by a prefix of its id); a digest of the tree's path tells
                // apart trees whose names read the same once sanitised.
                let name = format!(
                    "{}-image-{}-{}.",
                    self.instance,
                    rt.rootfs_path
                        .file_name()
                        .map(|n| n
                            .to_string_lossy()
                            .replace(|c: char| !c.is_ascii_alphanumeric(), "-"))
                        .unwrap_or_default(),
                    &crate::jobs::sha256_hex(rt.rootfs_path.as_os_str().as_encoded_bytes())[..8]
                );
                let spawned = std::thread::Builder::new()
                    .name("isobox-image".into())
                    .spawn(move || {
                        let _busy = busy;
                        let _ = crate::sys::set_thread_nice(10);
                        // The probe sandbox is no run: /metrics counts runs' steps.
                        super::steps::uncounted_on_this_thread();
                        images.build(ticket, |img| {
                            // A networked run's resolvers are bound as the probe's are, where
                            // the tree has a file for them.
                            let resolv = resolv_conf_bindable(&rt.rootfs_path)
                                .then_some(super::probe::PROBE_RESOLV_CONF);
                            super::probe::probe_image(&g, &name, rt, resolv, |id, plan, argv| {
                                let on = On {
                                    image: Some(img),
                                    networked: false,
                                    probe_resolv_conf: resolv,
                                };
                                g.run_on(id, plan, argv, &[], Stdin::Pipe, on)
                            })
                        });
                    });
                if let Err(e) = spawned {
                    crate::warn_limited!("root image build thread: {e}");
                    if let Some(i) = &self.images {
                        i.abandon(&plan.runtime.rootfs_path);
                    }
                }
                None
            }
        }
    }

    /// What runsc starts a cold image run from (`--exec-fd`: `isobox-start`) and gives
    /// it as fd 3 (`--pass-fd`: the workspace archive of `files`, after `resolv_conf`
    /// when the run has a network), each a descriptor of its own.
    fn loader_fds(
        &self,
        dir: &Path,
        files: &[(String, Vec<u8>)],
        resolv_conf: Option<&[u8]>,
    ) -> Result<(OwnedFd, OwnedFd), SandboxError> {
        let wrap = |source| SandboxError::Bundle {
            path: dir.to_path_buf(),
            source,
        };
        let exec = self
            .start_exec
            .as_ref()
            .ok_or_else(|| wrap(std::io::Error::other("this build has no isobox-start")))?;
        let bytes =
            super::image::archive(resolv_conf, files).map_err(|why| SandboxError::Bundle {
                path: dir.join("files"),
                source: std::io::Error::other(why),
            })?;
        let exec = crate::sys::reopen_read_only(std::os::fd::AsFd::as_fd(&**exec)).map_err(wrap)?;
        let archive = crate::sys::memfd_with(c"isobox-workspace", &bytes).map_err(wrap)?;
        Ok((exec, archive))
    }

    /// Whether `plan`'s run gets a network now: it asks for one and egress is verified.
    fn networked(&self, plan: &ExecPlan) -> bool {
        plan.network_requested && self.egress.as_ref().is_some_and(|e| e.verified())
    }

    /// On v1, runsc also creates the run's cgroup in hierarchies we do not manage
    /// (blkio, cpuset, devices, freezer, ...); remove those copies too.
    fn remove_v1_strays(&self, id: &str) {
        if let Some(Hierarchy::V1 { memory, .. }) = &self.cgroups {
            let Some(root) = memory.parent() else { return };
            let Ok(rd) = std::fs::read_dir(root) else {
                return;
            };
            for e in rd.flatten() {
                let d = e.path().join(&self.instance).join(id);
                if d.is_dir() {
                    let _ = std::fs::remove_dir(&d);
                }
            }
        }
    }

    /// [`Backend::run`] on what `on` says.
    fn run_on(
        &self,
        id: &str,
        plan: &ExecPlan,
        argv: Vec<String>,
        env: &[String],
        stdin: Stdin,
        on: On<'_>,
    ) -> Result<Spawned, SandboxError> {
        let On {
            image,
            networked,
            probe_resolv_conf,
        } = on;
        let hier = self
            .cgroups
            .as_ref()
            .ok_or_else(|| SandboxError::NoCgroups("no usable cgroup hierarchy".into()))?;
        let dir = self.runs_dir.join(id);
        // A session step's files are already in its workspace.
        let files: &[(String, Vec<u8>)] = if plan.workspace.is_some() {
            &[]
        } else {
            &plan.files
        };
        // An image run's files go into gVisor's own tmpfs, by isobox-start; nothing of
        // them is on the host but the archive in memory.
        let workspace_bytes = (image.is_none() && bundle::files_are_workspace(plan))
            .then_some(plan.limits.memory_bytes);
        // A cold run on an image gets its files through isobox-start, and so does a
        // networked pooled sandbox its resolvers; an offline pooled sandbox on one has
        // nothing to get (its harness writes the files) and starts as the user.
        let loader = image.is_some() && (plan.signal_start || networked);
        let host_files = if loader { &[][..] } else { files };
        // How the program's start is heard (`start.rs`): the hook, when there is one,
        // signals the FIFO made here; else the frame program goes before its argv (an
        // image run's isobox-start writes it once the files are there).
        let hook = if plan.signal_start && image.is_none() {
            self.start_hook.as_ref().and_then(|h| h.for_run())
        } else {
            None
        };
        let framed = plan.signal_start && hook.is_none();
        let argv = if loader {
            // A pooled sandbox's harness says itself when it is ready: no frame.
            let mode = if plan.signal_start {
                "--unpack"
            } else {
                "--boot"
            };
            let mut v = vec![
                super::start::PATH.to_string(),
                mode.to_string(),
                bundle::SANDBOX_UID.to_string(),
            ];
            v.extend(argv);
            v
        } else if framed {
            super::start::wrap_with_binary(argv)
        } else {
            argv
        };
        let mut start_signal = None;
        let mut image_fds = None;
        let written = STEPS.time(Step::BundleWrite, || {
            bundle::write_files(&dir, host_files, workspace_bytes).and_then(|s| {
                if let Some(preload) = plan.preload {
                    bundle::write_preload(&dir, preload)?;
                }
                if hook.is_some() {
                    let path = dir.join(bundle::STARTED_FIFO);
                    let fd = crate::sys::fifo_reader(&path, 0o600)
                        .map_err(|source| SandboxError::Bundle { path, source })?;
                    start_signal = Some(fd);
                }
                Ok(s)
            })
        });
        let src = match written {
            Ok(s) => s,
            Err(e) => {
                let _ = bundle::remove_run_dir(&dir);
                return Err(e);
            }
        };
        let limits = HostLimits {
            memory_bytes: plan.limits.memory_bytes + GVISOR_OVERHEAD_BYTES,
            cpu_quota_us: ((plan.limits.cpus * CPU_PERIOD_US as f64) as u64).max(1000),
            pids: host_pids_for(plan.limits.pids),
            cpu_weight: plan.cpu_weight,
        };
        let cgroup = match STEPS.time(Step::CgroupCreate, || {
            hier.create_run(&self.instance, id, limits)
        }) {
            Ok(c) => c,
            Err(e) => {
                let _ = bundle::remove_run_dir(&dir);
                return Err(e.into());
            }
        };
        // Network only while egress is verified; otherwise the run goes offline and
        // its result says so.
        let net = match (&self.egress, networked) {
            (Some(e), true) if e.verified() => {
                match STEPS.time(Step::Network, || e.lease(id, plan.allowlist.clone())) {
                    Ok(l) => Some(l),
                    Err(why) => {
                        crate::warn_limited!("sandbox={id} op=network err={why}; running offline");
                        None
                    }
                }
            }
            _ => None,
        };
        let configured = STEPS.time_more(Step::BundleWrite, || {
            // The loader's resolvers: the lease's (a run that got no network has none).
            let resolv = net
                .as_ref()
                .map(crate::netfilter::NetLease::resolv_conf_bytes)
                .or(probe_resolv_conf);
            if loader {
                image_fds = Some(self.loader_fds(&dir, files, resolv)?);
            }
            let lower = &plan.runtime.rootfs_path;
            let mut cfg = bundle::config(
                plan,
                &ProcessSpec { args: argv, env },
                lower,
                &src,
                &format!("/{}/{}", self.instance, id),
                net.as_ref(),
            );
            // The runtime's image, mounted inside gVisor; else the runtime's tree itself
            // where runsc would write nothing into it (a writable root never
            // qualifies); else an overlay of it that takes what runsc and the frame add.
            if let Some(image) = image {
                let start = if loader {
                    bundle::ImageStart::Loader {
                        resolv_conf: resolv.is_some(),
                    }
                } else {
                    bundle::ImageStart::AsUser
                };
                bundle::on_image(&mut cfg, image, &dir, plan.limits.memory_bytes, start)?;
            } else if framed || !bundle::mount_points_in(lower, &cfg) {
                let root = bundle::mount_root(&dir, lower)?;
                if framed {
                    bundle::install_start(&root)?;
                }
                let dests: Vec<&str> = plan.ro_binds.iter().map(|(_, d)| d.as_str()).collect();
                bundle::make_mount_points(&root, &dests)?;
                cfg["root"]["path"] = json!(root);
            }
            if let Some(hook) = hook {
                bundle::add_start_hook(&mut cfg, hook, &dir.join(bundle::STARTED_FIFO));
            }
            bundle::write_config(&dir, &cfg)
        });
        let res = configured.and_then(|()| {
            STEPS.time(Step::Spawn, || {
                self.start(
                    id,
                    &dir,
                    cgroup.clone(),
                    net,
                    stdin,
                    match (image, image_fds) {
                        (_, Some((exec, archive))) => RootKind::Loader(exec, archive),
                        (Some(_), None) => RootKind::Image,
                        (None, None) if bundle::writable_root(plan) => RootKind::Writable,
                        (None, None) => RootKind::ReadOnly,
                    },
                )
            })
        });
        match res {
            Ok(mut s) => {
                s.start_signal = start_signal;
                Ok(s)
            }
            Err(e) => {
                let _ = bundle::remove_run_dir(&dir);
                let _ = cgroup.destroy();
                Err(e)
            }
        }
    }
}

/// What a sandbox is started on ([`Gvisor::run_on`]).
#[derive(Clone, Copy)]
struct On<'a> {
    /// The runtime's root image, decided ([`Gvisor::image_for`]); `None`: its tree.
    image: Option<&'a Path>,
    /// Whether the run gets a network: asked for while egress was verified, read once
    /// for both the image's choice and the lease (which checks again: no network on a
    /// firewall not verified), so a sandbox on an image booted without a loader (an
    /// offline pooled one) never gets a lease whose host bind would bring the gofer
    /// back.
    networked: bool,
    /// The resolvers an offline image run's loader binds all the same: an image's
    /// probe's (a networked run's come from its lease).
    probe_resolv_conf: Option<&'a [u8]>,
}

/// Whether `tree`'s `/etc/resolv.conf` is a regular file, which an image run's loader
/// can bind the run's resolvers over (as `bundle::mount_points_in` wants for the bind
/// on the tree).
fn resolv_conf_bindable(tree: &Path) -> bool {
    tree.join("etc/resolv.conf")
        .symlink_metadata()
        .is_ok_and(|m| m.is_file())
}

/// How runsc is to give a sandbox its root.
enum RootKind {
    /// Read-only (the tree, or an overlay of it).
    ReadOnly,
    /// Writable, into an overlay in the sandbox's memory.
    Writable,
    /// The runtime's EROFS image (named in the spec): an offline pooled sandbox's.
    Image,
    /// The runtime's EROFS image, with `isobox-start` to run (`--exec-fd`) and the
    /// workspace archive (`--pass-fd` as fd 3): a cold run's, or a networked pooled
    /// sandbox's (`--boot`, its archive the resolvers alone).
    Loader(OwnedFd, OwnedFd),
}

impl Backend for Gvisor {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn run(
        &self,
        id: &str,
        plan: &ExecPlan,
        argv: Vec<String>,
        env: &[String],
        stdin: Stdin,
    ) -> Result<Spawned, SandboxError> {
        let networked = self.networked(plan);
        let image = self.image_for(plan, &argv, networked);
        let on = On {
            image: image.as_deref(),
            networked,
            probe_resolv_conf: None,
        };
        self.run_on(id, plan, argv, env, stdin, on)
    }

    fn run_on_tree(
        &self,
        id: &str,
        plan: &ExecPlan,
        argv: Vec<String>,
        env: &[String],
        stdin: Stdin,
    ) -> Result<Spawned, SandboxError> {
        let on = On {
            image: None,
            networked: self.networked(plan),
            probe_resolv_conf: None,
        };
        self.run_on(id, plan, argv, env, stdin, on)
    }

    fn give_up_start_hook(&self) {
        if let Some(h) = &self.start_hook {
            h.give_up();
        }
    }

    fn update(
        &self,
        cgroup: &RunCgroup,
        limits: Option<HostLimits>,
        low_priority: bool,
    ) -> Result<(), CgroupError> {
        if let Some(l) = limits {
            cgroup.set_limits(l)?;
        }
        cgroup.set_cpu_low(low_priority)
    }

    fn kill(&self, cgroup: &RunCgroup, init: Option<i32>) {
        if let Some(pid) = init {
            let _ = crate::sys::kill(pid, libc::SIGKILL);
        }
        if !cgroup.kill_all() {
            crate::error_limited!(
                "op=kill cgroup={:?} err=processes survived SIGKILL",
                cgroup.dirs().first()
            );
        }
    }

    fn wait(&self, mut child: Child, cgroup: &RunCgroup) -> Cleanup {
        STEPS.time(Step::Reap, || {
            // runsc has exited or is about to (its sandbox is dead); bound the wait
            // anyway.
            let exit_code = wait_bounded(&mut child, Duration::from_secs(5), || {
                cgroup.kill_all();
            });
            let oom_killed = cgroup.oom_kills() > 0;
            Cleanup {
                oom_killed,
                exit_code,
            }
        })
    }

    fn delete(&self, id: &str, cgroup: &RunCgroup, dir: &Path) {
        // A `runsc run` that ended by itself has deleted its container already (its
        // root holds nothing of it): another runsc process would only cost ~20 ms and
        // a Go runtime's start per run. Only one that was killed leaves its state.
        if STEPS.time(Step::StateFiles, || self.has_state(id)) {
            STEPS.time(Step::RunscDelete, || self.runsc_delete(id));
        }
        STEPS.time_more(Step::StateFiles, || self.remove_state_files(id));
        // The run's directory first: its workspace tmpfs's pages are charged to the
        // run's cgroup, freed before the cgroup goes rather than moved to its parent.
        if let Err(e) = STEPS.time(Step::BundleRemove, || bundle::remove_run_dir(dir)) {
            crate::error_limited!("sandbox={id} op=remove-bundle err={e}");
        }
        STEPS.time(Step::CgroupRemove, || {
            if let Err(e) = cgroup.destroy() {
                crate::error_limited!("sandbox={id} op=cgroup-destroy err={e}");
            }
            self.remove_v1_strays(id);
        });
    }

    fn sweep(&self) -> usize {
        let mut n = 0;
        // Containers recorded in this instance's own runsc root.
        if let Ok(o) = self
            .runsc_cmd()
            .arg("list")
            .arg("--format=json")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
        {
            if let Ok(serde_json::Value::Array(list)) =
                serde_json::from_slice::<serde_json::Value>(&o.stdout)
            {
                for c in list {
                    if let Some(id) = c
                        .get("id")
                        .and_then(|v| v.as_str())
                        .filter(|id| id.starts_with(&self.instance))
                    {
                        self.runsc_delete(id);
                        n += 1;
                    }
                }
            }
        }
        if let Some(h) = &self.cgroups {
            n += h.sweep(&self.instance);
            if let Hierarchy::V1 { memory, .. } = h {
                if let Some(root) = memory.parent() {
                    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
                        let slice = e.path().join(&self.instance);
                        for c in std::fs::read_dir(&slice).into_iter().flatten().flatten() {
                            if c.path().is_dir() {
                                let _ = std::fs::remove_dir(c.path());
                            }
                        }
                    }
                }
            }
        }
        // Run directories, each root overlay unmounted first (whatever else a crash
        // left mounted below them too, deepest first).
        for m in crate::sys::mountinfo::mounts_under(&self.runs_dir) {
            let _ = crate::sys::loopdev::umount2(&m, libc::MNT_DETACH);
        }
        for e in std::fs::read_dir(&self.runs_dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            if bundle::remove_run_dir(&e.path()).is_ok() {
                n += 1;
            }
        }
        // Whatever is left in our own runsc root belongs to containers deleted above:
        // their lock and state files, and (2024 runsc) their control sockets.
        let socket = format!("runsc-{}", self.instance);
        for e in std::fs::read_dir(&self.state_root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if (name.starts_with(&self.instance) || name.starts_with(&socket))
                && std::fs::remove_file(e.path()).is_ok()
            {
                n += 1;
            }
        }
        n
    }

    fn pause(&self, id: &str) -> Result<(), SandboxError> {
        self.verb("pause", id)
    }

    fn resume(&self, id: &str) -> Result<(), SandboxError> {
        self.verb("resume", id)
    }

    fn stats(&self, cgroup: &RunCgroup) -> Usage {
        cgroup.usage()
    }

    fn teardown(&self) {
        let _ = std::fs::remove_dir(&self.state_root);
        if let Some(parent) = self.state_root.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }

    fn egress(&self) -> Option<&Arc<crate::netfilter::Egress>> {
        self.egress.as_ref()
    }
}
