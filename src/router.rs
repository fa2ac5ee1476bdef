//! Path matching for route tables. A face (the isobox API in `api::routes`, and the
//! faces to come) keeps one table of [`Row`]s: a pattern, the methods it answers, and
//! whatever the face attaches (its route id, body cap, admission class and handler).
//! [`resolve`] finds the row for a request and the path's parameters, so no handler
//! parses its path again.
//!
//! Patterns are literal segments and parameters: `{name}` is exactly one non-empty
//! segment; `{name*}`, last only, is the non-empty rest of the path, slashes included
//! (a memory key). Matching is exact: no trailing slash, no empty segment. `HEAD` is
//! answered wherever `GET` is. Parameters stay percent-encoded, as sent.

use crate::http::Params;

/// One route of a face's table.
#[derive(Debug)]
pub struct Row<T: 'static> {
    /// The path pattern, e.g. `/v1/sessions/{id}/fs`.
    pub pattern: &'static str,
    /// Methods answered here (`GET` implies `HEAD`).
    pub methods: &'static [&'static str],
    /// What the face attaches to the route.
    pub route: T,
}

/// Why no route matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// No such path: 404.
    NotFound,
    /// Known path, wrong method: 405 with this `Allow` value (every method the path
    /// answers, in table order).
    MethodNotAllowed(String),
}

/// Matches `path` against `pattern`, filling `params` when given; `false` (and
/// `params` left as it may be) when it does not match.
///
/// Most rows of a table fail on their first bytes, so the literal prefix (everything
/// before the first parameter, whole segments and their slashes) is compared as bytes
/// first: a table of 25 rows matched segment by segment, twice over, was a seventh of
/// a memory-KV GET's CPU.
fn matches(pattern: &'static str, path: &str, mut params: Option<&mut Params>) -> bool {
    // Both start with a slash (a pattern without one matches nothing).
    if !pattern.starts_with('/') {
        return false;
    }
    let (p, q) = (pattern.as_bytes(), path.as_bytes());
    let mut i = 0;
    while i < p.len() && p[i] != b'{' {
        if q.get(i) != Some(&p[i]) {
            return false;
        }
        i += 1;
    }
    if i == p.len() {
        // No parameter: the path is the pattern.
        return q.len() == p.len();
    }
    // Back to the start of the segment holding the `{` (a `{` inside a literal
    // segment, as `v{x}`, is literal text there): the bytes before it are equal, so
    // both stand at a segment's start, on a character boundary.
    let start = pattern[..i].rfind('/').map_or(0, |k| k + 1);
    let (mut pat, mut rest) = (&pattern[start..], &path[start..]);
    loop {
        let (seg, pat_next) = split_segment(pat);
        if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix("*}")) {
            // The rest of the path, slashes and all.
            if rest.is_empty() {
                return false;
            }
            if let Some(params) = params.as_deref_mut() {
                params.push(name, rest);
            }
            return pat_next.is_none();
        }
        let (val, rest_next) = split_segment(rest);
        if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            if val.is_empty() {
                return false;
            }
            if let Some(params) = params.as_deref_mut() {
                params.push(name, val);
            }
        } else if seg != val {
            return false;
        }
        match (pat_next, rest_next) {
            (None, None) => return true,
            (Some(p), Some(r)) => {
                pat = p;
                rest = r;
            }
            _ => return false,
        }
    }
}

