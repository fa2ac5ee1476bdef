//! Long-lived sandboxes (the WBX face's) on the loop: one gVisor sandbox each, with
//! `isobox-init` as its pid 1 talking over the socket pair that is its fd 0
//! (`sandbox::wire`). Here: creating one (per-tenant limits, the spawn job, init's
//! hello), its lifetime (the boot deadline, expiry, `timeout`), listing and reading
//! them, and ending one (delete, expiry, init's death, shutdown) with the same kill,
//! wait and delete sequence. Commands running in them are `box_exec.rs`.
//!
//! It stays one file (about 750 lines of code): every end of a sandbox (delete, expiry,
//! its init's death, a failed start, a shutdown) takes the one kill, wait and delete
//! path here, and the states it moves through are read and changed in one place.
//!
//! A daemon crash loses its sandboxes: the startup sweep removes their containers,
//! cgroups and bundles (they are named under the instance like every run), and their
//! ids then answer 404.

use super::conn::Owner;
use super::Daemon;
use crate::http::Response;
use crate::reactor::{Addr, Component, ComponentId, Done, Readiness};
use crate::sandbox::wire::{self, Call, Decoder, Hello, Kind};
use crate::sandbox::{Cleanup, SandboxError, Spawned, Stdin};
use crate::wbx::sandboxes::{self as wsb, Create, Net, Op};
use mio::unix::SourceFd;
use mio::{Interest, Token};
use slab::Slab;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The long-lived sandboxes component (key: the sandbox).
pub(crate) const BOXES: ComponentId = ComponentId(7);
/// The control socket to its init.
const CTL: u16 = 0;
/// The pidfd of its `runsc run`.
const PID: u16 = 1;
/// Timers: the boot deadline, then the expiry.
const LIFETIME: u16 = 0;
/// Timers: a command's time limit (the generation names the command).
pub(super) const EXEC_DEADLINE: u16 = 1;

/// init must say hello within this.
const BOOT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a ready sandbox waits in the warm pool before it is booted anew (its
/// lifetime timer must be somewhere).
const POOLED_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Long-lived sandboxes on the loop.
pub(crate) struct Boxes;

impl Component<Daemon> for Boxes {
    fn name(&self) -> &'static str {
        "boxes"
    }

    fn ready(&self, d: &mut Daemon, key: usize, what: u16, r: Readiness) {
        match what {
            CTL => {
                if r.writable {
                    d.box_flush(key);
                }
                if r.readable {
                    d.box_read(key);
                }
            }
            PID => d.box_exited(key),
            _ => {}
        }
    }

    fn timer(&self, d: &mut Daemon, key: usize, what: u16, gen: u64) {
        match what {
            LIFETIME => d.box_lifetime(key, gen),
            EXEC_DEADLINE => d.exec_deadline(key, gen),
            super::box_procs::PROC_CALL_DEADLINE => d.proc_deadline(key, gen),
            super::box_procs::PROC_KILL_DEADLINE => d.proc_kill_deadline(key, gen),
            super::box_files::FS_DEADLINE => d.fs_deadline(key, gen),
            super::box_verbs::METRICS_DEADLINE => d.metrics_deadline(key, gen),
            super::batch::shared::STEP_DEADLINE => d.shared_deadline(key, gen),
            _ => {}
        }
    }
}

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// `runsc run` is being started, or init has not said hello yet.
    Starting,
    /// init said hello: commands may run.
    Running,
    /// Paused (`runsc pause`): nothing runs; its lifetime does not pass.
    Paused,
    /// Being killed and removed; gone for every client.
    Ending,
}

impl Sbx {
    /// Ready in the warm pool, and its boot measured: a create or a job may take it.
    fn takeable(&self) -> bool {
        self.pooled && self.state == State::Running && !self.measuring
    }

    /// A new call id for this sandbox's channel (never 0).
    pub(super) fn take_call_id(&mut self) -> u32 {
        let id = self.next_call;
        self.next_call = self.next_call.wrapping_add(1).max(1);
        id
    }
}

impl Sbx {
    /// The sandbox's address on its link (`None`: it has no network).
    pub(super) fn net_addr(&self) -> Option<std::net::Ipv4Addr> {
        self.net
            .as_ref()
            .map(crate::netfilter::NetLease::sandbox_addr)
    }
}

impl State {
    /// How the document (and the 409s) name it.
    pub(super) fn name(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Paused => "paused",
            State::Ending => "ending",
        }
    }
}

/// One long-lived sandbox.
pub(crate) struct Sbx {
    pub(super) serial: u64,
    pub(super) id: String,
    pub(super) tenant: String,
    pub(super) template: String,
    /// Its compute class (its limits and CPU weight).
    pub(super) class: &'static crate::wbx::compute::Class,
    pub(super) state: State,
    pub(super) created_ms: u64,
    pub(super) expires_ms: u64,
    /// When it expires (or, while starting, when it must have said hello).
    pub(super) deadline: Instant,
    /// While paused: the lifetime it has left.
    pub(super) remaining: Duration,
    /// A pause or resume is under way.
    pub(super) verb_busy: bool,
    /// Metrics requests waiting for the init's disk figures, by call id.
    pub(super) metrics: HashMap<u32, super::box_verbs::MetricsWait>,
    /// File operations waiting for the init's answer, by call id.
    pub(super) fs: HashMap<u32, super::box_files::FsWait>,
    /// Opens and watches whose wait ran out, by call id: a late `Ok` is closed at once.
    pub(super) abandoned: HashMap<u32, super::box_files::Abandoned>,
    /// Files being downloaded or uploaded, by handle.
    pub(super) transfers: HashMap<u32, super::box_transfer::Xfer>,
    /// Upload connections waiting for room on the channel (key, serial).
    pub(super) upload_waiting: Vec<(usize, u64)>,
    /// Clients watching directories, by watch handle.
    pub(super) watches: HashMap<u32, super::box_watch::WatchSub>,
    metadata: BTreeMap<String, String>,
    /// Its environment's names (create's `env` and every `POST …/env`), each with the
    /// bytes its variable takes.
    pub(super) env_names: BTreeMap<String, usize>,
    network: Net,
    started: Instant,
    start_ms: u64,
    /// Waiting in the warm pool: no tenant, no lifetime, found by nobody.
    pub(super) pooled: bool,
    /// Taken from the warm pool (`info.warm`).
    warm: bool,
    /// Pooled and ready, its boot's CPU still being read from its cgroup: not taken
    /// until then, so the figure holds the boot alone.
    measuring: bool,
    /// Egress cuts before it booted (a cut since leaves it without network).
    cuts_at_boot: u64,
    /// The container's name under the instance.
    pub(super) container: String,
    pub(super) ctl: Option<(mio::net::UnixStream, Token)>,
    pub(super) decoder: Decoder,
    pub(super) wbuf: Vec<u8>,
    pid: Option<(OwnedFd, Token)>,
    child: Option<Child>,
    pub(super) cgroup: Option<crate::cgroup::RunCgroup>,
    dir: Option<PathBuf>,
    net: Option<crate::netfilter::NetLease>,
    /// The create request waiting for hello.
    creator: Option<(usize, u64)>,
    /// Delete requests waiting for the sandbox to be gone.
    deleters: Vec<(usize, u64)>,
    timer_gen: u64,
    killing: bool,
    /// `runsc run` exited (its pidfd fired).
    exited: bool,
    pub(super) next_call: u32,
    /// Commands started and not ended, by call id until init answers, then by pid.
    pub(super) execs: super::box_exec::Execs,
    /// Background processes.
    pub(super) procs: super::box_procs::Procs,
    /// Who runs it, when not a client: a many-input request's shared sandbox
    /// (`batch/shared.rs`) or a background job's (`jobs.rs`). Found by nobody else;
    /// every frame of its init goes to its owner.
    pub(super) owner: Option<BoxOwner>,
    /// The kernel OOM-killed something in its cgroup (known once it is removed).
    oom_killed: bool,
    /// Why it ended (for a batch's inputs).
    end_why: String,
}

