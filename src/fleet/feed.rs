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
//! - **Keys are time-ordered** (`keys::hint`: a ten-second bucket, the
//!   writer's wall ms, a nonce, the kind and the name; flat, without the
//!   bucket, while a node of an older build is live: [`HintForms`]), so a
//!   reader lists from a cursor with `Store::list_after`. Writers' clocks and write latency differ, so the
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
    forms: Arc<HintForms>,
}

/// Which form hints are spelt in ([`keys::HintForm`]), shared by a
/// [`HintingStore`] and the node beside it.
///
/// Why a choice: builds before the bucketed form (node records without
/// `proto` ≥ [`crate::fleet::attrs::PROTO_BUCKETED_HINTS`]) list the feed
/// from a flat cursor and ignore bucketed keys, so while one is live a
/// bucketed hint would reach it only by its full listing. This build reads
/// both forms, so flat is safe for everyone and bucketed is cheaper where
/// a listing walks directories (the local store; a store that lists from
/// the cursor on the server, or filters the whole prefix on the client,
/// costs the same either way). Either way a wrong choice only delays a
/// reader: hints only hasten.
///
/// Who decides: a node after each `nodes/` listing ([`HintForms::set`]:
/// bucketed unless a live peer publishes a lower level); a writer without
/// a node beside it (an embedder; the CLI on a local directory, while on
/// any other store it writes flat: [`HintForms::fixed`]) by listing
/// `nodes/` itself before its first hint and again every
/// [`FORM_DECIDED_FOR`] ([`HintForms::decide`], the records judged by the
/// wall clock as a one-shot reader judges them).
#[derive(Debug)]
pub struct HintForms {
    /// 0: not decided; 1: flat; 2: bucketed.
    form: std::sync::atomic::AtomicU8,
    /// Wall ms of the decision.
    at_ms: std::sync::atomic::AtomicU64,
    /// Never decided again ([`HintForms::fixed`]).
    fixed: bool,
    /// One listing at a time: the hints of a burst wait for the first
    /// one's decision instead of each listing `nodes/`.
    deciding: tokio::sync::Mutex<()>,
}

/// How long a writer keeps a form it decided by listing `nodes/` before it
/// lists again (a node sets it at every listing of its own, far oftener).
pub const FORM_DECIDED_FOR: Duration = Duration::from_secs(300);

impl HintForms {
    /// Decided from node records: by the node beside the writer, else by
    /// listing `nodes/` (see the type's docs).
    pub fn auto() -> Arc<Self> {
        Arc::new(HintForms {
            form: 0.into(),
            at_ms: 0.into(),
            fixed: false,
            deciding: Default::default(),
        })
    }

    /// Always `form` (tests, the spike, a fleet known to be one build).
    pub fn fixed(form: keys::HintForm) -> Arc<Self> {
        Arc::new(HintForms {
            form: Self::code(form).into(),
            at_ms: 0.into(),
            fixed: true,
            deciding: Default::default(),
        })
    }

    fn code(form: keys::HintForm) -> u8 {
        match form {
            keys::HintForm::Flat => 1,
            keys::HintForm::Bucketed => 2,
        }
    }

    /// A node's decision from the peers it judged at wall time `wall_ms`
    /// (ignored when fixed).
    pub fn set(&self, form: keys::HintForm, wall_ms: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.fixed {
            self.at_ms.store(wall_ms, Relaxed);
            self.form.store(Self::code(form), Relaxed);
        }
    }

    /// The form decided, if still current at wall time `wall_ms`.
    pub fn current(&self, wall_ms: u64) -> Option<keys::HintForm> {
        use std::sync::atomic::Ordering::Relaxed;
        let form = match self.form.load(Relaxed) {
            1 => keys::HintForm::Flat,
            2 => keys::HintForm::Bucketed,
            _ => return None,
        };
        // A decision stamped ahead of this clock (a wall clock stepped
        // back, or a node on another clock) is not taken as fresh for
        // longer than the step: past a second ahead, it is decided again.
        let at = self.at_ms.load(Relaxed);
        let fresh = self.fixed
            || (at <= wall_ms.saturating_add(1_000)
                && wall_ms.saturating_sub(at) < FORM_DECIDED_FOR.as_millis() as u64);
        fresh.then_some(form)
    }

    /// The form to write in at wall time `wall_ms`: the current decision,
    /// else one made now from a listing of `nodes/` in `store` (flat if it
    /// fails: every build reads that).
    pub async fn decide(&self, store: &Arc<dyn Store>, wall_ms: u64) -> keys::HintForm {
        if let Some(form) = self.current(wall_ms) {
            return form;
        }
        let _one = self.deciding.lock().await;
        if let Some(form) = self.current(wall_ms) {
            return form; // decided while we waited
        }
        let form = match older_reader_listed(store, wall_ms).await {
            Ok(true) => keys::HintForm::Flat,
            Ok(false) => keys::HintForm::Bucketed,
            Err(e) => {
                tracing::debug!(error = %crate::error::Chain(&e), "listing nodes/ to choose the hint form; flat");
                keys::HintForm::Flat
            }
        };
        self.set(form, wall_ms);
        form
    }
}

