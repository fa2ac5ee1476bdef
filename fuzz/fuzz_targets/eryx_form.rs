//! `POST /eryx/v1/environments` forms: `eryx::form::read` never panics, stays within its
//! bounds, and what it accepts is what the body holds.
//!
//! The input is the body, read from memory in pieces whose sizes its first byte picks
//! (as a file read may split it anywhere). On `Ok`: the name follows the document's
//! rule, every import is a module name, at most 100 packages were written (one file
//! each, `NNN.whl|.tar.gz|.tgz`, none over 50 MB in all), and the package files are
//! exactly the ones listed. On `Err`: 400, 413, 415 or 422 `invalid_request`.
#![no_main]

use isobox::eryx::form::{self, MAX_PACKAGES, PACKAGES_BYTES};
use libfuzzer_sys::fuzz_target;
use std::io::Read;

struct Pieces<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = self.data.len().min(out.len()).min(self.step);
        out[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("isobox-fuzz-form-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let r = form::read(
        Pieces {
            data: body,
            step: usize::from(pick % 64) + 1,
        },
        "b",
        &dir,
    );
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    match r {
        Ok(f) => {
            assert!(form::check_name(&f.name).is_ok(), "{f:?}");
            assert!(f.imports.iter().all(|m| form::is_module_name(m)), "{f:?}");
            assert!(f.packages.len() <= MAX_PACKAGES);
            assert_eq!(files.len(), f.packages.len(), "{files:?} {f:?}");
            let mut total = 0u64;
            for (i, name) in files.iter().enumerate() {
                assert!(name.starts_with(&format!("{i:03}.")), "{files:?}");
                total += std::fs::metadata(dir.join(name)).unwrap().len();
            }
            assert!(total <= PACKAGES_BYTES);
            assert!(total <= body.len() as u64);
        }
        Err(e) => {
            assert!([400, 413, 415, 422].contains(&e.status), "{e:?}");
            assert_eq!(e.code, "invalid_request", "{e:?}");
            assert!(!e.message.is_empty());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
});