/// Who a sandbox that no client created is for (key and serial of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BoxOwner {
    /// A many-input request's shared sandbox.
    Batch(usize, u64),
    /// A background job's sandbox.
    Job(usize, u64),
}

/// What a shared-sandbox batch or a job gives the sandbox it boots: its owner, its
/// limits, the program's files (bound at `/workspace` as a one-shot run has them;
/// a job has none) and host directories bound read-only (a job's `input/`).
pub(super) struct InternalBoot {
    pub(super) owner: BoxOwner,
    pub(super) limits: crate::sandbox::limits::Limits,
    pub(super) files: Vec<(String, Vec<u8>)>,
    pub(super) ro_binds: Vec<(std::path::PathBuf, String)>,
}

/// Why a long-lived sandbox cannot boot when its init binary is missing (the client is
/// not told the host's path; the log says it).
pub(crate) const INIT_MISSING: &str = "long-lived sandboxes are unavailable on this server: \
     its sandbox init (isobox-init) is not installed; its operator's `isoboxd check` says more";

/// The component's state.
#[derive(Default)]
pub(crate) struct Table {
    pub(super) boxes: Slab<Sbx>,
    by_id: HashMap<String, usize>,
    serial: u64,
    /// Pooled boots that failed in a row, and until when the pool waits.
    warm_failures: u32,
    warm_pause_until: Option<Instant>,
    warm_unknown_logged: bool,
    /// The missing init was named in the log (once, until it is there again).
    init_missing_logged: bool,
    /// Figures for `/healthz`: creates served from the pool, creates that found it
    /// empty, boots that failed.
    warm_hits: u64,
    warm_misses: u64,
    warm_failed: u64,
    /// CPU the pool's boots took, each read from its cgroup once it said hello.
    warm_refill_cpu_ns: u64,
}

impl Table {
    /// The live sandbox `id` of `tenant` (another tenant's is not found).
    pub(super) fn find(&self, tenant: &str, id: &str) -> Option<usize> {
        self.by_id
            .get(id)
            .copied()
            .filter(|&k| self.boxes.get(k).is_some_and(|b| b.tenant == tenant))
    }

