//! The route table: one match from (method, path) to a route. The whole API on one screen.

/// Every route the daemon serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
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
    ("/healthz", "GET, HEAD"),
    ("/readyz", "GET, HEAD"),
    ("/runtimes", "GET, HEAD"),
    ("/llms.txt", "GET, HEAD"),
    ("/openapi.yaml", "GET, HEAD"),
    ("/execute", "POST"),
];

/// Resolves a request. `HEAD` is accepted wherever `GET` is.
///
/// # Errors
/// [`RouteError`] when the path is unknown or the method is not allowed on it.
pub fn route(method: &str, path: &str) -> Result<Route, RouteError> {
    let get = method == "GET" || method == "HEAD";
    let (route, allowed) = match path {
        "/healthz" => (Route::Healthz, get),
        "/readyz" => (Route::Readyz, get),
        "/runtimes" => (Route::Runtimes, get),
        "/llms.txt" => (Route::LlmsTxt, get),
        "/openapi.yaml" => (Route::OpenApi, get),
        "/execute" => (Route::Execute, method == "POST"),
        _ => return Err(RouteError::NotFound),
    };
    if allowed {
        Ok(route)
    } else {
        let allow = PATHS
            .iter()
            .find(|(p, _)| *p == path)
            .map_or("", |(_, m)| *m);
        Err(RouteError::MethodNotAllowed(allow))
    }
}

impl Route {
    /// The body cap of this route and the status answered above it.
    pub fn body_cap(self) -> usize {
        match self {
            Route::Execute => crate::http::limits::EXECUTE_BODY_BYTES,
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
            let m = methods.split(", ").next().unwrap();
            assert!(route(m, p).is_ok(), "{m} {p}");
        }
    }
}
