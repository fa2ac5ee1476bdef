//! `/v1/sessions`: create, exec, the file API, delete.
//!
//! It stays one file: the handlers of one resource of the face, sharing its token,
//! decoding and path rules.
//!
//! Handlers run on the reactor thread and only validate what needs no I/O; the rest
//! (LMDB, mounting, file operations) is returned as a pool job whose [`Outcome`] the
//! reactor then acts on. Uploads are set up at head time, before the body is read, so
//! a refusal comes before `100 Continue`; downloads stream from a transfer thread
//! through a pipe the reactor forwards.

use super::error::{fs_error, session_error};
use super::{Action, App, Download, Outcome, UploadTarget};
use crate::http::{Head, Params, Request, Response};
use crate::workspace::fs::{self as wfs, FsError};
use crate::workspace::zip::ZipError;
use crate::workspace::{self, Sessions};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Entries listed for one directory at most (`"truncated": true` beyond).
pub const MAX_LIST_ENTRIES: usize = 10_000;
/// Largest zip archive of a directory (the spec's 256 MiB), counted on file bytes.
pub const MAX_ZIP_BYTES: u64 = 256 << 20;
/// Most entries in one zip archive (no ZIP64).
pub const MAX_ZIP_ENTRIES: usize = workspace::zip::MAX_ENTRIES;
/// Transfer status: still running.
pub const XFER_RUNNING: u8 = 0;
/// Transfer status: every byte was written.
pub const XFER_OK: u8 = 1;
/// Transfer status: it failed midway; the connection must be closed, not finished.
pub const XFER_FAILED: u8 = 2;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateBody {
    runtime: Option<String>,
    ttl_sec: Option<serde_json::Number>,
    #[serde(rename = "type")]
    kind: Option<String>,
    volume_id: Option<String>,
    network: Option<bool>,
    version: Option<String>,
}

/// Words for the create body's fields in its 400s (`http::json`).
const CREATE_HINTS: crate::http::json::Hints = &[
    (
        "runtime",
        "a runtime name or alias such as \"python\" (see GET /runtimes)",
    ),
    ("ttlSec", "a whole number of seconds"),
    ("type", "\"filesystem\" or \"kernel\""),
    ("volumeId", "a volume id (from POST /v1/volumes), a string"),
    ("network", "true or false"),
    ("version", "a version string (see GET /runtimes)"),
];

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CreatedBody<'a> {
    id: &'a str,
    token: &'a str,
    runtime: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    created_at: String,
    ttl_sec: u64,
    expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    volume_id: Option<&'a str>,
    /// The version its steps (and kernel) run (an isobox extension).
    version: &'a str,
}

fn sessions(app: &App) -> Arc<Sessions> {
    Arc::clone(&app.sessions)
}

fn token(head: &Head) -> Option<String> {
    if head.header_count("x-session-token") != 1 {
        return None;
    }
    head.header("x-session-token").map(|t| t.trim().to_string())
}

