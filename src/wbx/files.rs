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
/// relative one is relative to the user's home (init resolves it). Any bytes: names
/// made inside a sandbox need not be UTF-8 (the query carries them percent-encoded).
fn path(name: &str, v: Option<Vec<u8>>) -> Result<Vec<u8>, Response> {
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
    if p.contains(&0) {
        return Err(error(400, &format!("{name}: must not contain NUL")));
    }
    Ok(p)
}

/// `path` from the query, percent-decoded to its bytes.
fn query_path(head: &crate::http::Head) -> Result<Vec<u8>, Response> {
    path("path", head.query_param_bytes("path"))
}

/// `path` from a JSON body (a string, so UTF-8; a name that is not is reached with
/// the query's endpoints).
fn body_path(f: &Fields, name: &str) -> Result<Vec<u8>, Response> {
    path(name, f.string(name)?.map(String::into_bytes))
}

/// `GET …/fs/watch?path=&recursive=`.
pub fn watch(req: &Request, id: String) -> Result<Op, Response> {
    let path = query_path(&req.head)?;
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
        path: query_path(&req.head)?,
        head_only,
    })
}

/// `DELETE …/files?path=`: a file or symlink (a directory: 400, fs/remove takes those).
pub fn delete(req: &Request, id: String) -> Result<Op, Response> {
    Ok(Op::Fs(
        id,
        FsCall::Remove {
            path: query_path(&req.head)?,
            recursive: false,
            files_only: true,
        },
    ))
}

/// `PUT …/files?path=`, at its head: the sandbox id and the path.
pub fn put_target(
    head: &crate::http::Head,
    params: &crate::http::Params,
) -> Result<(String, Vec<u8>), Response> {
    let id = params
        .get("id")
        .filter(|i| super::sandboxes::valid_id(i))
        .ok_or_else(super::sandboxes::not_found)?
        .to_string();
    Ok((id, query_path(head)?))
}

/// `GET …/fs/stat?path=`.
pub fn stat(req: &Request, id: String) -> Result<Op, Response> {
    Ok(Op::Fs(
        id,
        FsCall::Stat {
            path: query_path(&req.head)?,
        },
    ))
}

/// `GET …/fs/list?path=&depth=`.
pub fn list(req: &Request, id: String) -> Result<Op, Response> {
    let path = query_path(&req.head)?;
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
            path: body_path(&f, "path")?,
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
            from: body_path(&f, "from")?,
            to: body_path(&f, "to")?,
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
            path: body_path(&f, "path")?,
            recursive: flag(&f, "recursive", true)?,
            files_only: false,
        },
    ))
}

/// The last part of `path` (`/` for the root).
fn name_of(path: &[u8]) -> &[u8] {
    let mut trimmed = path;
    while let Some(t) = trimmed.strip_suffix(b"/") {
        trimmed = t;
    }
    match trimmed.iter().rposition(|&b| b == b'/') {
        Some(i) if i + 1 < trimmed.len() => &trimmed[i + 1..],
        _ if path.starts_with(b"/") => b"/",
        _ => path,
    }
}

/// A path as JSON shows it: its text, with any bytes that are not UTF-8 replaced.
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Sets `v[key]` to path `p` as text and, when `p` is not UTF-8, `v[key_encoded]`
/// to its bytes percent-encoded, which `?path=` takes as it is.
pub fn put_path(v: &mut serde_json::Value, key: &str, p: &[u8]) {
    v[key] = text(p).into();
    if std::str::from_utf8(p).is_err() {
        v[format!("{key}_encoded")] = crate::http::parse::percent_encode_path(p).into();
    }
}

/// An entry as the face writes it. A path (or a symlink's target) that is not UTF-8
/// also comes percent-encoded in `path_encoded` (`target_encoded`).
pub fn entry_json(e: &FsEntry) -> serde_json::Value {
    let kind = match e.kind.as_str() {
        k @ ("file" | "dir" | "symlink") => k,
        _ => "other",
    };
    let mut v = serde_json::json!({
        "name": text(name_of(&e.path)),
        "type": kind,
        "size": e.size,
        "mode": format!("{:04o}", e.mode & 0o7777),
        "modified_at": super::timestamp(u64::try_from(e.mtime_ms).unwrap_or(0)),
        "target": null,
    });
    put_path(&mut v, "path", &e.path);
    if let Some(t) = &e.target {
        put_path(&mut v, "target", t);
    }
    v
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
                    &serde_json::json!({ "path": text(path), "entries": list, "truncated": truncated }),
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
            call(stat(&req("GET /?path=%2Fa%FF%2B", ""), id()).unwrap()),
            FsCall::Stat {
                path: b"/a\xff+".to_vec()
            }
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
        assert_eq!(name_of(b"/"), b"/");
        assert_eq!(name_of(b"/a/b/"), b"b");
        assert_eq!(name_of(b"/a/b//"), b"b");
        assert_eq!(name_of(b"rel"), b"rel");
        // A name that is not UTF-8: shown with U+FFFD, and as bytes `?path=` takes.
        let odd = FsEntry {
            path: b"/home/user/a\xff\xfe+b".to_vec(),
            target: Some(b"/t\xff".to_vec()),
            kind: "symlink".into(),
            ..e.clone()
        };
        let v = entry_json(&odd);
        assert_eq!(v["name"], "a\u{fffd}\u{fffd}+b");
        assert_eq!(v["path"], "/home/user/a\u{fffd}\u{fffd}+b");
        assert_eq!(v["path_encoded"], "/home/user/a%FF%FE%2Bb");
        assert_eq!(v["target"], "/t\u{fffd}");
        assert_eq!(v["target_encoded"], "/t%FF");
        let back = req(
            &format!("GET /?path={}", v["path_encoded"].as_str().unwrap()),
            "",
        );
        assert_eq!(query_path(&back.head).unwrap(), odd.path);
        // On the wire a path that is not UTF-8 goes as bytes, one that is as a string.
        let wire = serde_json::to_value(&odd).unwrap();
        assert_eq!(wire["path"][11], b'a');
        assert_eq!(serde_json::from_value::<FsEntry>(wire).unwrap(), odd);
        assert_eq!(
            serde_json::to_value(&e).unwrap()["path"],
            "/home/user/data.csv"
        );
        assert!(entry_json(&e).get("path_encoded").is_none());
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
