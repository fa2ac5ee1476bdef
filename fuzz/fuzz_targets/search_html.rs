//! The agent's `web_search` results parser on arbitrary pages (a search engine's HTML,
//! cut at the read limit, in any script): it must never panic (the daemon aborts on a
//! panic), and what it returns must be usable hits.
#![no_main]

use isobox::agent::search::{format_hits, parse_results, MAX_RESULTS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let page = String::from_utf8_lossy(data);
    let hits = parse_results(&page, MAX_RESULTS);
    assert!(hits.len() <= MAX_RESULTS);
    for h in &hits {
        assert!(!h.title.is_empty());
        assert!(
            h.url.starts_with("http://") || h.url.starts_with("https://"),
            "{:?}",
            h.url
        );
    }
    let _ = format_hits(&hits);
});