/// `POST /v1/sessions`.
pub fn create(app: &mut App, req: &Request) -> Action {
    let b: CreateBody = match super::decode_json(&req.body, CREATE_HINTS) {
        Ok(b) => b,
        Err(r) => return Action::Respond(r),
    };
    let kernel = match b.kind.as_deref() {
        None | Some("filesystem") => false,
        Some("kernel") => true,
        Some(other) => {
            return Action::Respond(Response::error(
                400,
                "invalid_json",
                Some(&format!(
                    "type: unknown session type {}; use \"filesystem\" or \"kernel\"",
                    serde_json::Value::from(other)
                )),
            ))
        }
    };
    if let Some(v) = &b.volume_id {
        if !workspace::valid_id(v) {
            return Action::Respond(Response::error(404, "volume_not_found", None));
        }
    }
    let runtime = b.runtime.as_deref().map(str::trim).unwrap_or("");
    if runtime.is_empty() {
        return Action::Respond(Response::error(
            400,
            "runtime_required",
            Some("runtime: required"),
        ));
    }
    let Some(rt) = app.runtimes.resolve(runtime) else {
        return Action::Respond(Response::error(
            400,
            "unknown_language",
            Some(&format!(
                "runtime: {} is not a known runtime; see GET /runtimes",
                serde_json::Value::from(runtime)
            )),
        ));
    };
    // The session's version, as /execute picks one; its steps run it unless they name
    // another (a kernel's steps cannot).
    let rt = match b
        .version
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        None => rt,
        Some(v) => match app.runtimes.pick(runtime, v) {
            Some(picked) => picked,
            None => {
                return Action::Respond(Response::error(
                    400,
                    "unknown_version",
                    Some(&format!(
                        "version: {} is not a version of {}; it has {}; see GET /runtimes",
                        serde_json::Value::from(v),
                        serde_json::Value::from(rt.desc.language.as_str()),
                        app.runtimes.versions_listed(runtime)
                    )),
                ));
            }
        },
    };
    let version = rt.version.clone().unwrap_or_default();
    let max = app.cfg.sessions.ttl_max_sec;
    let ttl = match &b.ttl_sec {
        None => 86_400.min(max),
        Some(n) => match n.as_u64() {
            Some(t) if t >= 1 => t.min(max),
            _ => {
                return Action::Respond(Response::error(
                    400,
                    "invalid_json",
                    Some(&format!("ttlSec: must be a whole number of seconds from 1 to {max} (larger values are clamped)")),
                ))
            }
        },
    };
    let kernel_plan = if kernel {
        if !is_python(rt) {
            return Action::Respond(Response::error(
                400,
                "invalid_json",
                Some(&format!(
                    "type: kernel sessions run Python; {} is not a Python runtime",
                    serde_json::Value::from(rt.desc.language.as_str())
                )),
            ));
        }
        // Asked early to spare the pool a session that could not get a kernel; the
        // daemon asks again, with the client's address, where it takes the slot.
        if let crate::admission::KernelAdmission::Refused(r) = app.kernels.admit(
            &req.tenant,
            None,
            app.shutting_down,
            std::time::Instant::now(),
        ) {
            return Action::Respond(r);
        }
        Some(Box::new(crate::sandbox::plan::ExecPlan {
            runtime: rt.clone(),
            files: Vec::new(),
            entry: String::new(),
            stdin: Vec::new(),
            args: Vec::new(),
            limits: crate::sandbox::limits::RequestedLimits::default().resolve(&rt.desc.limits),
            network_requested: b.network.unwrap_or(true),
            allowlist: None,
            code_given: false,
            preload: None,
            workspace: None,
            long_lived: None,
            ro_binds: Vec::new(),
            signal_start: false,
            cpu_weight: None,
        }))
    } else {
        None
    };
    let language = rt.desc.language.clone();
    let sessions = sessions(app);
    let tenant = req.tenant.clone();
    let volume_id = b.volume_id;
    let network = b.network;
    let kind = if kernel { "kernel" } else { "filesystem" };
    Action::Job(Box::new(move || {
        let new = workspace::NewSession {
            runtime: &language,
            version: Some(version.clone()),
            kind,
            ttl_sec: ttl,
            volume_id,
            network,
        };
        let c = match sessions.create(&tenant, new) {
            Ok(c) => c,
            Err(e) if kernel_plan.is_some() => {
                return Outcome::KernelCreated(Err(session_error(&e)))
            }
            Err(e) => return Outcome::Respond(session_error(&e)),
        };
        log::info!(
            "session {} created runtime={language} type={kind} tenant={tenant}",
            c.id
        );
        let resp = Response::json(
            201,
            &CreatedBody {
                id: &c.id,
                token: &c.token,
                runtime: &c.record.runtime,
                kind: &c.record.kind,
                created_at: rfc3339(c.record.created_at_ms),
                ttl_sec: c.record.ttl_sec,
                expires_at: rfc3339(c.record.expires_at_ms()),
                volume_id: c.record.volume_id.as_deref(),
                version: &version,
            },
        );
        let Some(mut plan) = kernel_plan else {
            return Outcome::Respond(resp);
        };
        // The kernel holds its workspace (and volume) mounted, and the session's step
        // flag, for its whole life.
        match sessions.acquire(&c.id, true, c.record.volume_id.as_deref()) {
            Ok(lease) => {
                lease.no_touch_on_drop();
                plan.workspace = Some(Arc::new(lease));
                Outcome::KernelCreated(Ok(Box::new(super::KernelCreated {
                    session: c.id,
                    response: resp,
                    plan,
                    ttl_sec: c.record.ttl_sec,
                    tenant,
                })))
            }
            Err(e) => {
                if let Err(d) = sessions.delete(&c.id) {
                    log::error!("session {}: delete after a failed kernel start: {d}", c.id);
                }
                Outcome::KernelCreated(Err(session_error(&e)))
            }
        }
    }))
}