/// Does `record` (a node record) name a live node that reads flat hints
/// only ([`HintForms`])? Judged as a one-shot reader judges, by the wall
/// clock with the default skew.
fn reads_flat_only(record: &crate::record::LeaseRecord, wall_ms: u64) -> bool {
    crate::fleet::attrs::NodeAttrs::of(record).proto < crate::fleet::attrs::PROTO_BUCKETED_HINTS
        && crate::liveness::judge(
            Some(record),
            None,
            crate::liveness::Evidence::WallClock {
                now_ms: wall_ms,
                max_skew: crate::clock::DEFAULT_MAX_SKEW,
            },
        ) == crate::liveness::Liveness::Live
}

/// Lists `nodes/` and reads every record: is any a live node that reads
/// flat hints only? A record that does not decode is no such node (a
/// stray object; at worst its node learns of changes at its full listing).
async fn older_reader_listed(store: &Arc<dyn Store>, wall_ms: u64) -> Result<bool, StoreError> {
    let mut listing = store.list(keys::NODES);
    let mut names = Vec::new();
    while let Some(e) = listing.next().await {
        names.push(e?.key);
    }
    drop(listing);
    for key in names {
        let Some(o) = store.get(&key).await? else {
            continue;
        };
        if let Ok(r) = crate::record::LeaseRecord::decode(&key, &o.bytes, crate::record::Kind::Node)
            && reads_flat_only(&r, wall_ms)
        {
            return Ok(true);
        }
    }
    Ok(false)
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
            forms: HintForms::auto(),
        }
    }

    /// Spelling hints as `forms` says (shared with the node beside it, which
    /// sets it from its listings: `NodeDeps::hint_forms`).
    pub fn with_forms(mut self, forms: Arc<HintForms>) -> Self {
        self.forms = forms;
        self
    }

    /// The forms this store spells hints by.
    pub fn forms(&self) -> Arc<HintForms> {
        self.forms.clone()
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
            let wall = self.clock.wall_ms();
            let ms = wall.saturating_sub(back);
            let form = self.forms.decide(&self.inner, wall).await;
            write_hint(&self.inner, form, ms, self.entropy.as_ref(), kind, name).await;
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
            tracing::debug!(error = %crate::error::Chain(&e), "reading the bell");
            return;
        }
    };
    if let Err(e) = store.put(keys::BELL, body, cond).await {
        tracing::debug!(error = %crate::error::Chain(&e), "the bell was not rung (or rung by another)");
    }
}

