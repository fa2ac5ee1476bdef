//! `/v1/volumes`: named per-tenant filesystems, attached to a session with `volumeId`
//! and mounted read-write at `/memory` for its steps.

use super::error::session_error;
use super::sessions::rfc3339;
use super::{Action, App, Outcome};
use crate::http::{Request, Response};
use crate::store::volumes::VolumeRecord;
use crate::workspace::volumes::MAX_VOLUME_NAME_BYTES;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct VolumeBody<'a> {
    id: &'a str,
    name: &'a str,
    created_at: String,
    quota_bytes: u64,
    used_bytes: u64,
    /// The session holding it, if any.
    attached_session: Option<&'a str>,
}

fn body<'a>(id: &'a str, v: &'a VolumeRecord, used: u64) -> VolumeBody<'a> {
    VolumeBody {
        id,
        name: &v.name,
        created_at: rfc3339(v.created_at_ms),
        quota_bytes: v.quota_bytes,
        used_bytes: used,
        attached_session: v.held_by.as_deref(),
    }
}

/// `POST /v1/volumes` and `GET /v1/volumes`.
pub fn collection(app: &mut App, req: &Request) -> Action {
    let sessions = Arc::clone(&app.sessions);
    let tenant = req.tenant.clone();
    if req.head.method == "POST" {
        let b: CreateBody = match super::decode_json(
            &req.body,
            &[("name", "a name, a string of 1 to 128 bytes")],
        ) {
            Ok(b) => b,
            Err(r) => return Action::Respond(r),
        };
        let name = b.name.unwrap_or_default();
        // Controls are looked for before trimming: U+0085 is both a (C1) control and
        // Unicode whitespace.
        let control = name.chars().any(char::is_control);
        let name = name.trim();
        if name.is_empty() || name.len() > MAX_VOLUME_NAME_BYTES || control {
            return Action::Respond(Response::error(
                400,
                "invalid_json",
                Some("name: required, 1 to 128 bytes, no control characters"),
            ));
        }
        let name = name.to_string();
        return Action::Job(Box::new(move || {
            Outcome::Respond(match sessions.create_volume(&tenant, &name) {
                Ok((id, v)) => {
                    log::info!("volume {id} created tenant={tenant}");
                    Response::json(201, &body(&id, &v, 0))
                }
                Err(e) => session_error(&e),
            })
        }));
    }
    Action::Job(Box::new(move || {
        Outcome::Respond(match sessions.list_volumes(&tenant) {
            Ok(list) => {
                let vols: Vec<VolumeBody<'_>> = list
                    .iter()
                    .map(|(id, v)| body(id, v, sessions.volume_used_bytes(id)))
                    .collect();
                Response::json(200, &serde_json::json!({ "volumes": vols }))
            }
            Err(e) => session_error(&e),
        })
    }))
}

/// `GET /v1/volumes/{id}` and `DELETE /v1/volumes/{id}`.
pub fn item(app: &mut App, req: &Request) -> Action {
    let sessions = Arc::clone(&app.sessions);
    let tenant = req.tenant.clone();
    let id = req.params.get("id").unwrap_or("").to_string();
    let delete = req.head.method == "DELETE";
    Action::Job(Box::new(move || {
        Outcome::Respond(if delete {
            match sessions.delete_volume(&tenant, &id) {
                Ok(()) => Response::no_content(),
                Err(e) => session_error(&e),
            }
        } else {
            match sessions.volume(&tenant, &id) {
                Ok(v) => Response::json(200, &body(&id, &v, sessions.volume_used_bytes(&id))),
                Err(e) => session_error(&e),
            }
        })
    }))
}
