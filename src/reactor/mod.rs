//! The event loop, knowing no feature: one `mio::Poll`, a token table that maps each
//! registered fd to the component that owns it, a timer wheel whose entries name a
//! component too, the fixed worker pool whose completions come back through a channel
//! and the waker, and the table of components that all of these dispatch to.
//!
//! A subsystem (connections, runs, kernels, …) is a [`Component`]: it is told when one
//! of its sources is ready ([`Component::ready`]), when one of its timers fires
//! ([`Component::timer`]), and when one of its worker jobs completes (the job returns
//! a [`Done`], a continuation that the loop applies to the host). A new subsystem adds
//! a component and its own `what` numbers; it adds no variant to anything here. This is
//! Firecracker's `MutEventSubscriber` shaped for one thread whose components call each
//! other synchronously: each component's state is a part of the host `H` (the daemon),
//! and its methods get the whole host, so a run can write to its connection's buffer
//! without a message queue in between.
//!
//! This module imports nothing of the crate but `log`. Reactor thread only, except the
//! pool's workers, which touch no host state.

pub mod pool;
pub mod timer;
pub mod wake;

use mio::event::Source;
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A component's index in the reactor's table (each component's module names its own
/// as a constant; [`Reactor::add`] checks that the table agrees).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ComponentId(pub u16);

/// What a registered fd or a timer names: its component, one of that component's keys
/// (typically a slab key), and which of that key's sources or deadlines it is (each
/// component numbers its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addr {
    /// The owning component.
    pub component: ComponentId,
    /// The component's key (a connection, a run, a kernel, …).
    pub key: usize,
    /// Which source or deadline of that key.
    pub what: u16,
}

impl Addr {
    /// `what` of `key` of `component`.
    pub const fn new(component: ComponentId, key: usize, what: u16) -> Addr {
        Addr {
            component,
            key,
            what,
        }
    }
}

/// What an event said about a source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Readable, or closed for reading, or in error: a read will not block.
    pub readable: bool,
    /// Writable.
    pub writable: bool,
}

impl Readiness {
    fn of(ev: &mio::event::Event) -> Readiness {
        Readiness {
            readable: ev.is_readable() || ev.is_read_closed() || ev.is_error(),
            writable: ev.is_writable(),
        }
    }
}

/// A worker job's continuation: applied to the host on the reactor thread.
pub type Done<H> = Box<dyn FnOnce(&mut H) + Send>;
/// A unit of blocking work for the pool; what it returns runs on the reactor thread.
pub type Job<H> = pool::Job<Done<H>>;

/// A subsystem on the loop. Its state lives in the host `H`; the reactor calls these
/// with the whole host, so a component may act on the others synchronously.
pub trait Component<H> {
    /// Names the component in logs.
    fn name(&self) -> &'static str;
    /// A source registered under `Addr { key, what }` of this component is ready.
    fn ready(&self, host: &mut H, key: usize, what: u16, r: Readiness);
    /// A timer armed for `Addr { key, what }` of this component fired; `gen` is what it
    /// was armed with (owners compare it to their current one: cancellation is lazy).
    fn timer(&self, host: &mut H, key: usize, what: u16, gen: u64);
}

/// What the host gives the loop: its reactor.
pub trait Host: Sized + 'static {
    /// The host's reactor.
    fn reactor(&mut self) -> &mut Reactor<Self>;
}

/// The waker's token; every other token comes from the table.
pub const WAKER: Token = Token(0);

/// The loop's state: poll, tokens, timers, pool, components.
pub struct Reactor<H: 'static> {
    poll: Poll,
    tokens: Slab<Addr>,
    timers: timer::TimerWheel<(Addr, u64)>,
    /// Source of timer generations: one counter for every owner, so a timer armed for
    /// a key that was later reused can never match the new owner's.
    timer_seq: u64,
    pool: pool::WorkerPool<Done<H>>,
    completions: crossbeam_channel::Receiver<Done<H>>,
    done_tx: crossbeam_channel::Sender<Done<H>>,
    waker: Arc<wake::Wake>,
    /// Jobs that must run (kills, cleanups) but found the pool queue full; retried
    /// every turn, so nothing is ever dropped or run on this thread.
    overflow: VecDeque<Job<H>>,
    /// Timers to fire on the next turn, which then does not wait ([`Reactor::soon`]).
    again: Vec<(Addr, u64)>,
    components: Vec<&'static dyn Component<H>>,
}

