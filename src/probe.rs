//! The store probe: proof that a store honours conditional writes.
//!
//! Some S3-compatible stores silently ignore `If-Match` / `If-None-Match`; on
//! such a store every guarantee leasehold makes is void. Before a node serves
//! (and in `leasehold doctor`) the probe runs, on scratch keys under
//! `_probe/<random>/`:
//!
//! 1. `create`: create-if-absent on a fresh key succeeds;
//! 2. `rejected create`: a second create on it is refused;
//! 3. `update`: an If-Match with the current version succeeds and yields a
//!    new version. A 412 here may be the store's ETag dialect (Ceph RGW 16
//!    matches only a bare ETag): a 412 is a definite "not written", so the
//!    other form is tried, and the adapter speaks the form that worked
//!    ([`crate::store::EtagDialect`]; `doctor` names it);
//! 4. `rejected stale update`: an If-Match with the old version is refused
//!    in *both* ETag forms (learning a dialect never relaxes a check), and
//!    the object still holds step 3's bytes;
//!    then `listing versions`: a listing shows the version a read returns
//!    (expiry by observation compares the two; a store whose listings lack
//!    ETags would strand a dead node's sessions);
//! 5. `create race`: [`RACE_ROUNDS`] rounds of [`RACE_WIDTH`] concurrent
//!    creates of one fresh key, released together by a barrier: exactly one
//!    wins in every round;
//! 6. `update race`: as many rounds of concurrent If-Match updates with one
//!    version: exactly one wins, and the stored bytes are the winner's;
//! 7. `conditional get`: If-None-Match with the current version answers not
//!    modified (reported, not required: only the wake path's cache needs it).
//!
//! A store that fails steps 1-6 is refused with [`Error::Unsupported`] naming
//! the store and the step (exit 6), as is one that answers a step's request
//! with 501 or without an ETag; a transport failure is `Unavailable` (exit
//! 4). Every step is timed, and [`probe_report`] keeps the table on failure.
//! Scratch keys are deleted afterwards.
//!
//! # Power
//!
//! A store that checks conditions without a lock passes steps 1-4 (they are
//! sequential) and loses a race only when two writers pass the check before
//! either writes. One race round proves little: a store that serialises a
//! race by chance nine times in ten passes a single round one time in ten.
//! So each race step runs [`RACE_ROUNDS`] rounds with the writers released
//! together; a store that lets a round slip with probability `p` passes with
//! `(1 - p)^16`. Measured (tests/faults.rs,
//! `probe_refuses_a_lock_free_store_with_measured_power`): a store that checks
//! without a lock is refused in every one of 1,000 probes, and a correct
//! store passes every one. Cost: 2 × 16 × 8 conditional PUTs, 16 GETs and
//! the 4 sequential steps plus clean-up: about 300 requests (under a cent on
//! S3) and 32 concurrent rounds of latency (about 2 s at 60 ms a PUT).

use crate::clock::{Clock, Entropy};
use crate::error::{Error, Result};
use crate::store::{Cond, Conditional, EtagDialect, Store, StoreError, Version};
use bytes::Bytes;
use std::sync::Arc;

/// Concurrent writers in each race round.
pub const RACE_WIDTH: usize = 8;
/// Rounds of each race step (see the module docs for the power).
pub const RACE_ROUNDS: usize = 16;

/// One step's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Step {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
    /// Time since the previous step ended (or the probe began).
    pub ms: u64,
}

/// What the probe found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeReport {
    pub store: String,
    pub steps: Vec<Step>,
    /// If-None-Match on GET works (repeat resolves cost no body).
    pub conditional_get: bool,
    /// The If-Match form the store speaks, as learned at step 3 (None: a
    /// store without HTTP ETags).
    pub etag_dialect: Option<EtagDialect>,
}

struct Run<'a> {
    store: &'a Arc<dyn Store>,
    steps: Vec<Step>,
    clock: &'a dyn Clock,
    mark: crate::clock::MonoTime,
    /// The ETag form is known: step 4 showed it refuses a stale version.
    /// Until then a report names no dialect (what the handle holds is only
    /// its default).
    dialect_known: bool,
}

