//! Claiming sessions this node does not hold: the gate each candidate
//! passes (`core`'s rules over what this node observed), and the batched
//! conditional writes (create-if-absent, or If-Match at epoch + 1) that
//! take them, never sent past the lease's validity.

use super::*;

/// Claims in flight at once in a pass (see `Node::claim_batch`), and how
/// many a pass gathers before it sends them: a batch is sent when full and
/// at the end of the claim loop.
pub(super) const CLAIM_CONCURRENCY: usize = 16;
pub(super) const CLAIM_BATCH: usize = 64;

/// A claim decided by a pass and not yet sent (`Node::claim_try`).
pub(super) struct ClaimTry {
    pub(super) name: String,
    pub(super) key: String,
    pub(super) digest: String,
    /// What the pass saw there: `None` for a create.
    pub(super) existing: Option<(Version, ClaimView)>,
    pub(super) spec: Option<Arc<Spec>>,
    pub(super) cond: Cond,
    /// Before gc's floor.
    pub(super) epoch: u64,
    pub(super) needs_floor: bool,
    /// Read the manifest once the claim lands (no spec came with it).
    pub(super) read_spec: bool,
    pub(super) owner: Owner,
    pub(super) address: Option<String>,
    /// The session's endpoint, when its spec came with the claim and names
    /// a port (else set when it starts: `Node::start`).
    pub(super) endpoint: Option<String>,
    /// `starting`, for a spec with a health check that came with the claim.
    pub(super) health: Option<crate::fleet::check::Health>,
    /// Whether it may still be sent when its turn comes.
    pub(super) live: Live,
    /// A waker to answer as soon as the write commits (`wake_now`).
    pub(super) early: Option<EarlyAnswer>,
}

/// A wake's answer, given when its claim's write commits: before the
/// audit's read-back, the spec's read and the session's start, none of
/// which the waker waits for (it waits for the session to be ready, by
/// resolving). A store the audit then catches letting two writers win stops
/// this node before anything starts; the waker, told `claimed`, finds no
/// ready run at this epoch and says so.
pub(super) struct EarlyAnswer {
    pub(super) reply: crate::fleet::endpoint::Reply,
    pub(super) node: String,
    /// Bucket requests the claim cost before its write (the write counted
    /// on top).
    pub(super) reads: u32,
}

/// What says whether a claim waiting in a batch may still be sent: the
/// node's validity when the claim was decided (the confirmation of its
/// claims included), and, as they are now, the renew task's word on the
/// lease and the audit's on the store. Past any of them the node stops
/// acting, as `claim` did before each write when claims went one at a time.
#[derive(Clone)]
pub(super) struct Live {
    pub(super) decided: MonoTime,
    pub(super) lease: Option<watch::Receiver<Validity>>,
    pub(super) violation: Arc<std::sync::Mutex<Option<String>>>,
}

impl Live {
    pub(super) fn ended(&self, now: MonoTime) -> bool {
        now >= self.decided
            || self.lease.as_ref().is_some_and(|rx| {
                let v = *rx.borrow();
                v.lost || now >= v.until
            })
            || self.violation.lock().unwrap().is_some()
    }
}

/// A claim as sent, and what came of it.
pub(super) struct ClaimSent {
    pub(super) t: ClaimTry,
    /// Taken before the write was sent: the claim is ours as of then at
    /// the latest (see `Node::confirmed_until`).
    pub(super) sent: MonoTime,
    pub(super) record: ClaimRecord,
    pub(super) outcome: Result<ClaimOutcome>,
}

/// A manifest read: absent, or the record and its version.
pub(super) type ManifestRead = Result<Option<(ManifestRecord, Version)>>;

pub(super) enum ClaimOutcome {
    Committed {
        version: Version,
        /// The audit's read-back.
        audit: Result<()>,
        /// Boxed: a manifest record is large beside the other outcomes.
        manifest: Option<Box<ManifestRead>>,
    },
    Rejected(Option<(Bytes, Version)>),
    /// Our validity ended (or the lease or the store's audit failed)
    /// before it was sent.
    NotSent,
}

