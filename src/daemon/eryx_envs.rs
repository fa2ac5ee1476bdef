//! The eryx face's uploaded environments on the loop (`/eryx/v1/environments`).
//!
//! An upload's body is streamed to a file under the environment's own directory
//! (`DATA_DIR/eryx-envs/<id>/`) as it arrives (`transfer::UploadSink`), then read as a
//! multipart form on the pool (`eryx::form`): each package to `packages/NNN.whl` (or
//! `.tar.gz`, `.tgz`). The record (`store::eryx`) is durable before the client gets
//! its `202`; the build (`wasm::build`: a jailed `isobox-wasm build`, one at a time)
//! then writes `build/site-packages/` and the snapshot, and the record says `ready`
//! or `failed` with the reason.
//!
//! Runs in an environment that is building or failed get `409 environment_not_ready`.
//! An environment built for another snapshot (another eryx, another CPU: the snapshot's
//! name says which) is rebuilt at its next use, which gets the same 409 meanwhile. A
//! restart builds again what was building. Directories without a record (a crash
//! between the upload and its record) are removed at start.

use super::transfer::UploadSink;
use super::Daemon;
use crate::api::Outcome;
use crate::eryx::{self, form, Rejection};
use crate::http::{Framing, Head, Request, Response};
use crate::reactor::Done;
use crate::store::eryx::EryxEnvRecord;
use crate::wasm::build::BuildOutcome;
use crate::wasm::EnvPaths;
use crate::workspace::now_ms;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The environments' directory under the data directory.
pub const ENVS_DIR: &str = "eryx-envs";

/// An environment as the loop knows it.
#[derive(Debug, Clone)]
pub struct EryxEnv {
    /// As stored.
    pub rec: EryxEnvRecord,
    /// Its delete is being written: gone for every request.
    pub deleting: bool,
    /// Its build's cancel switch, while one is queued or going (its directory is the
    /// builder's until it ends).
    pub cancel: Option<Arc<AtomicBool>>,
}

impl EryxEnv {
    /// Whether a build of it is queued or going.
    pub fn building(&self) -> bool {
        self.cancel.is_some()
    }
}

/// Uploads going per tenant (counted against its environments from their head, so
/// uploads in flight cannot outnumber what the tenant may keep).
pub type Pending = Arc<Mutex<HashMap<String, usize>>>;

/// One upload in flight, counted in [`Pending`] until dropped.
struct PendingUpload {
    tenant: String,
    pending: Pending,
}

impl Drop for PendingUpload {
    fn drop(&mut self) {
        if let Ok(mut p) = self.pending.lock() {
            if let Some(n) = p.get_mut(&self.tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    p.remove(&self.tenant);
                }
            }
        }
    }
}

/// Environments by id.
pub type EnvRegistry = HashMap<String, EryxEnv>;

