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
impl crate::store::Forward for FaultStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

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

    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        match self.draw() {
            Fault::None | Fault::Delay(_) => self.inner.list_after(prefix, after),
            _ => futures::stream::once(async { Err(injected(false)) }).boxed(),
        }
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
impl crate::store::Forward for IgnoreConditions {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        let ignore = match cond {
            Cond::Create => self.ignore_create,
            Cond::Match(_) | Cond::MatchAs(..) => self.ignore_match,
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
impl crate::store::Forward for LockFreeConditions {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        let cur = self.inner.get(key).await?;
        match (&cond, &cur) {
            (Cond::Create, None) => {}
            (Cond::Create, Some(_)) => return Err(StoreError::AlreadyExists),
            (Cond::Match(v) | Cond::MatchAs(v, _), Some(o)) if o.version == *v => {}
            (Cond::Match(_) | Cond::MatchAs(..), _) => return Err(StoreError::Precondition),
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
}

/// How a [`DialectDouble`] departs from HTTP's entity-tag rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialectQuirk {
    /// If-Match matches only the bare ETag (Ceph RGW 16): a quoted one is
    /// always a 412.
    UnquotedOnly,
    /// The quoted form is checked, the bare form is ignored: any bare
    /// If-Match overwrites. The probe must refuse this store outright.
    UnquotedIgnored,
    /// Listings carry no ETags (some S3-compatibles omit them): expiry by
    /// observation, which compares listed and read versions, would strand a
    /// dead node's sessions.
    ListsWithoutEtags,
    /// The first If-Match PUT is answered 409 (AWS S3's
    /// ConditionalRequestConflict under concurrent conditional writes, which
    /// object_store reports as `AlreadyExists` once its retries are spent)
    /// after the write landed.
    Conflict409Landed,
    /// As `Conflict409Landed`, but nothing was written.
    Conflict409NotLanded,
    /// Writes answer without an ETag (the PyPI GCS emulator behind a TLS
    /// front, by report): the store gives no version to condition on.
    NoEtagOnPut,
}

/// An `object_store` backend (over [`object_store::memory::InMemory`]) with
/// one of the real-world quirks of [`DialectQuirk`]: below leasehold's
/// adapter, so the adapter's quoting is what it sees, as on the wire.
#[derive(Debug)]
pub struct DialectDouble {
    inner: object_store::memory::InMemory,
    quirk: DialectQuirk,
    fired: std::sync::atomic::AtomicBool,
}

impl DialectDouble {
    pub fn new(quirk: DialectQuirk) -> Self {
        DialectDouble {
            inner: object_store::memory::InMemory::new(),
            quirk,
            fired: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl fmt::Display for DialectDouble {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "memory store with quirk {:?}", self.quirk)
    }
}

#[async_trait]
impl object_store::ObjectStore for DialectDouble {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        mut opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        use object_store::{PutMode, UpdateVersion};
        let conflict = matches!(
            self.quirk,
            DialectQuirk::Conflict409Landed | DialectQuirk::Conflict409NotLanded
        );
        if conflict
            && matches!(opts.mode, PutMode::Update(_))
            && !self.fired.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            if self.quirk == DialectQuirk::Conflict409Landed {
                self.inner.put_opts(location, payload, opts).await?;
            }
            return Err(object_store::Error::AlreadyExists {
                path: location.to_string(),
                source: "409 ConditionalRequestConflict".into(),
            });
        }
        if self.quirk == DialectQuirk::NoEtagOnPut {
            let mut r = self.inner.put_opts(location, payload, opts).await?;
            r.e_tag = None;
            r.version = None;
            return Ok(r);
        }
        if let PutMode::Update(UpdateVersion {
            e_tag: Some(e),
            version,
        }) = &opts.mode
        {
            let quoted = e.starts_with('"');
            match (self.quirk, quoted) {
                (DialectQuirk::UnquotedOnly, true) => {
                    return Err(object_store::Error::Precondition {
                        path: location.to_string(),
                        source: "quoted If-Match (this store matches bare ETags only)".into(),
                    });
                }
                (DialectQuirk::UnquotedOnly, false) => {
                    opts.mode = PutMode::Update(UpdateVersion {
                        e_tag: Some(format!("\"{e}\"")),
                        version: version.clone(),
                    });
                }
                (DialectQuirk::UnquotedIgnored, false) => opts.mode = PutMode::Overwrite,
                _ => {}
            }
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<object_store::path::Path>>,
    ) -> BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        let strip = self.quirk == DialectQuirk::ListsWithoutEtags;
        self.inner
            .list(prefix)
            .map(move |r| {
                r.map(|mut m| {
                    if strip {
                        m.e_tag = None;
                    }
                    m
                })
            })
            .boxed()
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}
