//! The file endpoints of the WBX face (`fs/list`, `fs/stat`, `fs/mkdir`, `fs/move`,
//! `fs/remove`): each request parsed and checked into an [`FsCall`] for the sandbox's
//! init, which carries it out as the sandbox's user, and its answer shaped as the
//! face writes entries.

use super::error;
use super::sandboxes::{Fields, Op};
use crate::http::{Request, Response};
use crate::sandbox::wire::{FsCall, FsEntry, Reply};

/// Longest path accepted (Linux's `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Deepest listing.
pub const MAX_DEPTH: u64 = 5;

/// A path from the client: required, at most [`MAX_PATH_BYTES`], without NUL. A
/// relative one is relative to the user's home (init resolves it).
fn path(name: &str, v: Option<String>) -> Result<String, Response> {
    let p = v.unwrap_or_default();
    if p.is_empty() {
        return Err(error(
            400,
            &format!("{name}: required, a path in the sandbox"),
        ));
    }
    if p.len() > MAX_PATH_BYTES {
        return Err(error(
            400,
            &format!("{name}: at most {MAX_PATH_BYTES} bytes"),
        ));
    }
    if p.contains('\0') {
        return Err(error(400, &format!("{name}: must not contain NUL")));
    }
    Ok(p)
}

/// `path` from the query, percent-decoded (not UTF-8: 400).
fn query_path(req: &Request) -> Result<String, Response> {
    match req.head.query_param("path") {
        Some(p) => path("path", Some(p)),
        None if req.head.query_param_bytes("path").is_some() => Err(error(
            400,
            "path: must be UTF-8 (percent-encoded in the query)",
        )),
        None => path("path", None),
    }
}

/// `GET …/fs/watch?path=&recursive=`.
pub fn watch(req: &Request, id: String) -> Result<Op, Response> {
    let path = query_path(req)?;
    let recursive = match req.head.query_param("recursive").as_deref() {
        None | Some("false" | "0") => false,
        Some("true" | "1") => true,
        Some(_) => return Err(error(400, "recursive: must be true or false")),
    };
    Ok(Op::FsWatch {
        id,
        path,
        recursive,
    })
}

/// `GET`/`HEAD …/files?path=`.
pub fn get(req: &Request, id: String, head_only: bool) -> Result<Op, Response> {
    Ok(Op::FileGet {
        id,
        path: query_path(req)?,
        head_only,
    })
}

/// `DELETE …/files?path=`: a file or symlink (a directory: 400, fs/remove takes those).
pub fn delete(req: &Request, id: String) -> Result<Op, Response> {
    Ok(Op::Fs(
        id,
        FsCall::Remove {
            path: query_path(req)?,
            recursive: false,
            files_only: true,
        },
    ))
}

/// `PUT …/files?path=`, at its head: the sandbox id and the path.
pub fn put_target(
    head: &crate::http::Head,
    params: &crate::http::Params,
) -> Result<(String, String), Response> {
    let id = params
        .get("id")
        .filter(|i| super::sandboxes::valid_id(i))
        .ok_or_else(super::sandboxes::not_found)?
        .to_string();
    let path = match head.query_param("path") {
        Some(p) => path("path", Some(p))?,
        None if head.query_param_bytes("path").is_some() => {
            return Err(error(
                400,
                "path: must be UTF-8 (percent-encoded in the query)",
            ))
        }
        None => path("path", None)?,
    };
    Ok((id, path))
}

/// `GET …/fs/stat?path=`.
pub fn stat(req: &Request, id: String) -> Result<Op, Response> {
    Ok(Op::Fs(
        id,
        FsCall::Stat {
            path: query_path(req)?,
        },
    ))
}

/// `GET …/fs/list?path=&depth=`.
pub fn list(req: &Request, id: String) -> Result<Op, Response> {
    let path = query_path(req)?;
    let depth = match req.head.query_param("depth") {
        None => 1,
        Some(d) => match d.parse::<u64>() {
            Ok(n) if (1..=MAX_DEPTH).contains(&n) => n,
            _ => {
                return Err(error(
                    400,
                    &format!("depth: must be a whole number from 1 to {MAX_DEPTH}"),
                ))
            }
        },
    };
    Ok(Op::Fs(
        id,
        FsCall::List {
            path,
            depth: u8::try_from(depth).unwrap_or(1),
        },
    ))
}

fn flag(f: &Fields, name: &str, default: bool) -> Result<bool, Response> {
    if f.absent(name) {
        return Ok(default);
    }
    f.0[name]
        .as_bool()
        .ok_or_else(|| error(400, &format!("{name}: must be true or false")))
}