impl<H: Host> Reactor<H> {
    /// A poll, a waker and `workers` pool threads.
    ///
    /// # Errors
    /// When the poll, the waker or a thread cannot be made.
    pub fn new(workers: usize) -> io::Result<Reactor<H>> {
        let poll = Poll::new()?;
        let waker = Arc::new(wake::Wake::new(Waker::new(poll.registry(), WAKER)?));
        let (done_tx, completions) = pool::completion_channel();
        let pool = pool::WorkerPool::start(workers, done_tx.clone(), Arc::clone(&waker))?;
        Ok(Reactor {
            poll,
            tokens: Slab::new(),
            timers: timer::TimerWheel::new(Instant::now()),
            timer_seq: 0,
            pool,
            completions,
            done_tx,
            waker,
            overflow: VecDeque::new(),
            again: Vec::new(),
            components: Vec::new(),
        })
    }

    /// Adds a component; `id` must be the next index (ids are constants in each
    /// component's module, so the table's order is checked here, once, at startup).
    ///
    /// # Panics
    /// When `id` is not the next index: a wiring mistake found at the first start.
    pub fn add(&mut self, id: ComponentId, c: &'static dyn Component<H>) {
        assert_eq!(
            usize::from(id.0),
            self.components.len(),
            "component {} registered out of order",
            c.name()
        );
        self.components.push(c);
    }

    /// Registers `source` for `addr`; the token is released again when this fails.
    ///
    /// # Errors
    /// What `mio` said.
    pub fn register<S: Source + ?Sized>(
        &mut self,
        source: &mut S,
        addr: Addr,
        interest: Interest,
    ) -> io::Result<Token> {
        let t = self.token(addr);
        match self.poll.registry().register(source, t, interest) {
            Ok(()) => Ok(t),
            Err(e) => {
                self.release(t);
                Err(e)
            }
        }
    }

    /// Deregisters `source` and forgets its token.
    pub fn deregister<S: Source + ?Sized>(&mut self, source: &mut S, t: Token) {
        let _ = self.poll.registry().deregister(source);
        self.release(t);
    }

    /// A token for `addr`, not registered with the poll yet.
    pub fn token(&mut self, addr: Addr) -> Token {
        Token(self.tokens.insert(addr) + 1)
    }

    /// Who owns `t` (`None`: the waker, or a token already released).
    pub fn owner(&self, t: Token) -> Option<Addr> {
        t.0.checked_sub(1).and_then(|i| self.tokens.get(i)).copied()
    }

    /// Points `t` at a new owner (a kernel's pipes, lent to a step).
    pub fn retarget(&mut self, t: Token, addr: Addr) {
        if let Some(slot) = t.0.checked_sub(1).and_then(|i| self.tokens.get_mut(i)) {
            *slot = addr;
        }
    }

    /// Forgets `t`; releasing a token twice, or the waker's, does nothing.
    pub fn release(&mut self, t: Token) {
        if let Some(i) = t.0.checked_sub(1) {
            if self.tokens.contains(i) {
                self.tokens.remove(i);
            }
        }
    }

    /// The poll's registry (for re-registering an fd under the same token).
    pub fn registry(&self) -> &mio::Registry {
        self.poll.registry()
    }

    /// A fresh, never reused timer generation.
    pub fn next_gen(&mut self) -> u64 {
        self.timer_seq += 1;
        self.timer_seq
    }

    /// Calls back `addr`'s component at or after `at` with `gen`.
    pub fn arm(&mut self, at: Instant, addr: Addr, gen: u64) {
        self.timers.insert(at, (addr, gen));
    }

    /// Fires `addr`'s timer with `gen` on the next turn, after that turn's events,
    /// and makes that turn's poll not wait: for a source that has more to do than its
    /// share of one turn, without a wait for the timer wheel's next tick.
    pub fn soon(&mut self, addr: Addr, gen: u64) {
        self.again.push((addr, gen));
    }

    /// Arms a timer with a fresh generation, which it returns.
    pub fn arm_new(&mut self, at: Instant, addr: Addr) -> u64 {
        let gen = self.next_gen();
        self.arm(at, addr, gen);
        gen
    }

    /// Queues a job. Returns it back when the queue is full or the pool is stopping.
    pub fn submit(&mut self, job: Job<H>) -> Result<(), Job<H>> {
        self.pool.submit(job)
    }

    /// Queues a job that must not be lost: into the pool, or the overflow when full.
    pub fn submit_must(&mut self, job: Job<H>) {
        if let Err(job) = self.pool.submit(job) {
            self.overflow.push_back(job);
            // Logged at 1, 2, 4, 8, … waiting: a flood of kills cannot flood the log.
            if self.overflow.len().is_power_of_two() {
                log::warn!(
                    "op=submit worker queue full; {} jobs waiting",
                    self.overflow.len()
                );
            }
        }
    }

    /// A way for other threads (agent loops) to hand the reactor a continuation.
    pub fn mailbox(&self) -> Mailbox<H> {
        Mailbox {
            tx: self.done_tx.clone(),
            waker: Arc::clone(&self.waker),
        }
    }

