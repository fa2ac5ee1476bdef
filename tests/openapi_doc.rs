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
