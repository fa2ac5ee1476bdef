//! The agent's `web_search` tool: asks DuckDuckGo's HTML endpoint from the daemon's
//! host (not from a sandbox) and returns titles, URLs and snippets as text.
//!
//! Where the host cannot reach the endpoint, that is the tool's error: no result is
//! ever made up.

use std::io::Read;
use std::time::Duration;

/// The most results one search returns.
pub const MAX_RESULTS: usize = 10;
/// Results when the model does not say.
pub const DEFAULT_RESULTS: usize = 5;
/// The longest query.
pub const MAX_QUERY_BYTES: usize = 1024;
/// The most of a results page that is read.
const MAX_PAGE_BYTES: u64 = 2 << 20;

/// One hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The page's title.
    pub title: String,
    /// Its address.
    pub url: String,
    /// The engine's snippet.
    pub snippet: String,
}

/// Searches `query` at `endpoint`; at most `max` hits.
///
/// # Errors
/// A message saying why the endpoint gave nothing usable.
pub fn search(endpoint: &str, query: &str, max: usize) -> Result<Vec<Hit>, String> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(format!("the query exceeds {MAX_QUERY_BYTES} bytes"));
    }
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout(Duration::from_secs(20))
        .redirects(2)
        .user_agent(concat!("isoboxd/", env!("CARGO_PKG_VERSION")))
        .build();
    let sep = if endpoint.contains('?') { '&' } else { '?' };
    let url = format!(
        "{endpoint}{sep}q={}",
        crate::http::parse::percent_encode(query.as_bytes())
    );
    let resp = agent.get(&url).call().map_err(|e| match e {
        ureq::Error::Status(code, _) => format!("the search engine answered {code}"),
        ureq::Error::Transport(t) => format!(
            "the search engine could not be reached: {}{}",
            t.kind(),
            std::error::Error::source(&t)
                .map(|s| format!(" ({s})"))
                .unwrap_or_default()
        ),
    })?;
    let mut page = String::new();
    resp.into_reader()
        .take(MAX_PAGE_BYTES)
        .read_to_string(&mut page)
        .map_err(|e| format!("reading the search results failed: {e}"))?;
    Ok(parse_results(&page, max.clamp(1, MAX_RESULTS)))
}

/// The hits as the model (and the UI) sees them.
pub fn format_hits(hits: &[Hit]) -> String {
    if hits.is_empty() {
        return "no results\n".into();
    }
    let mut out = String::new();
    for (i, h) in hits.iter().enumerate() {
        out.push_str(&format!("{}. {}\n   {}\n", i + 1, h.title, h.url));
        if !h.snippet.is_empty() {
            out.push_str(&format!("   {}\n", h.snippet));
        }
    }
    out
}

/// Reads DuckDuckGo's HTML results: each hit is an `<a class="result__a" href=...>`
/// with its title, followed by an element of class `result__snippet`.
pub fn parse_results(page: &str, max: usize) -> Vec<Hit> {
    let mut hits = Vec::new();
    let mut rest = page;
    while hits.len() < max {
        let Some(at) = rest.find("result__a") else {
            break;
        };
        // The tag this class belongs to.
        let Some(tag_start) = rest[..at].rfind('<') else {
            rest = &rest[at + 9..];
            continue;
        };
        let Some(tag_len) = rest[tag_start..].find('>') else {
            break;
        };
        let tag = &rest[tag_start..tag_start + tag_len];
        let body_start = tag_start + tag_len + 1;
        let body_end = rest[body_start..]
            .find("</a>")
            .map_or(rest.len(), |e| body_start + e);
        let title = text_of(&rest[body_start..body_end]);
        let href = attr(tag, "href").map(|h| real_url(&decode_entities(h)));
        rest = &rest[body_end..];
        // Its snippet: before the next hit's anchor.
        let next = rest.find("result__a").unwrap_or(rest.len());
        let snippet = rest[..next].find("result__snippet").and_then(|s| {
            let open = rest[s..].find('>')? + s + 1;
            // The element's end (inline tags such as <b> inside it are kept as text).
            let close = ["</a>", "</div>", "</td>", "</span>"]
                .iter()
                .filter_map(|t| rest[open..].find(t))
                .min()
                .map_or(rest.len(), |c| open + c);
            Some(text_of(rest.get(open..close)?))
        });
        if let Some(url) = href.filter(|u| u.starts_with("http://") || u.starts_with("https://")) {
            if !title.is_empty() {
                hits.push(Hit {
                    title,
                    url,
                    snippet: snippet.unwrap_or_default(),
                });
            }
        }
    }
    hits
}

