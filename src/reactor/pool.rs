//! The fixed worker pool for blocking work (runsc spawn/delete, cgroup setup, file I/O).
//!
//! Jobs go in over a bounded channel; each returns a completion that is sent back
//! to the reactor, which is then woken through its waker (`wake`). Workers never
//! touch reactor state.

use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A unit of blocking work producing a completion of type `C`.
pub type Job<C> = Box<dyn FnOnce() -> C + Send + 'static>;

/// Bound on queued jobs; beyond it `submit` fails and the caller answers 503.
pub const MAX_QUEUED_JOBS: usize = 1024;

/// The pool handle owned by the reactor.
pub struct WorkerPool<C: Send + 'static> {
    jobs: Option<Sender<Job<C>>>,
    threads: Vec<JoinHandle<()>>,
}

impl<C: Send + 'static> WorkerPool<C> {
    /// Starts `n` workers. Completions are sent on `done` and `wake` is called after each.
    ///
    /// # Errors
    /// When a thread cannot be spawned.
    pub fn start(n: usize, done: Sender<C>, wake: Arc<super::wake::Wake>) -> std::io::Result<Self> {
        let (tx, rx): (Sender<Job<C>>, Receiver<Job<C>>) = bounded(MAX_QUEUED_JOBS);
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let rx = rx.clone();
            let done = done.clone();
            let wake = Arc::clone(&wake);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("isobox-worker-{i}"))
                    .spawn(move || {
                        for job in rx.iter() {
                            let c = job();
                            if done.send(c).is_err() {
                                break;
                            }
                            wake.wake();
                        }
                    })?,
            );
        }
        Ok(WorkerPool {
            jobs: Some(tx),
            threads,
        })
    }

    /// Queues a job. Returns it back when the queue is full or the pool is stopping.
    pub fn submit(&self, job: Job<C>) -> Result<(), Job<C>> {
        match &self.jobs {
            Some(tx) => tx.try_send(job).map_err(|e| match e {
                TrySendError::Full(j) | TrySendError::Disconnected(j) => j,
            }),
            None => Err(job),
        }
    }

    /// Stops taking jobs and waits for queued ones to finish.
    pub fn join(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Creates the completion channel for a pool.
pub fn completion_channel<C>() -> (Sender<C>, Receiver<C>) {
    unbounded()
}
