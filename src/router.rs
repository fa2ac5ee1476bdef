//! The route table: one match from (method, path) to a route. The whole API on one screen.

/// Every route the daemon serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /`: the web UI.
    Ui,
    /// `GET /healthz`
    Healthz,
    /// `GET /readyz`
    Readyz,
    /// `GET /runtimes`
    Runtimes,
    /// `GET /llms.txt`
    LlmsTxt,
    /// `GET /openapi.yaml`
    OpenApi,
    /// `POST /execute`
    Execute,
    /// `POST /v1/sessions`
    SessionCreate,
    /// `DELETE /v1/sessions/{id}`
    Session,
    /// `POST /v1/sessions/{id}/exec`
    SessionExec,
    /// `GET`, `PUT`, `DELETE /v1/sessions/{id}/fs`
    SessionFs,
    /// `GET /v1/memory/{namespace}`: list keys.
    MemoryList,
    /// `GET`, `PUT`, `DELETE /v1/memory/{namespace}/{key}` (the key may contain `/`).
    MemoryKey,
    /// `GET`, `POST /v1/volumes`
    Volumes,
    /// `GET`, `DELETE /v1/volumes/{id}`
    Volume,
    /// `GET /v1/agent` (availability), `POST /v1/agent` (the tool-calling loop).
    Agent,
}

/// Why no route matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteError {
    /// No such path: 404.
    NotFound,
    /// Known path, wrong method: 405 with this `Allow` value.
    MethodNotAllowed(&'static str),
}

/// Every (path, methods) pair, for `Allow`, the OpenAPI coverage test and docs.
pub const PATHS: &[(&str, &str)] = &[
    ("/", "GET, HEAD"),
    ("/healthz", "GET, HEAD"),
    ("/readyz", "GET, HEAD"),
    ("/runtimes", "GET, HEAD"),
    ("/llms.txt", "GET, HEAD"),
    ("/openapi.yaml", "GET, HEAD"),
    ("/execute", "POST"),
    ("/v1/sessions", "POST"),
    ("/v1/sessions/{id}", "DELETE"),
    ("/v1/sessions/{id}/exec", "POST"),
    ("/v1/sessions/{id}/fs", "GET, HEAD, PUT, DELETE"),
    ("/v1/memory/{namespace}", "GET, HEAD"),
    ("/v1/memory/{namespace}/{key}", "GET, HEAD, PUT, DELETE"),
    ("/v1/volumes", "GET, HEAD, POST"),
    ("/v1/volumes/{id}", "GET, HEAD, DELETE"),
    ("/v1/agent", "GET, HEAD, POST"),
];

/// `(namespace, key)` of a `/v1/memory/...` path, still percent-encoded; the key is
/// everything after the namespace's slash (it may contain `/`).
pub fn memory_parts(path: &str) -> Option<(&str, Option<&str>)> {
    let rest = path.strip_prefix("/v1/memory/")?;
    match rest.split_once('/') {
        None => (!rest.is_empty()).then_some((rest, None)),
        Some((ns, key)) => (!ns.is_empty() && !key.is_empty()).then_some((ns, Some(key))),
    }
}

