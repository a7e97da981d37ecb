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
//!    new version;
//! 4. `rejected stale update`: an If-Match with the old version is refused,
//!    and the object still holds step 3's bytes;
//! 5. `create race`: [`RACE_ROUNDS`] rounds of [`RACE_WIDTH`] concurrent
//!    creates of one fresh key, released together by a barrier: exactly one
//!    wins in every round;
//! 6. `update race`: as many rounds of concurrent If-Match updates with one
//!    version: exactly one wins, and the stored bytes are the winner's;
//! 7. `conditional get`: If-None-Match with the current version answers not
//!    modified (reported, not required: only the wake path's cache needs it).
//!
//! A store that fails steps 1-6 is refused with [`Error::Unsupported`] naming
//! the store and the step. Scratch keys are deleted afterwards.
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

use crate::clock::Entropy;
use crate::error::{Error, Result};
use crate::store::{Cond, Conditional, Store, StoreError, Version};
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
}

/// What the probe found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeReport {
    pub store: String,
    pub steps: Vec<Step>,
    /// If-None-Match on GET works (repeat resolves cost no body).
    pub conditional_get: bool,
}

struct Run<'a> {
    store: &'a Arc<dyn Store>,
    steps: Vec<Step>,
}

impl Run<'_> {
    fn pass(&mut self, name: &'static str, detail: impl Into<String>) {
        self.steps.push(Step {
            name,
            ok: true,
            detail: detail.into(),
        });
    }

    fn fail(&mut self, name: &'static str, detail: impl Into<String>) -> Error {
        let detail = detail.into();
        self.steps.push(Step {
            name,
            ok: false,
            detail: detail.clone(),
        });
        Error::Unsupported {
            store: self.store.to_string(),
            step: name.to_string(),
            detail,
        }
    }
}

fn transport(step: &'static str, key: &str, e: StoreError) -> Error {
    tracing::warn!(step, key, error = %e, "probe step could not complete");
    Error::from_store("probe", key, e)
}

fn body(tag: &str, entropy: &dyn Entropy) -> Bytes {
    Bytes::from(format!(
        "{{\"schema\":\"leasehold/v1\",\"kind\":\"probe\",\"step\":\"{tag}\",\"nonce\":\"{}\"}}",
        entropy.hex_id()
    ))
}

/// Runs the probe. `Err(Unsupported)` if the store does not honour
/// conditional writes; a transient error if it could not be reached.
pub async fn probe(store: &Arc<dyn Store>, entropy: &dyn Entropy) -> Result<ProbeReport> {
    let dir = format!("_probe/{}", entropy.hex_id());
    let a = format!("{dir}/a");
    let b = format!("{dir}/b");
    let mut run = Run {
        store,
        steps: Vec::new(),
    };
    let r = steps(&mut run, &dir, &a, &b, entropy).await;
    // Clean up whatever happened; failures here are not the store's fault.
    let race_keys: Vec<String> = (0..RACE_ROUNDS).map(|i| format!("{dir}/c{i}")).collect();
    for k in [&a, &b].into_iter().chain(race_keys.iter()) {
        if let Err(e) = store.delete(k).await {
            tracing::warn!(key = k, error = %e, "probe clean-up failed");
        }
    }
    let conditional_get = r?;
    Ok(ProbeReport {
        store: store.to_string(),
        steps: run.steps,
        conditional_get,
    })
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
) -> Result<Vec<(Bytes, Version)>> {
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
        let (bytes, r) = t.await.map_err(|e| Error::Internal(e.to_string()))?;
        match r {
            Ok(v) => winners.push((bytes, v)),
            Err(e) if expected(&e) => {}
            Err(e) => return Err(transport(step, key, e)),
        }
    }
    Ok(winners)
}

async fn steps(
    run: &mut Run<'_>,
    dir: &str,
    a: &str,
    b: &str,
    entropy: &dyn Entropy,
) -> Result<bool> {
    let store = run.store.clone();
    // 1. create
    let b1 = body("create", entropy);
    let v1 = match store.put(a, b1, Cond::Create).await {
        Ok(v) => v,
        Err(StoreError::AlreadyExists) => {
            return Err(run.fail("create", "a fresh random key reported AlreadyExists"));
        }
        Err(e) => return Err(transport("create", a, e)),
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
        Err(e) => return Err(transport("rejected create", a, e)),
    }

    // 3. update with the current version
    let b3 = body("update", entropy);
    let v2 = match store.put(a, b3.clone(), Cond::Match(v1.clone())).await {
        Ok(v) => v,
        Err(StoreError::Precondition) => {
            return Err(run.fail(
                "update",
                "If-Match with the version the store just returned was refused",
            ));
        }
        Err(e) => return Err(transport("update", a, e)),
    };
    if v2 == v1 {
        return Err(run.fail("update", "new bytes kept the same version"));
    }
    run.pass("update", format!("version {v2}"));

    // 4. rejected stale update, and nothing changed
    match store
        .put(a, body("stale", entropy), Cond::Match(v1.clone()))
        .await
    {
        Err(StoreError::Precondition) => {}
        Ok(_) => {
            return Err(run.fail(
                "rejected stale update",
                "an If-Match with a superseded version succeeded: the store ignores If-Match",
            ));
        }
        Err(e) => return Err(transport("rejected stale update", a, e)),
    }
    match store.get(a).await {
        Ok(Some(o)) if o.bytes == b3 && o.version == v2 => {
            run.pass("rejected stale update", "Precondition; object unchanged")
        }
        Ok(_) => {
            return Err(run.fail(
                "rejected stale update",
                "the rejected write changed the object",
            ));
        }
        Err(e) => return Err(transport("rejected stale update", a, e)),
    }

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
        .await?;
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
        Err(e) => return Err(transport("update race", b, e)),
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
        .await?;
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
            Err(e) => return Err(transport("update race", b, e)),
        }
    }
    run.pass(
        "update race",
        format!("1 of {RACE_WIDTH} won, {RACE_ROUNDS} rounds of {RACE_WIDTH}"),
    );

    // 7. conditional get (informational)
    let cg = matches!(
        store.get_if_changed(a, &v2).await,
        Ok(Conditional::NotModified)
    );
    run.steps.push(Step {
        name: "conditional get",
        ok: cg,
        detail: if cg {
            "If-None-Match answered not modified".into()
        } else {
            "not supported: repeat resolves will fetch the body".into()
        },
    });
    Ok(cg)
}