impl Run<'_> {
    fn lap(&mut self) -> u64 {
        let now = self.clock.now();
        let ms = now.saturating_since(self.mark).as_millis() as u64;
        self.mark = now;
        ms
    }

    fn pass(&mut self, name: &'static str, detail: impl Into<String>) {
        let ms = self.lap();
        self.steps.push(Step {
            name,
            ok: true,
            detail: detail.into(),
            ms,
        });
    }

    /// A store error during `step`: a store that cannot do what the step
    /// needs (no ETag on a write, conditional writes switched off) fails the
    /// step, so the store is refused (exit 6) with the step named; anything
    /// else is a transport failure (the probe could not complete).
    fn store_err(&mut self, step: &'static str, key: &str, e: StoreError) -> Error {
        match e {
            StoreError::NotSupported { message } => self.fail(step, message),
            e => transport(step, key, e),
        }
    }

    fn fail(&mut self, name: &'static str, detail: impl Into<String>) -> Error {
        let detail = detail.into();
        let ms = self.lap();
        self.steps.push(Step {
            name,
            ok: false,
            detail: detail.clone(),
            ms,
        });
        Error::Unsupported {
            store: self.store.to_string(),
            step: name.to_string(),
            detail,
        }
    }
}

fn transport(step: &'static str, key: &str, e: StoreError) -> Error {
    tracing::warn!(step, key, error = %crate::error::Chain(&e), "probe step could not complete");
    Error::from_store("probe", key, e)
}

fn body(tag: &str, entropy: &dyn Entropy) -> Bytes {
    Bytes::from(format!(
        "{{\"schema\":\"leasehold/v1\",\"kind\":\"probe\",\"step\":\"{tag}\",\"nonce\":\"{}\"}}",
        entropy.hex_id()
    ))
}

/// The store as the probe sees it: every key a write is sent to is noted.
#[derive(Debug)]
struct Written {
    inner: Arc<dyn Store>,
    keys: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl std::fmt::Display for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait::async_trait]
impl crate::store::Forward for Written {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        self.keys.lock().unwrap().insert(key.to_string());
        self.inner.put(key, bytes, cond).await
    }
}

/// Runs the probe. `Err(Unsupported)` if the store does not honour
/// conditional writes; a transient error if it could not be reached.
pub async fn probe(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    clock: &dyn Clock,
) -> Result<ProbeReport> {
    let (report, outcome) = probe_report(store, entropy, clock).await;
    outcome.map(|()| report)
}

/// Runs the probe and keeps its report whatever the outcome: the steps up to
/// and including a failed one, each timed (`leasehold doctor` shows the table
/// on failure as on success).
pub async fn probe_report(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    clock: &dyn Clock,
) -> (ProbeReport, Result<()>) {
    let dir = format!("_probe/{}", entropy.hex_id());
    let a = format!("{dir}/a");
    let b = format!("{dir}/b");
    // Every key a write was sent to (landed or not: an ambiguous one may
    // have), so that the clean-up deletes those and no others: a probe
    // refused at its first write has nothing to clean up.
    let written = Arc::new(Written {
        inner: store.clone(),
        keys: Default::default(),
    });
    let recording: Arc<dyn Store> = written.clone();
    let mut run = Run {
        store: &recording,
        steps: Vec::new(),
        clock,
        mark: clock.now(),
        dialect_known: false,
    };
    let r = steps(&mut run, &dir, &a, &b, entropy).await;
    let (steps_run, dialect_known) = (std::mem::take(&mut run.steps), run.dialect_known);
    // Clean up whatever happened; failures here are not the store's fault.
    let keys: Vec<String> = written.keys.lock().unwrap().iter().cloned().collect();
    let mut failed = 0;
    for k in &keys {
        if let Err(e) = store.delete(k).await {
            if failed == 0 {
                tracing::warn!(key = k, error = %crate::error::Chain(&e), "probe clean-up failed");
            }
            failed += 1;
        }
    }
    if failed > 1 {
        tracing::warn!(keys = failed, dir, "probe clean-up failed on more keys");
    }
    let report = ProbeReport {
        store: store.to_string(),
        steps: steps_run,
        conditional_get: *r.as_ref().unwrap_or(&false),
        etag_dialect: store.etag_dialect().filter(|_| dialect_known),
    };
    (report, r.map(|_| ()))
}