/// Whether `rt` is a Python runtime (kernel sessions run the Python harness).
fn is_python(rt: &crate::runtimes::Runtime) -> bool {
    rt.desc
        .run
        .first()
        .and_then(|p| p.rsplit('/').next())
        .is_some_and(|b| b == "python3" || b == "python")
}

/// `DELETE /v1/sessions/{id}`.
pub fn delete(app: &mut App, req: &Request) -> Action {
    let sessions = sessions(app);
    let (tenant, tok) = (req.tenant.clone(), token(&req.head));
    let id = req.params.get("id").unwrap_or("").to_string();
    Action::Job(Box::new(move || {
        let r = match sessions.authorize(&tenant, &id, tok.as_deref()) {
            // A kernel session's kernel ends first (on the reactor).
            Ok(rec) if rec.kind == "kernel" => return Outcome::KernelDelete { session: id },
            Ok(_) => sessions.delete(&id),
            Err(e) => Err(e),
        };
        Outcome::Respond(match r {
            Ok(()) => Response::no_content(),
            Err(e) => session_error(&e),
        })
    }))
}

/// `POST /v1/sessions/{id}/exec`: the `/execute` body minus `language`.
pub fn exec(app: &mut App, req: &Request) -> Action {
    // Asked again where the step takes its slot; asking here spares the pool a job
    // (and the workspace its files) when the step could not start anyway.
    if let Some(refusal) = app.runs.refusal(app.shutting_down) {
        return Action::Respond(refusal);
    }
    let sessions = sessions(app);
    let runtimes = Arc::clone(&app.runtimes);
    let (tenant, tok) = (req.tenant.clone(), token(&req.head));
    let id = req.params.get("id").unwrap_or("").to_string();
    let body = req.body.clone();
    let stream = super::execute::wants_stream(req);
    let delivery = move |detach| super::Delivery::of_parts(detach, stream);
    Action::Job(Box::new(move || {
        let rec = match sessions.authorize(&tenant, &id, tok.as_deref()) {
            Ok(r) => r,
            Err(e) => return Outcome::Respond(session_error(&e)),
        };
        let (mut plan, detach) = match super::execute::decode_for_session(
            &runtimes,
            &body,
            &rec.runtime,
            rec.version.as_deref(),
            rec.kind == "kernel",
            rec.network.unwrap_or(true),
        ) {
            Ok(p) => p,
            Err(resp) => return Outcome::Respond(resp),
        };
        if let Err(e) = sessions.check_reserve() {
            return Outcome::Respond(session_error(&e));
        }
        if rec.kind == "kernel" {
            return kernel_step(id, plan, delivery(detach), tenant);
        }
        let lease = match sessions.acquire(&id, true, rec.volume_id.as_deref()) {
            Ok(l) => l,
            Err(e) => return Outcome::Respond(session_error(&e)),
        };
        // The step's files land in the workspace (they persist, and count against
        // the quota), written as the sandbox user.
        let placed = wfs::Root::open(lease.mount())
            .map_err(FsError::Io)
            .and_then(|root| place_files(&root, &plan.files));
        if let Err(e) = placed {
            return Outcome::Respond(fs_error(&e));
        }
        plan.workspace = Some(Arc::new(lease));
        Outcome::Execute {
            plan: Box::new(plan),
            delivery: delivery(detach),
            tenant,
        }
    }))
}

