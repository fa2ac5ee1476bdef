//! Which face a request is on: the isobox face at `/` (`api`) or the WBX face under
//! `/wbx` (`wbx`). Each has its own route table, body caps, admission classes and
//! error shape; the connection code asks this module, and dispatches to the face.

use crate::api::{self, routes::Spec};
use crate::http::{Params, Response};

/// A request's route, on one of the faces.
#[derive(Debug, Clone, Copy)]
pub enum Routed {
    /// The isobox face (`/`).
    Isobox(&'static Spec),
    /// The WBX face (`/wbx`).
    Wbx(&'static crate::wbx::routes::Spec),
    /// The eryx face (`/eryx`).
    Eryx(&'static crate::eryx::Spec),
}

impl Routed {
    /// The row of `method` and `path` on the face the path is under (`/wbx/…`: the WBX
    /// face; anything else: the isobox face), and the path's parameters.
    ///
    /// # Errors
    /// 404 or 405, in that face's shape.
    pub(crate) fn resolve(method: &str, path: &str) -> Result<(Routed, Params), Response> {
        if let Some(rest) = under(path, crate::eryx::BASE) {
            return crate::eryx::resolve(method, rest).map(|(s, p)| (Routed::Eryx(s), p));
        }
        match wbx_path(path) {
            Some(rest) => {
                crate::wbx::routes::resolve(method, rest).map(|(s, p)| (Routed::Wbx(s), p))
            }
            None => api::resolve(method, path)
                .map(|(s, p)| (Routed::Isobox(s), p))
                .map_err(api::error::route_error),
        }
    }

    /// The face `path` is under (the `face` label of `/metrics`).
    pub(crate) fn face_of(path: &str) -> &'static str {
        if under(path, crate::eryx::BASE).is_some() {
            "eryx"
        } else if wbx_path(path).is_some() {
            "wbx"
        } else {
            "isobox"
        }
    }

    /// (face, path pattern): the labels `/metrics` counts the request under.
    pub(crate) fn label(self) -> (&'static str, &'static str) {
        match self {
            Routed::Isobox(s) => ("isobox", s.pattern),
            Routed::Wbx(s) => ("wbx", s.pattern),
            Routed::Eryx(s) => ("eryx", s.pattern),
        }
    }

    /// The answer when the daemon's budget for large bodies is taken (503 with
    /// `Retry-After: 1`, in the face's shape).
    pub(crate) fn busy_bodies(self) -> Response {
        const WHY: &str =
            "the server is receiving too many large request bodies at once; retry in a second";
        let resp = match self {
            Routed::Isobox(_) => Response::error(503, "busy", Some(WHY)),
            Routed::Wbx(_) => crate::wbx::error(503, WHY),
            Routed::Eryx(_) => crate::eryx::error(503, "unavailable", WHY),
        };
        resp.with_header("Retry-After", "1")
    }

    pub(crate) fn body_cap(self) -> usize {
        match self {
            Routed::Isobox(s) => s.body_cap,
            Routed::Wbx(s) => s.body_cap,
            Routed::Eryx(s) => s.body_cap,
        }
    }

    pub(crate) fn class(self) -> crate::admission::Class {
        match self {
            Routed::Isobox(s) => s.class,
            Routed::Wbx(s) => s.class,
            Routed::Eryx(s) => s.class,
        }
    }

    pub(crate) fn over_cap(self) -> Response {
        match self {
            Routed::Isobox(s) => s.over_cap(),
            Routed::Wbx(s) => s.over_cap(),
            Routed::Eryx(s) => s.over_cap(),
        }
    }

    /// An answer made in the isobox shape (admission's), in this route's face's
    /// (`authorization`: the request's header, which the eryx face's codes tell apart).
    pub(crate) fn shaped(self, resp: Response, authorization: Option<&str>) -> Response {
        match self {
            Routed::Isobox(_) => resp,
            Routed::Wbx(_) => crate::wbx::reshape(resp),
            Routed::Eryx(_) => crate::eryx::reshape(resp, authorization),
        }
    }
}

/// The part of `path` under the WBX face's base, if it is there.
fn wbx_path(path: &str) -> Option<&str> {
    under(path, crate::wbx::BASE)
}

/// The part of `path` under `base`, if it is there (`base` itself: `/`).
fn under<'a>(path: &'a str, base: &str) -> Option<&'a str> {
    match path.strip_prefix(base)? {
        "" => Some("/"),
        r if r.starts_with('/') => Some(r),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_paths_under_wbx_go_to_its_face() {
        assert_eq!(wbx_path("/wbx"), Some("/"));
        assert_eq!(wbx_path("/wbx/v1/sandboxes"), Some("/v1/sandboxes"));
        assert_eq!(wbx_path("/wbxx/v1"), None);
        assert_eq!(wbx_path("/execute"), None);
        assert!(matches!(
            Routed::resolve("GET", "/wbx/v1/templates"),
            Ok((Routed::Wbx(_), _))
        ));
        assert!(matches!(
            Routed::resolve("POST", "/execute"),
            Ok((Routed::Isobox(_), _))
        ));
        let r = Routed::resolve("GET", "/wbx/nothing").unwrap_err();
        assert_eq!(r.status, 404);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v, serde_json::json!({"error": "no such endpoint"}));
        assert!(matches!(
            Routed::resolve("POST", "/eryx/v1/execute"),
            Ok((Routed::Eryx(_), _))
        ));
        assert_eq!(Routed::face_of("/eryx/v1/stream"), "eryx");
        assert_eq!(Routed::face_of("/eryxx"), "isobox");
        let r = Routed::resolve("GET", "/eryx/v1/nothing").unwrap_err();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        let r = Routed::resolve("GET", "/nothing").unwrap_err();
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"], "not_found");
    }
}
