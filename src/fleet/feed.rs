//! The change feed (issue #14): small immutable hints that a manifest or a
//! claim was written, so that a node's pass reads what changed instead of
//! listing every manifest and claim.
//!
//! # Contract
//!
//! - **A hint only hastens.** It names a key (`manifests/<name>` or
//!   `sessions/<name>`) that a reader then reads from the bucket; what the
//!   reader acts on is that read, never the hint. A hint is no evidence of
//!   absence, liveness or ownership, and its body is empty.
//! - **Lost, duplicated, late or reordered hints delay, never decide.** A
//!   node still lists everything (the anti-entropy listing) at least every
//!   `full_every`, and its belief in its own claims comes only from those
//!   listings (`core::claim_belief`), so the worst a missing hint does is
//!   make a change wait for that listing.
//! - **Writers hint after the write**, never before: a reader that saw the
//!   hint and read the key before the write landed would drop the hint as
//!   seen and miss the change until the next full listing. A write whose
//!   outcome is unknown is hinted too (a spurious read costs one GET).
//! - **Keys are time-ordered** (`keys::hint`: the writer's wall ms, a nonce,
//!   the kind and the name), so a reader lists from a cursor with
//!   `Store::list_after`. Writers' clocks and write latency differ, so the
//!   cursor trails the reader's own wall clock by a skew window; a hint that
//!   lands further in the past than that is repaired by the full listing.
//! - **Retention.** Hints older than `RETENTION` are deleted by one node
//!   (the first live id in key order), in a task of its own beside its
//!   passes, every `RETENTION / 2`; a bucket lifecycle rule on `changes/`
//!   may do it too. A reader that has not read the feed for
//!   `RETENTION` − its skew window lists everything instead.
//!
//! Writing the hints is [`HintingStore`]'s job: a `Store` wrapper that adds
//! one create-if-absent per write or delete of a manifest or claim (and a
//! ring of the bell, [`ring_bell`], after a manifest's), so every writer
//! that goes through it (the CLI, the node daemon) hints without knowing.
//! Embedders that write manifests through their own store handle wrap it
//! the same way, or their changes wait for the full listing.

use crate::clock::{Clock, Entropy};
use crate::keys::{self, Hinted};
use crate::store::{Cond, Store, StoreError, Version};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// How long a hint is kept. Far longer than any reader's cursor trails (a
/// skew window): a reader that paused longer than this has done a full
/// listing since, which covers what it missed.
pub const RETENTION: Duration = Duration::from_secs(600);

/// Deliberate hint faults for the simulation: hints lost, duplicated, and
/// stamped up to `back_ms` in the past (a write that lands late, or two that
/// land in the other order). Drawn from the store's entropy, so a seeded run
/// replays.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HintFaults {
    /// Probability that a hint is never written.
    pub lose: f64,
    /// Probability that a hint is written twice.
    pub duplicate: f64,
    /// A hint's time is moved back by up to this many ms (uniformly).
    pub back_ms: u64,
}

/// Writes a hint after every write or delete of a manifest or a claim that
/// passes through it; everything else is forwarded untouched.
pub struct HintingStore {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    faults: HintFaults,
}

impl fmt::Debug for HintingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HintingStore")
            .field("inner", &self.inner)
            .field("faults", &self.faults)
            .finish()
    }
}

impl fmt::Display for HintingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

impl HintingStore {
    pub fn new(inner: Arc<dyn Store>, clock: Arc<dyn Clock>, entropy: Arc<dyn Entropy>) -> Self {
        HintingStore {
            inner,
            clock,
            entropy,
            faults: HintFaults::default(),
        }
    }

    /// With deliberate hint faults (tests and the simulation only).
    pub fn with_faults(mut self, faults: HintFaults) -> Self {
        self.faults = faults;
        self
    }

    fn draw(&self, p: f64) -> bool {
        p > 0.0 && (self.entropy.next_u64() as f64 / u64::MAX as f64) < p
    }

    async fn hint(&self, key: &str) {
        let Some((kind, name)) = Hinted::of_key(key) else {
            return;
        };
        if self.draw(self.faults.lose) {
            return;
        }
        let copies = if self.draw(self.faults.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let back = match self.faults.back_ms {
                0 => 0,
                b => self.entropy.next_u64() % (b + 1),
            };
            let ms = self.clock.wall_ms().saturating_sub(back);
            write_hint(&self.inner, ms, self.entropy.as_ref(), kind, name).await;
        }
        // A manifest written or deleted: every node looks now. (Claims
        // are written by nodes, whose rings are their own business.)
        if kind == Hinted::Manifest {
            ring_bell(&self.inner, self.entropy.as_ref()).await;
        }
    }
}

