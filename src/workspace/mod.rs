//! Filesystem sessions: a persistent `/workspace` per session, shared by steps that
//! each run in a fresh sandbox, plus the host-side file API.
//!
//! It stays one file: the registry, the lease counts and the sweep share the invariants
//! on what is mounted and when a record exists (a workspace is created before its
//! record and deleted after it), which are checked in one place.
//!
//! Each workspace is its own ext4 filesystem in a sparse image file
//! (`<data>/sessions/<id>/ws.img`), so the disk quota and the file count are enforced by
//! the kernel for the sandbox and the file API alike (ENOSPC inside the sandbox, 413 for
//! uploads). It is loop-mounted at `<data>/sessions/<id>/mnt` only while something uses
//! it and unmounted when idle, so a session at rest costs no memory and no loop device.
//! The registry (tenant, token hash, runtime, TTL) lives in LMDB.
//!
//! Everything here blocks (LMDB commits, mkfs, mount): callers are pool jobs or
//! transfer threads. The one exception is dropping a [`Lease`], which only touches
//! atomics and may happen on the reactor thread.

pub mod fs;
pub mod image;
pub mod volumes;
pub mod zip;

use crate::config::SessionConfig;
use crate::store::{SessionRecord, Store, StoreError};
use base64::Engine;
use ring::rand::SecureRandom;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// uid/gid owning everything in a workspace: the sandbox user (`sandbox::bundle`).
pub const WORKSPACE_UID: u32 = crate::sys::NOBODY;
/// Bytes of workspace per inode: bounds the file count (32 768 files for 512 MiB).
pub const BYTES_PER_INODE: u64 = 16 * 1024;
/// A workspace nobody used for this long is unmounted.
pub const UNMOUNT_IDLE: Duration = Duration::from_secs(30);
/// Concurrent downloads (files and zips), each a thread.
pub const MAX_TRANSFERS: usize = 16;
/// Image file name inside a session directory.
const IMAGE: &str = "ws.img";
/// Mount point name inside a session directory.
const MOUNT: &str = "mnt";

/// Why a session call failed; `api::sessions` maps each to the spec's status and code.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Unknown id, or another tenant's session.
    #[error("session not found")]
    NotFound,
    /// Missing or wrong `X-Session-Token`.
    #[error("invalid session token")]
    BadToken,
    /// A step is running in this session.
    #[error("a step is already running in this session")]
    Busy,
    /// The session count is at its maximum.
    #[error("too many sessions")]
    TooMany,
    /// The tenant's session count is at its maximum (the limit).
    #[error("too many sessions for this tenant")]
    TooManyForTenant(usize),
    /// No room for another workspace.
    #[error("{0}")]
    StorageFull(String),
    /// Too many downloads at once.
    #[error("too many downloads in progress")]
    TransfersBusy,
    /// Too many creates at once.
    #[error("too many sessions or volumes being created at once")]
    CreatesBusy,
    /// No such volume for this tenant.
    #[error("volume not found")]
    VolumeNotFound,
    /// The volume is attached to another session.
    #[error("the volume is attached to another session")]
    VolumeBusy,
    /// The volume count is at its maximum.
    #[error("too many volumes")]
    TooManyVolumes,
    /// The tenant's volume count is at its maximum (the limit).
    #[error("too many volumes for this tenant")]
    TooManyVolumesForTenant(usize),
    /// The workspace is gone or unusable.
    #[error("workspace unavailable: {0}")]
    Workspace(String),
    /// The registry failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the client gets back at create.
pub struct Created {
    /// Session id.
    pub id: String,
    /// Capability token (shown once).
    pub token: String,
    /// The stored record.
    pub record: SessionRecord,
}