/// Writes one hint stamped `ms`. Best effort: a hint that fails is
/// repaired by the next full listing, so the failure is only logged.
/// Whether it landed.
pub async fn write_hint(
    store: &Arc<dyn Store>,
    form: keys::HintForm,
    ms: u64,
    entropy: &dyn Entropy,
    kind: Hinted,
    name: &str,
) -> bool {
    // 8 hex digits: unique enough among writes of one millisecond.
    let nonce = format!("{:08x}", entropy.next_u64() as u32);
    let hint = keys::hint(ms, &nonce, kind, name, form);
    match store.put(&hint, Bytes::new(), Cond::Create).await {
        Ok(_) => true,
        Err(e) => {
            tracing::debug!(hint, error = %crate::error::Chain(&e), "a change hint was not written");
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
    forms: &HintForms,
    clock: &dyn crate::clock::Clock,
    ms: u64,
    entropy: &dyn Entropy,
    kind: Hinted,
    name: &str,
) -> bool {
    let mut pause = Duration::from_millis(100);
    let form = forms.decide(store, clock.wall_ms()).await;
    for attempt in 1..=HINT_TRIES {
        if write_hint(store, form, ms, entropy, kind, name).await {
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
                // A flat hint of the cursor's bucket from before it (see
                // `keys::HintForm::Bucketed`): read before, or repaired by
                // a full listing, as a flat cursor left it out.
                Some((ms, ..)) if ms < from => {}
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

    /// Writes a hint of a claim of `n` stamped `ms`, spelt `form`.
    async fn put_claim_hint(s: &Arc<dyn Store>, ms: u64, n: &str, form: keys::HintForm) {
        s.put(
            &keys::hint(ms, "00", Hinted::Claim, n, form),
            Bytes::new(),
            Cond::Create,
        )
        .await
        .unwrap();
    }

    /// Retention deletes old hints only, in either form.
    #[tokio::test]
    async fn expire_deletes_old_hints_only() {
        let s = mem();
        let now = 10_000_000u64;
        for form in [keys::HintForm::Flat, keys::HintForm::Bucketed] {
            for (ms, n) in [(now - 700_000, "old"), (now - 1_000, "young")] {
                put_claim_hint(&s, ms, n, form).await;
            }
        }
        s.put("changes/0000000000001-foreign", Bytes::new(), Cond::Create)
            .await
            .unwrap();
        assert_eq!(expire(&s, now).await.unwrap(), 2);
        let left = keys_under(&s, keys::CHANGES).await;
        assert_eq!(left.len(), 3, "{left:?}");
        assert_eq!(left.iter().filter(|k| k.ends_with("young")).count(), 2);
    }

    /// A reader of this build reads hints of both forms from its cursor
    /// (flat ones from a writer of an older build among them) and none
    /// from before it, though the listing from a bucketed cursor shows the
    /// flat hints of the cursor's bucket from before it.
    #[tokio::test]
    async fn the_cursor_reads_both_forms_from_its_time_on() {
        let s = mem();
        let t = 1_764_700_005_000u64;
        let mut c = FeedCursor::new(Duration::ZERO);
        c.covered_until(t);
        for (ms, form, n) in [
            (t - 1, keys::HintForm::Flat, "before-flat"),
            (t - 1, keys::HintForm::Bucketed, "before-bucketed"),
            (t, keys::HintForm::Flat, "at-flat"),
            (t + 1, keys::HintForm::Bucketed, "after-bucketed"),
            (t + 20_000, keys::HintForm::Flat, "later-flat"),
        ] {
            put_claim_hint(&s, ms, n, form).await;
        }
        let r = c.read(&s, t + 30_000).await.unwrap();
        assert_eq!(
            r.keys.iter().cloned().collect::<Vec<_>>(),
            [
                "sessions/after-bucketed",
                "sessions/at-flat",
                "sessions/later-flat"
            ]
        );
        assert_eq!(
            r.listed, 4,
            "the flat hint of the cursor's bucket is listed, not read"
        );
    }

    /// A node record under `nodes/` for the test, with `attrs`.
    async fn node_record(
        s: &Arc<dyn Store>,
        clock: &Arc<MockClock>,
        id: &str,
        proto: Option<u32>,
    ) -> crate::lease::Lease {
        use crate::lease::{Acquire, AcquireOptions, LeaseClient};
        let client = LeaseClient::builder(s.clone(), crate::Name::new(id).unwrap())
            .clock(clock.clone())
            .build()
            .unwrap();
        let mut opts = AcquireOptions::ttl(Duration::from_secs(10));
        if let Some(p) = proto {
            opts.attrs
                .insert(crate::fleet::attrs::PROTO.into(), p.into());
        }
        let Acquire::Acquired(lease) = client
            .acquire_kind(
                crate::record::Kind::Node,
                &crate::Name::new(id).unwrap(),
                &opts,
            )
            .await
            .unwrap()
        else {
            panic!("fresh key")
        };
        lease
    }

    /// A writer with no node beside it spells hints flat while a live node
    /// publishes a level below `PROTO_BUCKETED_HINTS` (it would not read
    /// bucketed ones), bucketed once none does: decided by listing `nodes/`
    /// before the first hint and again every `FORM_DECIDED_FOR`. A node's
    /// own decision (`HintForms::set`) is taken without a listing.
    #[tokio::test]
    async fn the_hint_form_keeps_to_the_oldest_live_reader() {
        let inner = mem();
        let counting = CountingStore::new(inner.clone());
        let clock = Arc::new(MockClock::new());
        let w: Arc<dyn Store> = Arc::new(HintingStore::new(
            Arc::new(counting.clone()),
            clock.clone(),
            Arc::new(SeededEntropy::new(3)),
        ));
        let newer = node_record(
            &inner,
            &clock,
            "new",
            Some(crate::fleet::attrs::PROTO_LEVEL),
        )
        .await;
        let older = node_record(&inner, &clock, "old", Some(1)).await;
        let forms = |s: Vec<String>| -> Vec<Option<bool>> {
            s.iter()
                .map(|k| keys::parse_hint(k).map(|_| k.matches('/').count() == 2))
                .collect()
        };
        w.put("sessions/a", Bytes::from_static(b"c"), Cond::Create)
            .await
            .unwrap();
        assert_eq!(counting.counts().list_pages, 1, "nodes/ listed to decide");
        assert_eq!(
            forms(keys_under(&inner, keys::CHANGES).await),
            [Some(false)],
            "flat"
        );
        // The older node stops; the decision holds until it is due again.
        older.release().await.unwrap();
        drop(newer);
        clock.advance(Duration::from_secs(60));
        w.put("sessions/b", Bytes::from_static(b"c"), Cond::Create)
            .await
            .unwrap();
        assert_eq!(counting.counts().list_pages, 1, "decided a minute ago");
        clock.advance(FORM_DECIDED_FOR);
        inner.delete(&keys::session("a")).await.unwrap();
        w.put("sessions/c", Bytes::from_static(b"c"), Cond::Create)
            .await
            .unwrap();
        assert_eq!(counting.counts().list_pages, 2);
        let hinted = keys_under(&inner, keys::CHANGES).await;
        assert_eq!(
            forms(hinted.clone()),
            [Some(false), Some(false), Some(true)],
            "bucketed once no older node is live: {hinted:?}"
        );
        // An older node whose record expired (not renewed) is no reader.
        let _stale = node_record(&inner, &clock, "stale", None).await;
        clock.advance(Duration::from_secs(30) + FORM_DECIDED_FOR);
        w.put("sessions/d", Bytes::from_static(b"c"), Cond::Create)
            .await
            .unwrap();
        assert_eq!(counting.counts().list_pages, 3);
        let hinted = keys_under(&inner, keys::CHANGES).await;
        assert!(
            hinted
                .iter()
                .any(|k| k.contains("-s-d") && k.matches('/').count() == 2)
        );
        // A node's decision stands without a listing, and a fixed form
        // never lists.
        let node_forms = HintForms::auto();
        node_forms.set(keys::HintForm::Flat, clock.wall_ms());
        let by_node: Arc<dyn Store> = Arc::new(
            HintingStore::new(
                Arc::new(counting.clone()),
                clock.clone(),
                Arc::new(SeededEntropy::new(4)),
            )
            .with_forms(node_forms),
        );
        by_node
            .put("sessions/e", Bytes::from_static(b"c"), Cond::Create)
            .await
            .unwrap();
        assert_eq!(counting.counts().list_pages, 3, "the node decided");
        let hinted = keys_under(&inner, keys::CHANGES).await;
        assert!(
            hinted
                .iter()
                .any(|k| k.contains("-s-e") && k.matches('/').count() == 1)
        );
        assert_eq!(
            HintForms::fixed(keys::HintForm::Bucketed).current(u64::MAX),
            Some(keys::HintForm::Bucketed)
        );
    }

    /// Forwards to the inner store, yielding before each read: a burst of
    /// hints then interleaves at the decision's reads.
    #[derive(Debug)]
    struct Yielding(Arc<dyn Store>);

    impl fmt::Display for Yielding {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}", self.0)
        }
    }

    #[async_trait]
    impl crate::store::Forward for Yielding {
        fn inner(&self) -> &dyn Store {
            &*self.0
        }

        async fn get(&self, key: &str) -> Result<Option<crate::store::Object>, StoreError> {
            tokio::task::yield_now().await;
            self.0.get(key).await
        }
    }

    /// The hints of a burst through a fresh writer wait for one listing of
    /// `nodes/` (not one each), and a decision stamped more than a second
    /// ahead of the reader's clock (a clock stepped back) is not fresh.
    #[tokio::test]
    async fn the_hint_form_is_decided_once_a_burst_and_not_ahead_of_the_clock() {
        let inner = mem();
        let counting = CountingStore::new(inner.clone());
        let clock = Arc::new(MockClock::new());
        let _node = node_record(&inner, &clock, "n1", Some(crate::fleet::attrs::PROTO_LEVEL)).await;
        let w: Arc<dyn Store> = Arc::new(HintingStore::new(
            Arc::new(Yielding(Arc::new(counting.clone()))),
            clock.clone(),
            Arc::new(SeededEntropy::new(5)),
        ));
        futures::future::join_all((0..8).map(|i| {
            let w = w.clone();
            async move {
                w.put(&keys::session(format!("b{i}")), Bytes::new(), Cond::Create)
                    .await
                    .unwrap()
            }
        }))
        .await;
        assert_eq!(
            counting.counts().list_pages,
            1,
            "one decision for the burst"
        );
        assert_eq!(keys_under(&inner, keys::CHANGES).await.len(), 8);
        let f = HintForms::auto();
        f.set(keys::HintForm::Flat, 100_000);
        assert_eq!(
            f.current(99_500),
            Some(keys::HintForm::Flat),
            "within a second"
        );
        assert_eq!(f.current(98_000), None, "stamped two seconds ahead");
        assert_eq!(f.current(100_000 + 299_999), Some(keys::HintForm::Flat));
        assert_eq!(
            f.current(100_000 + 300_000),
            None,
            "FORM_DECIDED_FOR passed"
        );
    }
}