/// Rings the fleet's bell (`keys::BELL`): a new version of one small
/// object, which every node reads with a conditional GET twice per renewal
/// period while it pauses (`core::bell_period`) and answers with a pass.
/// Rung after the hints are written (a rung pass must find them): by a
/// node that fenced a peer or released its claims, so that the nodes
/// placement ranks for those sessions look now, not at their next pass;
/// and by [`HintingStore`] after each write or delete of a manifest (the
/// CLI's `apply` and `delete`), so that a new or deleted session is acted
/// on within about ttl/6 without a nudge.
///
/// A hint like any other: a ring carries nothing but a fresh version, a
/// lost ring delays, and a flood of rings (a foreign writer) costs each
/// node at most a pass per bell period. Written conditionally like every
/// object (If-Match on the version read, create if absent); losing that
/// race means another node just rang it, which is as good.
pub async fn ring_bell(store: &Arc<dyn Store>, entropy: &dyn Entropy) {
    let body = Bytes::from(format!("{:016x}", entropy.next_u64()));
    let cond = match store.get(keys::BELL).await {
        Ok(Some(o)) => Cond::Match(o.version),
        Ok(None) => Cond::Create,
        Err(e) => {
            tracing::debug!(error = %e, "reading the bell");
            return;
        }
    };
    if let Err(e) = store.put(keys::BELL, body, cond).await {
        tracing::debug!(error = %e, "the bell was not rung (or rung by another)");
    }
}

/// Writes one hint stamped `ms`. Best effort: a hint that fails is
/// repaired by the next full listing, so the failure is only logged.
/// Whether it landed.
pub async fn write_hint(
    store: &Arc<dyn Store>,
    ms: u64,
    entropy: &dyn Entropy,
    kind: Hinted,
    name: &str,
) -> bool {
    // 8 hex digits: unique enough among writes of one millisecond.
    let nonce = format!("{:08x}", entropy.next_u64() as u32);
    let hint = keys::hint(ms, &nonce, kind, name);
    match store.put(&hint, Bytes::new(), Cond::Create).await {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(hint, error = %e, "a change hint was not written");
            false
        }
    }
}

/// As [`write_hint`], tried up to `HINT_TRIES` times, 100 ms and then
/// 200 ms apart on `clock`: for the hints peers otherwise learn late (a
/// fenced peer's tombstone, a node's own release), since a light pass
/// reads a peer's record only on a hint and lists `nodes/` only at the
/// slow pace. Each try is a fresh hint (its own nonce), stamped `ms`.
pub async fn write_hint_retried(
    store: &Arc<dyn Store>,
    clock: &dyn crate::clock::Clock,
    ms: u64,
    entropy: &dyn Entropy,
    kind: Hinted,
    name: &str,
) -> bool {
    let mut pause = Duration::from_millis(100);
    for attempt in 1..=HINT_TRIES {
        if write_hint(store, ms, entropy, kind, name).await {
            return true;
        }
        if attempt < HINT_TRIES {
            clock.sleep(pause).await;
            pause *= 2;
        }
    }
    false
}

/// Tries of [`write_hint_retried`].
pub const HINT_TRIES: u32 = 3;

#[async_trait]
impl crate::store::Forward for HintingStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        let r = self.inner.put(key, bytes, cond).await;
        // Also after a rejection: a retried write that landed the first
        // time answers "exists" or "precondition" (its writer reads it back
        // as committed), and a spurious hint costs a reader one GET.
        if matches!(
            &r,
            Ok(_)
                | Err(StoreError::Ambiguous { .. }
                    | StoreError::AlreadyExists
                    | StoreError::Precondition)
        ) {
            self.hint(key).await;
        }
        r
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let r = self.inner.delete(key).await;
        if matches!(&r, Ok(_) | Err(StoreError::Ambiguous { .. })) {
            self.hint(key).await;
        }
        r
    }
}

/// A reader's position in the feed: the hints it has acted on within the
/// skew window, and where its next listing starts.
#[derive(Debug, Clone)]
pub struct FeedCursor {
    skew: Duration,
    /// Wall ms the next listing starts from (inclusive), if any.
    from_ms: Option<u64>,
    /// Hints already acted on at or after `from_ms` (they are listed again
    /// while inside the window).
    seen: BTreeSet<String>,
}

/// What one read of the feed found. Nothing is marked seen until the
/// reader [`FeedCursor::commit`]s it, after acting on it: a pass that fails
/// half-way reads the same hints again.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FeedRead {
    /// Keys named by new hints, each once, in key order.
    pub keys: BTreeSet<String>,
    /// Hints listed (new or not), and entries under `changes/` that are no
    /// hint of ours (ignored).
    pub listed: usize,
    pub foreign: usize,
    /// The new hints themselves, and the reader's wall time at the send.
    fresh: Vec<String>,
    wall_ms: u64,
}