    /// The live sandbox `id`, whoever's it is (its public URLs are authorised by its
    /// token, not by a tenant).
    pub(super) fn by_id_any(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    /// Sandboxes on this server that count against `ISOBOX_WBX_MAX_TOTAL`: clients'
    /// and jobs' (a batch's shared sandbox holds an execution slot instead).
    pub(super) fn on_server(&self) -> usize {
        self.boxes
            .iter()
            .filter(|(_, b)| !b.pooled && !matches!(b.owner, Some(BoxOwner::Batch(..))))
            .count()
    }

    /// Whether nothing is left to end.
    pub(crate) fn is_empty(&self) -> bool {
        self.boxes.is_empty()
    }
}

/// The answer while the daemon stops (its sandboxes and jobs end with it).
pub(super) fn shutting_down() -> Response {
    crate::wbx::error(503, "the service is shutting down; retry in a few seconds")
        .with_header("Retry-After", "5")
}

/// The limits of a WBX sandbox of class `c` (a job's sandbox has them too).
pub(super) fn wbx_limits(c: &crate::wbx::compute::Class) -> crate::sandbox::limits::Limits {
    crate::sandbox::limits::Limits {
        memory_bytes: c.mem_mb << 20,
        cpus: f64::from(c.vcpu),
        pids: crate::sandbox::limits::PIDS.1,
        output_bytes: crate::sandbox::limits::OUTPUT_BYTES.1,
        wall_time_ms: crate::sandbox::limits::WALL_TIME_MS.1,
    }
}

pub(super) fn now_ms() -> u64 {
    crate::workspace::now_ms()
}

/// 24 hex digits of the system's randomness: the unguessable part of an id.
pub(super) fn random_hex() -> Option<String> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 12];
    ring::rand::SystemRandom::new().fill(&mut b).ok()?;
    Some(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Daemon {
    /// Carries out what a WBX request asks of the sandboxes.
    pub(crate) fn box_op(&mut self, ck: usize, tenant: String, op: Op) {
        let respond = |d: &mut Daemon, r: Response| d.respond(ck, r);
        if self.app.shutting_down {
            // Every sandbox is ending with the daemon.
            respond(self, shutting_down());
            return;
        }
        match op {
            Op::Create(c) => self.box_create(ck, tenant, c),
            Op::List => {
                let list: Vec<serde_json::Value> = self
                    .boxes
                    .boxes
                    .iter()
                    .filter(|(_, b)| {
                        b.tenant == tenant
                            && b.owner.is_none()
                            && matches!(b.state, State::Running | State::Paused)
                    })
                    .map(|(_, b)| self.box_json(b))
                    .collect();
                respond(
                    self,
                    Response::json(200, &serde_json::json!({ "sandboxes": list })),
                );
            }
            Op::Get(id) => match self.boxes.find(&tenant, &id) {
                Some(k) => {
                    let v = self.box_json(&self.boxes.boxes[k]);
                    respond(self, Response::json(200, &v));
                }
                None => respond(self, wsb::not_found()),
            },
            Op::Delete(id) => match self.boxes.find(&tenant, &id) {
                Some(k) => {
                    if let Some(c) = self.conns.get(ck) {
                        let serial = c.serial;
                        self.boxes.boxes[k].deleters.push((ck, serial));
                        let bserial = self.boxes.boxes[k].serial;
                        self.conn_own(
                            ck,
                            Owner::BoxWait {
                                key: k,
                                serial: bserial,
                                create: false,
                            },
                        );
                    }
                    self.box_end(k, "deleted");
                }
                None => respond(self, wsb::not_found()),
            },
            Op::Timeout(id, secs) => match self.boxes.find(&tenant, &id) {
                Some(k) if self.boxes.boxes[k].state == State::Paused => {
                    // Counted from the resume: paused time does not pass.
                    self.boxes.boxes[k].remaining = Duration::from_secs(secs);
                    let v = self.box_json(&self.boxes.boxes[k]);
                    respond(self, Response::json(200, &v));
                }
                Some(k) if self.boxes.boxes[k].state == State::Running => {
                    let b = &mut self.boxes.boxes[k];
                    b.expires_ms = now_ms() + secs * 1000;
                    b.deadline = Instant::now() + Duration::from_secs(secs);
                    self.box_arm(k);
                    let v = self.box_json(&self.boxes.boxes[k]);
                    respond(self, Response::json(200, &v));
                }
                Some(k) => {
                    let state = self.boxes.boxes[k].state.name();
                    respond(
                        self,
                        crate::wbx::error(409, &format!("the sandbox is {state}")),
                    );
                }
                None => respond(self, wsb::not_found()),
            },
            Op::Pause(id) => match self.boxes.find(&tenant, &id) {
                Some(k) => self.box_pause(ck, k),
                None => respond(self, wsb::not_found()),
            },
            Op::Resume(id) => match self.boxes.find(&tenant, &id) {
                Some(k) => self.box_resume_op(ck, k),
                None => respond(self, wsb::not_found()),
            },
            Op::Metrics(id) => match self.boxes.find(&tenant, &id) {
                Some(k) => self.box_metrics(ck, k),
                None => respond(self, wsb::not_found()),
            },
            Op::Url(id, port) => match self.boxes.find(&tenant, &id) {
                Some(k) => {
                    let r = self.box_url(k, port);
                    respond(self, r);
                }
                None => respond(self, wsb::not_found()),
            },
            Op::Exec { id, exec, stream } => match self.boxes.find(&tenant, &id) {
                Some(k) => self.exec_start(ck, k, *exec, stream),
                None => respond(self, wsb::not_found()),
            },
            Op::Env(id, env) => match self.boxes.find(&tenant, &id) {
                Some(k) => self.box_env(ck, k, env),
                None => respond(self, wsb::not_found()),
            },
            Op::Proc(id, op) => match self.boxes.find(&tenant, &id) {
                Some(k) => self.proc_op(ck, k, op),
                None => respond(self, wsb::not_found()),
            },
            Op::Fs(id, call) => match self.boxes.find(&tenant, &id) {
                Some(k) => self.box_fs(ck, k, call),
                None => respond(self, wsb::not_found()),
            },
            Op::FileGet {
                id,
                path,
                head_only,
            } => match self.boxes.find(&tenant, &id) {
                Some(k) => self.file_get(ck, k, path, head_only),
                None => respond(self, wsb::not_found()),
            },
            Op::FsWatch {
                id,
                path,
                recursive,
            } => match self.boxes.find(&tenant, &id) {
                Some(k) => self.file_watch(ck, k, path, recursive),
                None => respond(self, wsb::not_found()),
            },
        }
    }

    /// `GET …/url?port=`: the port's public URL and the sandbox's token. A paused
    /// sandbox has its URL too (its requests get a page saying it is paused).
    fn box_url(&self, k: usize, port: u16) -> Response {
        let b = &self.boxes.boxes[k];
        if b.state == State::Starting {
            return crate::wbx::error(409, "the sandbox is starting");
        }
        if b.net_addr().is_none() {
            let why = if b.network == Net::None {
                "the sandbox has no network (network.mode none): public URLs need mode full or allowlist"
            } else {
                "the sandbox has no network: this server runs without sandbox networking (ISOBOX_EGRESS=off, or egress not verified when it started)"
            };
            return crate::wbx::error(409, why);
        }
        let url = self.public_url(port, &b.id);
        let token = self.url_token(&b.id);
        let with = format!("{url}?wbx_token={token}");
        Response::json(
            200,
            &serde_json::json!({"url": url, "url_with_token": with, "token": token}),
        )
    }

    pub(super) fn box_json(&self, b: &Sbx) -> serde_json::Value {
        // A paused sandbox's end moves on with the clock: its lifetime does not pass.
        let expires_ms = if b.state == State::Paused {
            now_ms() + u64::try_from(b.remaining.as_millis()).unwrap_or(u64::MAX)
        } else {
            b.expires_ms
        };
        wsb::sandbox_json(&wsb::View {
            id: &b.id,
            template: &b.template,
            state: b.state.name(),
            created_ms: b.created_ms,
            expires_ms,
            metadata: &b.metadata,
            network: b.network.clone(),
            start_ms: b.start_ms,
            warm: b.warm,
            class: b.class,
        })
    }

    /// The 429 a new sandbox of `tenant` of class `class` gets, naming the limit it
    /// would pass.
    fn box_refusal(&self, tenant: &str, class: &crate::wbx::compute::Class) -> Option<Response> {
        if self.app.shutting_down {
            return Some(shutting_down());
        }
        let l = &self.cfg.wbx;
        // Ending sandboxes count until they are gone: their memory is still taken.
        let mine: Vec<&Sbx> = self
            .boxes
            .boxes
            .iter()
            .map(|(_, b)| b)
            .filter(|b| b.tenant == tenant && b.owner.is_none())
            .collect();
        let n = mine.len();
        let vcpu: u64 = mine.iter().map(|b| u64::from(b.class.vcpu)).sum();
        let mem_mb: u64 = mine.iter().map(|b| b.class.mem_mb).sum();
        // A batch's shared sandbox holds an execution slot instead; jobs' sandboxes
        // count.
        let on_server = self.boxes.on_server();
        if on_server >= l.max_total {
            return Some(
                crate::wbx::error(
                    429,
                    &format!("no free capacity right now: {} sandboxes run on this server (ISOBOX_WBX_MAX_TOTAL); retry later", l.max_total),
                )
                .with_header("Retry-After", "5"),
            );
        }
        let why = if n >= l.max_sandboxes {
            Some(format!("limit reached: at most {} sandboxes at once (ISOBOX_WBX_MAX_SANDBOXES); delete sandboxes you no longer need", l.max_sandboxes))
        } else if vcpu + u64::from(class.vcpu) > u64::from(l.max_vcpu) {
            Some(format!("limit reached: at most {} vCPUs across your sandboxes (ISOBOX_WBX_MAX_VCPU); yours have {vcpu} and one more of class {} has {}", l.max_vcpu, class.name, class.vcpu))
        } else if mem_mb + class.mem_mb > l.max_mem_mb {
            Some(format!("limit reached: at most {} MiB of memory across your sandboxes (ISOBOX_WBX_MAX_MEMORY_MB); yours have {mem_mb} and one more of class {} has {}", l.max_mem_mb, class.name, class.mem_mb))
        } else {
            None
        };
        why.map(|w| crate::wbx::error(429, &w))
    }

    fn box_create(&mut self, ck: usize, tenant: String, c: Box<Create>) {
        let t0 = Instant::now();
        let mut c = c;
        let class = match self.compute_class(&tenant, c.compute_class.map_or("", |c| c.name)) {
            Ok(class) => class,
            Err(refused) => {
                let resp = crate::wbx::compute::not_offered("compute_class", &refused);
                self.respond(ck, resp);
                return;
            }
        };
        c.compute_class = Some(class);
        if let Some(resp) = self.box_refusal(&tenant, class) {
            self.respond(ck, resp);
            return;
        }
        if let Some(key) = self.box_warm_take(&c) {
            self.box_claim(ck, key, tenant, *c, t0);
            return;
        }
        let Some(cserial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        match self.box_boot(Some((ck, cserial)), tenant, *c, None) {
            Ok(key) => {
                let serial = self.boxes.boxes[key].serial;
                self.conn_own(
                    ck,
                    Owner::BoxWait {
                        key,
                        serial,
                        create: true,
                    },
                );
            }
            Err(resp) => self.respond(ck, resp),
        }
    }

    /// Whether long-lived sandboxes cannot boot because their init binary is not
    /// there. Looked at on every boot (one `stat`), so an operator who installs it
    /// needs no restart; the log names the path once, as the client is not told it.
    pub(super) fn box_init_missing(&mut self) -> bool {
        use std::os::unix::fs::PermissionsExt;
        let there = std::fs::metadata(&self.cfg.init)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
        if there {
            self.boxes.init_missing_logged = false;
        } else if !self.boxes.init_missing_logged {
            self.boxes.init_missing_logged = true;
            log::error!(
                "sandboxes: the init of long-lived sandboxes, {}, is missing or not executable: \
                 /wbx sandboxes, jobs and shared-build batches are refused until it is there \
                 (build it with `make build`, or set ISOBOX_INIT; `isoboxd check` says the same)",
                self.cfg.init.display()
            );
        }
        !there
    }

    /// Boots a sandbox: for `creator` (answered once its init says hello), for a
    /// many-input request's shared sandbox or a job (`internal`: found by nobody
    /// else), or, with neither, for the warm pool (no tenant yet, found by nobody until
    /// claimed).
    pub(super) fn box_boot(
        &mut self,
        creator: Option<(usize, u64)>,
        tenant: String,
        c: Create,
        internal: Option<InternalBoot>,
    ) -> Result<usize, Response> {
        if self.box_init_missing() {
            return Err(crate::wbx::error(503, INIT_MISSING));
        }
        let Some(hex) = random_hex() else {
            return Err(crate::wbx::error(
                503,
                "the system's random source failed; retry",
            ));
        };
        let pooled = creator.is_none() && internal.is_none();
        self.boxes.serial += 1;
        let serial = self.boxes.serial;
        let id = format!("sb_{hex}");
        let container = self.container_id("b", serial);
        let Create {
            template,
            runtime,
            timeout_s,
            env,
            metadata,
            network,
            compute_class,
        } = c;
        let class = compute_class.unwrap_or_else(crate::wbx::compute::default_class);
        let env_names = crate::wbx::sandboxes::env_sizes(&env);
        let (owner, limits, files, ro_binds) = match internal {
            Some(bb) => (Some(bb.owner), bb.limits, bb.files, bb.ro_binds),
            None => (None, wbx_limits(class), Vec::new(), Vec::new()),
        };
        let plan = crate::sandbox::plan::ExecPlan {
            limits,
            runtime,
            files,
            entry: String::new(),
            stdin: Vec::new(),
            args: Vec::new(),
            network_requested: network != Net::None,
            allowlist: network.allowlist(),
            code_given: false,
            preload: None,
            workspace: None,
            long_lived: Some(self.cfg.init.clone()),
            ro_binds,
            signal_start: false,
            cpu_weight: Some(class.cpu_weight),
        };
        let now = Instant::now();
        let created_ms = now_ms();
        let key = self.boxes.boxes.insert(Sbx {
            serial,
            id: id.clone(),
            tenant,
            template,
            class,
            state: State::Starting,
            created_ms,
            expires_ms: created_ms + timeout_s * 1000,
            deadline: now + BOOT_TIMEOUT,
            remaining: Duration::ZERO,
            verb_busy: false,
            metrics: HashMap::new(),
            fs: HashMap::new(),
            abandoned: HashMap::new(),
            transfers: HashMap::new(),
            upload_waiting: Vec::new(),
            watches: HashMap::new(),
            metadata,
            env_names,
            network,
            started: now,
            start_ms: 0,
            pooled,
            warm: false,
            measuring: false,
            cuts_at_boot: self.app.egress.cuts(),
            container: container.clone(),
            ctl: None,
            decoder: Decoder::default(),
            wbuf: Vec::new(),
            pid: None,
            child: None,
            cgroup: None,
            dir: None,
            net: None,
            creator,
            deleters: Vec::new(),
            timer_gen: 0,
            killing: false,
            exited: false,
            next_call: 1,
            execs: Default::default(),
            procs: Default::default(),
            owner,
            oom_killed: false,
            end_why: String::new(),
        });
        if !pooled && owner.is_none() {
            self.boxes.by_id.insert(id, key);
        }
        self.box_count_publish();
        self.box_arm(key);
        // The sandbox's environment is its init's, which every process inherits.
        let mut env_list: Vec<String> = plan.runtime.desc.env.clone();
        env_list.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        let argv = if matches!(owner, Some(BoxOwner::Batch(..))) {
            // A batch's inputs run as a one-shot run's program does: as nobody, with
            // HOME=/tmp (the sandbox's environment), no home of their own.
            vec![
                crate::sandbox::plan::INIT_PATH.to_string(),
                format!("--user={}", crate::sys::NOBODY),
            ]
        } else {
            vec![
                crate::sandbox::plan::INIT_PATH.to_string(),
                "--user=1000".to_string(),
                "--home=/home/user".to_string(),
            ]
        };
        let backend = Arc::clone(&self.backend);
        let job = Box::new(move || -> Done<Daemon> {
            let result = backend
                .run(&container, &plan, argv, &env_list, Stdin::Control)
                .map(Box::new);
            Box::new(move |d: &mut Daemon| d.box_spawned(key, serial, result))
        });
        if self.reactor.submit(job).is_err() {
            self.box_forget(key);
            return Err(
                crate::wbx::error(503, "the daemon is overloaded; retry in a second")
                    .with_header("Retry-After", "1"),
            );
        }
        Ok(key)
    }

    /// Publishes the number of live sandboxes (tenants', pooled) for `/metrics`.
    /// (A batch's shared sandbox counts as its runs do, in the slots.)
    pub(super) fn box_count_publish(&mut self) {
        let pooled = self.boxes.boxes.iter().filter(|(_, b)| b.pooled).count();
        let batch = self
            .boxes
            .boxes
            .iter()
            .filter(|(_, b)| b.owner.is_some())
            .count();
        self.app.metrics.sandboxes = (self.boxes.boxes.len() - pooled - batch, pooled);
    }

    /// Publishes the pool's figures for `/healthz`.
    fn box_warm_publish(&mut self) {
        self.box_count_publish();
        let want = &self.cfg.wbx.warm_pool;
        let t = &self.boxes;
        self.app.wbx_warm = want
            .iter()
            .any(|(_, n)| *n > 0)
            .then(|| crate::api::WbxWarmFigures {
                templates: want
                    .iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|(name, n)| {
                        let ready = t
                            .boxes
                            .iter()
                            .filter(|(_, b)| b.takeable() && b.template == *name)
                            .count();
                        (name.clone(), crate::api::WarmRuntime { ready, target: *n })
                    })
                    .collect(),
                hits: t.warm_hits,
                misses: t.warm_misses,
                failures: t.warm_failed,
                refill_cpu_seconds: crate::api::cpu_seconds(t.warm_refill_cpu_ns),
            });
    }

    /// A ready sandbox of the pool that can serve `c` (`box_poolable`), with a
    /// network that is still there (none was cut since it booted); counts a hit, or a
    /// miss when the pool had none. Pooled ones that can no longer serve anyone are
    /// ended (and replaced).
    fn box_warm_take(&mut self, c: &Create) -> Option<usize> {
        if !self.box_poolable(c) {
            return None;
        }
        let egress = std::sync::Arc::clone(&self.app.egress);
        let stale: Vec<usize> = self
            .boxes
            .boxes
            .iter()
            .filter(|(_, b)| b.pooled && b.state == State::Running)
            .filter(|(_, b)| {
                egress.enabled() && (b.net.is_none() || b.cuts_at_boot != egress.cuts())
            })
            .map(|(k, _)| k)
            .collect();
        for k in stale {
            self.box_end(k, "its network went away while it waited in the pool");
        }
        let key = self
            .boxes
            .boxes
            .iter()
            .find(|(_, b)| b.takeable() && b.template == c.template)
            .map(|(k, _)| k);
        match key {
            Some(_) => self.boxes.warm_hits += 1,
            None => {
                self.boxes.warm_misses += 1;
                self.box_warm_publish();
            }
        }
        key
    }

    /// Takes pooled sandbox `key` out of the pool for `tenant`: its lifetime of
    /// `timeout_s` starts now. The caller gives it its owner and refills the pool.
    fn box_unpool(&mut self, key: usize, tenant: String, timeout_s: u64, t0: Instant) -> &mut Sbx {
        let now = Instant::now();
        let created_ms = now_ms();
        let b = &mut self.boxes.boxes[key];
        b.pooled = false;
        b.warm = true;
        b.tenant = tenant;
        b.created_ms = created_ms;
        b.expires_ms = created_ms + timeout_s * 1000;
        b.deadline = now + Duration::from_secs(timeout_s);
        b.start_ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX);
        log::info!(
            "sandbox={} template={} taken from the warm pool",
            b.id,
            b.template
        );
        b
    }

    /// Gives pooled sandbox `key` to `tenant` as `c` asks: its lifetime starts now, its
    /// environment is sent to its init ahead of any command, and the pool is refilled.
    fn box_claim(&mut self, ck: usize, key: usize, tenant: String, c: Create, t0: Instant) {
        let b = self.box_unpool(key, tenant, c.timeout_s, t0);
        b.metadata = c.metadata;
        b.env_names = crate::wbx::sandboxes::env_sizes(&c.env);
        let id = b.id.clone();
        self.boxes.by_id.insert(id, key);
        if !c.env.is_empty() {
            // Ordered on the channel: init has it before any command of the client.
            self.box_call(key, &Call::Env { env: c.env });
        }
        self.box_arm(key);
        let v = self.box_json(&self.boxes.boxes[key]);
        self.respond(ck, Response::json(201, &v));
        self.box_warm_fill();
    }

    /// A pooled sandbox for a job that asks for what the pool holds (`c`: its
    /// template, network `full`, economy; no inputs to bind, which only a boot can):
    /// taken for `owner`, already past its hello. `None` boots cold.
    pub(super) fn box_take_for_job(
        &mut self,
        tenant: String,
        c: &Create,
        owner: BoxOwner,
    ) -> Option<usize> {
        let key = self.box_warm_take(c)?;
        let b = self.box_unpool(key, tenant, c.timeout_s, Instant::now());
        b.owner = Some(owner);
        self.box_arm(key);
        self.box_warm_fill();
        Some(key)
    }

    /// Whether the pool is meant to hold sandboxes that `c` could take: its template
    /// is pooled, network `full`, economy (so finding none is a miss).
    fn box_poolable(&self, c: &Create) -> bool {
        c.network == Net::Full
            && c.compute_class
                .is_none_or(|k| k == crate::wbx::compute::default_class())
            && self
                .cfg
                .wbx
                .warm_pool
                .iter()
                .any(|(t, n)| *t == c.template && *n > 0)
    }

    /// Boots what the warm pool lacks (after a claim, at start, and every second),
    /// unless boots keep failing: then it waits, longer after each failure (to 60 s).
    pub(crate) fn box_warm_fill(&mut self) {
        self.box_warm_publish();
        if self.box_init_missing() {
            // Said once in the log; no boot is tried until the init is there.
            return;
        }
        if self.app.shutting_down
            || self.boxes.warm_pause_until.is_some_and(|t| Instant::now() < t)
            || self.app.probe != crate::api::ProbeState::Passed
            // A pooled sandbox has network `full`: only while egress is verified.
            || (self.app.egress.enabled() && !self.app.egress.verified())
            // One boot at a time: a pool refilling never competes with itself.
            || self
                .boxes
                .boxes
                .iter()
                .any(|(_, b)| b.pooled && b.state == State::Starting)
        {
            return;
        }
        let want = self.cfg.wbx.warm_pool.clone();
        for (template, n) in want {
            let have = self
                .boxes
                .boxes
                .iter()
                .filter(|(_, b)| b.pooled && b.template == template && b.state != State::Ending)
                .count();
            if have >= n {
                continue;
            }
            let Some((name, runtime, _)) = wsb::templates(&self.app.runtimes)
                .into_iter()
                .find(|(name, _, _)| *name == template)
            else {
                if !self.boxes.warm_unknown_logged {
                    self.boxes.warm_unknown_logged = true;
                    log::warn!("ISOBOX_WBX_WARM_POOL: no template {template:?} (GET /wbx/v1/templates lists them); not pooled");
                }
                continue;
            };
            {
                let c = Create {
                    template: name.clone(),
                    runtime: runtime.clone(),
                    timeout_s: 0,
                    env: Vec::new(),
                    metadata: BTreeMap::new(),
                    network: Net::Full,
                    // The pool holds economy sandboxes (`box_warm_take`).
                    compute_class: None,
                };
                if let Err(r) = self.box_boot(None, String::new(), c, None) {
                    log::warn!("warm pool: a sandbox could not be booted ({})", r.status);
                }
                return;
            }
        }
    }

    /// Arms the sandbox's one lifetime timer at its deadline.
    pub(super) fn box_arm(&mut self, key: usize) {
        let Some(b) = self.boxes.boxes.get(key) else {
            return;
        };
        let at = b.deadline;
        let gen = self.reactor.arm_new(at, Addr::new(BOXES, key, LIFETIME));
        if let Some(b) = self.boxes.boxes.get_mut(key) {
            b.timer_gen = gen;
        }
    }

    fn box_spawned(&mut self, key: usize, serial: u64, result: Result<Box<Spawned>, SandboxError>) {
        let Some(b) = self.boxes.boxes.get(key).filter(|b| b.serial == serial) else {
            // Forgotten meanwhile (its job could not be queued): remove what started.
            if let Ok(s) = result {
                let backend = Arc::clone(&self.backend);
                self.reactor.submit_must(Box::new(move || {
                    crate::sandbox::warm::discard(&*backend, *s);
                    super::nothing()
                }));
            }
            return;
        };
        let _ = b;
        let mut s = match result {
            Ok(s) => *s,
            Err(e) => {
                crate::error_limited!("sandbox={key} op=spawn err={e}");
                self.box_fail_waiters(
                    key,
                    502,
                    "the sandbox could not be started; see the daemon log",
                );
                self.box_forget(key);
                return;
            }
        };
        let ctl = s.ctl.take();
        let mut ok = ctl.is_some();
        let mut ctl_reg = None;
        if let Some(ctl) = ctl {
            ok &= ctl.set_nonblocking(true).is_ok();
            let mut ctl = mio::net::UnixStream::from_std(ctl);
            match self.reactor.register(
                &mut ctl,
                Addr::new(BOXES, key, CTL),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                Ok(t) => ctl_reg = Some((ctl, t)),
                Err(_) => ok = false,
            }
        }
        let pid_reg = self
            .reactor
            .register(
                &mut SourceFd(&s.pidfd.as_raw_fd()),
                Addr::new(BOXES, key, PID),
                Interest::READABLE,
            )
            .ok();
        ok &= pid_reg.is_some();
        // The program's own stdout and stderr: init writes nothing there; whatever
        // appears is not read (closing them is enough).
        drop(s.stdout);
        drop(s.stderr);
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        b.ctl = ctl_reg;
        b.pid = pid_reg.map(|t| (s.pidfd, t));
        b.child = Some(s.child);
        b.cgroup = Some(s.cgroup);
        b.dir = Some(s.dir);
        b.net = s.net;
        let ending = b.state == State::Ending;
        if !ok {
            crate::error_limited!("sandbox={key} op=register err=could not watch the sandbox");
            if let Some(b) = self.boxes.boxes.get_mut(key) {
                // Possibly marked while it started: the kill below must go out.
                b.killing = false;
            }
            self.box_fail_waiters(
                key,
                502,
                "the sandbox could not be started; see the daemon log",
            );
            self.box_end(key, "could not be watched");
            if self.boxes.boxes.get(key).is_some_and(|b| b.pid.is_none()) {
                // Its exit would never be seen: reap it after the kill.
                self.box_exited(key);
            }
        } else if ending {
            // Deleted (or the daemon began stopping) while it started.
            if let Some(b) = self.boxes.boxes.get_mut(key) {
                b.killing = false;
            }
            self.box_end(key, "ended while starting");
        } else {
            // init may have spoken already: edge-triggered, so look now.
            self.box_read(key);
        }
    }

    /// Reads init's frames (unless a streaming client holds the reading back).
    pub(super) fn box_read(&mut self, key: usize) {
        let mut buf = [0u8; 64 << 10];
        loop {
            let Some(b) = self.boxes.boxes.get_mut(key) else {
                return;
            };
            if b.state == State::Ending {
                return;
            }
            let Some((ctl, _)) = b.ctl.as_mut() else {
                return;
            };
            match ctl.read(&mut buf) {
                Ok(0) => {
                    self.box_end(key, "its init closed the control channel");
                    return;
                }
                Ok(n) => b.decoder.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.box_end(key, "its control channel failed");
                    return;
                }
            }
            loop {
                let Some(b) = self.boxes.boxes.get_mut(key) else {
                    return;
                };
                if b.state == State::Ending {
                    return;
                }
                match b.decoder.next_frame() {
                    Ok(Some(f)) => self.box_frame(key, f),
                    Ok(None) => break,
                    Err(e) => {
                        crate::warn_limited!("sandbox={key} broke the init protocol: {e}");
                        self.box_end(key, "its init broke the protocol");
                        return;
                    }
                }
            }
        }
    }

    fn box_frame(&mut self, key: usize, f: wire::Frame) {
        let Some(b) = self.boxes.boxes.get(key) else {
            return;
        };
        match (b.owner, f.kind, b.state) {
            (
                Some(BoxOwner::Batch(bk, bs)),
                Kind::Reply | Kind::Output | Kind::Exit,
                State::Running,
            ) => {
                // A batch's shared sandbox runs nothing but the batch's commands.
                self.shared_frame(bk, bs, key, &f);
                return;
            }
            (
                Some(BoxOwner::Job(jk, js)),
                Kind::Reply | Kind::Output | Kind::Exit | Kind::FileData,
                State::Running,
            ) => {
                // Nor a job's anything but its command and the saving of its files.
                self.job_frame(jk, js, key, &f);
                return;
            }
            _ => {}
        }
        match (f.kind, b.state) {
            (Kind::Hello, State::Starting) => match serde_json::from_slice::<Hello>(&f.payload) {
                Ok(h) if h.version == wire::VERSION => self.box_ready(key),
                _ => {
                    crate::warn_limited!("sandbox={key} init spoke another protocol version");
                    self.box_fail_waiters(key, 502, "the sandbox's init did not start properly");
                    self.box_end(key, "its init spoke another protocol");
                }
            },
            // A pause can catch frames already on their way: they count as before it.
            (Kind::Reply, State::Running | State::Paused) => {
                if !self.metrics_reply(key, f.channel, &f.payload)
                    && !self.fs_reply(key, f.channel, &f.payload)
                    && !self.proc_reply(key, f.channel, &f.payload)
                {
                    self.exec_reply(key, f.channel, &f.payload)
                }
            }
            (Kind::Output, State::Running | State::Paused) => {
                if b.procs.has(f.channel) && !b.execs.has(f.channel) {
                    self.proc_output(key, f.channel, &f.payload)
                } else {
                    self.exec_output(key, f.channel, &f.payload)
                }
            }
            (Kind::Exit, State::Running | State::Paused) => {
                if b.procs.running(f.channel) && !b.execs.has(f.channel) {
                    self.proc_exit(key, f.channel, &f.payload)
                } else {
                    self.exec_exit(key, f.channel, &f.payload)
                }
            }
            (Kind::Replay, State::Running | State::Paused) => {
                self.proc_replay(key, f.channel, &f.payload)
            }
            (Kind::FileData, State::Running | State::Paused) => {
                self.file_data(key, f.channel, &f.payload)
            }
            (Kind::FsEvent, State::Running | State::Paused) => {
                self.watch_event(key, f.channel, &f.payload)
            }
            _ => {
                crate::warn_limited!("sandbox={key} init sent an unexpected frame");
                self.box_end(key, "its init broke the protocol");
            }
        }
    }

    fn box_ready(&mut self, key: usize) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        b.state = State::Running;
        b.start_ms = u64::try_from(b.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let left = b.expires_ms.saturating_sub(now_ms());
        b.deadline = Instant::now() + Duration::from_millis(left);
        if b.pooled {
            // Its lifetime starts when it is taken.
            b.deadline = Instant::now() + POOLED_WAIT;
            self.boxes.warm_failures = 0;
        }
        let creator = b.creator.take();
        let pooled = b.pooled;
        let owner = b.owner;
        log::info!(
            "sandbox={} template={} ready in {} ms{}",
            b.id,
            b.template,
            b.start_ms,
            if pooled { " (warm pool)" } else { "" }
        );
        self.box_arm(key);
        if pooled {
            // What its boot cost, up to init's hello: read on the pool before anyone
            // can take it (the figure must not hold a client's or a job's work); it is
            // `ready` in the figures once it can be taken.
            if let Some(b) = self.boxes.boxes.get_mut(key) {
                if let Some(cg) = b.cgroup.clone() {
                    b.measuring = true;
                    let serial = b.serial;
                    self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
                        let cpu = cg.usage().cpu_ns;
                        Box::new(move |d: &mut Daemon| {
                            let Some(b) = d.boxes.boxes.get_mut(key).filter(|b| b.serial == serial)
                            else {
                                return;
                            };
                            b.measuring = false;
                            d.boxes.warm_refill_cpu_ns =
                                d.boxes.warm_refill_cpu_ns.saturating_add(cpu);
                            d.box_warm_publish();
                        })
                    }));
                }
            }
            self.box_warm_publish();
        }
        if let Some((ck, cserial)) = creator {
            if self.conns.get(ck).is_some_and(|c| c.serial == cserial) {
                let v = self.box_json(&self.boxes.boxes[key]);
                self.respond(ck, Response::json(201, &v));
                self.conn_resume(ck);
            }
        }
        match owner {
            Some(BoxOwner::Batch(bk, bs)) => self.shared_ready(bk, bs, key),
            Some(BoxOwner::Job(jk, js)) => self.job_ready(jk, js, key),
            None => {}
        }
    }

    fn box_lifetime(&mut self, key: usize, gen: u64) {
        let Some(b) = self.boxes.boxes.get(key).filter(|b| b.timer_gen == gen) else {
            return;
        };
        if Instant::now() < b.deadline {
            self.box_arm(key);
            return;
        }
        match b.state {
            State::Starting => {
                self.box_fail_waiters(key, 502, "the sandbox's init did not start in time");
                self.box_end(key, "did not start in time");
            }
            State::Running => self.box_end(key, "expired"),
            // The resume arms it again with what was left.
            State::Paused | State::Ending => {}
        }
    }

    /// Answers everything waiting on the sandbox with `status` and `message`: its
    /// creator and its commands (its deleters get their 204 once it is gone).
    fn box_fail_waiters(&mut self, key: usize, status: u16, message: &str) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let creator = b.creator.take();
        if let Some((ck, cserial)) = creator {
            if self.conns.get(ck).is_some_and(|c| c.serial == cserial) {
                self.respond(ck, crate::wbx::error(status, message));
                self.conn_resume(ck);
            }
        }
        self.exec_fail_all(key, status, message);
        self.metrics_fail_all(key, status, message);
        self.proc_fail_all(key, status, message);
        self.fs_fail_all(key, status, message);
        self.transfers_fail_all(key, status, message);
        self.watches_fail_all(key, message);
    }

    /// Ends the sandbox: gone for every client now; killed, then reaped and removed on
    /// the pool. Idempotent.
    pub(crate) fn box_end(&mut self, key: usize, why: &str) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        if b.state != State::Ending {
            log::info!("sandbox={} ending: {why}", b.id);
            b.state = State::Ending;
            b.end_why = why.to_string();
            let id = b.id.clone();
            if self.boxes.by_id.get(&id) == Some(&key) {
                self.boxes.by_id.remove(&id);
            }
            self.box_fail_waiters(key, 502, &format!("the sandbox ended: {why}"));
            if let Some(serial) = self.boxes.boxes.get(key).map(|b| b.serial) {
                self.proxy_sandbox_ended(key, serial);
            }
        }
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        if let Some((mut ctl, t)) = b.ctl.take() {
            self.reactor.deregister(&mut ctl, t);
        }
        if b.killing {
            return;
        }
        let Some(cg) = b.cgroup.clone() else {
            // Still being spawned: ended once it is (box_spawned).
            b.killing = true;
            return;
        };
        b.killing = true;
        let init_pid = b.child.as_ref().and_then(|c| i32::try_from(c.id()).ok());
        let backend = Arc::clone(&self.backend);
        self.reactor.submit_must(Box::new(move || {
            backend.kill(&cg, init_pid);
            super::nothing()
        }));
    }

    /// `runsc run` of a sandbox exited: reap it and remove the sandbox.
    pub(super) fn box_exited(&mut self, key: usize) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        if b.exited {
            return;
        }
        b.exited = true;
        if let Some((fd, t)) = b.pid.take() {
            self.reactor.deregister(&mut SourceFd(&fd.as_raw_fd()), t);
        }
        if self
            .boxes
            .boxes
            .get(key)
            .is_some_and(|b| b.state != State::Ending)
        {
            self.box_end(key, "its init exited");
        }
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let (Some(child), Some(cg), Some(dir)) = (b.child.take(), b.cgroup.take(), b.dir.take())
        else {
            self.box_forget(key);
            return;
        };
        let (serial, container, net) = (b.serial, b.container.clone(), b.net.take());
        let backend = Arc::clone(&self.backend);
        self.reactor.submit_must(Box::new(move || -> Done<Daemon> {
            let c: Cleanup = backend.wait(child, &cg);
            backend.delete(&container, &cg, &dir);
            drop(net);
            log::debug!(
                "sandbox container={container} removed (exit {})",
                c.exit_code
            );
            Box::new(move |d: &mut Daemon| d.box_removed(key, serial, c.oom_killed))
        }));
    }

    fn box_removed(&mut self, key: usize, serial: u64, oom_killed: bool) {
        if let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) {
            b.oom_killed = oom_killed;
            self.box_forget(key);
        }
    }

    /// Drops the sandbox's record (its processes are gone) and answers its deleters.
    fn box_forget(&mut self, key: usize) {
        let Some(b) = self.boxes.boxes.try_remove(key) else {
            return;
        };
        self.box_count_publish();
        if b.pooled && b.start_ms == 0 && !self.app.shutting_down {
            // A pooled boot that never became ready: the pool waits before the next.
            let t = &mut self.boxes;
            t.warm_failures = t.warm_failures.saturating_add(1);
            t.warm_failed += 1;
            let wait = Duration::from_secs((1u64 << t.warm_failures.min(6)).min(60));
            t.warm_pause_until = Some(Instant::now() + wait);
            log::warn!(
                "warm pool: a sandbox did not start; the pool waits {} s",
                wait.as_secs()
            );
        }
        if self.boxes.by_id.get(&b.id) == Some(&key) {
            self.boxes.by_id.remove(&b.id);
        }
        match b.owner {
            Some(BoxOwner::Batch(bk, bs)) => {
                // Its processes and memory are gone: the batch goes on (or gives its
                // slot back).
                self.shared_box_gone(
                    (bk, bs),
                    (key, b.serial),
                    b.start_ms > 0,
                    b.oom_killed,
                    &b.end_why,
                );
            }
            Some(BoxOwner::Job(jk, js)) => {
                self.job_box_gone(jk, js, (key, b.serial), b.oom_killed, &b.end_why);
            }
            None => {}
        }
        for (ck, cserial) in b.deleters {
            if self.conns.get(ck).is_some_and(|c| c.serial == cserial) {
                self.respond(ck, Response::no_content());
                self.conn_resume(ck);
            }
        }
    }

    /// Writes what is queued for init.
    pub(super) fn box_flush(&mut self, key: usize) {
        let Some(b) = self.boxes.boxes.get_mut(key) else {
            return;
        };
        let Some((ctl, _)) = b.ctl.as_mut() else {
            return;
        };
        while !b.wbuf.is_empty() {
            match ctl.write(&b.wbuf) {
                Ok(0) => break,
                Ok(n) => {
                    b.wbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // WouldBlock: the writable edge brings us back; errors show as EOF.
                Err(_) => break,
            }
        }
        self.uploads_resume(key);
    }

    /// Ends every sandbox (shutdown): what waits on them hears 503, as for a service
    /// restarting.
    /// A batch's shared sandbox is not among them: it is a run, and has the runs'
    /// grace (`box_end_batches`).
    pub(crate) fn box_end_all(&mut self, why: &str) {
        for k in self.box_keys(false) {
            self.box_fail_waiters(
                k,
                503,
                "the service is shutting down; retry in a few seconds",
            );
            self.box_end(k, why);
        }
    }

    /// Ends every batch's shared sandbox (the shutdown grace is over).
    pub(crate) fn box_end_batches(&mut self, why: &str) {
        for k in self.box_keys(true) {
            self.box_end(k, why);
        }
    }

    /// The sandboxes that are batches' shared ones (`batch`), or all the others.
    fn box_keys(&self, batch: bool) -> Vec<usize> {
        let t = &self.boxes.boxes;
        t.iter()
            .filter(|(_, b)| matches!(b.owner, Some(BoxOwner::Batch(..))) == batch)
            .map(|(k, _)| k)
            .collect()
    }

    /// The client creating sandbox `key` left before it was ready: nobody has its id,
    /// so it ends.
    pub(crate) fn box_creator_left(&mut self, key: usize, serial: u64) {
        let Some(b) = self.boxes.boxes.get_mut(key).filter(|b| b.serial == serial) else {
            return;
        };
        if b.state == State::Starting {
            b.creator = None;
            self.box_end(key, "its creator left before it was ready");
        }
    }
}
