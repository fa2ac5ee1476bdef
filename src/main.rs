//! `isoboxd`: parse flags and environment, start the daemon, print the error chain on failure.
//! `isoboxd check [FLAGS]`: report what is missing or wrong on this host with those
//! settings, and exit 1 when the daemon could not serve.

use isobox::config::{Config, ConfigError};
use isobox::daemon::Daemon;

// jemalloc gives freed memory back where glibc's malloc kept it (`sys::alloc`).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    // What still calls glibc's malloc (LMDB, libc itself): two arenas are plenty, and
    // keep far less freed memory than glibc's default of 8 per core.
    isobox::sys::limit_malloc_arenas(2);
    // A crash says where it happened (thread, fault address, backtrace) in the log.
    if let Err(e) = isobox::sys::crash::install() {
        eprintln!("isoboxd: installing the crash reporter: {e}");
        std::process::exit(2);
    }
    if let Err(e) = isobox::sys::alloc::tune_allocator() {
        eprintln!("isoboxd: {e}");
        std::process::exit(2);
    }
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let check = args.first().is_some_and(|a| a == "check");
    if check {
        args.remove(0);
    }
    let cfg = match Config::load(args) {
        Ok(c) => c,
        // `--help` and `--version` (stdout, exit 0), or what clap refused (stderr, 2).
        Err(ConfigError::Args(e)) => e.exit(),
        Err(e) => {
            eprintln!("isoboxd: {e}");
            std::process::exit(2);
        }
    };
    if check {
        let (report, serves) = isobox::check::render(&isobox::check::run(&cfg));
        print!("{report}");
        std::process::exit(if serves { 0 } else { 1 });
    }
    let mut logger = env_logger::Builder::new();
    logger
        .parse_filters(&cfg.log_level)
        .format_timestamp_millis();
    if cfg.log_json {
        logger.format(|buf, record| {
            use std::io::Write;
            let line = isobox::log::json_line(
                &buf.timestamp_millis().to_string(),
                record.level(),
                record.target(),
                &record.args().to_string(),
            );
            writeln!(buf, "{line}")
        });
    }
    logger.init();
    let mut daemon = match Daemon::new(cfg) {
        Ok(d) => d,
        Err(e) => {
            let mut msg = format!("isoboxd: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            std::process::exit(1);
        }
    };
    // The ready line tests and scripts wait for; it carries the bound address.
    log::info!(
        "isoboxd {} listening on http://{}",
        isobox::VERSION,
        daemon.local_addr()
    );
    if let Err(e) = daemon.run() {
        eprintln!("isoboxd: event loop failed: {e}");
        std::process::exit(1);
    }
    // Everything the daemon owns goes now (its store's writer finishes every queued
    // write as it does); then the process ends without `exit`'s teardown racing the
    // threads that were never joined (`sys::exit_now`).
    drop(daemon);
    isobox::sys::exit_now(0);
}
