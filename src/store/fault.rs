//! A fault-injecting [`Store`] wrapper for tests, the simulation and the
//! spike: latency, errors, writes that land but report failure, partitions,
//! and (for refusal tests) a store that ignores conditional headers.

use super::{Cond, Conditional, Entry, Object, Store, StoreError, Version};
use crate::clock::Clock;
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What happens to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Pass through.
    None,
    /// Fail without touching the store (a write answers `Ambiguous`, as a
    /// client could not tell this from a lost response; a read `Unavailable`).
    FailBefore,
    /// Perform the write, then lose the response: the write landed but the
    /// caller sees `Ambiguous`. On reads, same as `FailBefore`.
    LandThenFail,
    /// Wait this long (on the injected clock) before the request reaches the
    /// store, and as long again before its response arrives.
    Delay(Duration),
}

/// Probabilities for randomly drawn faults, each in 0.0..=1.0.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    pub fail_before: f64,
    pub land_then_fail: f64,
    pub delay: f64,
    pub max_delay: Duration,
}

struct State {
    script: VecDeque<Fault>,
    plan: FaultPlan,
    rng: rand::rngs::StdRng,
    partitioned: bool,
    injected: u64,
}

/// Wraps a store and injects faults: first from a script (deterministic unit
/// tests), then drawn from a seeded [`FaultPlan`].
pub struct FaultStore {
    inner: Arc<dyn Store>,
    clock: Option<Arc<dyn Clock>>,
    state: Mutex<State>,
}

impl fmt::Debug for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultStore({:?})", self.inner)
    }
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

impl FaultStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FaultStore {
            inner,
            clock: None,
            state: Mutex::new(State {
                script: VecDeque::new(),
                plan: FaultPlan::default(),
                rng: rand::rngs::StdRng::seed_from_u64(0),
                partitioned: false,
                injected: 0,
            }),
        }
    }

    /// Delays are slept on this clock (a mock clock advances instantly).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    pub fn with_plan(self, seed: u64, plan: FaultPlan) -> Self {
        {
            let mut s = self.state.lock().unwrap();
            s.plan = plan;
            s.rng = rand::rngs::StdRng::seed_from_u64(seed);
        }
        self
    }

    /// Queues faults for the next requests, in order.
    pub fn push(&self, f: Fault) {
        self.state.lock().unwrap().script.push_back(f);
    }

    /// While partitioned, every request fails before reaching the store.
    pub fn set_partitioned(&self, p: bool) {
        self.state.lock().unwrap().partitioned = p;
    }

    /// How many faults (other than `None`) were injected so far.
    pub fn injected(&self) -> u64 {
        self.state.lock().unwrap().injected
    }

    fn draw(&self) -> Fault {
        let mut s = self.state.lock().unwrap();
        let f = if s.partitioned {
            Fault::FailBefore
        } else if let Some(f) = s.script.pop_front() {
            f
        } else {
            let plan = s.plan.clone();
            let x: f64 = s.rng.random();
            if x < plan.fail_before {
                Fault::FailBefore
            } else if x < plan.fail_before + plan.land_then_fail {
                Fault::LandThenFail
            } else if x < plan.fail_before + plan.land_then_fail + plan.delay
                && !plan.max_delay.is_zero()
            {
                let ms = s.rng.random_range(0..=plan.max_delay.as_millis() as u64);
                Fault::Delay(Duration::from_millis(ms))
            } else {
                Fault::None
            }
        };
        if f != Fault::None {
            s.injected += 1;
        }
        f
    }

    async fn delay(&self, d: Duration) {
        if let Some(c) = &self.clock {
            c.sleep(d).await;
        }
    }
}

fn injected(write: bool) -> StoreError {
    let message = "injected fault".to_string();
    if write {
        StoreError::Ambiguous { message }
    } else {
        StoreError::Unavailable { message }
    }
}