/// `POST …/fs/mkdir` `{"path", "parents"}`.
pub fn mkdir(req: &Request, id: String) -> Result<Op, Response> {
    let f = Fields::of(req, &["path", "parents"])?;
    Ok(Op::Fs(
        id,
        FsCall::Mkdir {
            path: path("path", f.string("path")?)?,
            parents: flag(&f, "parents", false)?,
        },
    ))
}

/// `POST …/fs/move` `{"from", "to", "overwrite"}`.
pub fn mv(req: &Request, id: String) -> Result<Op, Response> {
    let f = Fields::of(req, &["from", "to", "overwrite"])?;
    Ok(Op::Fs(
        id,
        FsCall::Move {
            from: path("from", f.string("from")?)?,
            to: path("to", f.string("to")?)?,
            overwrite: flag(&f, "overwrite", false)?,
        },
    ))
}

/// `POST …/fs/remove` `{"path", "recursive"}` (a directory goes with its contents
/// unless `recursive` is false).
pub fn remove(req: &Request, id: String) -> Result<Op, Response> {
    let f = Fields::of(req, &["path", "recursive"])?;
    Ok(Op::Fs(
        id,
        FsCall::Remove {
            path: path("path", f.string("path")?)?,
            recursive: flag(&f, "recursive", true)?,
            files_only: false,
        },
    ))
}

/// The last part of `path` (`/` for the root).
fn name_of(path: &str) -> &str {
    match path.trim_end_matches('/').rsplit_once('/') {
        Some((_, n)) if !n.is_empty() => n,
        _ if path.starts_with('/') => "/",
        _ => path,
    }
}

/// An entry as the face writes it.
pub fn entry_json(e: &FsEntry) -> serde_json::Value {
    let kind = match e.kind.as_str() {
        k @ ("file" | "dir" | "symlink") => k,
        _ => "other",
    };
    serde_json::json!({
        "name": name_of(&e.path),
        "path": e.path,
        "type": kind,
        "size": e.size,
        "mode": format!("{:04o}", e.mode & 0o7777),
        "modified_at": super::timestamp(u64::try_from(e.mtime_ms).unwrap_or(0)),
        "target": e.target,
    })
}