/// In-memory state of a session in use; created on first use, never persisted.
#[derive(Default)]
struct Live {
    /// Serialises mount, unmount and delete; holds whether the workspace is mounted.
    mounted: Mutex<bool>,
    users: AtomicU32,
    step: AtomicBool,
    deleted: AtomicBool,
    last_used_ms: AtomicU64,
    /// `last_used_ms` changed since it was written to LMDB.
    dirty: AtomicBool,
    /// Mount point of the volume this session holds, while mounted (under `mounted`'s
    /// lock for every change).
    volume: Mutex<Option<PathBuf>>,
}

/// The session service (shared by the reactor, the pool and transfer threads).
pub struct Sessions {
    store: Store,
    root: PathBuf,
    /// `<data>/volumes`.
    vol_root: PathBuf,
    cfg: SessionConfig,
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// Serialises creates, so the session count and storage checks hold.
    create_lock: Mutex<()>,
    /// Creates waiting for `create_lock`: bounded, so creates (each an `mkfs`) can
    /// never take every pool worker.
    creates_waiting: AtomicUsize,
    storage_used: AtomicU64,
    next_expiry_ms: AtomicU64,
    transfers: AtomicUsize,
    last_scan_ms: AtomicU64,
    rng: ring::rand::SystemRandom,
}

/// A session in use: its workspace stays mounted until every lease is dropped.
pub struct Lease {
    id: String,
    live: Arc<Live>,
    mount: PathBuf,
    step: bool,
    /// The step flag was already given back ([`Lease::end_step`]).
    step_ended: AtomicBool,
    /// Dropping it counts as a use (not for a kernel's lease: its steps touch it).
    touch_on_drop: AtomicBool,
    volume: Option<PathBuf>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease({}, step={})", self.id, self.step)
    }
}

impl Lease {
    /// Host path of the mounted workspace.
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The step is over (its response is out): another step may start, while the
    /// mounts stay until the lease is dropped (after runsc has deleted the container).
    pub fn end_step(&self) {
        if self.step && !self.step_ended.swap(true, Ordering::AcqRel) {
            self.live.step.store(false, Ordering::Release);
        }
    }

    /// The lease's end is not a use (a kernel's: the idle time counts from its last step).
    pub fn no_touch_on_drop(&self) {
        self.touch_on_drop.store(false, Ordering::Relaxed);
    }

    /// Records a use now (a kernel's step: the kernel holds one lease for its life).
    pub fn touch(&self) {
        self.live.last_used_ms.store(now_ms(), Ordering::Relaxed);
        self.live.dirty.store(true, Ordering::Relaxed);
    }

