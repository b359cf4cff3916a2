//! The decoder's thread team: `n − 1` worker threads made once per [`crate::Decoder`] and the
//! thread that calls, which run each parallel phase together and meet at its end. Between phases
//! a worker spins for a short while (a phase's glue — a norm, a top-k — is shorter than waking a
//! parked thread), then parks until the next phase, as ggml's thread pool does. It replaces a
//! `rayon` region per product, whose wake-ups cost ~60 µs each at 16 threads.
//!
//! Work is only ever split by outputs (each output computed whole by one thread), so the thread
//! count and which thread takes what never change a bit.
//!
//! [`install`] makes a team the calling thread's for a closure; [`broadcast`], [`map`] and
//! [`map_mut`] run on that team, or on the calling thread alone where there is none or where
//! they are called from inside a phase (a nested phase runs serially: same bits, no deadlock).

// The job a phase runs is a reference to the caller's closure, handed to the workers with its
// lifetime erased: sound because `Team::run` returns only after every worker has finished with it
// (each counts itself done, and a worker takes part in every phase before the next is posted).
// `map_mut` hands each index of a slice to exactly one thread (an atomic counter), so the `&mut`
// it makes are disjoint.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a worker spins for the next phase before it parks.
const SPIN: Duration = Duration::from_micros(100);

/// A phase: `f(i, n)` on thread `i` of the `n` that run it.
type Job<'a> = &'a (dyn Fn(usize, usize) + Sync);

#[derive(Debug)]
struct Inner {
    threads: usize,
    /// Bumped to post a phase.
    epoch: AtomicU64,
    /// The posted phase: a `*const Job` on the poster's stack.
    job: AtomicPtr<()>,
    /// Workers finished with the posted phase.
    done: AtomicUsize,
    /// A worker's phase panicked.
    panicked: AtomicBool,
    stop: AtomicBool,
    /// Parked workers, and where they park.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// A persistent team of `threads` threads: the caller of [`Team::run`] and `threads − 1` workers.
#[derive(Debug)]
pub struct Team {
    inner: Arc<Inner>,
    workers: Vec<JoinHandle<()>>,
    /// A phase is running (a nested one runs serially).
    busy: AtomicBool,
}

impl Team {
    /// A team of `threads` threads (at least 1), its workers named `{name}-{i}`.
    pub fn new(threads: usize, name: &str) -> std::io::Result<Team> {
        let threads = threads.max(1);
        let inner = Arc::new(Inner {
            threads,
            epoch: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut team = Team {
            inner: inner.clone(),
            workers: Vec::with_capacity(threads - 1),
            busy: AtomicBool::new(false),
        };
        for i in 1..threads {
            let inner = inner.clone();
            let handle = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&inner, i))?;
            // On an error, the workers made so far are stopped and joined by `team`'s drop.
            team.workers.push(handle);
        }
        Ok(team)
    }

    /// Threads of the team, the caller's included.
    pub fn threads(&self) -> usize {
        self.inner.threads
    }