/// The first segment of `s` and what follows its slash (`None`: it was the last).
fn split_segment(s: &str) -> (&str, Option<&str>) {
    match s.bytes().position(|b| b == b'/') {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

/// Orders two patterns by which segments are literal, in order (a parameter is
/// less): of two patterns matching one path, the greater has the literal where the
/// other has a parameter.
fn literal_rank(a: &str, b: &str) -> std::cmp::Ordering {
    let lit = |seg: &str| !seg.starts_with('{');
    a.split('/').map(lit).cmp(b.split('/').map(lit))
}

fn answers(methods: &[&str], method: &str) -> bool {
    methods.contains(&method) || (method == "HEAD" && methods.contains(&"GET"))
}

/// Finds the row of `table` for `method` and `path`, and the path's parameters.
///
/// # Errors
/// [`RouteError::NotFound`] when no pattern matches the path;
/// [`RouteError::MethodNotAllowed`] when some do, but none answers the method.
pub fn resolve<'t, T>(
    table: &'t [Row<T>],
    method: &str,
    path: &str,
) -> Result<(&'t Row<T>, Params), RouteError> {
    use std::cmp::Ordering;
    // One pass: of the rows matching the path, only those of the greatest literal
    // rank count (`/v1/jobs/wait` is not the job `wait` of `/v1/jobs/{id}`, for any
    // method); the first of them answering the method is the route, else every
    // method they answer is the `Allow`, in table order.
    let mut best: Option<&'t Row<T>> = None;
    let mut found: Option<&'t Row<T>> = None;
    let mut allow: Vec<&'static str> = Vec::new();
    for row in table {
        if !matches(row.pattern, path, None) {
            continue;
        }
        match best.map(|b| literal_rank(row.pattern, b.pattern)) {
            Some(Ordering::Less) => continue,
            Some(Ordering::Equal) => {}
            Some(Ordering::Greater) | None => {
                best = Some(row);
                found = None;
                allow.clear();
            }
        }
        if found.is_some() {
            continue;
        }
        if answers(row.methods, method) {
            found = Some(row);
            continue;
        }
        for m in row.methods {
            if !allow.contains(m) {
                allow.push(m);
            }
            if *m == "GET" && !allow.contains(&"HEAD") && !row.methods.contains(&"HEAD") {
                allow.push("HEAD");
            }
        }
    }
    if let Some(row) = found {
        let mut params = Params::default();
        matches(row.pattern, path, Some(&mut params));
        return Ok((row, params));
    }
    if allow.is_empty() {
        Err(RouteError::NotFound)
    } else {
        Err(RouteError::MethodNotAllowed(allow.join(", ")))
    }
}

/// Every pattern of `table` with the methods it answers, one entry per pattern in
/// table order (for docs and the OpenAPI coverage test).
pub fn paths<T>(table: &[Row<T>]) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for row in table {
        let i = match out.iter().position(|(p, _)| *p == row.pattern) {
            Some(i) => i,
            None => {
                out.push((row.pattern, Vec::new()));
                out.len() - 1
            }
        };
        for m in row.methods {
            if !out[i].1.contains(m) {
                out[i].1.push(m);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &[Row<u8>] = &[
        Row {
            pattern: "/",
            methods: &["GET", "HEAD"],
            route: 0,
        },
        Row {
            pattern: "/healthz",
            methods: &["GET", "HEAD"],
            route: 1,
        },
        Row {
            pattern: "/execute",
            methods: &["POST"],
            route: 2,
        },
        Row {
            pattern: "/v1/sessions/{id}",
            methods: &["DELETE"],
            route: 3,
        },
        Row {
            pattern: "/v1/sessions/{id}/fs",
            methods: &["GET", "HEAD"],
            route: 4,
        },
        Row {
            pattern: "/v1/sessions/{id}/fs",
            methods: &["PUT"],
            route: 5,
        },
        Row {
            pattern: "/v1/memory/{namespace}",
            methods: &["GET", "HEAD"],
            route: 6,
        },
        Row {
            pattern: "/v1/memory/{namespace}/{key*}",
            methods: &["GET", "HEAD", "PUT"],
            route: 7,
        },
        Row {
            pattern: "/v1/agent",
            methods: &["GET"],
            route: 8,
        },
        Row {
            pattern: "/v1/jobs/wait",
            methods: &["POST"],
            route: 9,
        },
        Row {
            pattern: "/v1/jobs/{id}",
            methods: &["GET", "DELETE"],
            route: 10,
        },
    ];

    #[test]
    fn test_a_literal_segment_beats_a_parameter() {
        assert_eq!(id("POST", "/v1/jobs/wait"), Ok(9));
        assert_eq!(id("GET", "/v1/jobs/job_1"), Ok(10));
        // `wait` is not a job: its path answers POST only.
        assert_eq!(
            id("GET", "/v1/jobs/wait"),
            Err(RouteError::MethodNotAllowed("POST".into()))
        );
        assert_eq!(
            id("POST", "/v1/jobs/job_1"),
            Err(RouteError::MethodNotAllowed("GET, HEAD, DELETE".into()))
        );
    }

    fn route(method: &str, path: &str) -> Result<(u8, Vec<(String, String)>), RouteError> {
        resolve(T, method, path).map(|(row, p)| {
            (
                row.route,
                p.iter()
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect(),
            )
        })
    }

    fn id(method: &str, path: &str) -> Result<u8, RouteError> {
        route(method, path).map(|(r, _)| r)
    }

    #[test]
    fn test_literal_paths_match_exactly() {
        assert_eq!(id("GET", "/"), Ok(0));
        assert_eq!(id("GET", "/healthz"), Ok(1));
        assert_eq!(id("HEAD", "/healthz"), Ok(1));
        assert_eq!(id("GET", "/healthz/"), Err(RouteError::NotFound));
        assert_eq!(id("GET", "//healthz"), Err(RouteError::NotFound));
        assert_eq!(id("GET", "healthz"), Err(RouteError::NotFound));
        assert_eq!(id("GET", ""), Err(RouteError::NotFound));
        assert_eq!(id("GET", "/nope"), Err(RouteError::NotFound));
    }

    #[test]
    fn test_wrong_method_lists_every_method_of_the_path() {
        assert_eq!(
            id("GET", "/execute"),
            Err(RouteError::MethodNotAllowed("POST".into()))
        );
        assert_eq!(
            id("get", "/healthz"),
            Err(RouteError::MethodNotAllowed("GET, HEAD".into()))
        );
        assert_eq!(
            id("DELETE", "/v1/sessions/ab/fs"),
            Err(RouteError::MethodNotAllowed("GET, HEAD, PUT".into()))
        );
        // GET implies HEAD in Allow too.
        assert_eq!(
            id("POST", "/v1/agent"),
            Err(RouteError::MethodNotAllowed("GET, HEAD".into()))
        );
        assert_eq!(id("HEAD", "/v1/agent"), Ok(8));
    }

    #[test]
    fn test_parameters_are_one_non_empty_segment() {
        assert_eq!(
            route("DELETE", "/v1/sessions/ab"),
            Ok((3, vec![("id".into(), "ab".into())]))
        );
        assert_eq!(
            route("PUT", "/v1/sessions/a%2Fb/fs"),
            Ok((5, vec![("id".into(), "a%2Fb".into())]))
        );
        assert_eq!(id("GET", "/v1/sessions/"), Err(RouteError::NotFound));
        assert_eq!(id("GET", "/v1/sessions//fs"), Err(RouteError::NotFound));
        assert_eq!(id("GET", "/v1/sessions/a/b/fs"), Err(RouteError::NotFound));
        assert_eq!(id("GET", "/v1/sessions/a/fs/"), Err(RouteError::NotFound));
    }

    #[test]
    fn test_rest_parameter_takes_slashes() {
        assert_eq!(
            route("GET", "/v1/memory/facts/a/b/c"),
            Ok((
                7,
                vec![
                    ("namespace".into(), "facts".into()),
                    ("key".into(), "a/b/c".into())
                ]
            ))
        );
        assert_eq!(id("GET", "/v1/memory/facts"), Ok(6));
        assert_eq!(id("GET", "/v1/memory/"), Err(RouteError::NotFound));
        assert_eq!(id("GET", "/v1/memory/f/"), Err(RouteError::NotFound));
        assert_eq!(id("GET", "/v1/memory//k"), Err(RouteError::NotFound));
        // As before: the key is everything after the namespace's slash.
        assert_eq!(
            route("GET", "/v1/memory/f//x"),
            Ok((
                7,
                vec![
                    ("namespace".into(), "f".into()),
                    ("key".into(), "/x".into())
                ]
            ))
        );
    }

    /// The matcher as it was before the byte-prefix pass and the single pass: the
    /// new one must answer every path of every face's table exactly as it did.
    mod reference {
        use super::super::{answers, RouteError, Row};
        use crate::http::Params;

        fn matches(pattern: &'static str, path: &str, params: &mut Params) -> bool {
            let (Some(mut pat), Some(mut rest)) =
                (pattern.strip_prefix('/'), path.strip_prefix('/'))
            else {
                return false;
            };
            if pat.is_empty() {
                return rest.is_empty();
            }
            loop {
                let (seg, pat_next) = pat
                    .split_once('/')
                    .map_or((pat, None), |(s, n)| (s, Some(n)));
                if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix("*}")) {
                    if rest.is_empty() {
                        return false;
                    }
                    params.push(name, rest);
                    return pat_next.is_none();
                }
                let (val, rest_next) = rest
                    .split_once('/')
                    .map_or((rest, None), |(s, n)| (s, Some(n)));
                if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    if val.is_empty() {
                        return false;
                    }
                    params.push(name, val);
                } else if seg != val {
                    return false;
                }
                match (pat_next, rest_next) {
                    (None, None) => return true,
                    (Some(p), Some(r)) => {
                        pat = p;
                        rest = r;
                    }
                    _ => return false,
                }
            }
        }

        fn literals(pattern: &str) -> Vec<bool> {
            pattern
                .split('/')
                .map(|seg| !seg.starts_with('{'))
                .collect()
        }

        pub fn resolve<'t, T>(
            table: &'t [Row<T>],
            method: &str,
            path: &str,
        ) -> Result<(&'t Row<T>, Params), RouteError> {
            let mut allow: Vec<&'static str> = Vec::new();
            let best = table
                .iter()
                .filter(|row| matches(row.pattern, path, &mut Params::default()))
                .map(|row| literals(row.pattern))
                .max();
            for row in table {
                let mut params = Params::default();
                if !matches(row.pattern, path, &mut params) || Some(literals(row.pattern)) != best {
                    continue;
                }
                if answers(row.methods, method) {
                    return Ok((row, params));
                }
                for m in row.methods {
                    if !allow.contains(m) {
                        allow.push(m);
                    }
                    if *m == "GET" && !allow.contains(&"HEAD") && !row.methods.contains(&"HEAD") {
                        allow.push("HEAD");
                    }
                }
            }
            if allow.is_empty() {
                Err(RouteError::NotFound)
            } else {
                Err(RouteError::MethodNotAllowed(allow.join(", ")))
            }
        }
    }

    /// Paths near every pattern of `table`: each parameter replaced by values that
    /// are and are not one segment (and by the table's literal segments, where a
    /// literal must win), and each path cut short, extended and doubled-slashed.
    fn paths_near<T>(table: &[Row<T>]) -> Vec<String> {
        let mut literals: Vec<&str> = table
            .iter()
            .flat_map(|r| r.pattern.split('/'))
            .filter(|s| !s.starts_with('{'))
            .collect();
        literals.sort_unstable();
        literals.dedup();
        let mut values = vec!["a", "", "a/b", "a%2Fb", "-", "ab/", "/x", "é", "ü/x", "{b}"];
        values.extend(literals.iter().copied());
        let mut out = vec![String::new(), "/".into(), "//".into(), "x".into()];
        for row in table {
            let segs: Vec<&str> = row.pattern.split('/').collect();
            // Every parameter gets each value in turn (the others keep "p").
            let params: Vec<usize> = (0..segs.len())
                .filter(|&i| segs[i].starts_with('{'))
                .collect();
            let fill = |pick: Option<(usize, &str)>| {
                segs.iter()
                    .enumerate()
                    .map(|(i, s)| match pick {
                        Some((j, v)) if i == j => v.to_string(),
                        _ if s.starts_with('{') => "p".to_string(),
                        _ => s.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join("/")
            };
            let mut base = vec![fill(None)];
            for &j in &params {
                for v in &values {
                    base.push(fill(Some((j, v))));
                }
            }
            for b in base {
                for i in 0..=b.len() {
                    if b.is_char_boundary(i) {
                        out.push(b[..i].to_string());
                    }
                }
                out.push(format!("{b}/"));
                out.push(format!("{b}/x"));
                out.push(format!("/{b}"));
                out.push(b.replacen('/', "//", 2));
                out.push(b);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    fn same_as_before<T: std::fmt::Debug>(table: &[Row<T>]) -> usize {
        let show = |r: Result<(&Row<T>, Params), RouteError>| {
            r.map(|(row, p)| {
                (
                    row as *const Row<T> as usize,
                    p.iter()
                        .map(|(n, v)| format!("{n}={v}"))
                        .collect::<Vec<_>>(),
                )
            })
        };
        let paths = paths_near(table);
        for path in &paths {
            for method in [
                "GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "get",
            ] {
                assert_eq!(
                    show(resolve(table, method, path)),
                    show(reference::resolve(table, method, path)),
                    "{method} {path:?}"
                );
            }
        }
        paths.len()
    }

    /// Shapes no face uses today, where a byte-prefix shortcut could differ from
    /// whole segments: a `{` inside a segment, non-ASCII literals, no leading slash.
    const ODD: &[Row<u8>] = &[
        Row {
            pattern: "/v{ver}/x",
            methods: &["GET"],
            route: 0,
        },
        Row {
            pattern: "/a{b}",
            methods: &["GET"],
            route: 1,
        },
        Row {
            pattern: "/é{id}",
            methods: &["GET"],
            route: 2,
        },
        Row {
            pattern: "/é/{id}",
            methods: &["PUT"],
            route: 3,
        },
        Row {
            pattern: "healthz",
            methods: &["GET"],
            route: 4,
        },
        Row {
            pattern: "",
            methods: &["GET"],
            route: 5,
        },
        Row {
            pattern: "{id}",
            methods: &["GET"],
            route: 6,
        },
        Row {
            pattern: "/x/{a}{b}/{rest*}",
            methods: &["GET"],
            route: 7,
        },
    ];

    #[test]
    fn test_every_face_routes_every_nearby_path_as_the_plain_matcher_did() {
        assert!(same_as_before(ODD) > 100);
        let n = same_as_before(T)
            + same_as_before(crate::api::routes::ROUTES)
            + same_as_before(crate::wbx::routes::ROUTES)
            + same_as_before(crate::eryx::ROUTES);
        assert!(n > 5_000, "{n} paths");
    }

    #[test]
    fn test_paths_lists_each_pattern_once() {
        let p = paths(T);
        assert_eq!(p.len(), 10);
        assert_eq!(
            p.iter()
                .find(|(p, _)| *p == "/v1/sessions/{id}/fs")
                .unwrap()
                .1,
            vec!["GET", "HEAD", "PUT"]
        );
    }
}