    /// Whether no must-run job is waiting for room in the pool.
    pub fn overflow_empty(&self) -> bool {
        self.overflow.is_empty()
    }

    fn flush_overflow(&mut self) {
        while let Some(job) = self.overflow.pop_front() {
            if let Err(job) = self.pool.submit(job) {
                self.overflow.push_front(job);
                break;
            }
        }
    }

    /// Stops the pool: waits for the pool to take every overflowed job (yielding: the
    /// reactor thread may not sleep), then for every job to finish. Completions that
    /// come after this are dropped.
    pub fn join(&mut self) {
        while !self.overflow.is_empty() {
            self.flush_overflow();
            std::thread::yield_now();
        }
        self.pool.join();
    }
}

/// Sends continuations to the reactor from another thread and wakes it.
pub struct Mailbox<H> {
    tx: crossbeam_channel::Sender<Done<H>>,
    waker: Arc<wake::Wake>,
}

impl<H> Clone for Mailbox<H> {
    fn clone(&self) -> Self {
        Mailbox {
            tx: self.tx.clone(),
            waker: Arc::clone(&self.waker),
        }
    }
}

impl<H> Mailbox<H> {
    /// Queues `done` for the reactor thread. False when the reactor is gone.
    pub fn send(&self, done: Done<H>) -> bool {
        if self.tx.send(done).is_err() {
            return false;
        }
        self.waker.wake();
        true
    }
}

/// Scratch space one loop keeps between turns.
pub struct Turn {
    events: Events,
    fired: Vec<(Addr, u64)>,
    again: Vec<(Addr, u64)>,
}

impl Default for Turn {
    fn default() -> Self {
        Turn {
            events: Events::with_capacity(1024),
            fired: Vec::new(),
            again: Vec::new(),
        }
    }
}

/// One turn of the loop: wait for events or the next timer, call each ready source's
/// component, apply finished jobs' continuations, retry overflowed jobs, fire due
/// timers.
///
/// # Errors
/// When polling itself fails.
pub fn turn<H: Host>(host: &mut H, scratch: &mut Turn) -> io::Result<()> {
    let r = host.reactor();
    let timeout = if r.again.is_empty() {
        r.timers.next_timeout(Instant::now())
    } else {
        Some(Duration::ZERO)
    };
    match r.poll.poll(&mut scratch.events, timeout) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
        Err(e) => return Err(e),
    }
    // What asked for this turn; what asks during it waits for the next.
    std::mem::swap(&mut r.again, &mut scratch.again);
    for ev in scratch.events.iter() {
        if ev.token() == WAKER {
            drain_completions(host);
            continue;
        }
        // A token released by an earlier event of this turn names nobody (or, reused
        // since, someone whose own checks see a spurious event: harmless).
        let Some(addr) = host.reactor().owner(ev.token()) else {
            continue;
        };
        let Some(&c) = host.reactor().components.get(usize::from(addr.component.0)) else {
            continue;
        };
        c.ready(host, addr.key, addr.what, Readiness::of(ev));
    }
    // Completions can arrive between wakes; drain them every turn.
    drain_completions(host);
    let r = host.reactor();
    r.flush_overflow();
    r.timers.advance(Instant::now(), &mut scratch.fired);
    for (addr, gen) in scratch.fired.drain(..).chain(scratch.again.drain(..)) {
        let Some(&c) = host.reactor().components.get(usize::from(addr.component.0)) else {
            continue;
        };
        c.timer(host, addr.key, addr.what, gen);
    }
    Ok(())
}

fn drain_completions<H: Host>(host: &mut H) {
    host.reactor().waker.drained();
    while let Ok(done) = host.reactor().completions.try_recv() {
        done(host);
    }
}

