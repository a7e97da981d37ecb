//! Injected time and randomness.
//!
//! Safety in leasehold rests on monotonic clocks only (see docs/protocol.md,
//! "Time"). Every instant the protocol reasons about comes from a [`Clock`],
//! and every nonce and instance id from an [`Entropy`], so that tests and the
//! seeded simulation control both. `clippy.toml` forbids reading the real clock
//! or an ambient RNG anywhere else; the two real implementations below are the
//! only places that do.

use futures::future::BoxFuture;
use std::fmt::Debug;
use std::ops::{Add, Sub};
#[cfg(any(test, feature = "testkit"))]
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

/// The default wall-clock skew bound for one-shot expiry judgements (the
/// wake path's `resolve`, the change feed's cursor window): a reader that
/// compares a record's wall-clock stamp with its own clock allows this much
/// disagreement. Advisory, never a safety decision (DESIGN.md, "Time").
pub const DEFAULT_MAX_SKEW: std::time::Duration = std::time::Duration::from_secs(5);

/// A point on one process's monotonic clock, as a duration since that clock's
/// arbitrary origin. Instants from different clocks are not comparable; the
/// protocol never compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MonoTime(Duration);

impl MonoTime {
    pub const ZERO: MonoTime = MonoTime(Duration::ZERO);

    pub fn from_since_origin(d: Duration) -> Self {
        MonoTime(d)
    }

    pub fn since_origin(self) -> Duration {
        self.0
    }

    /// `self - earlier`, or zero if `earlier` is later.
    pub fn saturating_since(self, earlier: MonoTime) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for MonoTime {
    type Output = MonoTime;
    /// Saturating, as `Sub` is: a deadline "never" (a grace or timeout of
    /// `Duration::MAX` from a library caller) is the far end of time, not
    /// a panic.
    fn add(self, d: Duration) -> MonoTime {
        MonoTime(self.0.saturating_add(d))
    }
}

impl Sub<Duration> for MonoTime {
    type Output = MonoTime;
    fn sub(self, d: Duration) -> MonoTime {
        MonoTime(self.0.saturating_sub(d))
    }
}

/// A source of time.
///
/// # Contract
/// - `now` never goes backwards and advances at (close to) the real rate; the
///   lease margin covers rate drift, not jumps.
/// - `wall_ms` is advisory: it is written into records for humans and never
///   decides safety.
/// - `sleep` completes no earlier than `now() + d`.
pub trait Clock: Send + Sync + Debug {
    fn now(&self) -> MonoTime;
    fn wall_ms(&self) -> u64;
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()>;
}

/// The process's real clocks.
#[derive(Debug)]
pub struct SystemClock {
    origin: std::time::Instant,
}

impl SystemClock {
    #[allow(clippy::disallowed_methods)] // the one place the real clock is read
    pub fn new() -> Self {
        SystemClock {
            origin: std::time::Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> MonoTime {
        MonoTime(self.origin.elapsed())
    }

    #[allow(clippy::disallowed_methods)]
    fn wall_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    #[allow(clippy::disallowed_methods)]
    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// A manual clock for tests and simulation. `sleep` advances the clock by the
/// requested duration and returns at once (like tokio's paused time with
/// auto-advance), so code that backs off runs deterministically and instantly.
#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Clone, Default)]
pub struct MockClock {
    inner: Arc<Mutex<MockState>>,
}

#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Default)]
struct MockState {
    now: Duration,
    wall_offset_ms: i64,
}

#[cfg(any(test, feature = "testkit"))]
impl MockClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock whose wall time is offset from the shared base by `ms`.
    pub fn with_wall_offset_ms(self, ms: i64) -> Self {
        self.inner.lock().unwrap().wall_offset_ms = ms;
        self
    }

    pub fn advance(&self, d: Duration) {
        self.inner.lock().unwrap().now += d;
    }

    pub fn set(&self, t: MonoTime) {
        let mut s = self.inner.lock().unwrap();
        assert!(t.0 >= s.now, "mock clock must not go backwards");
        s.now = t.0;
    }
}

/// Wall time that the mock clock reports at its origin: 2026-01-01T00:00:00Z.
#[cfg(any(test, feature = "testkit"))]
pub const MOCK_WALL_EPOCH_MS: u64 = 1_767_225_600_000;

#[cfg(any(test, feature = "testkit"))]
impl Clock for MockClock {
    fn now(&self) -> MonoTime {
        MonoTime(self.inner.lock().unwrap().now)
    }

    fn wall_ms(&self) -> u64 {
        let s = self.inner.lock().unwrap();
        (MOCK_WALL_EPOCH_MS as i64 + s.now.as_millis() as i64 + s.wall_offset_ms).max(0) as u64
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        self.advance(d);
        Box::pin(async {})
    }
}

/// A clock that moves only when told to, with sleeps that really wait: a
/// sleeping task stays pending (its waker registered) until [`advance`]
/// passes its deadline. Unlike [`MockClock`], concurrent tasks interleave as
/// they would in real time, so a whole node can run for virtual hours in a
/// test and its requests be counted exactly.
///
/// [`advance`]: ManualClock::advance
#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    inner: Arc<Mutex<ManualState>>,
}

#[cfg(any(test, feature = "testkit"))]
#[derive(Debug, Default)]
struct ManualState {
    now: Duration,
    timers: Vec<(Duration, std::task::Waker)>,
}

#[cfg(any(test, feature = "testkit"))]
impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `d`, waking every sleep that is now due.
    pub fn advance(&self, d: Duration) {
        let due: Vec<std::task::Waker> = {
            let mut s = self.inner.lock().unwrap();
            s.now += d;
            let now = s.now;
            let (due, rest): (Vec<_>, Vec<_>) = s.timers.drain(..).partition(|(t, _)| *t <= now);
            s.timers = rest;
            due.into_iter().map(|(_, w)| w).collect()
        };
        for w in due {
            w.wake();
        }
    }