/// One round of `RACE_WIDTH` concurrent puts of `key` under `cond`, released
/// together: (bytes, version) of each write the store accepted. `expected`
/// is the refusal every loser must get.
async fn race(
    store: &Arc<dyn Store>,
    step: &'static str,
    key: &str,
    cond: Cond,
    expected: fn(&StoreError) -> bool,
    entropy: &dyn Entropy,
) -> std::result::Result<Vec<(Bytes, Version)>, StoreError> {
    let barrier = Arc::new(tokio::sync::Barrier::new(RACE_WIDTH));
    let mut tasks = Vec::new();
    for i in 0..RACE_WIDTH {
        let s = store.clone();
        let k = key.to_string();
        let c = cond.clone();
        let bytes = body(&format!("{step}-{i}"), entropy);
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            (bytes.clone(), s.put(&k, bytes, c).await)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (bytes, r) = t.await.map_err(|e| StoreError::Unavailable {
            message: format!("{step} task on {key} failed: {e}"),
        })?;
        match r {
            Ok(v) => winners.push((bytes, v)),
            Err(e) if expected(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(winners)
}

/// The If-Match forms to try, the store's current one first; `[Quoted]`
/// stands for "the store's only form" when it has no dialects.
fn dialects(current: Option<EtagDialect>) -> Vec<EtagDialect> {
    match current {
        None => vec![EtagDialect::Quoted],
        Some(EtagDialect::Quoted) => vec![EtagDialect::Quoted, EtagDialect::Unquoted],
        Some(EtagDialect::Unquoted) => vec![EtagDialect::Unquoted, EtagDialect::Quoted],
    }
}

fn form_name(dialect: Option<EtagDialect>, form: EtagDialect) -> Option<&'static str> {
    dialect.map(|_| form.as_str())
}

/// Learns the store's If-Match form with the probe's sequential steps only
/// (create, rejected create, update, stale update in both forms, listing
/// versions: about ten requests on a scratch key), for one-shot commands
/// that write with If-Match without running the whole probe (`lease renew`,
/// `lease release`, `apply --replace`). Nothing is relaxed: a store that
/// accepts a stale version in either form is refused here too. A store
/// without ETag dialects (local, memory) answers None at no cost.
pub async fn learn_dialect(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    clock: &dyn Clock,
) -> Result<Option<EtagDialect>> {
    if store.etag_dialect().is_none() {
        return Ok(None);
    }
    let dir = format!("_probe/{}", entropy.hex_id());
    let a = format!("{dir}/a");
    let mut run = Run {
        store,
        steps: Vec::new(),
        clock,
        mark: clock.now(),
        dialect_known: false,
    };
    let r = sequential(&mut run, &dir, &a, entropy).await;
    if let Err(e) = store.delete(&a).await {
        tracing::warn!(key = a, error = %crate::error::Chain(&e), "probe clean-up failed");
    }
    r.map(|_| store.etag_dialect())
}

async fn steps(
    run: &mut Run<'_>,
    dir: &str,
    a: &str,
    b: &str,
    entropy: &dyn Entropy,
) -> Result<bool> {
    let store = run.store.clone();
    let v2 = sequential(run, dir, a, entropy).await?;
    races(run, dir, b, entropy).await?;

    // 7. conditional get (informational)
    let cg = matches!(
        store.get_if_changed(a, &v2).await,
        Ok(Conditional::NotModified)
    );
    let ms = run.lap();
    run.steps.push(Step {
        name: "conditional get",
        ms,
        ok: cg,
        detail: if cg {
            "If-None-Match answered not modified".into()
        } else {
            "not supported: repeat resolves will fetch the body".into()
        },
    });
    Ok(cg)
}

/// Steps 1-4 and the listing check on key `a`; the version step 3 wrote.
async fn sequential(
    run: &mut Run<'_>,
    dir: &str,
    a: &str,
    entropy: &dyn Entropy,
) -> Result<Version> {
    let store = run.store.clone();
    // 1. create
    let b1 = body("create", entropy);
    let v1 = match store.put(a, b1, Cond::Create).await {
        Ok(v) => v,
        Err(StoreError::AlreadyExists) => {
            return Err(run.fail("create", "a fresh random key reported AlreadyExists"));
        }
        Err(e) => return Err(run.store_err("create", a, e)),
    };
    if v1.etag.is_none() && v1.version.is_none() {
        return Err(run.fail("create", "the store returned no ETag or version"));
    }
    run.pass("create", format!("version {v1}"));

    // 2. rejected create
    match store
        .put(a, body("create-again", entropy), Cond::Create)
        .await
    {
        Err(StoreError::AlreadyExists) => run.pass("rejected create", "AlreadyExists"),
        Ok(_) => {
            return Err(run.fail(
                "rejected create",
                "a create on an existing key succeeded: the store ignores If-None-Match",
            ));
        }
        Err(e) => return Err(run.store_err("rejected create", a, e)),
    }

    // 3. update with the current version, learning the ETag dialect: a 412
    // on the version the store has just returned may be the quoting (Ceph
    // RGW matches bare ETags only). A 412 is a definite "not written", so
    // the other form may be tried; step 4 then makes sure neither form
    // accepts a stale version, so this never relaxes a check.
    let b3 = body("update", entropy);
    let first = store.etag_dialect();
    // Each form is tried for one request (`Cond::MatchAs`), so the form the
    // store handle speaks for everyone else changes only once, and only if
    // the current one was refused.
    let mut v2 = None;
    let mut learned = None;
    for (i, form) in dialects(first).into_iter().enumerate() {
        let cond = match first {
            None => Cond::Match(v1.clone()),
            Some(_) => Cond::MatchAs(v1.clone(), form),
        };
        match store.put(a, b3.clone(), cond).await {
            Ok(v) => {
                // Switched only once step 4 has shown the form refuses a
                // stale version: a refused store is left as it was.
                if i > 0 {
                    learned = Some(form);
                }
                v2 = Some(v);
                break;
            }
            Err(StoreError::Precondition) => {}
            Err(e) => return Err(run.store_err("update", a, e)),
        }
    }
    let Some(v2) = v2 else {
        return Err(run.fail(
            "update",
            "If-Match with the version the store just returned was refused (quoted and unquoted)",
        ));
    };
    if v2 == v1 {
        return Err(run.fail("update", "new bytes kept the same version"));
    }
    let dialect = learned.or(first);
    run.pass(
        "update",
        match dialect {
            Some(d) => format!("version {v2}; If-Match ETags {}", d.as_str()),
            None => format!("version {v2}"),
        },
    );

    // 4. rejected stale update, in every ETag form, and nothing changed
    for form in dialects(dialect) {
        let cond = match dialect {
            None => Cond::Match(v1.clone()),
            Some(_) => Cond::MatchAs(v1.clone(), form),
        };
        match store.put(a, body("stale", entropy), cond).await {
            Err(StoreError::Precondition) => {}
            Ok(_) => {
                return Err(run.fail(
                    "rejected stale update",
                    match form_name(dialect, form) {
                        Some(f) => format!(
                            "an If-Match with a superseded version ({f} ETag) succeeded: the store ignores If-Match"
                        ),
                        None => "an If-Match with a superseded version succeeded: the store ignores If-Match".into(),
                    },
                ));
            }
            Err(e) => return Err(run.store_err("rejected stale update", a, e)),
        }
    }
    match store.get(a).await {
        Ok(Some(o)) if o.bytes == b3 && o.version == v2 => {
            if let Some(l) = learned {
                store.set_etag_dialect(l);
            }
            run.dialect_known = true;
            run.pass("rejected stale update", "Precondition; object unchanged")
        }
        Ok(_) => {
            return Err(run.fail(
                "rejected stale update",
                "the rejected write changed the object",
            ));
        }
        Err(e) => return Err(run.store_err("rejected stale update", a, e)),
    }

    // 4b. listings carry the versions reads return: expiry by observation
    // compares a listed version with a read one (`Version`'s equality: the
    // ETags), and a store whose listings lack them (or differ) would strand
    // a dead node's sessions.
    let mut listed = None;
    let mut entries = store.list(&format!("{dir}/"));
    while let Some(e) = futures::StreamExt::next(&mut entries).await {
        match e {
            Ok(e) if e.key == a => listed = Some(e.version),
            Ok(_) => {}
            Err(e) => return Err(run.store_err("listing versions", dir, e)),
        }
    }
    match listed {
        Some(v) if v == v2 => run.pass("listing versions", "listed version matches the read"),
        Some(v) => {
            return Err(run.fail(
                "listing versions",
                format!(
                    "the listing shows version {v} where a read shows {v2}: peers could never observe a lease unchanged"
                ),
            ));
        }
        None => {
            return Err(run.fail(
                "listing versions",
                "a key just written is missing from the listing",
            ));
        }
    }

    Ok(v2)
}

/// Steps 5 and 6.
async fn races(run: &mut Run<'_>, dir: &str, b: &str, entropy: &dyn Entropy) -> Result<()> {
    let store = run.store.clone();
    // 5. create race, RACE_ROUNDS rounds on fresh keys
    for round in 0..RACE_ROUNDS {
        let key = format!("{dir}/c{round}");
        let winners = race(
            &store,
            "create race",
            &key,
            Cond::Create,
            |e| matches!(e, StoreError::AlreadyExists),
            entropy,
        )
        .await
        .map_err(|e| run.store_err("create race", &key, e))?;
        if winners.len() != 1 {
            return Err(run.fail(
                "create race",
                format!(
                    "{} of {RACE_WIDTH} concurrent creates succeeded (round {} of {RACE_ROUNDS})",
                    winners.len(),
                    round + 1
                ),
            ));
        }
    }
    run.pass(
        "create race",
        format!("1 of {RACE_WIDTH} won, {RACE_ROUNDS} rounds of {RACE_WIDTH}"),
    );

    // 6. update race, RACE_ROUNDS rounds on one key, each from the last
    // round's winner
    let mut base = match store.put(b, body("race-base", entropy), Cond::Create).await {
        Ok(v) => v,
        Err(StoreError::AlreadyExists) => {
            return Err(run.fail("update race", "a fresh random key reported AlreadyExists"));
        }
        Err(e) => return Err(run.store_err("update race", b, e)),
    };
    for round in 0..RACE_ROUNDS {
        let winners = race(
            &store,
            "update race",
            b,
            Cond::Match(base.clone()),
            |e| matches!(e, StoreError::Precondition),
            entropy,
        )
        .await
        .map_err(|e| run.store_err("update race", b, e))?;
        if winners.len() != 1 {
            return Err(run.fail(
                "update race",
                format!(
                    "{} of {RACE_WIDTH} concurrent If-Match updates succeeded (round {} of {RACE_ROUNDS})",
                    winners.len(),
                    round + 1
                ),
            ));
        }
        match store.get(b).await {
            Ok(Some(o)) if o.bytes == winners[0].0 && o.version == winners[0].1 => {
                base = o.version;
            }
            Ok(_) => {
                return Err(run.fail(
                    "update race",
                    format!(
                        "the stored bytes are not the winner's (round {} of {RACE_ROUNDS})",
                        round + 1
                    ),
                ));
            }
            Err(e) => return Err(run.store_err("update race", b, e)),
        }
    }
    run.pass(
        "update race",
        format!("1 of {RACE_WIDTH} won, {RACE_ROUNDS} rounds of {RACE_WIDTH}"),
    );

    Ok(())
}
