//! `/v1/runs/{id}`: a recorded run — one streamed over SSE, or started with
//! `"detach": true` — read (`GET`, optionally waiting for its end), followed from an
//! event on (`GET …/events` with `Last-Event-ID` or `?after=N`), or cancelled
//! (`POST …/cancel`). The records live on the reactor (`daemon::records`); here the
//! request is checked and handed over.

use super::{Action, App};
use crate::http::{Request, Response};

/// Longest `?wait=` of `GET /v1/runs/{id}`, in seconds.
pub const MAX_WAIT_S: u64 = 60;
/// Longest run id accepted (ids are `run_` and 24 hex digits; longer is not one).
const MAX_ID_BYTES: usize = 64;

/// What a request asks of a recorded run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunVerb {
    /// Its state and, once it ended, its result; waiting up to this long for the end.
    Get {
        /// How long to wait for the end (zero: answer at once).
        wait_ms: u64,
    },
    /// Its events after the one with this id (0: all), then the live rest, as SSE.
    Events {
        /// The last event the client has.
        after: u64,
    },
    /// Cancel it (kill its sandbox); the record keeps its outcome.
    Cancel,
}

/// A request on a recorded run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOp {
    /// The run's id.
    pub id: String,
    /// Who asks: a run is visible only to the tenant that started it.
    pub tenant: String,
    /// What is asked.
    pub verb: RunVerb,
}

fn op(req: &Request, verb: RunVerb) -> Action {
    let id = req.params.get("id").unwrap_or("");
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Action::Respond(not_found());
    }
    Action::Run(RunOp {
        id: id.to_string(),
        tenant: req.tenant.clone(),
        verb,
    })
}

/// The answer for an id that names no run this tenant can see (never there, expired
/// from the record store, or another tenant's).
pub fn not_found() -> Response {
    Response::error(
        404,
        "run_not_found",
        Some("no such run: it never existed, belongs to another key, or its record expired"),
    )
}

/// `GET /v1/runs/{id}[?wait=S]`.
pub fn get(_: &mut App, req: &Request) -> Action {
    let wait_ms = match req.head.query_param("wait").as_deref() {
        None | Some("") => 0,
        Some(s) => match s.parse::<u64>() {
            Ok(n) if n <= MAX_WAIT_S => n * 1000,
            _ => {
                return Action::Respond(Response::error(
                    400,
                    "invalid_query",
                    Some(&format!("wait: whole seconds from 0 to {MAX_WAIT_S}")),
                ))
            }
        },
    };
    op(req, RunVerb::Get { wait_ms })
}

/// `GET /v1/runs/{id}/events[?after=N]`, or with `Last-Event-ID: N` (the query wins).
pub fn events(_: &mut App, req: &Request) -> Action {
    // A Last-Event-ID that is no event id is refused even when `after` wins over it:
    // a client sending garbage learns so.
    if let Some(h) = req.head.header("last-event-id").map(str::trim) {
        if !h.is_empty() && (h.len() > 19 || !h.bytes().all(|b| b.is_ascii_digit())) {
            return Action::Respond(Response::error(
                400,
                "invalid_query",
                Some("Last-Event-ID: the id of the last event received, a whole number"),
            ));
        }
    }
    let from_query = req.head.query_param("after");
    let (given, what) = match from_query.as_deref() {
        Some(q) => (Some(q.to_string()), "after"),
        None => (
            req.head
                .header("last-event-id")
                .map(|h| h.trim().to_string()),
            "Last-Event-ID",
        ),
    };
    let after = match given.as_deref() {
        None | Some("") => 0,
        // At most 19 digits (what the OpenAPI document says; always a u64).
        Some(s) => match s.parse::<u64>().ok().filter(|_| s.len() <= 19) {
            Some(n) => n,
            None => {
                return Action::Respond(Response::error(
                    400,
                    "invalid_query",
                    Some(&format!(
                        "{what}: the id of the last event received, a whole number"
                    )),
                ))
            }
        },
    };
    op(req, RunVerb::Events { after })
}

/// `POST /v1/runs/{id}/cancel`.
pub fn cancel(_: &mut App, req: &Request) -> Action {
    op(req, RunVerb::Cancel)
}
