//! `isoboxd`: parse flags and environment, start the daemon, print the error chain on failure.

use isobox::config::Config;
use isobox::daemon::Daemon;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", Config::help());
        return;
    }
    if args.iter().any(|a| a == "--version") {
        println!("isoboxd {}", isobox::VERSION);
        return;
    }
    // Two arenas are plenty for one reactor and a few workers, and keep far less
    // freed memory than glibc's default of 8 per core (a 30-minute soak saw RSS ratchet
    // up with connection bursts and never come down).
    isobox::sys::limit_malloc_arenas(2);
    let cfg = match Config::load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("isoboxd: {e}");
            std::process::exit(2);
        }
    };
    env_logger::Builder::new()
        .parse_filters(&cfg.log_level)
        .format_timestamp_millis()
        .init();
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
}
