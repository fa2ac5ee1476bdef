//! A terminal WebSocket's client messages (`wbx::terminal`): any text is read into one
//! message or refused with words, never a panic; what is read is within its bounds; and
//! the input backlog check never overflows.
#![no_main]

use isobox::wbx::terminal::{incoming, input_fits, Incoming, INPUT_BACKLOG_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match incoming(text) {
        Ok(Incoming::Resize(cols, rows)) => {
            assert!((1..=1000).contains(&cols) && (1..=1000).contains(&rows));
        }
        Ok(Incoming::Input(bytes)) => {
            // Input is the JSON string's own bytes: never longer than the message.
            assert!(bytes.len() <= text.len());
        }
        Ok(Incoming::Signal(n)) => {
            assert!([15, 2, 1, 9].contains(&n), "{n}");
        }
        Ok(Incoming::Eof | Incoming::Ping) => {}
        Err(e) => {
            assert!(!e.is_empty());
            // A refusal quotes at most a short piece of what was sent.
            assert!(e.len() <= 200 + 32 * 4, "{}", e.len());
        }
    }
    if data.len() >= 16 {
        let a = usize::from_le_bytes(data[..8].try_into().unwrap());
        let b = usize::from_le_bytes(data[8..16].try_into().unwrap());
        let fits = input_fits(a, b).is_ok();
        assert_eq!(fits, a.checked_add(b).is_some_and(|s| s <= INPUT_BACKLOG_BYTES));
    }
});