/// A quoted attribute's value in a tag.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let mut from = 0;
    while let Some(i) = tag[from..].find(name) {
        let at = from + i;
        let after = &tag[at + name.len()..];
        let preceded = at == 0 || tag.as_bytes()[at - 1].is_ascii_whitespace();
        if preceded {
            if let Some(v) = after.trim_start().strip_prefix('=') {
                let v = v.trim_start();
                let q = v.chars().next()?;
                if q == '"' || q == '\'' {
                    let end = v[1..].find(q)?;
                    return Some(&v[1..=end]);
                }
            }
        }
        from = at + name.len();
    }
    None
}

/// DuckDuckGo links through `//duckduckgo.com/l/?uddg=<target>`: the target.
fn real_url(href: &str) -> String {
    if let Some(q) = href.split_once('?').map(|(_, q)| q) {
        for pair in q.split('&') {
            if let Some(v) = pair.strip_prefix("uddg=") {
                return percent_decode(v);
            }
        }
    }
    if let Some(rest) = href.strip_prefix("//") {
        return format!("https://{rest}");
    }
    href.to_string()
}

/// Text of an HTML fragment: tags dropped, entities decoded, whitespace collapsed.
fn text_of(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for ch in html.chars() {
        match ch {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    decode_entities(&out)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn decode_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        // Byte search: the 12th byte may fall inside a character.
        let Some(end) = rest.bytes().take(12).position(|b| b == b';') else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let ent = &rest[1..end];
        let ch = match ent {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "nbsp" => Some(' '),
            _ => ent
                .strip_prefix("#x")
                .or_else(|| ent.strip_prefix("#X"))
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| ent.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A percent-encoded value decoded (`+` is a space), or as given when it is not valid
/// percent-encoding.
fn percent_decode(s: &str) -> String {
    crate::http::parse::percent_decode_bytes(s).map_or_else(
        || s.to_string(),
        |b| String::from_utf8_lossy(&b).into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"<div class="result results_links results_links_deep web-result ">
<h2 class="result__title">
<a rel="nofollow" class="result__a" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fexample.com%2Fa%3Fx%3D1%26y%3D2&amp;rut=abc">Example &amp; <b>Co</b></a>
</h2>
<a class="result__snippet" href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fexample.com%2F">The <b>example</b> domain&#x27;s page.</a>
</div>
<div class="result"><a rel="nofollow" class="result__a" href="https://direct.example.org/">Direct</a></div>
<div class="result"><a class="result__a" href="javascript:alert(1)">Bad</a></div>
<div class="result"><a class="result__a" href="https://third.example.net/">Third</a>
<div class="result__snippet">third snippet</div></div>"#;

    #[test]
    fn test_parses_titles_real_urls_and_snippets() {
        let hits = parse_results(PAGE, 10);
        assert_eq!(
            hits,
            vec![
                Hit {
                    title: "Example & Co".into(),
                    url: "https://example.com/a?x=1&y=2".into(),
                    snippet: "The example domain's page.".into(),
                },
                Hit {
                    title: "Direct".into(),
                    url: "https://direct.example.org/".into(),
                    snippet: String::new(),
                },
                Hit {
                    title: "Third".into(),
                    url: "https://third.example.net/".into(),
                    snippet: "third snippet".into(),
                },
            ]
        );
        assert_eq!(parse_results(PAGE, 1).len(), 1);
        assert!(parse_results("<html>no hits</html>", 5).is_empty());
        assert!(parse_results("<a class=\"result__a\" href=\"https://x", 5).is_empty());
        let text = format_hits(&hits[..1]);
        assert_eq!(
            text,
            "1. Example & Co\n   https://example.com/a?x=1&y=2\n   The example domain's page.\n"
        );
        assert_eq!(format_hits(&[]), "no results\n");
    }

    #[test]
    fn test_odd_pages_never_panic() {
        // Entities before multi-byte text (a CJK or Cyrillic results page).
        assert_eq!(decode_entities("&amp;日本語"), "&日本語");
        assert_eq!(decode_entities("&quot; Привет мир"), "\" Привет мир");
        assert_eq!(decode_entities("&日本語;"), "&日本語;");
        // A snippet whose link holds `result__a` and no closing tag after it.
        let page = "<a class=\"result__a\" href=\"https://a.example/\">A</a>\
                    <a class=\"result__snippet\" href=\"https://x/result__a\">never closed";
        let _ = parse_results(page, 5);
        // Every prefix of a real-looking page (a page cut at the read limit).
        let page = PAGE.replace("Example", "例え&amp;日本");
        for i in (0..page.len()).filter(|&i| page.is_char_boundary(i)) {
            let _ = parse_results(&page[..i], 10);
        }
    }

    #[test]
    fn test_percent_coding() {
        assert_eq!(percent_decode("a%20b%26c%2F%C3%BC"), "a b&c/ü");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn test_unreachable_endpoint_is_an_error() {
        // A loopback port nobody listens on (bound, then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = search(&format!("http://127.0.0.1:{port}/html/"), "x", 3).unwrap_err();
        assert!(e.contains("could not be reached"), "{e}");
    }
}
