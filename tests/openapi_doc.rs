//! The served OpenAPI document is valid OpenAPI 3.1 (checked by openapi-spec-validator,
//! installed by `make test` into /tmp/isobox-test-venv) and lists every route the
//! routers know (the isobox face's and the WBX face's), with its methods, and no
//! route that does not exist.

mod common;
use common::{test_python, Daemon};

#[test]
fn test_openapi_valid_and_complete() {
    let d = Daemon::start();
    let paths = std::env::temp_dir().join(format!("isobox-paths-{}", std::process::id()));
    let text: String = isobox::api::routes::paths()
        .iter()
        .chain(isobox::wbx::routes::paths().iter())
        .chain(isobox::eryx::paths().iter())
        .map(|(p, m)| format!("{p}\t{m}\n"))
        .collect();
    std::fs::write(&paths, text).unwrap();
    let venv = test_python();
    let out = std::process::Command::new(&venv)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/openapi/check.py"
        ))
        .arg(format!("http://{}", d.addr))
        .arg(&paths)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {venv} (run `make test-venv`): {e}"));
    let _ = std::fs::remove_file(&paths);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "openapi check failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    d.stop();
}

/// Which requests spend the per-client rate limit is said one way everywhere: the
/// route tables decide, and README, llms.txt, the OpenAPI document and `--help` name
/// exactly those routes, in the same words.
#[test]
fn test_one_story_on_the_rate_limit() {
    use isobox::admission::Class;
    let spends = |c: Class| matches!(c, Class::Starts | Class::MemoryStarts);
    let mut routes: Vec<String> = Vec::new();
    for r in isobox::api::routes::ROUTES {
        if spends(r.route.class) {
            routes.extend(r.methods.iter().map(|m| format!("{m} {}", r.pattern)));
        }
    }
    for r in isobox::wbx::routes::ROUTES {
        if spends(r.route.class) {
            routes.extend(r.methods.iter().map(|m| format!("{m} /wbx{}", r.pattern)));
        }
    }
    // A HEAD of a GET route is that request without its body: the docs name the GET.
    for r in isobox::eryx::ROUTES {
        if spends(r.route.class) {
            routes.extend(
                r.methods
                    .iter()
                    .filter(|m| **m != "HEAD")
                    .map(|m| format!("{m} /eryx{}", r.pattern)),
            );
        }
    }
    assert!(routes.len() >= 5, "{routes:?}");
    // The eryx face limits per org (its document), not per client: a bucket per tenant.
    for r in isobox::eryx::ROUTES {
        assert_eq!(r.route.class, Class::Tenant, "/eryx{}", r.pattern);
    }
    let join = |items: Vec<String>| {
        let (last, rest) = items.split_last().unwrap();
        format!("{} and {last}", rest.join(", "))
    };
    let ticked = join(routes.iter().map(|r| format!("`{r}`")).collect());
    let root = env!("CARGO_MANIFEST_DIR");
    let eryx =
        "(the eryx face, `/eryx`, has a bucket per tenant instead: `ISOBOX_ERYX_RATE_PER_MIN`)";
    for doc in ["README.md", "docs/llms.txt", "docs/openapi.yaml"] {
        let text = std::fs::read_to_string(format!("{root}/{doc}")).unwrap();
        assert!(
            text.contains(&format!("{ticked} {eryx}")),
            "{doc} does not name the rate-limited requests as `{ticked} {eryx}`"
        );
    }
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_isoboxd"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let plain = format!(
        "{} (empty: 429 rate_limited; the eryx face has a bucket per tenant instead: ISOBOX_ERYX_RATE_PER_MIN)",
        join(routes.clone())
    );
    assert!(
        help.contains(&plain),
        "--help does not say `{plain}`:\n{help}"
    );
}
