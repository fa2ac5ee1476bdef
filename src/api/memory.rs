//! `/v1/memory/{namespace}/{key}`: the per-tenant KV, with ETags, conditional
//! requests, TTLs and cursor pagination. Storage is `store::kv`; every call is a pool
//! job (one LMDB transaction).

use super::error::kv_error;
use super::sessions::rfc3339;
use super::{Action, App, Outcome, Reply};
use crate::http::parse::percent_decode_path;
use crate::http::{Head, Request, Response};
use crate::store::kv::{self, Precondition};
use crate::workspace::now_ms;
use serde::Serialize;
use std::sync::Arc;

fn decoded(raw: &str, what: &str) -> Result<String, Response> {
    percent_decode_path(raw)
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            Response::error(
                400,
                if what == "namespace" {
                    "invalid_namespace"
                } else {
                    "invalid_key"
                },
                Some(&format!("{what}: malformed percent-encoding or not UTF-8")),
            )
        })
}

fn precondition(head: &Head) -> Precondition {
    match (head.header("if-match"), head.header("if-none-match")) {
        (Some(m), Some(n)) => Precondition::Both(kv::parse_etag_list(m), kv::parse_etag_list(n)),
        (Some(m), None) => Precondition::IfMatch(kv::parse_etag_list(m)),
        (None, Some(n)) => Precondition::IfNoneMatch(kv::parse_etag_list(n)),
        (None, None) => Precondition::None,
    }
}