    /// Host path of the mounted volume (bound at `/memory`), for a step of a session
    /// holding one.
    pub fn volume_mount(&self) -> Option<&Path> {
        self.volume.as_deref()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.touch_on_drop.load(Ordering::Relaxed) {
            self.live.last_used_ms.store(now_ms(), Ordering::Relaxed);
            self.live.dirty.store(true, Ordering::Relaxed);
        }
        self.end_step();
        self.live.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A download slot; the count drops with it.
pub struct TransferSlot(Arc<Sessions>);

impl Drop for TransferSlot {
    fn drop(&mut self) {
        self.0.transfers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether `id` has the shape of a session id (32 lowercase hex digits).
pub fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn sha256_hex(b: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, b)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares two digests in constant time (`subtle`); only a length mismatch, which
/// is public, returns early.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// What a new session is (see [`Sessions::create`]).
pub struct NewSession<'a> {
    /// Its runtime's name.
    pub runtime: &'a str,
    /// The version of it that its steps (and its kernel) run.
    pub version: Option<String>,
    /// `filesystem` or `kernel`.
    pub kind: &'a str,
    /// Idle time after which it is reaped.
    pub ttl_sec: u64,
    /// The volume it holds at `/memory`.
    pub volume_id: Option<String>,
    /// Its steps' network when they do not say.
    pub network: Option<bool>,
}

impl Sessions {
    /// Opens the registry under `data_dir/state`, the workspaces under
    /// `data_dir/sessions`, and sweeps what a crash left: mounts, half-created
    /// workspaces, records whose workspace vanished.
    ///
    /// # Errors
    /// When LMDB or the sessions directory cannot be opened.
    pub fn open(data_dir: &Path, cfg: SessionConfig) -> Result<Sessions, SessionError> {
        let root = data_dir.join("sessions");
        let vol_root = data_dir.join("volumes");
        for d in [&root, &vol_root] {
            std::fs::create_dir_all(d)
                .map_err(|e| SessionError::Workspace(format!("{}: {e}", d.display())))?;
        }
        let store = Store::open(&data_dir.join("state"))?;
        let s = Sessions {
            store,
            root,
            vol_root,
            cfg,
            live: Mutex::new(HashMap::new()),
            create_lock: Mutex::new(()),
            creates_waiting: AtomicUsize::new(0),
            storage_used: AtomicU64::new(0),
            next_expiry_ms: AtomicU64::new(u64::MAX),
            transfers: AtomicUsize::new(0),
            last_scan_ms: AtomicU64::new(now_ms()),
            rng: ring::rand::SystemRandom::new(),
        };
        s.sweep()?;
        Ok(s)
    }

    fn sweep(&self) -> Result<(), SessionError> {
        self.sweep_volumes()?;
        for m in image::mounts_under(&self.root) {
            log::warn!("sweep: unmounting leftover {}", m.display());
            if let Err(e) = image::unmount_lazy(&m) {
                log::error!("sweep: unmount {}: {e}", m.display());
            }
        }
        let records: HashMap<String, SessionRecord> = self.store.sessions()?.into_iter().collect();
        let mut used = 0u64;
        let mut next = u64::MAX;
        if let Ok(rd) = std::fs::read_dir(&self.root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let ours = valid_id(&name) || name.strip_suffix(".partial").is_some_and(valid_id);
                if !ours {
                    continue;
                }
                if records.contains_key(&name) {
                    continue;
                }
                log::warn!("sweep: removing workspace {name} with no session record");
                remove_session_dir(&e.path());
            }
        }
        for (id, rec) in &records {
            let img = self.root.join(id).join(IMAGE);
            match image::allocated_bytes(&img) {
                Ok(b) => used += b,
                // Only an image that is not there drops its session: any other error
                // (EIO, EACCES) may pass, and the data is kept for it.
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    log::error!(
                        "session {id}: workspace image cannot be read ({e}); kept, its calls will fail until it can"
                    );
                }
                Err(e) => {
                    log::error!(
                        "session {id}: workspace image missing ({e}); the session is dropped"
                    );
                    self.store.delete_session(id)?;
                    remove_session_dir(&self.root.join(id));
                    continue;
                }
            }
            next = next.min(rec.expires_at_ms());
        }
        self.storage_used
            .store(used + self.volumes_allocated(), Ordering::Relaxed);
        self.next_expiry_ms.store(next, Ordering::Relaxed);
        let released = self.store.release_orphan_holds()?;
        if released > 0 {
            log::warn!("sweep: released {released} volume holds of sessions that are gone");
        }
        log::info!(
            "sessions: {} in the registry, {} bytes of workspace on disk",
            records.len(),
            used
        );
        Ok(())
    }

    /// The state store (the memory KV lives there too).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The session settings.
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    /// Earliest expiry known (Unix ms); the reactor submits [`Sessions::reap`] once it passes.
    pub fn next_expiry_ms(&self) -> u64 {
        self.next_expiry_ms.load(Ordering::Relaxed)
    }

    /// Takes the create lock, waiting behind at most one other create.
    pub(super) fn create_guard(&self) -> Result<std::sync::MutexGuard<'_, ()>, SessionError> {
        if self.creates_waiting.fetch_add(1, Ordering::AcqRel) >= 1 {
            self.creates_waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(SessionError::CreatesBusy);
        }
        let g = self.create_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.creates_waiting.fetch_sub(1, Ordering::AcqRel);
        Ok(g)
    }