/// The registry as the store holds it; directories without a record are removed (at
/// start, before the loop runs).
pub fn load(store: &crate::store::Store, data_dir: &Path) -> EnvRegistry {
    let envs: EnvRegistry = match store.eryx_envs() {
        Ok(all) => all
            .into_iter()
            .map(|(id, rec)| {
                (
                    id,
                    EryxEnv {
                        rec,
                        deleting: false,
                        cancel: None,
                    },
                )
            })
            .collect(),
        Err(e) => {
            log::error!("eryx environments: reading the store: {e}");
            return EnvRegistry::new();
        }
    };
    let dir = data_dir.join(ENVS_DIR);
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !envs.contains_key(&name) {
                log::info!("eryx environments: removing {name}, which has no record");
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    envs
}

/// The answer when the store refused a write.
fn store_refusal() -> Response {
    eryx::error(
        503,
        "unavailable",
        "The environment could not be stored; retry shortly",
    )
}

/// An environment as the API shows it.
pub fn env_json(id: &str, rec: &EryxEnvRecord) -> Value {
    let mut v = json!({
        "id": id,
        "name": rec.name,
        "status": rec.status,
        "imports": rec.imports,
        "packages": rec.packages,
        "created_at": eryx::timestamp(rec.created_at_ms),
        "updated_at": eryx::timestamp(rec.updated_at_ms),
    });
    if let Some(e) = &rec.error {
        v["error"] = json!(e);
    }
    v
}

/// An upload on its way to an environment's directory.
struct EnvUpload {
    id: String,
    tenant: String,
    dir: PathBuf,
    file: std::fs::File,
    boundary: String,
    /// Set once the form was read into the directory: it stays.
    keep: bool,
    /// Counts this upload against its tenant until its form is taken in (or refused).
    pending: Option<PendingUpload>,
}

impl Drop for EnvUpload {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl UploadSink for EnvUpload {
    fn file(&mut self) -> &mut std::fs::File {
        &mut self.file
    }

    fn cap(&self) -> u64 {
        form::BODY_BYTES
    }

    fn too_large(&self) -> Response {
        form::too_large().response()
    }

    fn shape(&self, resp: Response) -> Response {
        shape(resp)
    }

    fn release(&mut self) {
        self.pending = None;
    }

    fn commit(mut self: Box<Self>, ck: usize, serial: u64) -> Done<Daemon> {
        use std::io::{Seek, SeekFrom};
        let body = self.dir.join("upload.body");
        let packages = self.dir.join("packages");
        let read = self
            .file
            .seek(SeekFrom::Start(0))
            .and_then(|_| std::fs::create_dir(&packages))
            .map_err(|e| {
                log::error!("eryx environment {}: {e}", self.id);
                Rejection::new(500, "internal_error", "The upload could not be stored")
            })
            .and_then(|()| {
                form::read(
                    std::io::BufReader::new(&mut self.file),
                    &self.boundary,
                    &packages,
                )
            });
        let _ = std::fs::remove_file(&body);
        self.keep = read.is_ok();
        let (id, tenant, dir) = (self.id.clone(), self.tenant.clone(), self.dir.clone());
        let pending = self.pending.take();
        drop(self);
        Box::new(move |d: &mut Daemon| {
            d.eryx_env_uploaded(ck, serial, &tenant, id, &dir, read);
            // Counted in the registry now (or refused).
            drop(pending);
        })
    }
}

impl Daemon {
    /// The environments' directory.
    fn eryx_envs_dir(&self) -> PathBuf {
        self.cfg.data_dir.join(ENVS_DIR)
    }

    /// The tenant's environment named `name`, if it has one (not being deleted).
    fn eryx_env_named(&self, tenant: &str, name: &str) -> Option<(&String, &EryxEnv)> {
        self.eryx_envs
            .iter()
            .find(|(_, e)| e.rec.tenant == tenant && e.rec.name == name && !e.deleting)
    }

    /// Whether `name` is taken in the tenant (by an environment, or one whose delete is
    /// being written: if that delete fails, it is still there).
    fn eryx_env_taken(&self, tenant: &str, name: &str) -> bool {
        self.eryx_envs
            .values()
            .any(|e| e.rec.tenant == tenant && e.rec.name == name)
    }

    /// The tenant's environments (not being deleted).
    fn eryx_env_count(&self, tenant: &str) -> usize {
        self.eryx_envs
            .values()
            .filter(|e| e.rec.tenant == tenant && !e.deleting)
            .count()
    }

    /// `POST /v1/environments` at its head (admission done): the body goes to a file.
    pub(crate) fn eryx_env_upload_begin(&mut self, ck: usize, head: Head, tenant: String) {
        let refuse = |d: &mut Daemon, resp: Response| {
            if head.framing == Framing::None {
                d.respond(ck, resp);
            } else {
                d.respond_and_close(ck, resp);
            }
        };
        if let Some(resp) = self.eryx_off() {
            return refuse(self, resp);
        }
        if self.app.shutting_down {
            return refuse(
                self,
                eryx::error(503, "unavailable", "The server is shutting down"),
            );
        }
        let boundary = match form::boundary(head.header("content-type")) {
            Ok(b) => b,
            Err(r) => return refuse(self, r.response()),
        };
        let limit = self.cfg.eryx.environments;
        let n = self.eryx_env_count(&tenant);
        let uploading = self
            .eryx_env_pending
            .lock()
            .map(|p| p.get(&tenant).copied().unwrap_or(0))
            .unwrap_or(0);
        if n + uploading >= limit {
            return refuse(self, environment_limit(n + uploading, limit));
        }
        if let Ok(mut p) = self.eryx_env_pending.lock() {
            *p.entry(tenant.clone()).or_default() += 1;
        }
        let pending = PendingUpload {
            tenant: tenant.clone(),
            pending: Arc::clone(&self.eryx_env_pending),
        };
        let Some(id) = eryx::new_session_id() else {
            return refuse(
                self,
                eryx::error(500, "internal_error", "No random bytes for an id"),
            );
        };
        let root = self.eryx_envs_dir();
        let job = Box::new(move || -> Result<Box<dyn UploadSink>, Response> {
            use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
            let internal = |e: std::io::Error| {
                log::error!("eryx environment {id}: {e}");
                eryx::error(500, "internal_error", "The upload could not be stored")
            };
            // Passable, not listable: a worker (the overflow user) reads an
            // environment's build by its path, and ids are not guessable.
            if !root.exists() {
                std::fs::DirBuilder::new()
                    .mode(0o711)
                    .recursive(true)
                    .create(&root)
                    .map_err(internal)?;
            }
            let dir = root.join(&id);
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&dir)
                .map_err(internal)?;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join("upload.body"));
            let file = match file {
                Ok(f) => f,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(internal(e));
                }
            };
            Ok(Box::new(EnvUpload {
                id,
                tenant,
                dir,
                file,
                boundary,
                keep: false,
                pending: Some(pending),
            }))
        });
        self.begin_upload_with(ck, head, job, shape);
    }

    /// The form is read into environment `id`'s directory (or refused): checked
    /// against the tenant's others, stored, answered `202`, and built.
    fn eryx_env_uploaded(
        &mut self,
        ck: usize,
        serial: u64,
        tenant: &str,
        id: String,
        dir: &Path,
        read: Result<form::EnvForm, Rejection>,
    ) {
        let answer =
            |d: &mut Daemon, resp: Response| d.on_outcome(ck, serial, Outcome::Respond(resp));
        let f = match read {
            Ok(f) => f,
            Err(r) => return answer(self, r.response()),
        };
        let limit = self.cfg.eryx.environments;
        let n = self.eryx_env_count(tenant);
        let refused = if self.eryx_env_taken(tenant, &f.name) {
            Some(eryx::error(
                409,
                "conflict",
                &format!("You already have an environment named {}", f.name),
            ))
        } else if n >= limit {
            Some(environment_limit(n, limit))
        } else {
            None
        };
        if let Some(resp) = refused {
            self.eryx_env_remove_dir(dir.to_path_buf());
            return answer(self, resp);
        }
        let now = now_ms();
        let rec = EryxEnvRecord {
            tenant: tenant.to_string(),
            name: f.name,
            status: "building".into(),
            imports: f.imports,
            packages: f.packages,
            error: None,
            snapshot: None,
            created_at_ms: now,
            updated_at_ms: now,
        };
        // In the map at once, so the name and the tenant's count hold while the
        // record is made durable.
        self.eryx_envs.insert(
            id.clone(),
            EryxEnv {
                rec: rec.clone(),
                deleting: false,
                cancel: None,
            },
        );
        let mailbox = self.reactor.mailbox();
        let dir = dir.to_path_buf();
        self.app
            .sessions
            .store()
            .put_eryx_env_then(&id.clone(), &rec.clone(), true, move |r| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    let resp = match r {
                        Ok(true) => {
                            log::info!(
                                "eryx environment {id} ({}) uploaded tenant={} packages={}",
                                rec.name,
                                rec.tenant,
                                rec.packages.len()
                            );
                            d.eryx_env_build(&id);
                            Response::json(202, &env_json(&id, &rec))
                        }
                        Ok(false) | Err(_) => {
                            if let Err(e) = r {
                                log::error!("eryx environment {id}: storing it: {e}");
                            }
                            d.eryx_envs.remove(&id);
                            d.eryx_env_remove_dir(dir);
                            store_refusal()
                        }
                    };
                    d.on_outcome(ck, serial, Outcome::Respond(resp));
                }));
            });
    }

    /// Removes an environment's directory, on the pool.
    fn eryx_env_remove_dir(&mut self, dir: PathBuf) {
        self.reactor.submit_must(Box::new(move || {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    log::warn!("eryx environment: removing {}: {e}", dir.display());
                }
            }
            super::nothing()
        }));
    }

    /// Queues environment `id`'s build (unless one is going).
    pub(crate) fn eryx_env_build(&mut self, id: &str) {
        let dir = self.eryx_envs_dir().join(id);
        let (Some(engine), Some(env)) = (&self.wasm, self.eryx_envs.get_mut(id)) else {
            return;
        };
        if env.building() || env.deleting {
            return;
        }
        env.rec.status = "building".into();
        let cancel = Arc::new(AtomicBool::new(false));
        env.cancel = Some(Arc::clone(&cancel));
        let req = crate::wasm::build::BuildRequest {
            packages: dir.join("packages"),
            names: env.rec.packages.clone(),
            out: dir.join("build"),
            imports: env.rec.imports.clone(),
            cancel,
        };
        let mailbox = self.reactor.mailbox();
        let id = id.to_string();
        engine.build(
            req,
            Box::new(move |r| {
                mailbox.send(Box::new(move |d: &mut Daemon| d.eryx_env_built(&id, r)));
            }),
        );
    }

    /// Environment `id`'s build ended: its record says how, durably. An environment
    /// deleted meanwhile has its directory removed now; one the server failed to build
    /// stays `building`, to be built again at its next use or the next start.
    fn eryx_env_built(&mut self, id: &str, outcome: BuildOutcome) {
        let dir = self.eryx_envs_dir().join(id);
        let Some(env) = self.eryx_envs.get_mut(id) else {
            self.eryx_env_remove_dir(dir);
            return;
        };
        env.cancel = None;
        if env.deleting || outcome == BuildOutcome::Cancelled {
            // Its delete is being written; the directory goes when it is durable.
            return;
        }
        env.rec.updated_at_ms = now_ms();
        match outcome {
            BuildOutcome::Ready(snapshot) => {
                env.rec.status = "ready".into();
                env.rec.error = None;
                env.rec.snapshot = Some(snapshot);
            }
            BuildOutcome::Failed(e) => {
                env.rec.status = "failed".into();
                env.rec.error = Some(e);
                env.rec.snapshot = None;
            }
            BuildOutcome::Retry | BuildOutcome::Cancelled => return,
        }
        let rec = env.rec.clone();
        let id = id.to_string();
        self.app
            .sessions
            .store()
            .put_eryx_env_then(&id.clone(), &rec, false, move |r| {
                if let Err(e) = r {
                    log::error!("eryx environment {id}: storing its build's outcome: {e}");
                }
            });
    }

    /// Builds again what was building when the daemon stopped (at start).
    pub(crate) fn eryx_envs_resume(&mut self) {
        let building: Vec<String> = self
            .eryx_envs
            .iter()
            .filter(|(_, e)| e.rec.status == "building")
            .map(|(id, _)| id.clone())
            .collect();
        for id in building {
            self.eryx_env_build(&id);
        }
    }

    /// `GET /v1/environments`, `GET`/`DELETE /v1/environments/{name}`.
    pub(crate) fn eryx_env_request(&mut self, ck: usize, req: &Request, one: bool) {
        let method = req.head.method.as_str();
        if !one {
            // POST is taken over at its head; this is GET or HEAD.
            let mut mine: Vec<(&String, &EryxEnv)> = self
                .eryx_envs
                .iter()
                .filter(|(_, e)| e.rec.tenant == req.tenant && !e.deleting)
                .collect();
            mine.sort_by(|a, b| (a.1.rec.created_at_ms, a.0).cmp(&(b.1.rec.created_at_ms, b.0)));
            let list: Vec<Value> = mine.iter().map(|(id, e)| env_json(id, &e.rec)).collect();
            self.respond(ck, Response::json(200, &json!({ "environments": list })));
            return;
        }
        let name = req.params.get("name").unwrap_or_default().to_string();
        let Some((id, env)) = self.eryx_env_named(&req.tenant, &name) else {
            self.respond(ck, no_environment(&name).response());
            return;
        };
        let id = id.clone();
        if method != "DELETE" {
            let body = env_json(&id, &env.rec);
            self.respond(ck, Response::json(200, &body));
            return;
        }
        if let Some(e) = self.eryx_envs.get_mut(&id) {
            e.deleting = true;
            // A queued build is skipped, a build going is killed: a deleted environment
            // costs no more CPU, and its files go as soon as the builder lets go.
            if let Some(c) = &e.cancel {
                c.store(true, Ordering::Relaxed);
            }
        }
        let Some(serial) = self.conns.get(ck).map(|c| c.serial) else {
            return;
        };
        self.conn_own(ck, super::conn::Owner::Job);
        let mailbox = self.reactor.mailbox();
        self.app
            .sessions
            .store()
            .delete_eryx_env_then(&id.clone(), move |r| {
                mailbox.send(Box::new(move |d: &mut Daemon| {
                    let resp = match r {
                        Ok(_) => {
                            log::info!("eryx environment {id} ({name}) deleted");
                            let building = d.eryx_envs.remove(&id).is_some_and(|e| e.building());
                            // A build going still writes there: its end removes it.
                            if !building {
                                let dir = d.eryx_envs_dir().join(&id);
                                d.eryx_env_remove_dir(dir);
                            }
                            Response::no_content()
                        }
                        Err(e) => {
                            log::error!("eryx environment {id}: deleting it: {e}");
                            // Still there; a build its delete cancelled is done
                            // again at its next use.
                            if let Some(env) = d.eryx_envs.get_mut(&id) {
                                env.deleting = false;
                            }
                            store_refusal()
                        }
                    };
                    d.on_outcome(ck, serial, Outcome::Respond(resp));
                }));
            });
    }

    /// What a run in environment `name` needs: nothing for `python`; for an uploaded
    /// one, its build, when ready and current. One built for another snapshot is
    /// rebuilt now.
    ///
    /// # Errors
    /// 404 `not_found` (no such environment), 409 `environment_not_ready`.
    pub(crate) fn eryx_env_for_run(
        &mut self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<EnvPaths>, Rejection> {
        if name == eryx::DEFAULT_ENVIRONMENT {
            return Ok(None);
        }
        let Some((id, env)) = self.eryx_env_named(tenant, name) else {
            return Err(no_environment(name));
        };
        let id = id.clone();
        let not_ready = |why: String| Rejection::new(409, "environment_not_ready", why);
        // Until the engine's own snapshot is prepared (at start), no environment's
        // build can be known to be current.
        let Some(current) = self
            .wasm
            .as_ref()
            .and_then(crate::wasm::Engine::snapshot_name)
        else {
            return Err(not_ready(format!(
                "Environment {name} is not ready: the server is starting"
            )));
        };
        if env.rec.status == "building" && !env.building() {
            // Its last build ended on the server's side (or was cancelled by a delete
            // that then failed): built again now.
            self.eryx_env_build(&id);
            return Err(not_ready(format!("Environment {name} is being built")));
        }
        match env.rec.status.as_str() {
            "ready" => {}
            "failed" => {
                let first = env
                    .rec
                    .error
                    .as_deref()
                    .and_then(|e| e.lines().next())
                    .unwrap_or_default();
                return Err(not_ready(format!(
                    "Environment {name} failed to build: {first}"
                )));
            }
            _ => return Err(not_ready(format!("Environment {name} is being built"))),
        }
        let snapshot = env.rec.snapshot.clone().unwrap_or_default();
        if current != snapshot {
            log::info!("eryx environment {id} ({name}) was built for {snapshot}: rebuilding it");
            if let Some(e) = self.eryx_envs.get_mut(&id) {
                e.rec.status = "building".into();
                e.rec.updated_at_ms = now_ms();
                let rec = e.rec.clone();
                let sid = id.clone();
                self.app
                    .sessions
                    .store()
                    .put_eryx_env_then(&id, &rec, false, move |r| {
                        if let Err(e) = r {
                            log::error!("eryx environment {sid}: storing its rebuild: {e}");
                        }
                    });
            }
            self.eryx_env_build(&id);
            return Err(not_ready(format!(
                "Environment {name} is being rebuilt for this server's Python"
            )));
        }
        let build = self.eryx_envs_dir().join(&id).join("build");
        Ok(Some(EnvPaths {
            snapshot: build.join(snapshot),
            site: build.join("site-packages"),
        }))
    }

    /// Whether environment `name` exists for `tenant` (a session's create).
    pub(crate) fn eryx_env_exists(&self, tenant: &str, name: &str) -> bool {
        name == eryx::DEFAULT_ENVIRONMENT || self.eryx_env_named(tenant, name).is_some()
    }
}

/// An error made in the isobox face's shape, in this face's; a full disk is the
/// server's (`503`), not the upload's.
fn shape(resp: Response) -> Response {
    if resp.status == 413 {
        return eryx::error(
            503,
            "unavailable",
            "The server has no room for the upload now; retry later",
        );
    }
    // Admission is done: no refusal here is about the key.
    eryx::reshape(resp, None)
}

/// `429 environment_limit`.
fn environment_limit(n: usize, limit: usize) -> Response {
    eryx::error(
        429,
        "environment_limit",
        &format!("Your org already has {n} environments (limit: {limit})"),
    )
}

/// `404 not_found` for an environment.
pub fn no_environment(name: &str) -> Rejection {
    let shown: String = name.chars().take(64).collect();
    Rejection::new(404, "not_found", format!("No such environment: {shown}"))
}