/// A kernel session's step, checked: the reactor gives it to the kernel, which writes
/// its files into the workspace first.
fn kernel_step(
    id: String,
    mut plan: crate::sandbox::plan::ExecPlan,
    delivery: super::Delivery,
    tenant: String,
) -> Outcome {
    let refuse = |why: &str| Outcome::Respond(Response::error(400, "invalid_json", Some(why)));
    if !plan.stdin.is_empty() {
        return refuse(
            "stdin: a kernel step has no stdin (its code runs in the kernel's interpreter)",
        );
    }
    if !plan.args.is_empty() {
        return refuse(
            "args: a kernel step takes no args (its code runs in the kernel's interpreter)",
        );
    }
    // The code runs as given: from `code`, or else the first file's text.
    let files = std::mem::take(&mut plan.files);
    let code = match files.first() {
        Some((_, bytes)) => match std::str::from_utf8(bytes) {
            Ok(s) => s.to_string(),
            Err(_) => return refuse("files[0]: the code a kernel runs must be UTF-8 text"),
        },
        None => String::new(),
    };
    // The files are written only once the kernel has taken the step (a refused step
    // must not touch the workspace a running one uses).
    let skip = usize::from(plan.code_given);
    plan.files = files.into_iter().skip(skip).collect();
    Outcome::KernelStep {
        session: id,
        plan: Box::new(plan),
        code,
        delivery,
        tenant,
    }
}

/// Writes a kernel step's files into its session's workspace (a pool job, after the
/// kernel took the step).
///
/// # Errors
/// The response for a file that cannot be placed.
pub fn write_step_files(
    sessions: &Sessions,
    id: &str,
    files: &[(String, Vec<u8>)],
) -> Result<(), Response> {
    let lease = sessions
        .acquire(id, false, None)
        .map_err(|e| session_error(&e))?;
    let root = wfs::Root::open(lease.mount()).map_err(|e| fs_error(&FsError::Io(e)))?;
    place_files(&root, files).map_err(|e| fs_error(&e))
}

/// Writes a step's files into a workspace, owned by the sandbox user.
fn place_files(root: &wfs::Root, files: &[(String, Vec<u8>)]) -> Result<(), FsError> {
    for (name, bytes) in files {
        let rel = wfs::normalize(name.as_bytes())?;
        wfs::write_file(
            root,
            &rel,
            bytes,
            workspace::WORKSPACE_UID,
            workspace::WORKSPACE_UID,
        )?;
    }
    Ok(())
}