/// How long until `at`, never negative.
pub fn until(at: Instant) -> Duration {
    at.saturating_duration_since(Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A host with two components that record what they were told.
    struct TestHost {
        reactor: Reactor<TestHost>,
        seen: Vec<String>,
    }

    impl Host for TestHost {
        fn reactor(&mut self) -> &mut Reactor<Self> {
            &mut self.reactor
        }
    }

    struct Pipes;
    struct Clock;
    const PIPES: ComponentId = ComponentId(0);
    const CLOCK: ComponentId = ComponentId(1);

    impl Component<TestHost> for Pipes {
        fn name(&self) -> &'static str {
            "pipes"
        }
        fn ready(&self, host: &mut TestHost, key: usize, what: u16, r: Readiness) {
            host.seen.push(format!(
                "pipes key={key} what={what} readable={}",
                r.readable
            ));
        }
        fn timer(&self, host: &mut TestHost, key: usize, what: u16, gen: u64) {
            host.seen.push(format!("pipes timer {key}/{what}/{gen}"));
        }
    }

    impl Component<TestHost> for Clock {
        fn name(&self) -> &'static str {
            "clock"
        }
        fn ready(&self, _: &mut TestHost, _: usize, _: u16, _: Readiness) {}
        fn timer(&self, host: &mut TestHost, key: usize, what: u16, gen: u64) {
            host.seen.push(format!("clock timer {key}/{what}/{gen}"));
        }
    }

    fn host() -> TestHost {
        let mut reactor = Reactor::new(1).unwrap();
        reactor.add(PIPES, &Pipes);
        reactor.add(CLOCK, &Clock);
        TestHost {
            reactor,
            seen: Vec::new(),
        }
    }

    #[test]
    fn test_events_timers_and_jobs_reach_their_component() {
        let mut h = host();
        let (mut tx, rx) = std::os::unix::net::UnixStream::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        let mut rx = mio::net::UnixStream::from_std(rx);
        let t = h
            .reactor
            .register(&mut rx, Addr::new(PIPES, 7, 2), Interest::READABLE)
            .unwrap();
        assert_eq!(h.reactor.owner(t), Some(Addr::new(PIPES, 7, 2)));
        tx.write_all(b"x").unwrap();
        let gen = h.reactor.arm_new(
            Instant::now() + Duration::from_millis(20),
            Addr::new(CLOCK, 3, 1),
        );
        let job: Job<TestHost> =
            Box::new(|| Box::new(|h: &mut TestHost| h.seen.push("job".into())));
        assert!(h.reactor.submit(job).is_ok());
        let mut scratch = Turn::default();
        let t0 = Instant::now();
        while h.seen.len() < 3 && t0.elapsed() < Duration::from_secs(5) {
            turn(&mut h, &mut scratch).unwrap();
        }
        h.seen.sort();
        assert_eq!(
            h.seen,
            vec![
                format!("clock timer 3/1/{gen}"),
                "job".to_string(),
                "pipes key=7 what=2 readable=true".to_string(),
            ]
        );
        // A released token names nobody: its events are dropped, not misdelivered.
        h.reactor.deregister(&mut rx, t);
        assert_eq!(h.reactor.owner(t), None);
        h.reactor.release(t);
        h.reactor.release(WAKER);
        h.reactor.join();
    }

    #[test]
    fn test_soon_fires_on_the_next_turn_without_waiting() {
        let mut h = host();
        // A timer a minute away would make the turn wait; `soon` must not.
        h.reactor.arm(
            Instant::now() + Duration::from_secs(60),
            Addr::new(CLOCK, 1, 1),
            5,
        );
        h.reactor.soon(Addr::new(CLOCK, 2, 0), 9);
        let mut scratch = Turn::default();
        let t0 = Instant::now();
        turn(&mut h, &mut scratch).unwrap();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(h.seen, vec!["clock timer 2/0/9".to_string()]);
        // Once only.
        h.reactor.soon(Addr::new(CLOCK, 3, 0), 1);
        turn(&mut h, &mut scratch).unwrap();
        assert_eq!(h.seen.len(), 2, "{:?}", h.seen);
        h.reactor.release(WAKER);
        h.reactor.join();
    }

    #[test]
    fn test_tokens_are_reused_and_retargeted() {
        let mut h = host();
        let a = h.reactor.token(Addr::new(PIPES, 1, 0));
        let b = h.reactor.token(Addr::new(PIPES, 2, 0));
        assert!(a != WAKER && b != WAKER && a != b);
        h.reactor.retarget(a, Addr::new(CLOCK, 9, 4));
        assert_eq!(h.reactor.owner(a), Some(Addr::new(CLOCK, 9, 4)));
        h.reactor.release(a);
        // A released slot is reused: a stale token then names the new owner, which is
        // why every owner also checks a serial or a generation.
        let c = h.reactor.token(Addr::new(PIPES, 3, 0));
        assert_eq!(c, a);
        assert_eq!(h.reactor.owner(b), Some(Addr::new(PIPES, 2, 0)));
        h.reactor.join();
    }

    #[test]
    #[should_panic(expected = "registered out of order")]
    fn test_component_ids_must_match_the_table() {
        let mut r: Reactor<TestHost> = Reactor::new(1).unwrap();
        r.add(CLOCK, &Clock);
    }

    #[test]
    fn test_mailbox_wakes_the_loop() {
        let mut h = host();
        let m = h.reactor.mailbox();
        let th = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            m.send(Box::new(|h: &mut TestHost| h.seen.push("mail".into())))
        });
        let mut scratch = Turn::default();
        // No timer is armed: only the waker can end this poll.
        turn(&mut h, &mut scratch).unwrap();
        assert!(th.join().unwrap());
        if h.seen.is_empty() {
            turn(&mut h, &mut scratch).unwrap();
        }
        assert_eq!(h.seen, vec!["mail".to_string()]);
        h.reactor.join();
    }
}