impl FeedCursor {
    pub fn new(skew: Duration) -> Self {
        FeedCursor {
            skew,
            from_ms: None,
            seen: BTreeSet::new(),
        }
    }

    /// Where the cursor stands (None before the first full listing).
    pub fn from_ms(&self) -> Option<u64> {
        self.from_ms
    }

    /// A full listing was *sent* at wall time `wall_ms`: it showed every
    /// write that landed before, so the feed is needed only from then on
    /// (less the skew window).
    pub fn covered_until(&mut self, wall_ms: u64) {
        let from = wall_ms.saturating_sub(self.skew.as_millis() as u64);
        self.move_to(from);
    }

    /// Moves the cursor to `from`. Backwards too: a wall clock stepped back
    /// re-lists hints already acted on (they are read again, 304s at
    /// worst) rather than skip the ones that land meanwhile. Hints before
    /// the cursor are forgotten only when it moves forward past them.
    fn move_to(&mut self, from: u64) {
        let forward = self.from_ms.is_none_or(|f| from > f);
        self.from_ms = Some(from);
        if forward {
            let cut = keys::hint_cursor(from);
            self.seen = self.seen.split_off(&cut);
        }
    }

    /// Lists the feed from the cursor (sent at wall time `wall_ms`) and
    /// returns the keys new hints name. Before a full listing there is no
    /// cursor and nothing is read: that listing covers everything.
    pub async fn read(&self, store: &Arc<dyn Store>, wall_ms: u64) -> Result<FeedRead, StoreError> {
        let mut out = FeedRead {
            wall_ms,
            ..FeedRead::default()
        };
        let Some(from) = self.from_ms else {
            return Ok(out);
        };
        let mut listing = store.list_after(keys::CHANGES, &keys::hint_cursor(from));
        while let Some(e) = listing.next().await {
            let e = e?;
            tokio::task::coop::consume_budget().await;
            out.listed += 1;
            match keys::parse_hint(&e.key) {
                Some((_, kind, name)) => {
                    if !self.seen.contains(&e.key) {
                        out.keys.insert(kind.key(name));
                        out.fresh.push(e.key);
                    }
                }
                None => out.foreign += 1,
            }
        }
        Ok(out)
    }

    /// The reader acted on `read`: its hints are seen, and the cursor
    /// moves to the read's send time less the window (hints that land from
    /// then on carry at least that, given writers' clocks and latency).
    pub fn commit(&mut self, read: FeedRead) {
        if self.from_ms.is_none() {
            return;
        }
        self.seen.extend(read.fresh);
        self.covered_until(read.wall_ms);
    }
}

/// Deletes hints written before `wall_ms − RETENTION`. Returns how many.
/// Deletes race harmlessly between nodes and with `gc`.
pub async fn expire(store: &Arc<dyn Store>, wall_ms: u64) -> Result<usize, StoreError> {
    let cut = keys::hint_cursor(wall_ms.saturating_sub(RETENTION.as_millis() as u64));
    let mut old = Vec::new();
    let mut listing = store.list(keys::CHANGES);
    while let Some(e) = listing.next().await {
        let e = e?;
        // Sorted: everything from the cut on is young enough.
        if e.key >= cut {
            break;
        }
        if keys::parse_hint(&e.key).is_some() {
            old.push(e.key);
        }
    }
    drop(listing);
    let n = old.len();
    let failed = futures::stream::iter(old)
        .map(|k| {
            let store = store.clone();
            async move { store.delete(&k).await }
        })
        .buffer_unordered(EXPIRE_CONCURRENCY)
        .filter(|r| futures::future::ready(r.is_err()))
        .count()
        .await;
    if failed > 0 {
        tracing::debug!(failed, "some expired hints were not deleted (next time)");
    }
    Ok(n - failed)
}

