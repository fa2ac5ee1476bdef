//! Every error a handler meets, mapped to its status and body, in one place: the
//! isobox face's error codes (`{"error": "code", "detail": "..."}`) for sessions, the
//! file API, the memory store and routing. Errors that mean we lost something (the
//! state store, the disk) are logged here with their cause and answered without it.

use crate::http::Response;
use crate::router::RouteError;
use crate::store::kv::KvError;
use crate::store::StoreError;
use crate::workspace::fs::FsError;
use crate::workspace::SessionError;

/// The response of a session error.
pub fn session_error(e: &SessionError) -> Response {
    match e {
        SessionError::NotFound => Response::error(404, "session_not_found", None),
        SessionError::BadToken => Response::error(
            401,
            "invalid_session_token",
            Some("missing or wrong X-Session-Token"),
        ),
        SessionError::Busy => Response::error(
            409,
            "session_busy",
            Some("a step is already running in this session; retry when it ends"),
        ),
        SessionError::TooMany => Response::error(
            429,
            "too_many_sessions",
            Some("the server holds as many sessions as it may (ISOBOX_MAX_SESSIONS); retry later"),
        ),
        SessionError::TooManyForTenant(n) => Response::error(
            429,
            "too_many_sessions",
            Some(&format!(
                "this API key has {n} sessions, its most (ISOBOX_MAX_SESSIONS_PER_TENANT); delete one first"
            )),
        ),
        SessionError::StorageFull(why) => Response::error(507, "storage_full", Some(why)),
        SessionError::VolumeNotFound => Response::error(404, "volume_not_found", None),
        SessionError::VolumeBusy => Response::error(
            409,
            "volume_busy",
            Some("the volume is attached to another session; end that session first"),
        ),
        SessionError::TooManyVolumes => Response::error(
            429,
            "too_many_volumes",
            Some("the server holds as many volumes as it may (ISOBOX_MAX_VOLUMES); retry later"),
        ),
        SessionError::TooManyVolumesForTenant(n) => Response::error(
            429,
            "too_many_volumes",
            Some(&format!(
                "this API key has {n} volumes, its most (ISOBOX_MAX_VOLUMES_PER_TENANT); delete one first"
            )),
        ),
        SessionError::CreatesBusy => {
            Response::error(503, "busy", Some("too many creates in progress"))
                .with_header("Retry-After", "1")
        }
        SessionError::TransfersBusy => {
            Response::error(503, "busy", Some("too many downloads in progress"))
                .with_header("Retry-After", "1")
        }
        SessionError::Workspace(why) => Response::error(500, "workspace_error", Some(why)),
        SessionError::Store(StoreError::Write(w)) if w.disk_full() => store_full(&w.0),
        SessionError::Store(e) => {
            log::error!("session store: {e}");
            Response::error(
                500,
                "internal_error",
                Some("the state store failed; see the daemon log"),
            )
        }
    }
}

/// The response of a file API error.
pub fn fs_error(e: &FsError) -> Response {
    match e {
        FsError::InvalidPath(why) => Response::error(400, "invalid_path", Some(why)),
        FsError::NotFound => Response::error(404, "file_not_found", None),
        FsError::NotADirectory => Response::error(
            400,
            "invalid_path",
            Some("a component of the path is not a directory"),
        ),
        FsError::NotAFile => {
            Response::error(400, "invalid_path", Some("not a regular file or directory"))
        }
        FsError::IsADirectory => Response::error(400, "invalid_path", Some("is a directory")),
        FsError::NoSpace => Response::error(
            413,
            "quota_exceeded",
            Some("the session's disk quota is exhausted"),
        ),
        FsError::Io(e) => {
            log::error!("workspace io: {e}");
            Response::error(
                500,
                "io_error",
                Some("file operation failed; see the daemon log"),
            )
        }
    }
}

/// The response of a KV error.
pub fn kv_error(e: &KvError) -> Response {
    let d = e.to_string();
    match e {
        KvError::InvalidNamespace(_) => Response::error(400, "invalid_namespace", Some(&d)),
        KvError::InvalidKey(_) => Response::error(400, "invalid_key", Some(&d)),
        KvError::ValueTooLarge { .. } => Response::error(413, "value_too_large", Some(&d)),
        KvError::InvalidTtl(_) => Response::error(400, "invalid_ttl", Some(&d)),
        KvError::Quota { .. } => Response::error(413, "quota_exceeded", Some(&d)),
        KvError::PreconditionFailed => Response::error(412, "precondition_failed", None),
        KvError::BadCursor => Response::error(400, "invalid_cursor", Some(&d)),
        KvError::Store(StoreError::Busy) => {
            Response::error(503, "overloaded", Some(&d)).with_header("Retry-After", "1")
        }
        KvError::Store(StoreError::Write(w)) if w.disk_full() => store_full(&w.0),
        KvError::Store(e) => {
            log::error!("kv store: {e}");
            Response::error(
                500,
                "internal_error",
                Some("the state store failed; see the daemon log"),
            )
        }
    }
}

/// A write refused because the state store's disk is full: nothing was written.
fn store_full(why: &str) -> Response {
    Response::error(507, "insufficient_storage", Some(why)).with_header("Retry-After", "60")
}

/// Answers for a route error.
pub fn route_error(e: RouteError) -> Response {
    match e {
        RouteError::NotFound => Response::error(404, "not_found", None),
        RouteError::MethodNotAllowed(allow) => {
            Response::error(405, "method_not_allowed", None).with_header("Allow", allow)
        }
    }
}