/// The path and format of a file API call.
fn fs_target(head: &Head) -> Result<(wfs::RelPath, bool), Response> {
    let raw = match head.query.as_deref() {
        None => Vec::new(),
        Some(_) => match head.query_param_bytes("path") {
            Some(p) => p,
            None if head
                .query
                .as_deref()
                .is_some_and(|q| q.split('&').any(|kv| kv.split('=').next() == Some("path"))) =>
            {
                return Err(Response::error(
                    400,
                    "invalid_path",
                    Some("path: malformed percent-encoding"),
                ))
            }
            None => Vec::new(),
        },
    };
    let rel = wfs::normalize(&raw).map_err(|e| fs_error(&e))?;
    let zip = match head.query_param("format").as_deref() {
        None | Some("") | Some("raw") => false,
        Some("zip") => true,
        Some(other) => {
            return Err(Response::error(
                400,
                "invalid_format",
                Some(&format!(
                    "format: {} is not supported; use zip",
                    serde_json::Value::from(other)
                )),
            ))
        }
    };
    Ok((rel, zip))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListingBody {
    path: String,
    dir: bool,
    entries: Vec<EntryBody>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EntryBody {
    name: String,
    /// Percent-encoded raw bytes, only for names that are not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    name_encoded: Option<String>,
    size: u64,
    dir: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    symlink: bool,
    mod_time: String,
}

/// `GET`/`HEAD /v1/sessions/{id}/fs`: a listing, a file, or a zip of a directory.
pub fn fs_get(app: &mut App, req: &Request) -> Action {
    let (rel, zip) = match fs_target(&req.head) {
        Ok(t) => t,
        Err(r) => return Action::Respond(r),
    };
    let sessions = sessions(app);
    let (tenant, tok) = (req.tenant.clone(), token(&req.head));
    let id = req.params.get("id").unwrap_or("").to_string();
    let head_only = req.head.method == "HEAD";
    Action::Job(Box::new(move || {
        match fs_get_job(
            &sessions,
            &tenant,
            &id,
            tok.as_deref(),
            &rel,
            zip,
            head_only,
        ) {
            Ok(o) => o,
            Err(r) => Outcome::Respond(r),
        }
    }))
}

fn fs_get_job(
    sessions: &Arc<Sessions>,
    tenant: &str,
    id: &str,
    tok: Option<&str>,
    rel: &wfs::RelPath,
    zip: bool,
    head_only: bool,
) -> Result<Outcome, Response> {
    let record = sessions
        .authorize(tenant, id, tok)
        .map_err(|e| session_error(&e))?;
    let lease = sessions
        .acquire(id, false, None)
        .map_err(|e| session_error(&e))?;
    let root = wfs::Root::open(lease.mount()).map_err(|e| fs_error(&FsError::Io(e)))?;
    let kind = wfs::stat(&root, rel).map_err(|e| fs_error(&e))?;
    let name = rel.file_name().unwrap_or(b"workspace").to_vec();
    match kind {
        wfs::Kind::Dir { .. } if !zip => {
            let l = wfs::list_dir(&root, rel, MAX_LIST_ENTRIES).map_err(|e| fs_error(&e))?;
            let entries = l
                .entries
                .into_iter()
                .map(|e| {
                    let utf8 = std::str::from_utf8(&e.name).is_ok();
                    EntryBody {
                        name: String::from_utf8_lossy(&e.name).into_owned(),
                        name_encoded: (!utf8)
                            .then(|| crate::http::parse::percent_encode_path(&e.name)),
                        size: e.size,
                        dir: e.dir,
                        symlink: e.symlink,
                        mod_time: rfc3339(e.mod_time_ms),
                    }
                })
                .collect();
            Ok(Outcome::Respond(Response::json(
                200,
                &ListingBody {
                    path: rel.display(),
                    dir: true,
                    entries,
                    truncated: l.truncated,
                },
            )))
        }
        wfs::Kind::Dir { .. } => {
            let size = wfs::tree_size(&root, rel, MAX_ZIP_ENTRIES).map_err(|e| fs_error(&e))?;
            if size.truncated
                || size.bytes > MAX_ZIP_BYTES
                || size.name_bytes > workspace::zip::MAX_NAME_BYTES as u64
            {
                return Err(Response::error(
                    413,
                    "archive_too_large",
                    Some("a zip is capped at 256 MiB of files, 65534 entries and 8 MiB of entry names (paths); download a subdirectory"),
                ));
            }
            let mut zip_name = name;
            zip_name.extend_from_slice(b".zip");
            let head = download_head("application/zip", &zip_name);
            if head_only {
                return Ok(Outcome::Download(Box::new(Download {
                    head,
                    length: None,
                    rx: None,
                    status: Arc::new(AtomicU8::new(XFER_OK)),
                })));
            }
            let slot = sessions.transfer_slot().map_err(|e| session_error(&e))?;
            let rel = rel.clone();
            spawn_transfer(head, None, move |w| {
                let _slot = slot;
                let _lease = lease;
                zip_tree(&root, &rel, w)
            })
        }
        wfs::Kind::File { .. } if zip => Err(Response::error(
            400,
            "invalid_format",
            Some("format=zip applies to directories; this path is a file"),
        )),
        wfs::Kind::File { .. } => {
            let (mut file, size) = wfs::open_read(&root, rel).map_err(|e| fs_error(&e))?;
            // Only a sparse file can be larger than the disk it is on: its holes would
            // be sent as zeros, up to terabytes (issue 26, item 2).
            if size > record.quota_bytes {
                return Err(Response::error(
                    413,
                    "quota_exceeded",
                    Some(&format!(
                        "this file's size ({size} bytes) is larger than the session's disk quota ({} bytes): it is sparse; read the parts you need in a step",
                        record.quota_bytes
                    )),
                ));
            }
            let head = download_head("application/octet-stream", &name);
            if head_only {
                return Ok(Outcome::Download(Box::new(Download {
                    head,
                    length: Some(size),
                    rx: None,
                    status: Arc::new(AtomicU8::new(XFER_OK)),
                })));
            }
            let slot = sessions.transfer_slot().map_err(|e| session_error(&e))?;
            spawn_transfer(head, Some(size), move |w| {
                let _slot = slot;
                let _lease = lease;
                let n = std::io::copy(&mut std::io::Read::take(&mut file, size), w)?;
                if n != size {
                    return Err(std::io::Error::other("file shrank while being sent"));
                }
                Ok(())
            })
        }
        _ => Err(fs_error(&FsError::NotAFile)),
    }
}

/// Writes the zip of `rel` to `w`, stopping at the cap if files grew meanwhile.
fn zip_tree(root: &wfs::Root, rel: &wfs::RelPath, w: &mut dyn Write) -> std::io::Result<()> {
    let mut z =
        workspace::zip::ZipStreamWriter::new(std::io::BufWriter::with_capacity(64 * 1024, w));
    let mut total = 0u64;
    wfs::walk_files(root, rel, MAX_ZIP_ENTRIES, |path, entry, file| {
        match (entry, file) {
            (wfs::WalkEntry::Dir { mtime }, _) => {
                let mut name = path.to_vec();
                name.push(b'/');
                match z.add_dir(&name, mtime) {
                    Ok(()) => {}
                    // A name a zip cannot carry safely (a backslash would be a path
                    // separator to some unzippers): left out, like symlinks.
                    Err(ZipError::BadName(_)) => {}
                    Err(e) => return Err(std::io::Error::other(e)),
                }
            }
            (wfs::WalkEntry::File { mtime, mode, size }, Some(mut f)) => {
                total += size;
                if total > MAX_ZIP_BYTES {
                    return Err(std::io::Error::other("archive grew past its cap"));
                }
                let mut limited = std::io::Read::take(&mut f, size);
                match z.add_file(path, mtime, mode, &mut limited) {
                    Ok(_) | Err(ZipError::BadName(_)) => {}
                    Err(e) => return Err(std::io::Error::other(e)),
                }
            }
            _ => {}
        }
        Ok(())
    })
    .map_err(|e| std::io::Error::other(e.to_string()))?;
    z.finish().map_err(std::io::Error::other)?.flush()
}

pub(crate) fn download_head(content_type: &str, name: &[u8]) -> Response {
    // An ASCII fallback name plus the exact one (RFC 6266 / RFC 5987).
    let ascii: String = String::from_utf8_lossy(name)
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Response::bytes(200, content_type, Vec::new()).with_header(
        "Content-Disposition",
        format!(
            "attachment; filename=\"{ascii}\"; filename*=UTF-8''{}",
            crate::http::parse::percent_encode_path(name).replace('/', "%2F")
        ),
    )
}

/// Starts a thread that writes the body into a pipe the reactor forwards.
pub(crate) fn spawn_transfer(
    head: Response,
    length: Option<u64>,
    produce: impl FnOnce(&mut dyn Write) -> std::io::Result<()> + Send + 'static,
) -> Result<Outcome, Response> {
    let fail = |e: std::io::Error| {
        log::error!("transfer: {e}");
        Response::error(500, "io_error", Some("could not start the transfer"))
    };
    let (rx, mut tx) = std::io::pipe().map_err(fail)?;
    let status = Arc::new(AtomicU8::new(XFER_RUNNING));
    let st = Arc::clone(&status);
    std::thread::Builder::new()
        .name("isobox-xfer".into())
        .spawn(move || {
            let r = produce(&mut tx);
            if let Err(e) = &r {
                // A client that went away shows up as EPIPE: not worth a warning.
                if e.kind() != std::io::ErrorKind::BrokenPipe {
                    crate::warn_limited!("transfer failed: {e}");
                }
            }
            st.store(
                if r.is_ok() { XFER_OK } else { XFER_FAILED },
                Ordering::Release,
            );
            drop(tx);
        })
        .map_err(fail)?;
    Ok(Outcome::Download(Box::new(Download {
        head,
        length,
        rx: Some(std::os::fd::OwnedFd::from(rx)),
        status,
    })))
}

/// `DELETE /v1/sessions/{id}/fs?path=`.
pub fn fs_delete(app: &mut App, req: &Request) -> Action {
    let (rel, _) = match fs_target(&req.head) {
        Ok(t) => t,
        Err(r) => return Action::Respond(r),
    };
    let sessions = sessions(app);
    let (tenant, tok) = (req.tenant.clone(), token(&req.head));
    let id = req.params.get("id").unwrap_or("").to_string();
    Action::Job(Box::new(move || {
        let r = (|| {
            sessions
                .authorize(&tenant, &id, tok.as_deref())
                .map_err(|e| session_error(&e))?;
            let lease = sessions
                .acquire(&id, false, None)
                .map_err(|e| session_error(&e))?;
            let root = wfs::Root::open(lease.mount()).map_err(|e| fs_error(&FsError::Io(e)))?;
            wfs::remove(&root, &rel).map_err(|e| fs_error(&e))
        })();
        Outcome::Respond(match r {
            Ok(()) => Response::no_content(),
            Err(r) => r,
        })
    }))
}

/// `PUT /v1/sessions/{id}/fs?path=`, at head time: a job that checks the session and
/// opens the temporary file the body will be written to, or the refusal.
pub fn upload_begin(
    app: &mut App,
    head: &Head,
    tenant: &str,
    params: &Params,
) -> Result<super::UploadJob, Response> {
    let (rel, zip) = fs_target(head)?;
    if zip {
        return Err(Response::error(
            400,
            "invalid_format",
            Some("format applies to downloads only"),
        ));
    }
    let sessions = sessions(app);
    let (tenant, tok) = (tenant.to_string(), token(head));
    let id = params.get("id").unwrap_or("").to_string();
    Ok(Box::new(move || {
        sessions
            .authorize(&tenant, &id, tok.as_deref())
            .map_err(|e| session_error(&e))?;
        let lease = sessions
            .acquire(&id, false, None)
            .map_err(|e| session_error(&e))?;
        sessions.check_reserve().map_err(|e| session_error(&e))?;
        let root = wfs::Root::open(lease.mount()).map_err(|e| fs_error(&FsError::Io(e)))?;
        let avail = workspace::image::usage(lease.mount())
            .map(|u| u.avail_bytes)
            .unwrap_or(u64::MAX);
        let upload = wfs::create_upload(
            &root,
            &rel,
            workspace::WORKSPACE_UID,
            workspace::WORKSPACE_UID,
        )
        .map_err(|e| fs_error(&e))?;
        Ok(Box::new(UploadTarget {
            upload,
            lease,
            path: rel.display(),
            avail_bytes: avail,
        }))
    }))
}

#[derive(Serialize)]
struct UploadedBody<'a> {
    path: &'a str,
    bytes: u64,
}

/// Finishes an upload whose body was written whole (a pool job).
pub fn upload_commit(t: UploadTarget) -> Response {
    let UploadTarget {
        upload,
        lease,
        path,
        ..
    } = t;
    let r = upload.commit();
    drop(lease);
    match r {
        Ok(bytes) => Response::json(200, &UploadedBody { path: &path, bytes }),
        Err(e) => fs_error(&e),
    }
}

/// RFC 3339 UTC with milliseconds, from Unix milliseconds. Saturates at
/// 9999-12-31T23:59:59.999Z, the last instant with the four-digit year RFC 3339 has.
pub fn rfc3339(ms: u64) -> String {
    let t = jiff::civil::DateTime::constant(1970, 1, 1, 0, 0, 0, 0)
        .saturating_add(std::time::Duration::from_millis(ms));
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_796_054_399_000), "2026-11-30T15:59:59.000Z");
        // Leap days, a century that is not a leap year, and the upper end.
        assert_eq!(rfc3339(68_169_600_000), "1972-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
        assert_eq!(rfc3339(4_107_542_399_001), "2100-02-28T23:59:59.001Z");
        assert_eq!(rfc3339(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
        assert_eq!(rfc3339(2_147_483_647_000), "2038-01-19T03:14:07.000Z");
        assert_eq!(rfc3339(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(253_402_300_800_000), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59.999Z");
    }
}