/// init's answer to `call` as the client gets it; `None` when it makes no sense
/// (init broke the protocol).
pub fn answer(call: &FsCall, reply: Reply) -> Option<Response> {
    match reply {
        Reply::Refused { status, message } => {
            // Only the statuses a file system refusal can have: a forged init cannot
            // make the face answer anything else.
            let status = match status {
                400 | 403 | 404 | 409 | 413 => status,
                _ => return None,
            };
            Some(error(status, &message))
        }
        Reply::Error(e) => Some(error(502, &e)),
        Reply::Ok(v) => match call {
            FsCall::Remove { .. } => Some(Response::no_content()),
            // Opens are answered by the transfer, never as JSON.
            FsCall::Open { .. } | FsCall::Watch { .. } => None,
            FsCall::List { path, .. } => {
                let entries: Vec<FsEntry> = serde_json::from_value(v["entries"].clone()).ok()?;
                let truncated = v["truncated"].as_bool()?;
                let list: Vec<serde_json::Value> = entries.iter().map(entry_json).collect();
                Some(Response::json(
                    200,
                    &serde_json::json!({ "path": path, "entries": list, "truncated": truncated }),
                ))
            }
            FsCall::Stat { .. } | FsCall::Mkdir { .. } | FsCall::Move { .. } => {
                let e: FsEntry = serde_json::from_value(v).ok()?;
                Some(Response::json(200, &entry_json(&e)))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Params;

    fn req(line: &str, body: &str) -> Request {
        Request {
            head: crate::http::parse::parse_head(
                format!("{line} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
            )
            .unwrap(),
            body: body.as_bytes().to_vec(),
            tenant: "t".into(),
            params: Params::default(),
        }
    }

    fn message(r: Response) -> (u16, String) {
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        (r.status, v["error"].as_str().unwrap().to_string())
    }

    fn call(op: Op) -> FsCall {
        match op {
            Op::Fs(_, c) => c,
            _ => panic!(),
        }
    }

    #[test]
    fn test_requests_parse_and_refuse_in_words() {
        let id = || "sb_x".to_string();
        assert_eq!(
            call(list(&req("GET /?path=/home/user&depth=5", ""), id()).unwrap()),
            FsCall::List {
                path: "/home/user".into(),
                depth: 5
            }
        );
        assert_eq!(
            call(list(&req("GET /?path=%2Ftmp%2Fa%20b", ""), id()).unwrap()),
            FsCall::List {
                path: "/tmp/a b".into(),
                depth: 1
            }
        );
        for d in ["0", "6", "x", "-1", "1.5"] {
            assert_eq!(
                message(list(&req(&format!("GET /?path=/&depth={d}"), ""), id()).unwrap_err()),
                (400, "depth: must be a whole number from 1 to 5".into())
            );
        }
        assert_eq!(
            message(stat(&req("GET /", ""), id()).unwrap_err()),
            (400, "path: required, a path in the sandbox".into())
        );
        assert_eq!(
            message(stat(&req("GET /?path=%FF", ""), id()).unwrap_err()),
            (
                400,
                "path: must be UTF-8 (percent-encoded in the query)".into()
            )
        );
        assert_eq!(
            message(stat(&req("GET /?path=a%00b", ""), id()).unwrap_err()).0,
            400
        );
        let long = "a".repeat(MAX_PATH_BYTES);
        assert!(stat(&req(&format!("GET /?path={long}"), ""), id()).is_ok());
        assert_eq!(
            message(stat(&req(&format!("GET /?path={long}a"), ""), id()).unwrap_err()),
            (400, "path: at most 4096 bytes".into())
        );
        assert_eq!(
            call(mkdir(&req("POST /", r#"{"path":"out"}"#), id()).unwrap()),
            FsCall::Mkdir {
                path: "out".into(),
                parents: false
            }
        );
        assert_eq!(
            message(mkdir(&req("POST /", r#"{"path":"out","parents":"yes"}"#), id()).unwrap_err()),
            (400, "parents: must be true or false".into())
        );
        assert_eq!(
            call(
                mv(
                    &req("POST /", r#"{"from":"a","to":"b","overwrite":true}"#),
                    id()
                )
                .unwrap()
            ),
            FsCall::Move {
                from: "a".into(),
                to: "b".into(),
                overwrite: true
            }
        );
        assert_eq!(
            message(mv(&req("POST /", r#"{"from":"a"}"#), id()).unwrap_err()),
            (400, "to: required, a path in the sandbox".into())
        );
        assert_eq!(
            call(remove(&req("POST /", r#"{"path":"/tmp/x"}"#), id()).unwrap()),
            FsCall::Remove {
                path: "/tmp/x".into(),
                recursive: true,
                files_only: false
            }
        );
        assert_eq!(
            message(remove(&req("POST /", r#"{"path":"/tmp/x","force":true}"#), id()).unwrap_err())
                .1,
            "invalid request body: unknown field `force`; this endpoint takes path, recursive"
        );
    }

    #[test]
    fn test_answers_are_shaped_and_forged_ones_refused() {
        let e = FsEntry {
            path: "/home/user/data.csv".into(),
            kind: "file".into(),
            size: 12,
            mode: 0o100644,
            mtime_ms: 1_700_000_000_123,
            target: None,
        };
        let v = entry_json(&e);
        assert_eq!(
            v,
            serde_json::json!({"name": "data.csv", "path": "/home/user/data.csv", "type": "file", "size": 12, "mode": "0644", "modified_at": "2023-11-14T22:13:20Z", "target": null})
        );
        assert_eq!(name_of("/"), "/");
        assert_eq!(name_of("/a/b/"), "b");
        let stat = FsCall::Stat { path: "x".into() };
        let r = answer(
            &stat,
            Reply::Refused {
                status: 404,
                message: "/x: no such file or directory".into(),
            },
        )
        .unwrap();
        assert_eq!(message(r), (404, "/x: no such file or directory".into()));
        // A status a refusal cannot have, or an answer of the wrong shape: nonsense.
        assert!(answer(
            &stat,
            Reply::Refused {
                status: 200,
                message: "".into()
            }
        )
        .is_none());
        assert!(answer(&stat, Reply::Ok(serde_json::json!({"path": 1}))).is_none());
        let list = FsCall::List {
            path: "/".into(),
            depth: 1,
        };
        assert!(answer(&list, Reply::Ok(serde_json::json!({"entries": []}))).is_none());
        let r = answer(
            &list,
            Reply::Ok(serde_json::json!({"entries": [e], "truncated": false})),
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["entries"][0]["name"], "data.csv");
        assert_eq!(v["path"], "/");
    }
}