    /// Sleeps currently pending.
    pub fn pending(&self) -> usize {
        self.inner.lock().unwrap().timers.len()
    }
}

#[cfg(any(test, feature = "testkit"))]
impl Clock for ManualClock {
    fn now(&self) -> MonoTime {
        MonoTime(self.inner.lock().unwrap().now)
    }

    fn wall_ms(&self) -> u64 {
        MOCK_WALL_EPOCH_MS + self.inner.lock().unwrap().now.as_millis() as u64
    }

    fn sleep(&self, d: Duration) -> BoxFuture<'static, ()> {
        let inner = self.inner.clone();
        let deadline = inner.lock().unwrap().now + d;
        Box::pin(futures::future::poll_fn(move |cx| {
            let mut s = inner.lock().unwrap();
            if s.now >= deadline {
                std::task::Poll::Ready(())
            } else {
                s.timers.push((deadline, cx.waker().clone()));
                std::task::Poll::Pending
            }
        }))
    }
}

/// A source of random 64-bit values for instance ids and write nonces.
pub trait Entropy: Send + Sync + Debug {
    fn next_u64(&self) -> u64;

    /// 16 lowercase hex digits.
    fn hex_id(&self) -> String {
        format!("{:016x}", self.next_u64())
    }
}

/// Operating-system randomness (seeded once from the OS, then a CSPRNG).
#[derive(Debug)]
pub struct OsEntropy(Mutex<rand::rngs::StdRng>);

impl OsEntropy {
    pub fn new() -> Self {
        use rand::SeedableRng;
        OsEntropy(Mutex::new(rand::rngs::StdRng::from_os_rng()))
    }
}

impl Default for OsEntropy {
    fn default() -> Self {
        Self::new()
    }
}

impl Entropy for OsEntropy {
    fn next_u64(&self) -> u64 {
        use rand::RngCore;
        self.0.lock().unwrap().next_u64()
    }
}

/// Deterministic randomness from a seed, for tests and simulation.
#[cfg(any(test, feature = "testkit"))]
#[derive(Debug)]
pub struct SeededEntropy(Mutex<rand::rngs::StdRng>);

#[cfg(any(test, feature = "testkit"))]
impl SeededEntropy {
    pub fn new(seed: u64) -> Self {
        use rand::SeedableRng;
        SeededEntropy(Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)))
    }
}

#[cfg(any(test, feature = "testkit"))]
impl Entropy for SeededEntropy {
    fn next_u64(&self) -> u64 {
        use rand::RngCore;
        self.0.lock().unwrap().next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mock_clock_sleep_advances_and_wall_offset_applies() {
        let c = MockClock::new().with_wall_offset_ms(-3000);
        assert_eq!(c.now(), MonoTime::ZERO);
        futures::executor::block_on(c.sleep(Duration::from_millis(250)));
        assert_eq!(c.now().since_origin(), Duration::from_millis(250));
        assert_eq!(c.wall_ms(), MOCK_WALL_EPOCH_MS + 250 - 3000);
    }

    #[test]
    fn seeded_entropy_repeats() {
        let a = SeededEntropy::new(7);
        let b = SeededEntropy::new(7);
        assert_eq!(a.hex_id(), b.hex_id());
        assert_eq!(a.hex_id().len(), 16);
    }
}
