//! Embeds `runtimes/*.toml` into the binary so `isoboxd` runs with no files beside it,
//! and the web UI's third-party scripts (`ui/vendor`, from npm) when they are there.
use std::fmt::Write;

/// The UI's vendored files: (name served under `/ui/`, path under `ui/vendor`, type).
const UI_VENDOR: &[(&str, &str, &str)] = &[
    (
        "xterm.js",
        "node_modules/@xterm/xterm/lib/xterm.js",
        "text/javascript; charset=utf-8",
    ),
    (
        "xterm.css",
        "node_modules/@xterm/xterm/css/xterm.css",
        "text/css; charset=utf-8",
    ),
    (
        "addon-fit.js",
        "node_modules/@xterm/addon-fit/lib/addon-fit.js",
        "text/javascript; charset=utf-8",
    ),
    // CodeMirror 6, bundled from `ui/vendor/editor.js` by `make ui-vendor`.
    (
        "editor.js",
        "dist/editor.js",
        "text/javascript; charset=utf-8",
    ),
];

/// `ui_vendor.rs`: every vendored file, or none (with a warning) when `make ui-vendor`
/// has not fetched them: the page then says what is missing instead of a terminal, and
/// the notebook's cells are plain text areas.
fn ui_vendor() {
    println!("cargo:rerun-if-changed=ui/vendor/package-lock.json");
    let dir = std::path::Path::new("ui/vendor");
    let mut src = String::from(
        "/// The UI's vendored files (`ui/vendor`, from npm): (name, content type, bytes).\n\
         pub const UI_VENDOR: &[(&str, &str, &[u8])] = &[\n",
    );
    for (_, rel, _) in UI_VENDOR {
        // A file that is not there makes cargo run this again on every build, until
        // `make ui-vendor` has fetched it.
        println!("cargo:rerun-if-changed={}", dir.join(rel).display());
    }
    let missing: Vec<&str> = UI_VENDOR
        .iter()
        .filter(|(_, rel, _)| !dir.join(rel).is_file())
        .map(|(name, _, _)| *name)
        .collect();
    if missing.is_empty() {
        for (name, rel, ctype) in UI_VENDOR {
            let p = dir.join(rel);
            let abs = std::fs::canonicalize(&p).expect("vendored file path");
            writeln!(
                src,
                "    ({name:?}, {ctype:?}, include_bytes!({:?})),",
                abs.display().to_string()
            )
            .expect("write to string");
        }
    } else {
        println!(
            "cargo:warning=the web UI's terminal and code editor are left out of this build: {} missing (run `make ui-vendor`)",
            missing.join(", ")
        );
    }
    src.push_str("];\n");
    let out =
        std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("ui_vendor.rs");
    std::fs::write(out, src).expect("write ui_vendor.rs");
}

/// Compiles the static programs without libc that isoboxd embeds (x86-64 Linux only):
/// `src/sandbox/start.c` into `$OUT_DIR/isobox-start` (`sandbox::start::BINARY`) and
/// `src/sandbox/started.c` into `$OUT_DIR/isobox-started` (`sandbox::start::HOOK`).
/// Only the compiler is taken from the `cc` crate (`CC`), none of its default flags,
/// `CFLAGS` or sanitizer flags (a sanitizer's or profiler's runtime cannot link into a
/// program without libc). When one does not compile, the build says so and goes on
/// without it: without `isobox-start` isoboxd writes the start frame with the shell, as
/// on other CPUs; without `isobox-started` cold runs use the frame.
fn static_programs() {
    println!("cargo::rustc-check-cfg=cfg(isobox_static)");
    println!("cargo::rustc-check-cfg=cfg(isobox_hook)");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-changed=src/sandbox/start.c");
    println!("cargo:rerun-if-changed=src/sandbox/started.c");
    println!("cargo:rerun-if-changed=src/sandbox/nolibc.h");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if arch != "x86_64" || os != "linux" {
        return;
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .cargo_warnings(false)
        .get_compiler();
    for (src, name, cfg, without) in [
        (
            "src/sandbox/start.c",
            "isobox-start",
            "isobox_static",
            "isoboxd uses /bin/sh for the start frame",
        ),
        (
            "src/sandbox/started.c",
            "isobox-started",
            "isobox_hook",
            "cold runs signal their start with the frame, inside the sandbox",
        ),
    ] {
        let mut cmd = std::process::Command::new(compiler.path());
        cmd.args([
            "-Os",
            "-static",
            "-nostdlib",
            "-ffreestanding",
            "-fno-pie",
            "-no-pie",
            "-fno-stack-protector",
            "-fno-asynchronous-unwind-tables",
            "-fno-sanitize=all",
            "-Wl,--build-id=none",
            "-s",
        ]);
        if compiler.is_like_gnu() && !compiler.is_like_clang() {
            // GCC turns the length loop into a call to libc's strlen without it.
            cmd.arg("-fno-tree-loop-distribute-patterns");
        }
        cmd.arg("-o").arg(out.join(name)).arg(src);
        match cmd.status() {
            Ok(st) if st.success() => println!("cargo:rustc-cfg={cfg}"),
            other => println!("cargo:warning={src} did not compile ({other:?}): {without}"),
        }
    }
}

fn main() {
    ui_vendor();
    static_programs();
    println!("cargo:rerun-if-changed=runtimes");
    println!("cargo:rerun-if-env-changed=ISOBOX_BUILD_VERSION");
    let mut entries: Vec<_> = std::fs::read_dir("runtimes")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect()
        })
        .unwrap_or_default();
    entries.sort();
    let mut src = String::from("/// Runtime descriptors built into the binary: (file name, contents).\npub const EMBEDDED_RUNTIMES: &[(&str, &str)] = &[\n");
    for p in entries {
        let abs = std::fs::canonicalize(&p).expect("descriptor path");
        let name = p
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .to_string();
        writeln!(
            src,
            "    ({name:?}, include_str!({:?})),",
            abs.display().to_string()
        )
        .expect("write to string");
    }
    src.push_str("];\n");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"))
        .join("embedded_runtimes.rs");
    std::fs::write(out, src).expect("write embedded_runtimes.rs");
}