impl ClaimTry {
    /// The claim's round trips, touching no node state, so that a pass can
    /// have several in flight: gc's floor where needed, the conditional
    /// write (resolved by read-back when its answer is lost), then on
    /// success the audit's read-back and the manifest for the spec.
    /// Boxed and owning what it uses: futures that borrow, gathered by a
    /// stream combinator inside the node's loop, made the compiler give up
    /// proving the spawned loop `Send` (rust-lang/rust#102211).
    pub(super) fn send(mut self, deps: ClaimIo) -> futures::future::BoxFuture<'static, ClaimSent> {
        async move {
            let early = self.early.take();
            // Our validity ended (or the lease was lost, or the store
            // caught lying) while the batch waited: nothing is sent.
            let mut expired = self.live.ended(deps.clock.now());
            let floor = if expired {
                Ok(0)
            } else if self.needs_floor {
                crate::fleet::gc::floor(&deps.store).await
            } else {
                Ok(0)
            };
            // Above gc's floor (bounded on decode, so `f + 1` fits); none
            // may exceed the highest epoch, and one that would is not sent.
            let epoch = self.epoch.max(floor.as_ref().map_or(0, |f| f + 1));
            let beyond = epoch > crate::record::MAX_EPOCH;
            if beyond {
                tracing::warn!(
                    session = %self.name,
                    "gc's epoch floor is at the highest epoch: no fencing token above it exists; not claimed"
                );
            }
            // Again right before the write: the floor's read takes a trip.
            expired = expired || beyond || self.live.ended(deps.clock.now());
            let sent = deps.clock.now();
            let record = ClaimRecord {
                schema: SCHEMA.into(),
                kind: "session".into(),
                owner: self.owner.clone(),
                epoch,
                state: ClaimState::Running,
                digest: self.digest.clone(),
                address: self.address.clone(),
                endpoint: self.endpoint.clone(),
                health: self.health,
                exit_code: None,
                reason: None,
                backoff_until_ms: None,
                restarts: 0,
                // A tick's run, carried on: taken over, it is still that
                // tick's (`fleet::cron`).
                tick_ms: self.existing.as_ref().and_then(|(_, c)| c.tick),
                // Drawn only for a claim sent (the seeded entropy stream of
                // a simulation is as it was with claims one at a time).
                updated_at_ms: if expired { 0 } else { deps.clock.wall_ms() },
                nonce: if expired {
                    String::new()
                } else {
                    deps.entropy.hex_id()
                },
            };
            let outcome = match floor {
                _ if expired => Ok(ClaimOutcome::NotSent),
                Err(e) => Err(e),
                Ok(_) => self.write(&deps, &record, early).await,
            };
            ClaimSent {
                t: self,
                sent,
                record,
                outcome,
            }
        }
        .boxed()
    }

    pub(super) async fn write(
        &self,
        deps: &ClaimIo,
        record: &ClaimRecord,
        early: Option<EarlyAnswer>,
    ) -> Result<ClaimOutcome> {
        let put = put_checked(
            &deps.store,
            &self.key,
            Bytes::from(record.encode()),
            self.cond.clone(),
            &record.nonce,
            json_nonce,
        )
        .await?;
        Ok(match put {
            Put::Committed(version) => {
                if let Some(e) = early {
                    crate::fleet::endpoint::answer(
                        &e.reply,
                        Ok(ClaimAnswer::Claimed {
                            node: e.node,
                            epoch: record.epoch,
                            round_trips: e.reads + 1,
                        }),
                    );
                }
                let audit = audit(&deps.store, &self.key, &record.nonce, record.epoch).await;
                let manifest = match (self.read_spec, Name::new(&self.name)) {
                    (true, Ok(n)) => {
                        Some(Box::new(crate::fleet::manifest::get(&deps.store, &n).await))
                    }
                    _ => None,
                };
                ClaimOutcome::Committed {
                    version,
                    audit,
                    manifest,
                }
            }
            Put::Rejected(found) => ClaimOutcome::Rejected(found),
        })
    }
}