/// `GET`, `HEAD`, `PUT`, `DELETE /v1/memory/{namespace}/{key}`.
pub fn key(app: &mut App, req: &Request) -> Action {
    let (Some(ns_raw), Some(key_raw)) = (req.params.get("namespace"), req.params.get("key")) else {
        return Action::Respond(Response::error(404, "not_found", None));
    };
    let (ns, key) = match (decoded(ns_raw, "namespace"), decoded(key_raw, "key")) {
        (Ok(n), Ok(k)) => (n, k),
        (Err(r), _) | (_, Err(r)) => return Action::Respond(r),
    };
    if let Err(e) = kv::validate_namespace(&ns).and_then(|()| kv::validate_key(&key)) {
        return Action::Respond(kv_error(&e));
    }
    let sessions = Arc::clone(&app.sessions);
    let tenant = req.tenant.clone();
    let cond = precondition(&req.head);
    match req.head.method.as_str() {
        "PUT" => {
            let ttl = match req.head.header("x-ttl-seconds").map(str::trim) {
                None => None,
                Some(v) => match v.parse::<u64>() {
                    Ok(t) if (1..=kv::MAX_TTL_SEC).contains(&t) => Some(t),
                    _ => {
                        return Action::Respond(Response::error(
                            400,
                            "invalid_ttl",
                            Some(&format!(
                                "X-TTL-Seconds: a whole number of seconds from 1 to {}",
                                kv::MAX_TTL_SEC
                            )),
                        ))
                    }
                },
            };
            let value = req.body.clone();
            // Handed to the store's writer without a worker: writes that arrive
            // together share one commit, and no thread waits for the sync.
            Action::Deferred(Box::new(move |reply: Reply| {
                sessions.store().kv_put_then(
                    &tenant,
                    &ns,
                    &key,
                    value,
                    ttl,
                    cond,
                    now_ms(),
                    move |r| {
                        reply(Outcome::Respond(match r {
                            Ok(p) => {
                                let mut r = Response::no_content().with_header("ETag", p.etag);
                                if let Some(at) = p.expires_at_ms {
                                    r = r.with_header("X-Expires-At", rfc3339(at));
                                }
                                r
                            }
                            Err(e) => kv_error(&e),
                        }));
                    },
                );
            }))
        }
        "DELETE" => Action::Deferred(Box::new(move |reply: Reply| {
            sessions
                .store()
                .kv_delete_then(&tenant, &ns, &key, cond, now_ms(), move |r| {
                    reply(Outcome::Respond(match r {
                        Ok(_) => Response::no_content(),
                        Err(e) => kv_error(&e),
                    }));
                });
        })),
        // A read is answered here, on the reactor thread: an LMDB read transaction
        // is a lookup in the memory map (no syscall; one uncontended lock of the
        // reader table, ~30 ns; never waiting for the writer), and the value is at
        // most 1 MiB.
        // A hop to a worker and back cost more than the read itself (GET 0.66× Redis
        // through a worker, 0.96× here: bench/README.md, Memory KV).
        _ => Action::Respond(
            match sessions.store().kv_get(&tenant, &ns, &key, now_ms()) {
                Ok(None) => Response::error(404, "key_not_found", None),
                Ok(Some(e)) if !cond.match_holds(Some(&e.etag)) => {
                    // RFC 9110 §13.1.1: a GET whose If-Match fails is a 412.
                    Response::error(412, "precondition_failed", None)
                }
                Ok(Some(e)) => {
                    // RFC 9110 §13.1.2: a GET whose If-None-Match fails (weak
                    // comparison) is a 304.
                    let not_modified = !cond.holds(Some(&e.etag));
                    let mut r = if not_modified {
                        Response::bytes(304, "application/octet-stream", Vec::new())
                    } else {
                        Response::bytes(200, "application/octet-stream", e.value)
                    };
                    r = r
                        .with_header("ETag", e.etag)
                        .with_header("Cache-Control", "no-cache");
                    if let Some(at) = e.expires_at_ms {
                        r = r.with_header("X-Expires-At", rfc3339(at));
                    }
                    r
                }
                Err(e) => kv_error(&e),
            },
        ),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListBody {
    namespace: String,
    keys: Vec<String>,
    items: Vec<ItemBody>,
    cursor: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ItemBody {
    key: String,
    size: u64,
    etag: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<String>,
}

/// `GET /v1/memory/{namespace}?prefix=&limit=&cursor=`.
pub fn list(app: &mut App, req: &Request) -> Action {
    let Some(ns_raw) = req.params.get("namespace") else {
        return Action::Respond(Response::error(404, "not_found", None));
    };
    let ns = match decoded(ns_raw, "namespace") {
        Ok(n) => n,
        Err(r) => return Action::Respond(r),
    };
    if let Err(e) = kv::validate_namespace(&ns) {
        return Action::Respond(kv_error(&e));
    }
    let q = |k: &str| req.head.query_param(k);
    let prefix = q("prefix").unwrap_or_default();
    let limit = match q("limit").as_deref().map(str::parse::<usize>) {
        None => kv::DEFAULT_LIST_LIMIT,
        Some(Ok(n)) if (1..=kv::MAX_LIST_LIMIT).contains(&n) => n,
        Some(_) => {
            return Action::Respond(Response::error(
                400,
                "invalid_limit",
                Some(&format!("limit: 1 to {}", kv::MAX_LIST_LIMIT)),
            ))
        }
    };
    let cursor = q("cursor").filter(|c| !c.is_empty());
    if req.head.query.is_some()
        && (q("prefix").is_none() && has_param(&req.head, "prefix")
            || cursor.is_none()
                && has_param(&req.head, "cursor")
                && !empty_param(&req.head, "cursor"))
    {
        return Action::Respond(Response::error(
            400,
            "invalid_query",
            Some("prefix/cursor: malformed percent-encoding"),
        ));
    }
    let sessions = Arc::clone(&app.sessions);
    let tenant = req.tenant.clone();
    Action::Job(Box::new(move || {
        Outcome::Respond(
            match sessions.store().kv_list(
                &tenant,
                &ns,
                &prefix,
                limit,
                cursor.as_deref(),
                now_ms(),
            ) {
                Ok(page) => Response::json(
                    200,
                    &ListBody {
                        namespace: ns,
                        keys: page.keys.iter().map(|k| k.key.clone()).collect(),
                        items: page
                            .keys
                            .into_iter()
                            .map(|k| ItemBody {
                                key: k.key,
                                size: k.size,
                                etag: k.etag,
                                expires_at: k.expires_at_ms.map(rfc3339),
                            })
                            .collect(),
                        cursor: page.next_cursor,
                    },
                ),
                Err(e) => kv_error(&e),
            },
        )
    }))
}

fn has_param(head: &Head, key: &str) -> bool {
    head.query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|kv| kv.split('=').next() == Some(key)))
}

fn empty_param(head: &Head, key: &str) -> bool {
    head.query.as_deref().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == key || kv.strip_prefix(key).is_some_and(|r| r == "="))
    })
}
