//! `POST /wbx/v1/jobs` bodies (parsed on the daemon's event loop, up to 17 MiB since
//! WebAssembly jobs carry their module in base64): `jobs::submit` never panics, and
//! what it accepts is within every bound.
//!
//! On `Ok`: a command job has a command and no WebAssembly part; a WebAssembly job has
//! no command or template, network `none`, a time limit of at most 600 s, memory
//! within 16–1024 MiB, at most 1024 args, and either an inline module whose bytes are
//! a core module of version 1 of at most 8,000,000 bytes with the recorded size and
//! SHA-256, or an input of its own named as the module; its stdin is the recorded
//! size, at most 4,000,000 bytes. On `Err`: 400 or 413 and the WBX error shape,
//! exactly `{"error": "…"}`.
#![no_main]

use isobox::http::{Params, Request};
use isobox::wbx::jobs::{self, JobOp};
use isobox_fuzz::runtimes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let req = Request {
        head: isobox::http::parse::parse_head(b"POST /wbx/v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("a fixed head"),
        body: data.to_vec(),
        tenant: "t".into(),
        params: Params::default(),
    };
    let s = match jobs::submit(&req, runtimes(), &isobox_fuzz::wbx_jobs()) {
        Ok(JobOp::Submit(s)) => s,
        Ok(other) => panic!("a job parsed as {other:?}"),
        Err(resp) => {
            assert!(resp.status == 400 || resp.status == 413, "status {}", resp.status);
            let v: serde_json::Value = serde_json::from_slice(&resp.body).expect("JSON error");
            assert!(
                v.as_object().is_some_and(|o| o.len() == 1) && v["error"].is_string(),
                "not the WBX error shape: {v}"
            );
            return;
        }
    };
    let spec = &s.spec;
    let Some(w) = &spec.wasm else {
        assert!(!spec.command.trim().is_empty());
        assert!(s.wasm_bytes.is_none());
        return;
    };
    assert!(spec.command.is_empty() && spec.template.is_empty());
    assert_eq!(spec.network["mode"], "none");
    assert!((1..=jobs::MAX_WASM_TIMEOUT_S).contains(&spec.timeout_s));
    assert!(jobs::WASM_MEMORY_MB.contains(&w.memory_mb));
    assert!(w.args.len() <= jobs::MAX_WASM_ARGS);
    let bytes = s.wasm_bytes.as_ref().expect("a WebAssembly job's bytes");
    match (&w.module_sha256, &w.module_input) {
        (Some(sha), None) => {
            assert_eq!(bytes.module.len() as u64, w.module_bytes);
            assert!(w.module_bytes <= jobs::MAX_WASM_MODULE_BYTES);
            assert!(jobs::check_module(&bytes.module, "m").is_ok());
            assert_eq!(*sha, isobox::jobs::sha256_hex(&bytes.module));
        }
        (None, Some(name)) => {
            assert!(bytes.module.is_empty());
            assert!(spec.inputs.iter().any(|i| &i.dest == name), "{name} is no input");
        }
        other => panic!("module {other:?}"),
    }
    assert_eq!(bytes.stdin.len() as u64, w.stdin_bytes);
    assert!(w.stdin_bytes <= jobs::MAX_WASM_STDIN_BYTES);
});