/// The `{id}` of a `/v1/volumes/{id}` path.
pub fn volume_id(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/v1/volumes/")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// The `{id}` of a `/v1/sessions/{id}...` path (not validated here).
pub fn session_id(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// The PATHS pattern a concrete path matches (`{id}` standing for one segment).
fn pattern(path: &str) -> Option<&'static str> {
    if let Some(p) = PATHS.iter().map(|(p, _)| *p).find(|p| *p == path) {
        return Some(p);
    }
    if let Some((_, key)) = memory_parts(path) {
        return Some(if key.is_some() {
            "/v1/memory/{namespace}/{key}"
        } else {
            "/v1/memory/{namespace}"
        });
    }
    if volume_id(path).is_some() {
        return Some("/v1/volumes/{id}");
    }
    let id = session_id(path)?;
    let tail = &path["/v1/sessions/".len() + id.len()..];
    match tail {
        "" => Some("/v1/sessions/{id}"),
        "/exec" => Some("/v1/sessions/{id}/exec"),
        "/fs" => Some("/v1/sessions/{id}/fs"),
        _ => None,
    }
}

/// Resolves a request. `HEAD` is accepted wherever `GET` is.
///
/// # Errors
/// [`RouteError`] when the path is unknown or the method is not allowed on it.
pub fn route(method: &str, path: &str) -> Result<Route, RouteError> {
    let get = method == "GET" || method == "HEAD";
    let pat = pattern(path).ok_or(RouteError::NotFound)?;
    let (route, allowed) = match pat {
        "/" => (Route::Ui, get),
        "/healthz" => (Route::Healthz, get),
        "/readyz" => (Route::Readyz, get),
        "/runtimes" => (Route::Runtimes, get),
        "/llms.txt" => (Route::LlmsTxt, get),
        "/openapi.yaml" => (Route::OpenApi, get),
        "/execute" => (Route::Execute, method == "POST"),
        "/v1/sessions" => (Route::SessionCreate, method == "POST"),
        "/v1/sessions/{id}" => (Route::Session, method == "DELETE"),
        "/v1/sessions/{id}/exec" => (Route::SessionExec, method == "POST"),
        "/v1/sessions/{id}/fs" => (
            Route::SessionFs,
            get || method == "PUT" || method == "DELETE",
        ),
        "/v1/memory/{namespace}" => (Route::MemoryList, get),
        "/v1/memory/{namespace}/{key}" => (
            Route::MemoryKey,
            get || method == "PUT" || method == "DELETE",
        ),
        "/v1/volumes" => (Route::Volumes, get || method == "POST"),
        "/v1/volumes/{id}" => (Route::Volume, get || method == "DELETE"),
        "/v1/agent" => (Route::Agent, get || method == "POST"),
        _ => return Err(RouteError::NotFound),
    };
    if allowed {
        Ok(route)
    } else {
        let allow = PATHS
            .iter()
            .find(|(p, _)| *p == pat)
            .map_or("", |(_, m)| *m);
        Err(RouteError::MethodNotAllowed(allow))
    }
}

impl Route {
    /// The body cap of this route and the status answered above it.
    pub fn body_cap(self) -> usize {
        match self {
            Route::Execute | Route::SessionExec => crate::http::limits::EXECUTE_BODY_BYTES,
            Route::SessionFs => crate::http::limits::UPLOAD_BODY_BYTES,
            Route::MemoryKey => crate::http::limits::KV_VALUE_BODY_BYTES,
            Route::Agent => crate::http::limits::AGENT_BODY_BYTES,
            _ => crate::http::limits::DEFAULT_BODY_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_routes_and_methods() {
        assert_eq!(route("GET", "/healthz"), Ok(Route::Healthz));
        assert_eq!(route("HEAD", "/healthz"), Ok(Route::Healthz));
        assert_eq!(route("POST", "/execute"), Ok(Route::Execute));
        assert_eq!(
            route("GET", "/execute"),
            Err(RouteError::MethodNotAllowed("POST"))
        );
        assert_eq!(
            route("get", "/healthz"),
            Err(RouteError::MethodNotAllowed("GET, HEAD"))
        );
        assert_eq!(route("GET", "/nope"), Err(RouteError::NotFound));
        assert_eq!(route("GET", "/healthz/"), Err(RouteError::NotFound));
    }

    #[test]
    fn test_every_path_routes() {
        for (p, methods) in PATHS {
            let p = p.replace("{id}", "0123abcd");
            for m in methods.split(", ") {
                assert!(route(m, &p).is_ok(), "{m} {p}");
            }
        }
    }

    #[test]
    fn test_session_paths() {
        assert_eq!(route("POST", "/v1/sessions"), Ok(Route::SessionCreate));
        assert_eq!(route("DELETE", "/v1/sessions/ab"), Ok(Route::Session));
        assert_eq!(
            route("POST", "/v1/sessions/ab/exec"),
            Ok(Route::SessionExec)
        );
        assert_eq!(route("PUT", "/v1/sessions/ab/fs"), Ok(Route::SessionFs));
        assert_eq!(
            route("GET", "/v1/sessions/ab"),
            Err(RouteError::MethodNotAllowed("DELETE"))
        );
        assert_eq!(route("GET", "/v1/sessions/"), Err(RouteError::NotFound));
        assert_eq!(route("GET", "/v1/sessions//fs"), Err(RouteError::NotFound));
        assert_eq!(
            route("GET", "/v1/sessions/a/b/fs"),
            Err(RouteError::NotFound)
        );
        assert_eq!(
            route("GET", "/v1/sessions/a/fs/"),
            Err(RouteError::NotFound)
        );
        assert_eq!(session_id("/v1/sessions/ab/fs"), Some("ab"));
    }

    #[test]
    fn test_memory_and_volume_paths() {
        assert_eq!(route("GET", "/v1/memory/facts"), Ok(Route::MemoryList));
        assert_eq!(route("PUT", "/v1/memory/facts/pi"), Ok(Route::MemoryKey));
        assert_eq!(route("GET", "/v1/memory/facts/a/b/c"), Ok(Route::MemoryKey));
        assert_eq!(memory_parts("/v1/memory/f/a/b"), Some(("f", Some("a/b"))));
        assert_eq!(route("GET", "/v1/memory/"), Err(RouteError::NotFound));
        assert_eq!(route("GET", "/v1/memory/f/"), Err(RouteError::NotFound));
        assert_eq!(route("GET", "/v1/memory//k"), Err(RouteError::NotFound));
        assert_eq!(
            route("PUT", "/v1/memory/f"),
            Err(RouteError::MethodNotAllowed("GET, HEAD"))
        );
        assert_eq!(route("POST", "/v1/volumes"), Ok(Route::Volumes));
        assert_eq!(route("DELETE", "/v1/volumes/v1"), Ok(Route::Volume));
        assert_eq!(route("GET", "/v1/volumes/v1/x"), Err(RouteError::NotFound));
    }
}