impl Node {
    /// The claim gate for session `name` (manifest key `mkey`, claim key
    /// `ckey`, its owner's node key `okey`) as this pass sees it: the one
    /// question the claim loop asks of every name it looks at.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gate_for(
        &self,
        name: &str,
        mkey: &str,
        ckey: &str,
        okey: Option<&str>,
        mv: &plan::ManifestView,
        cv: Option<&ClaimView>,
        views: &[plan::NodeView],
        refetched: &std::collections::HashSet<String>,
        now: MonoTime,
    ) -> core::Gate {
        let claimable = plan::claimable(mv, cv, views, &self.me);
        let owner_stale = match (cv, okey) {
            (Some(c), Some(key)) if c.state != ClaimState::Released => {
                !refetched.contains(key)
                    && self
                        .peers
                        .nodes
                        .get(key)
                        .is_none_or(|n| n.record.holder.instance != c.owner.instance)
            }
            _ => false,
        };
        let vanished = self.claim_vanished(ckey, cv);
        core::gate(
            &core::Candidate {
                claim_corrupt: self.corrupt.contains_key(ckey),
                manifest_corrupt: self.corrupt.contains_key(mkey),
                owner_corrupt: okey.is_some_and(|k| self.peers.corrupt.contains(k)),
                claimable,
                control_read: self.control.read,
                cordoned: self.deps.status.cordoned(),
                draining: self.control.draining,
                absence_pending: vanished && self.absent_claim_wait(name).is_some(),
                owner_stale,
                claimable_for: self
                    .gate
                    .first_claimable
                    .get(name)
                    .map_or(Duration::ZERO, |first| now.saturating_since(*first)),
                grace: self.cfg.grace,
                predecessor_unproven: self.predecessor_unproven(cv),
            },
            || {
                let ranked = plan::rank(mv, views);
                let position = ranked.iter().position(|n| n.id == self.me.node)?;
                let ahead_idle_for = ranked[..position]
                    .iter()
                    .filter_map(|n| self.peers.progress.get(&n.id).and_then(|(_, t)| *t))
                    .map(|t| now.saturating_since(t))
                    .min()
                    .unwrap_or(Duration::MAX);
                Some(core::Rank {
                    position,
                    ahead_idle_for,
                })
            },
        )
    }

    /// Claims one session now (the wake path): [`Node::claim_try`], then a
    /// batch of one.
    pub(super) async fn claim(
        &mut self,
        name: &str,
        digest: String,
        existing: Option<(Version, ClaimView)>,
        spec: Option<Arc<Spec>>,
    ) -> Result<bool> {
        match self.claim_try(name, digest, existing, spec) {
            Some(t) => self.claim_batch(vec![t]).await,
            None => Ok(false),
        }
    }

    /// A claim this pass decided to make, not yet sent: its condition and
    /// the epoch it goes at (gc's floor still to apply), or `None` when our
    /// validity has ended (nothing may be claimed then) or no epoch above
    /// the claim's exists.
    pub(super) fn claim_try(
        &self,
        name: &str,
        digest: String,
        existing: Option<(Version, ClaimView)>,
        spec: Option<Arc<Spec>>,
    ) -> Option<ClaimTry> {
        if self.deps.clock.now() >= self.valid_until() {
            return None;
        }
        let key = crate::keys::session(name);
        // Above any epoch we saw for it (should it have vanished), above
        // the claim we replace, and at least the generation's first.
        let (cond, above) = match &existing {
            None => (Cond::Create, 0),
            Some((v, c)) => (Cond::Match(v.clone()), c.epoch),
        };
        let seen = self.memory.seen_claims.get(&key).copied().unwrap_or(0);
        let epoch = match core::claim_epoch(above, seen, self.bucket.epoch_base) {
            Ok(epoch) => epoch,
            Err(highest) => {
                tracing::warn!(
                    session = name,
                    epoch = highest,
                    "claim at the highest epoch: no fencing token above it exists; not claimed"
                );
                return None;
            }
        };
        // A claim created where none is, or over a placeholder, may follow
        // a claim that `gc` deleted: it starts above gc's epoch floor (one
        // GET, on these paths only; see `gc`).
        // Also over any claim at epoch 0: a placeholder a tick released
        // (`fleet::cron`) is no longer one, and follows it as closely.
        let needs_floor = !matches!(&existing, Some((_, c))
            if !c.is_placeholder() && !c.is_vanished() && c.epoch > 0);
        // The spec is read with the claim when none came with it (the
        // manifest's, unless the listing found it corrupt: `spec_for`).
        let read_spec = spec.is_none() && !self.corrupt.contains_key(&crate::keys::manifest(name));
        let endpoint = spec.as_ref().and_then(|s| self.endpoint_of(s));
        let health = spec
            .as_ref()
            .and_then(|s| s.check.as_ref())
            .map(|_| crate::fleet::check::Health::Starting);
        Some(ClaimTry {
            name: name.to_string(),
            key,
            digest,
            existing,
            spec,
            cond,
            epoch,
            needs_floor,
            read_spec,
            owner: self.me.clone(),
            address: self.cfg.address.clone(),
            endpoint,
            health,
            live: Live {
                decided: self.valid_until(),
                lease: self.validity.clone(),
                violation: self.audit.violation.clone(),
            },
            early: None,
        })
    }

    /// Sends `tries` [`CLAIM_CONCURRENCY`] at a time and applies each
    /// outcome in order as it comes. Every outcome is applied, whatever an
    /// earlier one was: a claim that landed is recorded as ours (and
    /// started) even when another in the batch failed, so no claim of ours
    /// stands unknown to us (short of a store violation, which stops the
    /// node: `apply_claim`). The first error is returned after all are
    /// applied, as a failed claim ends the pass.
    ///
    /// Why concurrent: a claim is two to four round trips (gc's floor on a
    /// create, the conditional write, its audit read-back, the manifest's
    /// spec), and a pass that placed or took over sessions one after the
    /// other spent them in series: at 30-60 ms per request on S3, about a
    /// thousand sessions of a dead peer took a survivor minutes (issue
    /// #14). The decisions are unchanged: each claim is still an If-Match
    /// or create-if-absent on what this pass saw, and the gate runs before
    /// any is sent.
    pub(super) async fn claim_batch(&mut self, tries: Vec<ClaimTry>) -> Result<bool> {
        if tries.is_empty() {
            return Ok(false);
        }
        self.ensure_marker().await?;
        let io = ClaimIo::of(&self.deps);
        // Each applied as it comes back, in order: a claim that landed is
        // ours (and started) without waiting for the slowest of the batch.
        let mut sent = futures::stream::iter(tries)
            .map(move |t| t.send(io.clone()))
            .buffered(CLAIM_CONCURRENCY);
        let mut changed = false;
        let mut first_err = None;
        while let Some(s) = sent.next().await {
            match self.apply_claim(s).await {
                Ok(c) => changed |= c,
                Err(e) => {
                    changed = true;
                    first_err.get_or_insert(e);
                }
            }
            // Each claim that landed started a session, which waits for
            // its watchdog to report (a few milliseconds each): a batch of
            // 64 held every other session's exit until the pass ended, up
            // to 1.5 s. Exits are recorded between starts instead (and the
            // caller's count of the load is redone: a finished session no
            // longer counts).
            if self.handle_exits().await {
                changed = true;
                self.exits_mid_batch = true;
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(changed),
        }
    }

    /// Sends the claim loop's `batch` (`claim_batch`), then counts what it
    /// came to: the load it counted as landing is recounted from what is
    /// owned now, and a name claimed is not revisited.
    pub(super) async fn send_claims(
        &mut self,
        batch: &mut Vec<ClaimTry>,
        revisit: &mut std::collections::BTreeSet<String>,
        load: &mut u32,
    ) -> Result<bool> {
        let names: Vec<String> = batch.iter().map(|t| t.name.clone()).collect();
        *load = load.saturating_sub(names.len() as u32);
        self.exits_mid_batch = false;
        let r = self.claim_batch(std::mem::take(batch)).await;
        for name in &names {
            if let Some(o) = self.owned.get(name) {
                revisit.remove(name);
                *load += u32::from(!o.record.state.is_terminal());
            }
        }
        if self.exits_mid_batch {
            // Sessions outside the batch may have finished or been lost
            // meanwhile: counted again (rare; O(owned) only then).
            *load = self.load();
        }
        r
    }

    /// What one sent claim came to, applied to this node: recorded as ours
    /// and started, or the rival's claim cached, or the error returned.
    pub(super) async fn apply_claim(&mut self, s: ClaimSent) -> Result<bool> {
        let ClaimSent {
            t,
            sent,
            record,
            outcome,
        } = s;
        match outcome? {
            ClaimOutcome::Committed {
                version,
                audit,
                manifest,
            } => {
                self.note_audit(&t.key, audit, record.epoch);
                // A store that let two writers win: nothing more is started
                // or recorded (the node stops, and its lease with it).
                if self.audit.violation.lock().unwrap().is_some() {
                    return Ok(true);
                }
                let (name, key, epoch) = (t.name.as_str(), t.key.as_str(), record.epoch);
                self.gate.first_claimable.remove(name);
                self.event(
                    EventKind::Claimed,
                    Some(name),
                    Some(epoch),
                    match &t.existing {
                        None => "claim made again after its absence".to_string(),
                        Some((_, c)) if c.is_vanished() => {
                            "claim made again after its absence".to_string()
                        }
                        Some((_, c)) if c.is_placeholder() => "new session".to_string(),
                        Some((_, c)) => format!(
                            "from {}/{} at epoch {}",
                            c.owner.node, c.owner.instance, c.epoch
                        ),
                    },
                );
                self.claims
                    .insert(key.to_string(), (version.clone(), ClaimView::from(&record)));
                self.note_claim(key);
                // The only insertion: the floor stays at or below every
                // confirmation (see `confirmed_floor`).
                self.confirmed_floor = Some(self.confirmed_floor.map_or(sent, |f| f.min(sent)));
                self.owned.insert(
                    name.to_string(),
                    Owned {
                        record,
                        version,
                        running: false,
                        confirmed: sent,
                        started_at: sent,
                        quick_exits: 0,
                        restart_at: None,
                        restart_times: Default::default(),
                        spec: t.spec.map(|s| (plan::Digest::new(&t.digest), s)),
                        pending_finish: None,
                        active_at: sent,
                    },
                );
                if let Some(m) = manifest {
                    self.take_manifest(name, *m);
                }
                // The renew task must bound this session too, from now.
                self.confirmed_tx
                    .send_replace(self.confirmed_until().unwrap_or(MonoTime::ZERO));
                self.start(name).await;
                Ok(true)
            }
            ClaimOutcome::NotSent => Ok(false),
            ClaimOutcome::Rejected(found) => {
                // Another node claimed first: placement should make this
                // rare. What stands there now replaces our cached view (a
                // light pass may have had a stale one), so the next pass
                // does not repeat a write that cannot succeed.
                self.cache_read_back(&t.key, found);
                self.event(
                    EventKind::Conflict,
                    Some(&t.name),
                    Some(record.epoch),
                    "lost the claim race",
                );
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod live_tests {
    use super::*;

    /// A claim waiting in a batch is not sent once its validity as decided
    /// has passed, nor once the renew task says the lease is lost or past
    /// its end, nor once the audit caught the store letting two writers
    /// win, whatever the validity saved when it was decided (issue #14:
    /// before, a batch checked only that saved validity).
    #[test]
    fn a_batched_claim_is_not_sent_past_the_lease_or_a_store_violation() {
        let t0 = MonoTime::ZERO + Duration::from_secs(100);
        let secs = Duration::from_secs;
        let (tx, rx) = watch::channel(Validity {
            until: t0 + secs(10),
            lost: false,
        });
        let lease = |until: MonoTime, lost: bool| {
            tx.send_replace(Validity { until, lost });
        };
        let live = Live {
            decided: t0 + secs(5),
            lease: Some(rx),
            violation: Default::default(),
        };
        assert!(!live.ended(t0));
        assert!(live.ended(t0 + secs(5)), "past the decided validity");
        lease(t0 + secs(2), false);
        assert!(!live.ended(t0));
        assert!(live.ended(t0 + secs(2)), "past the lease's end now");
        lease(t0 + secs(10), true);
        assert!(live.ended(t0), "the lease lost");
        lease(t0 + secs(10), false);
        assert!(!live.ended(t0));
        *live.violation.lock().unwrap() = Some("two writers won".into());
        assert!(live.ended(t0), "the store caught lying");
    }
}
