//! The pieces of the event loop that know no feature: the timer wheel (`timer`), the
//! fixed worker pool whose completions come back through a channel and the waker
//! (`pool`), and the token table that maps a registered fd's `mio::Token` to what owns
//! it (`Tokens`). What a token or a timer means, and what a completion does, is the
//! daemon's business (`daemon/`); this module imports nothing of the crate but `log`.

pub mod pool;
pub mod timer;

use mio::Token;
use slab::Slab;

/// Registered fds by token: each token names one owner `S`. Tokens below `first` are
/// the daemon's fixed ones (listener, waker, signals) and are never handed out.
pub struct Tokens<S> {
    owners: Slab<S>,
    first: usize,
}

impl<S: Copy> Tokens<S> {
    /// A table whose tokens start at `first`.
    pub fn new(first: usize) -> Tokens<S> {
        Tokens {
            owners: Slab::new(),
            first,
        }
    }

    /// A fresh token for `owner`.
    pub fn insert(&mut self, owner: S) -> Token {
        Token(self.owners.insert(owner) + self.first)
    }

    /// Who owns `t` (`None`: a fixed token, or one already released).
    pub fn get(&self, t: Token) -> Option<S> {
        t.0.checked_sub(self.first)
            .and_then(|i| self.owners.get(i))
            .copied()
    }

    /// Points `t` at a new owner (a kernel's pipes, lent to a step).
    pub fn retarget(&mut self, t: Token, owner: S) {
        if let Some(slot) =
            t.0.checked_sub(self.first)
                .and_then(|i| self.owners.get_mut(i))
        {
            *slot = owner;
        }
    }

    /// Forgets `t`; releasing a token twice, or a fixed one, does nothing.
    pub fn release(&mut self, t: Token) {
        if let Some(i) = t.0.checked_sub(self.first) {
            if self.owners.contains(i) {
                self.owners.remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_tokens_map_to_owners_and_skip_fixed_ones() {
        let mut t: Tokens<u32> = Tokens::new(5);
        let a = t.insert(7);
        let b = t.insert(8);
        assert!(a.0 >= 5 && b.0 >= 5 && a != b);
        assert_eq!(t.get(a), Some(7));
        assert_eq!(t.get(Token(0)), None);
        t.retarget(a, 9);
        assert_eq!(t.get(a), Some(9));
        t.release(a);
        t.release(a);
        t.release(Token(1));
        assert_eq!(t.get(a), None);
        assert_eq!(t.get(b), Some(8));
        // A released slot is reused: a stale token then names the new owner, which is
        // why every owner also carries a serial.
        let c = t.insert(10);
        assert_eq!(c, a);
    }
}
