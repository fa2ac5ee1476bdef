//! The startup self-probe: one real sandbox, through the backend's own verbs.

use super::backend::{wait_and_delete, Backend, Spawned, Stdin};
use super::plan::ExecPlan;
use std::time::{Duration, Instant};

/// The startup self-probe: a real sandbox on `rt`'s root filesystem must start, read a
/// file from its working directory and print it back, within 60 s, its start heard as
/// a cold run's is (`start.rs`). When the sandbox ran but runsc did not run the
/// poststart hook (which would make every cold run look as if it never started), the
/// backend gives the hook up, cold runs use the frame, and the probe runs once more.
///
/// # Errors
/// A sentence saying what failed.
pub fn probe(b: &dyn Backend, id: &str, rt: crate::runtimes::Runtime) -> Result<(), String> {
    match probe_once(b, id, rt.clone()) {
        Err(Probe::Unheard) => {
            // The frame does not depend on runsc: cold runs use it from now on.
            log::warn!(
                "the probe's sandbox ran but runsc did not run its poststart hook (isobox-started); \
                 cold runs signal their start with the frame from now on"
            );
            b.give_up_start_hook();
            probe_once(b, &format!("{id}f"), rt).map_err(Probe::into_sentence)
        }
        r => r.map_err(Probe::into_sentence),
    }
}

/// How one probe failed.
enum Probe {
    /// The sandbox ran and printed the file, but its start was not heard.
    Unheard,
    /// A sentence saying what failed.
    Failed(String),
}

impl Probe {
    fn into_sentence(self) -> String {
        match self {
            Probe::Unheard => "the sandbox ran, but its start was not heard".into(),
            Probe::Failed(s) => s,
        }
    }
}

/// The probe's plan on `rt`: one file, small limits, its start heard.
fn probe_plan(rt: crate::runtimes::Runtime) -> ExecPlan {
    use crate::sandbox::limits::Limits;
    ExecPlan {
        runtime: rt,
        files: vec![("probe.txt".into(), b"isobox-probe-ok\n".to_vec())],
        entry: "probe.txt".into(),
        stdin: Vec::new(),
        args: Vec::new(),
        limits: Limits {
            memory_bytes: 64 << 20,
            cpus: 1.0,
            pids: 16,
            output_bytes: 1024,
            wall_time_ms: 20_000,
        },
        network_requested: false,
        allowlist: None,
        code_given: false,
        preload: None,
        workspace: None,
        long_lived: None,
        ro_binds: Vec::new(),
        signal_start: true,
        cpu_weight: None,
    }
}

/// What a probe sandbox gave: stdout, stderr, exit code, and whether its poststart
/// hook signalled (`None`: it had none).
struct Ran {
    out: Vec<u8>,
    err: Vec<u8>,
    exit_code: i32,
    signalled: Option<bool>,
}

/// Waits for the probe sandbox `s` (at most 60 s, then kills it), reads what it
/// wrote, and removes it.
fn finish(b: &dyn Backend, id: &str, s: Spawned) -> Ran {
    use std::io::Read;
    let Spawned {
        mut child,
        stdin,
        mut stdout,
        mut stderr,
        cgroup,
        dir,
        start_signal,
        ..
    } = s;
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(60);
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if Instant::now() >= deadline {
        b.kill(&cgroup, i32::try_from(child.id()).ok());
    }
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let _ = stdout.read_to_end(&mut out);
    let _ = stderr.read_to_end(&mut err);
    // runsc runs the hook before it waits for the program: its signal is there now.
    let signalled = start_signal.map(|fd| {
        let mut got = [0u8; super::start::SIGNAL_BYTES];
        let n = (&std::fs::File::from(fd)).read(&mut got).unwrap_or(0);
        n == got.len()
    });
    let c = wait_and_delete(b, id, child, &cgroup, &dir);
    Ran {
        out,
        err,
        exit_code: c.exit_code,
        signalled,
    }
}

impl Ran {
    fn failed(&self) -> String {
        format!(
            "sandbox exited {} with stdout {:?}; stderr: {}",
            self.exit_code,
            String::from_utf8_lossy(&self.out)
                .chars()
                .take(400)
                .collect::<String>(),
            String::from_utf8_lossy(&self.err)
                .chars()
                .take(400)
                .collect::<String>()
        )
    }
}

fn probe_once(b: &dyn Backend, id: &str, rt: crate::runtimes::Runtime) -> Result<(), Probe> {
    let plan = probe_plan(rt);
    // On the tree: the probe is of the start hook and of runs on trees (a root image has
    // its own, `probe_image`).
    let s = b
        .run_on_tree(
            id,
            &plan,
            vec!["/bin/cat".into(), "probe.txt".into()],
            &[],
            Stdin::Pipe,
        )
        .map_err(|e| Probe::Failed(e.to_string()))?;
    let r = finish(b, id, s);
    if r.out == b"isobox-probe-ok\n" && r.exit_code == 0 && r.signalled == Some(false) {
        Err(Probe::Unheard)
    } else if r.out == b"isobox-probe-ok\n" && r.exit_code == 0 {
        Ok(())
    } else {
        Err(Probe::Failed(r.failed()))
    }
}

/// The resolv.conf an image's probe has its loader bind, as a networked run's does.
pub const PROBE_RESOLV_CONF: &[u8] = b"# isobox-probe-resolv\n";

/// The probe of a runtime's root image (`sandbox::image`) before any run may use it:
/// `spawn` starts the probe's plan with the given argv on the image (as `id`), with
/// `resolv_conf` ([`PROBE_RESOLV_CONF`], unless the tree has no file to bind it over)
/// for its loader to bind as a networked run's resolvers. The sandbox must print the
/// probe's file back, then that `/etc/resolv.conf`, then its own `/proc/self/status`
/// as the sandbox user with no capability in any set (what `isobox-start --unpack`
/// drops to), with nothing on stderr but the start frame, and exit 0.
///
/// # Errors
/// A sentence saying what failed.
pub fn probe_image(
    b: &dyn Backend,
    id: &str,
    rt: crate::runtimes::Runtime,
    resolv_conf: Option<&[u8]>,
    spawn: impl FnOnce(&str, &ExecPlan, Vec<String>) -> Result<Spawned, super::SandboxError>,
) -> Result<(), String> {
    let plan = probe_plan(rt);
    let mut argv = vec!["/bin/cat".into(), "probe.txt".into()];
    if resolv_conf.is_some() {
        argv.push("/etc/resolv.conf".into());
    }
    argv.push("/proc/self/status".into());
    let s = spawn(id, &plan, argv).map_err(|e| e.to_string())?;
    let r = finish(b, id, s);
    let out = String::from_utf8_lossy(&r.out);
    let nobody = crate::sys::NOBODY;
    let want = [
        format!("Uid:\t{nobody}\t{nobody}\t{nobody}\t{nobody}\n"),
        format!("Gid:\t{nobody}\t{nobody}\t{nobody}\t{nobody}\n"),
        "CapInh:\t0000000000000000\n".into(),
        "CapPrm:\t0000000000000000\n".into(),
        "CapEff:\t0000000000000000\n".into(),
        "CapBnd:\t0000000000000000\n".into(),
    ];
    let ok = r.exit_code == 0
        && out
            .strip_prefix("isobox-probe-ok\n")
            .is_some_and(|o| o.as_bytes().starts_with(resolv_conf.unwrap_or_default()))
        && want.iter().all(|w| out.contains(w.as_str()))
        && r.err == super::start::FRAME;
    if ok {
        Ok(())
    } else {
        Err(r.failed())
    }
}