#[async_trait]
impl Store for FaultStore {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        match self.draw() {
            Fault::None => self.inner.get(key).await,
            Fault::Delay(d) => {
                self.delay(d).await;
                let r = self.inner.get(key).await;
                self.delay(d).await;
                r
            }
            _ => Err(injected(false)),
        }
    }

    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        match self.draw() {
            Fault::None => self.inner.get_if_changed(key, known).await,
            Fault::Delay(d) => {
                self.delay(d).await;
                let r = self.inner.get_if_changed(key, known).await;
                self.delay(d).await;
                r
            }
            _ => Err(injected(false)),
        }
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        match self.draw() {
            Fault::None => self.inner.put(key, bytes, cond).await,
            Fault::FailBefore => Err(injected(true)),
            Fault::LandThenFail => {
                // Whatever the store answered, the caller hears nothing useful.
                let _ = self.inner.put(key, bytes, cond).await;
                Err(injected(true))
            }
            Fault::Delay(d) => {
                self.delay(d).await;
                let r = self.inner.put(key, bytes, cond).await;
                self.delay(d).await;
                r
            }
        }
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        match self.draw() {
            Fault::None | Fault::Delay(_) => self.inner.delete(key).await,
            Fault::FailBefore => Err(injected(true)),
            Fault::LandThenFail => {
                let _ = self.inner.delete(key).await;
                Err(injected(true))
            }
        }
    }

    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        match self.draw() {
            Fault::None | Fault::Delay(_) => self.inner.list(prefix),
            _ => futures::stream::once(async { Err(injected(false)) }).boxed(),
        }
    }

    fn identity(&self) -> String {
        self.inner.identity()
    }
}

/// A deliberately broken store that ignores `If-None-Match` and/or
/// `If-Match`, as some S3-compatible stores silently do. Used to show that the
/// probe refuses such a store.
#[derive(Debug)]
pub struct IgnoreConditions {
    pub inner: Arc<dyn Store>,
    pub ignore_create: bool,
    pub ignore_match: bool,
}

impl fmt::Display for IgnoreConditions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (ignoring conditions)", self.inner)
    }
}

#[async_trait]
impl Store for IgnoreConditions {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.inner.get(key).await
    }
    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        self.inner.get_if_changed(key, known).await
    }
    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        let ignore = match cond {
            Cond::Create => self.ignore_create,
            Cond::Match(_) => self.ignore_match,
        };
        if !ignore {
            return self.inner.put(key, bytes, cond).await;
        }
        // Overwrite whatever is there, as a store that drops the header would.
        let cur = self.inner.get(key).await?;
        let cond = match cur {
            Some(o) => Cond::Match(o.version),
            None => Cond::Create,
        };
        self.inner.put(key, bytes, cond).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }
    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.inner.list(prefix)
    }

    fn identity(&self) -> String {
        self.inner.identity()
    }
}

/// A store that *checks* conditions but without a lock, as racy stores have
/// shipped (SeaweedFS issue 8800, RustFS 1659, MinIO 21603 while read quorum
/// is lost): a conditional put reads the current version, compares, waits
/// `window` (zero: one yield to the scheduler), then overwrites whatever is
/// there. Sequential use looks perfect; concurrent writers can all win. Used
/// to measure the probe's power.
#[derive(Debug)]
pub struct LockFreeConditions {
    pub inner: Arc<dyn Store>,
    pub window: std::time::Duration,
    pub clock: Arc<dyn crate::clock::Clock>,
}

impl fmt::Display for LockFreeConditions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (conditions checked without a lock)", self.inner)
    }
}

#[async_trait]
impl Store for LockFreeConditions {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.inner.get(key).await
    }
    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        self.inner.get_if_changed(key, known).await
    }
    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        let cur = self.inner.get(key).await?;
        match (&cond, &cur) {
            (Cond::Create, None) => {}
            (Cond::Create, Some(_)) => return Err(StoreError::AlreadyExists),
            (Cond::Match(v), Some(o)) if o.version == *v => {}
            (Cond::Match(_), _) => return Err(StoreError::Precondition),
        }
        if self.window.is_zero() {
            tokio::task::yield_now().await;
        } else {
            self.clock.sleep(self.window).await;
        }
        // Overwrite, whoever wrote in between.
        loop {
            let cond = match self.inner.get(key).await? {
                Some(o) => Cond::Match(o.version),
                None => Cond::Create,
            };
            match self.inner.put(key, bytes.clone(), cond).await {
                Err(StoreError::AlreadyExists | StoreError::Precondition) => continue,
                other => return other,
            }
        }
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key).await
    }
    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.inner.list(prefix)
    }

    fn identity(&self) -> String {
        self.inner.identity()
    }
}