    fn random(&self, n: usize) -> Result<Vec<u8>, SessionError> {
        let mut b = vec![0u8; n];
        self.rng
            .fill(&mut b)
            .map_err(|_| SessionError::Workspace("system random source failed".into()))?;
        Ok(b)
    }

    /// Creates a session: its workspace image first, its record last, so a crash in
    /// between leaves a directory the startup sweep removes, never a record without
    /// a workspace.
    ///
    /// # Errors
    /// [`SessionError::TooMany`], [`SessionError::StorageFull`], or a failure.
    pub fn create(&self, tenant: &str, new: NewSession<'_>) -> Result<Created, SessionError> {
        let NewSession {
            runtime,
            version,
            kind,
            ttl_sec,
            volume_id,
            network,
        } = new;
        let _g = self.create_guard()?;
        let count = self.store.session_count()?;
        if count >= self.cfg.max_sessions as u64 {
            return Err(SessionError::TooMany);
        }
        // One tenant (or, in open mode, everyone) cannot take every session: its own
        // cap within the global one. Counted from the registry, under the create lock.
        let mine = self
            .store
            .sessions()?
            .iter()
            .filter(|(_, r)| r.tenant == tenant)
            .count();
        if mine >= self.cfg.max_sessions_per_tenant {
            return Err(SessionError::TooManyForTenant(
                self.cfg.max_sessions_per_tenant,
            ));
        }
        let quota = self.cfg.quota_bytes;
        let used = self.storage_used.load(Ordering::Relaxed);
        if used >= self.cfg.storage_max_bytes {
            return Err(SessionError::StorageFull(format!(
                "session workspaces use {used} bytes, the ceiling is {}",
                self.cfg.storage_max_bytes
            )));
        }
        let free =
            image::free_bytes(&self.root).map_err(|e| SessionError::Workspace(e.to_string()))?;
        if free < self.cfg.storage_reserve_bytes.saturating_add(quota) {
            return Err(SessionError::StorageFull(
                "not enough free disk for another workspace".into(),
            ));
        }
        let id: String = self
            .random(16)?
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.random(32)?);
        let partial = self.root.join(format!("{id}.partial"));
        let dir = self.root.join(&id);
        let made = (|| -> Result<u64, String> {
            std::fs::create_dir(&partial).map_err(|e| e.to_string())?;
            let img = partial.join(IMAGE);
            image::create(&img, quota, (quota / BYTES_PER_INODE).max(1024))
                .map_err(|e| e.to_string())?;
            std::fs::create_dir(partial.join(MOUNT)).map_err(|e| e.to_string())?;
            std::fs::rename(&partial, &dir).map_err(|e| e.to_string())?;
            // The rename must be durable before the record is: after a power loss the
            // sweep would otherwise delete the `.partial` of an acknowledged session.
            sync_dir(&self.root).map_err(|e| e.to_string())?;
            image::allocated_bytes(&dir.join(IMAGE)).map_err(|e| e.to_string())
        })();
        let allocated = match made {
            Ok(a) => a,
            Err(e) => {
                remove_session_dir(&partial);
                remove_session_dir(&dir);
                // The detail names host paths: it stays in the log.
                log::error!("session {id}: creating the workspace: {e}");
                return Err(SessionError::Workspace(
                    "the workspace could not be created; see the daemon log".into(),
                ));
            }
        };
        let now = now_ms();
        let record = SessionRecord {
            tenant: tenant.to_string(),
            token_sha256: sha256_hex(token.as_bytes()),
            runtime: runtime.to_string(),
            kind: kind.to_string(),
            created_at_ms: now,
            ttl_sec,
            last_used_ms: now,
            quota_bytes: quota,
            volume_id,
            network,
            version,
        };
        match self.store.insert_session_holding(&id, &record) {
            Ok(true) => {}
            Ok(false) => {
                remove_session_dir(&dir);
                return Err(SessionError::Workspace("session id collision".into()));
            }
            Err(e) => {
                remove_session_dir(&dir);
                return Err(match e {
                    crate::store::volumes::HoldError::NotFound => SessionError::VolumeNotFound,
                    crate::store::volumes::HoldError::Held => SessionError::VolumeBusy,
                    crate::store::volumes::HoldError::Store(e) => e.into(),
                });
            }
        }
        self.storage_used.fetch_add(allocated, Ordering::Relaxed);
        self.next_expiry_ms
            .fetch_min(record.expires_at_ms(), Ordering::Relaxed);
        Ok(Created { id, token, record })
    }

    /// Checks a call on `/v1/sessions/{id}/*`: the id exists and belongs to `tenant`
    /// (otherwise 404, whoever asks), then the token matches (otherwise 401).
    ///
    /// # Errors
    /// [`SessionError::NotFound`] or [`SessionError::BadToken`].
    pub fn authorize(
        &self,
        tenant: &str,
        id: &str,
        token: Option<&str>,
    ) -> Result<SessionRecord, SessionError> {
        if !valid_id(id) {
            return Err(SessionError::NotFound);
        }
        let rec = self.store.session(id)?.ok_or(SessionError::NotFound)?;
        let presented = sha256_hex(token.unwrap_or("").as_bytes());
        // Tenant mismatch and unknown id look the same from outside; the token digest
        // is compared only after, in constant time.
        if rec.tenant != tenant {
            return Err(SessionError::NotFound);
        }
        if token.is_none() || !ct_eq(presented.as_bytes(), rec.token_sha256.as_bytes()) {
            return Err(SessionError::BadToken);
        }
        // Idle past its TTL, it is gone, whether or not upkeep has reaped it yet (a
        // call must not bring it back); one in use now is not idle. Its last use is
        // the later of the stored one and the one in memory (upkeep writes that down
        // every few seconds).
        if !self.in_use(id) {
            let last = rec.last_used_ms.max(self.last_used_in_memory(id));
            let expires = last.saturating_add(rec.ttl_sec.saturating_mul(1000));
            if now_ms() >= expires {
                return Err(SessionError::NotFound);
            }
        }
        Ok(rec)
    }

    /// Whether a call uses session `id` now.
    fn in_use(&self, id: &str) -> bool {
        let m = self.live.lock().unwrap_or_else(|p| p.into_inner());
        m.get(id)
            .is_some_and(|l| l.users.load(Ordering::Acquire) > 0)
    }

    /// Session `id`'s last use as memory has it (0: none since the start).
    fn last_used_in_memory(&self, id: &str) -> u64 {
        let m = self.live.lock().unwrap_or_else(|p| p.into_inner());
        m.get(id)
            .map_or(0, |l| l.last_used_ms.load(Ordering::Acquire))
    }

    fn live(&self, id: &str) -> Arc<Live> {
        let mut m = self.live.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(m.entry(id.to_string()).or_default())
    }

    /// The live entry with one more user, counted under the map lock so upkeep never
    /// drops an entry somebody is about to use.
    fn live_in_use(&self, id: &str) -> Arc<Live> {
        let mut m = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let live = Arc::clone(m.entry(id.to_string()).or_default());
        live.users.fetch_add(1, Ordering::AcqRel);
        live
    }

    /// Takes a lease on an authorised session, mounting its workspace when needed.
    /// `step` leases are exclusive: a second concurrent step gets [`SessionError::Busy`].
    ///
    /// # Errors
    /// [`SessionError::Busy`], [`SessionError::NotFound`] when deleted meanwhile, or
    /// [`SessionError::Workspace`] when it cannot be mounted.
    pub fn acquire(
        &self,
        id: &str,
        step: bool,
        volume: Option<&str>,
    ) -> Result<Lease, SessionError> {
        let live = self.live_in_use(id);
        let mount = self.root.join(id).join(MOUNT);
        // From here the lease owns the count (and the step flag once set): dropping it
        // undoes both.
        let mut lease = Lease {
            id: id.to_string(),
            live: Arc::clone(&live),
            mount: mount.clone(),
            step: false,
            step_ended: AtomicBool::new(false),
            touch_on_drop: AtomicBool::new(true),
            volume: None,
        };
        if step {
            if live
                .step
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return Err(SessionError::Busy);
            }
            lease.step = true;
        }
        let mut mounted = live.mounted.lock().unwrap_or_else(|p| p.into_inner());
        if live.deleted.load(Ordering::Acquire) {
            return Err(SessionError::NotFound);
        }
        if !*mounted {
            let img = self.root.join(id).join(IMAGE);
            if !img.exists() {
                return Err(SessionError::Workspace(
                    "the workspace image is missing on the server".into(),
                ));
            }
            image::mount(&img, &mount).map_err(|e| {
                log::error!("session {id}: mount: {e}");
                SessionError::Workspace("the workspace could not be mounted".into())
            })?;
            *mounted = true;
        }
        if let (true, Some(vid)) = (step, volume) {
            let mut vol = live.volume.lock().unwrap_or_else(|p| p.into_inner());
            if vol.is_none() {
                *vol = Some(self.mount_volume(vid)?);
            }
            lease.volume = vol.clone();
        }
        drop(mounted);
        Ok(lease)
    }

    /// Ends a session: record first (so no new call finds it), then the workspace.
    ///
    /// # Errors
    /// [`SessionError::Busy`] while a step runs.
    pub fn delete(&self, id: &str) -> Result<(), SessionError> {
        let live = self.live(id);
        self.retire(id, &live, |l| l.step.load(Ordering::Acquire))?;
        self.destroy(id, &live);
        Ok(())
    }

    /// Deletes `id`'s record unless `busy` (checked under the mount lock, where
    /// `acquire` checks `deleted` after counting itself: either the step or fs call
    /// is seen here and the session stays, or it sees `deleted` and backs off).
    fn retire(
        &self,
        id: &str,
        live: &Live,
        busy: impl Fn(&Live) -> bool,
    ) -> Result<(), SessionError> {
        let _mounted = live.mounted.lock().unwrap_or_else(|p| p.into_inner());
        if busy(live) {
            return Err(SessionError::Busy);
        }
        live.deleted.store(true, Ordering::Release);
        match self.store.delete_session(id) {
            Ok(true) => Ok(()),
            Ok(false) => {
                live.deleted.store(false, Ordering::Release);
                Err(SessionError::NotFound)
            }
            Err(e) => {
                live.deleted.store(false, Ordering::Release);
                Err(e.into())
            }
        }
    }

    fn destroy(&self, id: &str, live: &Live) {
        let mut mounted = live.mounted.lock().unwrap_or_else(|p| p.into_inner());
        live.deleted.store(true, Ordering::Release);
        let dir = self.root.join(id);
        if *mounted {
            // Downloads in flight keep their open files; the mount goes when they end.
            if let Err(e) = image::unmount_lazy(&dir.join(MOUNT)) {
                log::error!("session {id}: unmount: {e}");
            }
            *mounted = false;
        }
        self.unmount_volume_of(id, live, true);
        drop(mounted);
        let freed = image::allocated_bytes(&dir.join(IMAGE)).unwrap_or(0);
        remove_session_dir(&dir);
        let _ = self
            .storage_used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                Some(u.saturating_sub(freed))
            });
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        log::info!("session {id} ended");
    }

    /// Periodic upkeep: writes last-use times to LMDB, unmounts idle workspaces,
    /// reaps sessions idle past their TTL (never one in use), refreshes the storage
    /// figure. Returns how many sessions were reaped.
    ///
    /// # Errors
    /// [`SessionError::Store`] when LMDB fails.
    pub fn upkeep(&self) -> Result<usize, SessionError> {
        let lives: Vec<(String, Arc<Live>)> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        let now = now_ms();
        // Expired memory KV entries (reads already treat them as absent).
        match self.store.kv_purge_expired(now, 10_000) {
            Ok(0) => {}
            Ok(n) => log::debug!("kv: purged {n} expired entries"),
            Err(e) => log::error!("kv purge: {e}"),
        }
        for (id, live) in &lives {
            if live.dirty.swap(false, Ordering::AcqRel) {
                if let Err(e) = self
                    .store
                    .touch_session(id, live.last_used_ms.load(Ordering::Relaxed))
                {
                    live.dirty.store(true, Ordering::Release);
                    log::error!("session {id}: recording last use: {e}");
                }
            }
            let idle_ms = now.saturating_sub(live.last_used_ms.load(Ordering::Relaxed));
            if live.users.load(Ordering::Acquire) == 0
                && idle_ms >= u64::try_from(UNMOUNT_IDLE.as_millis()).unwrap_or(u64::MAX)
            {
                let mut mounted = live.mounted.lock().unwrap_or_else(|p| p.into_inner());
                if live.users.load(Ordering::Acquire) == 0 {
                    self.unmount_volume_of(id, live, false);
                }
                if *mounted && live.users.load(Ordering::Acquire) == 0 {
                    let mnt = self.root.join(id).join(MOUNT);
                    // Give deleted files' blocks back to the host before it goes to rest.
                    if let Err(e) = image::trim(&mnt) {
                        log::warn!("session {id}: trim: {e}");
                    }
                    match image::unmount(&mnt) {
                        Ok(()) => *mounted = false,
                        Err(e) => log::warn!("session {id}: idle unmount: {e}"),
                    }
                }
                if !*mounted && live.users.load(Ordering::Acquire) == 0 {
                    drop(mounted);
                    let mut m = self.live.lock().unwrap_or_else(|p| p.into_inner());
                    if live.users.load(Ordering::Acquire) == 0
                        && !live.dirty.load(Ordering::Acquire)
                    {
                        m.remove(id);
                    }
                }
            }
        }
        // The full scan runs when the earliest known expiry has passed (it is only ever
        // too early: uses push expiries later) and at least once a minute, to refresh
        // the storage figure with what sandboxes wrote.
        let mut reaped = 0;
        let due = self.next_expiry_ms() <= now
            || now.saturating_sub(self.last_scan_ms.load(Ordering::Relaxed)) >= 60_000;
        if !due {
            return Ok(0);
        }
        self.last_scan_ms.store(now, Ordering::Relaxed);
        let mut next = u64::MAX;
        let mut used = 0u64;
        for (id, rec) in self.store.sessions()? {
            let live = self
                .live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .cloned();
            let in_use = live
                .as_ref()
                .is_some_and(|l| l.users.load(Ordering::Acquire) > 0);
            let last = live.as_ref().map_or(rec.last_used_ms, |l| {
                rec.last_used_ms.max(l.last_used_ms.load(Ordering::Relaxed))
            });
            let expires = last.saturating_add(rec.ttl_sec.saturating_mul(1000));
            if expires <= now && !in_use {
                let live = self.live(&id);
                match self.retire(&id, &live, |l| l.users.load(Ordering::Acquire) > 0) {
                    Ok(()) => {
                        log::info!("session {id} idle past its ttl of {} s", rec.ttl_sec);
                        self.destroy(&id, &live);
                        reaped += 1;
                        continue;
                    }
                    Err(SessionError::Busy | SessionError::NotFound) => continue,
                    Err(e) => {
                        log::error!("session {id}: reaping: {e}");
                        continue;
                    }
                }
            }
            used += image::allocated_bytes(&self.root.join(&id).join(IMAGE)).unwrap_or(0);
            if in_use && expires <= now {
                // Re-checked at the next periodic scan, not every second.
                continue;
            }
            next = next.min(expires);
        }
        self.next_expiry_ms.store(next, Ordering::Relaxed);
        self.storage_used
            .store(used + self.volumes_allocated(), Ordering::Relaxed);
        Ok(reaped)
    }

    /// Unmounts every workspace (shutdown) and writes last-use times.
    pub fn unmount_all(&self) {
        let lives: Vec<(String, Arc<Live>)> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        for (id, live) in lives {
            if live.dirty.swap(false, Ordering::AcqRel) {
                let _ = self
                    .store
                    .touch_session(&id, live.last_used_ms.load(Ordering::Relaxed));
            }
            let mut mounted = live.mounted.lock().unwrap_or_else(|p| p.into_inner());
            if *mounted {
                if let Err(e) = image::unmount_lazy(&self.root.join(&id).join(MOUNT)) {
                    log::error!("session {id}: unmount at shutdown: {e}");
                }
                *mounted = false;
            }
            self.unmount_volume_of(&id, &live, true);
        }
    }

    /// Takes a download slot, or [`SessionError::TransfersBusy`].
    ///
    /// # Errors
    /// When [`MAX_TRANSFERS`] downloads are running.
    pub fn transfer_slot(self: &Arc<Self>) -> Result<TransferSlot, SessionError> {
        let n = self.transfers.fetch_add(1, Ordering::AcqRel);
        let slot = TransferSlot(Arc::clone(self));
        if n >= MAX_TRANSFERS {
            return Err(SessionError::TransfersBusy);
        }
        Ok(slot)
    }

    /// Sessions in the registry (for `/readyz` and the bench).
    ///
    /// # Errors
    /// [`SessionError::Store`].
    pub fn count(&self) -> Result<u64, SessionError> {
        Ok(self.store.session_count()?)
    }
}