    /// `f(i, n)` for each thread `i` of the `n` that run the phase, the caller being 0; returns
    /// `n` when every thread is done. `n` is the team's size, or 1 — `f(0, 1)` on the caller
    /// alone — for a team of one or a phase started while one of this team's runs (from inside
    /// `f`). A panic on any thread is resumed here after all are done.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) -> usize {
        let inner = &*self.inner;
        if inner.threads == 1 || self.busy.swap(true, Ordering::Acquire) {
            f(0, 1);
            return 1;
        }
        let job: Job<'_> = f;
        inner
            .job
            .store(&job as *const Job<'_> as *mut (), Ordering::Relaxed);
        inner.done.store(0, Ordering::Relaxed);
        inner.epoch.fetch_add(1, Ordering::SeqCst);
        if inner.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = inner.lock.lock().unwrap_or_else(|p| p.into_inner());
            inner.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0, inner.threads)));
        let want = inner.threads - 1;
        let start = Instant::now();
        let mut spins = 0u32;
        while inner.done.load(Ordering::Acquire) < want {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        inner.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.busy.store(false, Ordering::Release);
        // Cleared whichever panic is raised, so the next phase does not report this one's.
        let worker_panicked = inner.panicked.swap(false, Ordering::AcqRel);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if worker_panicked {
            panic!("a thread of the decoder's team panicked");
        }
        inner.threads
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        let inner = &*self.inner;
        inner.stop.store(true, Ordering::SeqCst);
        inner.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = inner.lock.lock().unwrap_or_else(|p| p.into_inner());
            inner.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Worker `i`'s loop: wait for a phase (spin, then park), run its share, count itself done.
fn work(inner: &Inner, i: usize) {
    // The epoch the team was made with: a phase posted before this thread started is still one
    // to run.
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        while inner.epoch.load(Ordering::SeqCst) == seen {
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) || start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let g = inner.lock.lock().unwrap_or_else(|p| p.into_inner());
            inner.sleepers.fetch_add(1, Ordering::SeqCst);
            let g = inner
                .wake
                .wait_while(g, |_| inner.epoch.load(Ordering::SeqCst) == seen)
                .unwrap_or_else(|p| p.into_inner());
            inner.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(g);
        }
        seen = inner.epoch.load(Ordering::SeqCst);
        if inner.stop.load(Ordering::SeqCst) {
            return;
        }
        let job = inner.job.load(Ordering::Relaxed) as *const Job<'_>;
        // SAFETY: the poster stored `job` before bumping the epoch we saw (SeqCst), and waits for
        // this worker's `done` before its stack frame (which holds the `Job`) goes away.
        let f = unsafe { *job };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(i, inner.threads))) {
            inner.panicked.store(true, Ordering::Release);
            // A payload whose drop panics must not end this thread (the caller waits for it).
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
        }
        inner.done.fetch_add(1, Ordering::AcqRel);
    }
}

thread_local! {
    /// The team [`install`]ed on this thread.
    static CURRENT: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// Run `f` with `team` as this thread's team (what [`broadcast`], [`map`] and [`map_mut`] use).
pub fn install<R>(team: &Team, f: impl FnOnce() -> R) -> R {
    struct Restore(*const Team);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.replace(team as *const Team)));
    f()
}

/// `g` with this thread's team, if one is installed.
fn with_current<R>(g: impl FnOnce(Option<&Team>) -> R) -> R {
    let p = CURRENT.with(Cell::get);
    // SAFETY: `install` sets the pointer only for the span of its closure, during which the team
    // it borrows lives; the guard restores the one before.
    g(unsafe { p.as_ref() })
}

/// Threads a phase started on this thread would have: the installed team's, else 1.
pub fn threads() -> usize {
    with_current(|t| t.map_or(1, Team::threads))
}

/// `f(i, n)` on each thread `i` of `n` (this thread's team, or this thread alone: `n` = 1), the
/// results in thread order.
pub fn broadcast<T: Send>(f: impl Fn(usize, usize) -> T + Sync) -> Vec<T> {
    with_current(|team| {
        let Some(team) = team else {
            return vec![f(0, 1)];
        };
        let slots: Vec<Mutex<Option<T>>> = (0..team.threads()).map(|_| Mutex::new(None)).collect();
        let ran = team.run(&|i, n| {
            let v = f(i, n);
            *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
        });
        slots
            .into_iter()
            .take(ran)
            .map(|s| s.into_inner().unwrap_or_else(|p| p.into_inner()))
            .map(|v| v.expect("every thread of the phase ran"))
            .collect()
    })
}

