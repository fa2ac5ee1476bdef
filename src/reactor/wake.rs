//! Waking the loop from other threads: at most one wake outstanding per drain, and
//! none at all in the middle of a thread's burst of completions.
//!
//! Each completion a worker, the store's writer or an agent loop hands the reactor used
//! to write the loop's eventfd: a syscall each, and on a host where the loop and the
//! sender share a core, a switch to the loop for every one of them (a commit of 8 KV
//! writes woke the loop 8 times, and it answered them one at a time). Now a sender
//! wakes the loop only when no wake is outstanding since the loop last drained its
//! completions, and a sender that hands over many at once wraps them in [`hold`]: the
//! loop is woken once, when the last is queued.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The loop's waker, with whether a wake is outstanding.
pub struct Wake {
    waker: mio::Waker,
    pending: AtomicBool,
}

thread_local! {
    /// The wakes this thread holds back until its [`hold`] scope ends (`None`: not in one).
    static HELD: RefCell<Option<Vec<Arc<Wake>>>> = const { RefCell::new(None) };
}

impl Wake {
    pub(crate) fn new(waker: mio::Waker) -> Wake {
        Wake {
            waker,
            pending: AtomicBool::new(false),
        }
    }

    /// Called after queuing a completion for the loop: wakes it, unless a wake is
    /// outstanding (the loop will drain what this queued with the rest), or this
    /// thread is inside [`hold`] (then the wake happens when the scope ends).
    pub fn wake(self: &Arc<Self>) {
        // An RMW on both sides: a sender that finds a wake outstanding reads a value
        // the loop's `drained` has not yet replaced, so the loop's drain that follows
        // sees the completion queued before it.
        if self.pending.swap(true, Ordering::SeqCst) {
            return;
        }
        // (A thread-local being torn down counts as not held: wake at once.)
        let held = HELD
            .try_with(|h| match h.borrow_mut().as_mut() {
                Some(v) => {
                    if !v.iter().any(|w| Arc::ptr_eq(w, self)) {
                        v.push(Arc::clone(self));
                    }
                    true
                }
                None => false,
            })
            .unwrap_or(false);
        if !held {
            self.now();
        }
    }

    fn now(&self) {
        if let Err(e) = self.waker.wake() {
            // Not outstanding after all: the next sender tries again.
            self.pending.swap(false, Ordering::SeqCst);
            log::error!("op=wake err={e}");
        }
    }

    /// The loop calls this before it drains its completions: what is queued after it
    /// wakes the loop again.
    pub(crate) fn drained(&self) {
        self.pending.swap(false, Ordering::SeqCst);
    }
}

/// Runs `f`, holding back the wakes of every completion it queues until it returns:
/// each loop is woken once, after the last. Nested scopes wake at the outermost end.
pub fn hold<R>(f: impl FnOnce() -> R) -> R {
    let outer = HELD.with(|h| {
        let mut h = h.borrow_mut();
        if h.is_some() {
            false
        } else {
            *h = Some(Vec::new());
            true
        }
    });
    // Wakes what was held when the scope ends, also by unwinding (a test build's panic
    // caught further up must not leave this thread holding wakes for good).
    struct Release(bool);
    impl Drop for Release {
        fn drop(&mut self) {
            if self.0 {
                let held = HELD
                    .try_with(|h| h.borrow_mut().take())
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                for w in held {
                    w.now();
                }
            }
        }
    }
    let _release = Release(outer);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll, Token};
    use std::time::Duration;

    /// How many times the waker fired since the last call (0 or 1: an edge each).
    /// A signal for another test of this process (EINTR) is waited through, as the
    /// reactor's own loop does.
    fn fired(poll: &mut Poll, events: &mut Events) -> usize {
        loop {
            match poll.poll(events, Some(Duration::from_millis(50))) {
                Ok(()) => return events.iter().filter(|e| e.token() == Token(7)).count(),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!("poll: {e}"),
            }
        }
    }

    #[test]
    fn test_one_wake_per_drain_and_held_wakes_come_at_the_scope_end() {
        let mut poll = Poll::new().unwrap();
        let mut events = Events::with_capacity(8);
        let w = Arc::new(Wake::new(
            mio::Waker::new(poll.registry(), Token(7)).unwrap(),
        ));
        w.wake();
        assert_eq!(fired(&mut poll, &mut events), 1);
        // Outstanding (the loop has not drained): no second write to the eventfd.
        w.wake();
        w.wake();
        assert_eq!(fired(&mut poll, &mut events), 0);
        // After a drain the next completion wakes the loop again.
        w.drained();
        w.wake();
        assert_eq!(fired(&mut poll, &mut events), 1);
        w.drained();
        // Held: nothing until the outermost scope ends, then one wake.
        let inside = hold(|| {
            w.wake();
            hold(|| w.wake());
            fired(&mut poll, &mut events)
        });
        assert_eq!(inside, 0);
        assert_eq!(fired(&mut poll, &mut events), 1);
        // The scope is gone: a wake after a drain is immediate again.
        w.drained();
        w.wake();
        assert_eq!(fired(&mut poll, &mut events), 1);
    }
}