/// fsyncs a directory (its entries: a rename into it).
pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Whether the data dir's filesystem still has its reserve free; steps and uploads are
/// refused below it (workspaces are thinly provisioned: their quotas can add up to
/// more than the disk).
impl Sessions {
    /// 507 when the host disk is below the reserve.
    ///
    /// # Errors
    /// [`SessionError::StorageFull`].
    pub fn check_reserve(&self) -> Result<(), SessionError> {
        let free = image::free_bytes(&self.root).unwrap_or(u64::MAX);
        if free < self.cfg.storage_reserve_bytes {
            log::warn!("storage: {free} bytes free, below the reserve; refusing writes");
            return Err(SessionError::StorageFull(
                "the server's disk is nearly full".into(),
            ));
        }
        Ok(())
    }
}

/// Removes a session directory (image file, mount point, the directory). The sandbox's
/// files live inside the image, so nothing here walks a tree the sandbox could change.
fn remove_session_dir(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let _ = image::unmount_lazy(&dir.join(MOUNT));
    let _ = std::fs::remove_file(dir.join(IMAGE));
    let _ = std::fs::remove_dir(dir.join(MOUNT));
    if let Err(e) = std::fs::remove_dir(dir) {
        log::error!("removing {}: {e}", dir.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ct_eq_digests() {
        let a = sha256_hex(b"token");
        assert!(ct_eq(a.as_bytes(), sha256_hex(b"token").as_bytes()));
        assert!(!ct_eq(a.as_bytes(), sha256_hex(b"tokens").as_bytes()));
        // One byte different, first or last.
        for i in [0, a.len() - 1] {
            let mut b = a.clone().into_bytes();
            b[i] ^= 1;
            assert!(!ct_eq(a.as_bytes(), &b));
        }
        // Unequal lengths, including a prefix and the empty string.
        assert!(!ct_eq(a.as_bytes(), &a.as_bytes()[..a.len() - 1]));
        assert!(!ct_eq(&a.as_bytes()[..1], a.as_bytes()));
        assert!(!ct_eq(b"", a.as_bytes()));
        assert!(ct_eq(b"", b""));
    }
}