/// `f(i)` for every `i < tasks`, the tasks taken in turn from one counter by the team's threads
/// (a slowed thread takes fewer), the results in task order.
pub fn map<T: Send>(tasks: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let parts = broadcast(|_, _| {
        let mut mine = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= tasks {
                return mine;
            }
            mine.push((i, f(i)));
        }
    });
    let mut all: Vec<(usize, T)> = parts.into_iter().flatten().collect();
    all.sort_unstable_by_key(|p| p.0);
    all.into_iter().map(|p| p.1).collect()
}

/// A slice's elements handed out one to a task.
struct Disjoint<S>(*mut S);
// SAFETY: the pointer is only turned into `&mut` of elements given to one task each (`map_mut`).
unsafe impl<S: Send> Sync for Disjoint<S> {}

/// `f(i, &mut items[i])` for every element, as [`map`]: each element to exactly one task.
pub fn map_mut<S: Send, T: Send>(items: &mut [S], f: impl Fn(usize, &mut S) -> T + Sync) -> Vec<T> {
    let n = items.len();
    let base = Disjoint(items.as_mut_ptr());
    let base = &base;
    map(n, |i| {
        // SAFETY: i < n, and `map` hands each i to exactly one task, so no two `&mut` alias;
        // `items` is borrowed mutably for the whole call.
        let item = unsafe { &mut *base.0.add(i) };
        f(i, item)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every thread of the team takes part in a phase (so a split is real), results come back in
    /// thread and task order, and a phase nested in one runs on its thread alone.
    #[test]
    fn phases_run_on_every_thread_in_order() {
        let team = Team::new(3, "test").expect("team");
        install(&team, || {
            assert_eq!(threads(), 3);
            for _ in 0..1000 {
                let ids = broadcast(|i, n| (i, n, std::thread::current().id()));
                assert_eq!(ids.iter().map(|v| v.0).collect::<Vec<_>>(), [0, 1, 2]);
                assert!(ids.iter().all(|v| v.1 == 3));
                assert_ne!(ids[0].2, ids[1].2);
                assert_ne!(ids[1].2, ids[2].2);
            }
            assert_eq!(
                map(100, |i| i * i),
                (0..100).map(|i| i * i).collect::<Vec<_>>()
            );
            let mut v: Vec<u32> = (0..50).collect();
            let got = map_mut(&mut v, |i, x| {
                *x += 1;
                i as u32 + *x
            });
            assert_eq!(v, (1..51).collect::<Vec<_>>());
            assert_eq!(got, (0..50).map(|i| 2 * i + 1).collect::<Vec<_>>());
            let nested = broadcast(|_, _| broadcast(|i, n| (i, n)));
            assert!(nested.iter().all(|inner| inner == &[(0, 1)]));
        });
        assert_eq!(
            threads(),
            1,
            "the team is this thread's only within install"
        );
    }

    /// A worker's panic reaches the caller after the phase, and the team still runs phases (also
    /// after a phase in which the caller's share panicked too).
    #[test]
    fn a_panic_on_a_worker_reaches_the_caller() {
        let team = Team::new(2, "test").expect("team");
        let r = catch_unwind(AssertUnwindSafe(|| {
            install(&team, || {
                broadcast(|i, _| assert_ne!(i, 1, "worker 1 fails"))
            })
        }));
        assert!(r.is_err());
        install(&team, || assert_eq!(broadcast(|i, _| i), [0, 1]));
        // The caller's share and a worker's in the same phase: the caller's panic is raised, and
        // the next phase reports none.
        let r = catch_unwind(AssertUnwindSafe(|| {
            install(&team, || broadcast(|_, _| panic!("every thread fails")))
        }));
        assert!(r.is_err());
        install(&team, || assert_eq!(broadcast(|i, _| i), [0, 1]));
    }

    /// Workers park after their spin and wake for the next phase.
    #[test]
    fn parked_workers_wake_for_the_next_phase() {
        let team = Team::new(4, "test").expect("team");
        for _ in 0..3 {
            std::thread::sleep(SPIN * 20);
            install(&team, || assert_eq!(broadcast(|i, _| i), [0, 1, 2, 3]));
        }
    }
}