/// Concurrent deletes when expiring hints (a burst of 100,000 applies
/// leaves 200,000 hints to delete ten minutes later).
const EXPIRE_CONCURRENCY: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{MockClock, SeededEntropy};
    use crate::store::CountingStore;

    fn mem() -> Arc<dyn Store> {
        Arc::new(crate::store::ObjectStoreBackend::memory())
    }

    async fn keys_under(s: &Arc<dyn Store>, p: &str) -> Vec<String> {
        s.list(p).map(|e| e.unwrap().key).collect().await
    }

    /// Writes of manifests and claims (and their deletes) are hinted after
    /// the write, refused ones too (a retried write that landed the first
    /// time is refused); other keys are not.
    #[tokio::test]
    async fn every_manifest_and_claim_write_is_hinted_and_nothing_else() {
        let inner = mem();
        let clock = Arc::new(MockClock::new());
        let h: Arc<dyn Store> = Arc::new(HintingStore::new(
            inner.clone(),
            clock.clone(),
            Arc::new(SeededEntropy::new(1)),
        ));
        h.put("manifests/a", Bytes::from_static(b"m"), Cond::Create)
            .await
            .unwrap();
        h.put("sessions/a", Bytes::from_static(b"c"), Cond::Create)
            .await
            .unwrap();
        h.put("nodes/n1", Bytes::from_static(b"n"), Cond::Create)
            .await
            .unwrap();
        // Refused: hinted all the same.
        assert!(
            h.put("sessions/a", Bytes::from_static(b"x"), Cond::Create)
                .await
                .is_err()
        );
        h.delete("manifests/a").await.unwrap();
        let hints = keys_under(&inner, keys::CHANGES).await;
        let named: Vec<_> = hints
            .iter()
            .map(|k| keys::parse_hint(k).map(|(_, kind, n)| kind.key(n)))
            .collect();
        assert_eq!(hints.len(), 4, "{hints:?}");
        assert_eq!(
            named
                .iter()
                .filter(|k| k.as_deref() == Some("manifests/a"))
                .count(),
            2
        );
        assert_eq!(
            named
                .iter()
                .filter(|k| k.as_deref() == Some("sessions/a"))
                .count(),
            2
        );
    }

    /// The cursor reads each hint once, re-lists the window without acting
    /// again, skips foreign objects, and reads nothing before a full listing.
    #[tokio::test]
    async fn the_cursor_reads_each_hint_once() {
        let inner = mem();
        let counting = CountingStore::new(inner.clone());
        let s: Arc<dyn Store> = Arc::new(counting.clone());
        let clock = Arc::new(MockClock::new());
        let w: Arc<dyn Store> = Arc::new(HintingStore::new(
            inner.clone(),
            clock.clone(),
            Arc::new(SeededEntropy::new(2)),
        ));
        let mut c = FeedCursor::new(Duration::from_secs(10));
        w.put("manifests/a", Bytes::from_static(b"m"), Cond::Create)
            .await
            .unwrap();
        assert!(c.read(&s, clock.wall_ms()).await.unwrap().keys.is_empty());
        assert_eq!(counting.counts().list_pages, 0, "no cursor, no request");
        c.covered_until(clock.wall_ms());
        clock.advance(Duration::from_secs(1));
        w.put("sessions/b", Bytes::from_static(b"c"), Cond::Create)
            .await
            .unwrap();
        // Foreign bytes under the feed, in its time range: counted, skipped.
        let junk = format!("{}-junk", keys::hint_cursor(clock.wall_ms()));
        inner.put(&junk, Bytes::new(), Cond::Create).await.unwrap();
        let r = c.read(&s, clock.wall_ms()).await.unwrap();
        // The window re-lists the manifest's hint too: it is new to us.
        assert_eq!(
            r.keys.iter().cloned().collect::<Vec<_>>(),
            ["manifests/a", "sessions/b"]
        );
        assert_eq!(r.foreign, 1);
        // Not acted on (a failed pass): read again.
        let r = c.read(&s, clock.wall_ms()).await.unwrap();
        assert_eq!(r.keys.len(), 2, "uncommitted hints come again");
        c.commit(r);
        clock.advance(Duration::from_secs(1));
        let again = c.read(&s, clock.wall_ms()).await.unwrap();
        assert!(again.keys.is_empty(), "{again:?}");
        assert_eq!(again.listed, 3, "still inside the window");
        c.commit(again);
        clock.advance(Duration::from_secs(30));
        let r = c.read(&s, clock.wall_ms()).await.unwrap();
        c.commit(r);
        let later = c.read(&s, clock.wall_ms()).await.unwrap();
        assert_eq!(later.listed, 0, "the cursor moved past them");
        // A wall clock stepped back a minute lists them again, and acts on
        // none it has not forgotten.
        c.covered_until(clock.wall_ms() - 60_000);
        let back = c.read(&s, clock.wall_ms()).await.unwrap();
        assert_eq!(back.listed, 3);
    }

    /// Retention deletes old hints only.
    #[tokio::test]
    async fn expire_deletes_old_hints_only() {
        let s = mem();
        let now = 10_000_000u64;
        for (ms, n) in [(now - 700_000, "old"), (now - 1_000, "young")] {
            s.put(
                &keys::hint(ms, "00", Hinted::Claim, n),
                Bytes::new(),
                Cond::Create,
            )
            .await
            .unwrap();
        }
        s.put("changes/0000000000001-foreign", Bytes::new(), Cond::Create)
            .await
            .unwrap();
        assert_eq!(expire(&s, now).await.unwrap(), 1);
        let left = keys_under(&s, keys::CHANGES).await;
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left.iter().any(|k| k.ends_with("young")));
    }
}
