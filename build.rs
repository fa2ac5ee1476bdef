//! Embeds `runtimes/*.toml` into the binary so `isoboxd` runs with no files beside it.
use std::fmt::Write;

fn main() {
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
