//! One pass of the pull loop (`Node::tick`): read what changed, judge peers,
//! keep owned sessions in line, claim what this node should run. The
//! phases, in order, are listed in docs/fleet.md, "One pass".

use super::*;

/// What a pass's listings found, for the phases after them.
struct PassListings {
    /// Everything was listed (not only the feed's hints).
    full: bool,
    /// The feed as read, committed once acted on (`commit_feed`).
    read: Option<crate::fleet::feed::FeedRead>,
    /// When the listings were sent, by the monotonic and the wall clock.
    listed_at: MonoTime,
    wall_at: u64,
    /// Names a hint named (light passes only).
    hinted: std::collections::BTreeSet<String>,
    /// What a full listing counted, and when its claims were listed.
    fleet_size: Option<(u64, MonoTime)>,
    /// Something read was new.
    changed: bool,
}

impl Node {
    /// One pass, as a sequence of named phases (docs/fleet.md, "One
    /// pass"). Each phase is a method below, in this order; the order is
    /// the shell's (the rules each applies are in `core`). Returns whether
    /// anything changed (which keeps the pace brisk).
    #[tracing::instrument(level = "debug", name = "node pass", skip_all)]
    pub(super) async fn tick(&mut self) -> Result<bool> {
        self.pass += 1;
        let (nudged, mut changed) = self.check_bucket_and_control().await?;
        let listed = self.list(nudged).await?;
        changed |= listed.changed;
        self.publish_listed(listed.full);
        let (now, loads, mut views, expiring) = self.judge_peers();
        changed |= expiring;
        changed |= self.keep_owned(listed.full, listed.fleet_size).await;
        let names = self.names_to_look_at(&views, &listed.hinted);
        self.fence_dead_peers(&views, &loads).await;
        changed |= self.claim_round(names, &loads, &mut views, now).await?;
        changed |= self.keep_alarms().await;
        changed |= self.keep_schedules(&views).await;
        self.forget_epochs(&listed.hinted);
        self.commit_feed(listed);
        self.expire_feed(&views);
        self.pass_incomplete = false;
        #[cfg(debug_assertions)]
        self.check_invariants();
        Ok(changed)
    }

    /// Is this still our bucket (the fleet marker), and what does the
    /// operator ask (the control object)? Returns whether this pass was
    /// nudged, and whether the control changed.
    async fn check_bucket_and_control(&mut self) -> Result<(bool, bool)> {
        let mut control_changed = false;
        // Is this still the bucket we serve? Checked before any epoch is
        // issued (`ensure_marker` before every claim and fence write; a
        // wake's claim leans on a check sent within ttl/3, see
        // `wake_now::MARKER_FRESH_FOR`), and
        // at least every MARKER_EVERY ttls when nothing is written: a wiped
        // bucket also fails our renewals within ttl/3, which stops
        // everything, and the next registration checks it again.
        if core::marker_due(
            self.bucket
                .checked
                .map(|(_, t)| self.deps.clock.now().saturating_since(t)),
            self.cfg.ttl,
            MARKER_EVERY,
        ) {
            self.ensure_marker().await?;
        }
        // Operator control (`control/<id>`): at the first pass, every
        // CONTROL_EVERY passes, and at once when nudged.
        let nudged = self
            .deps
            .status
            .nudged
            .swap(false, std::sync::atomic::Ordering::SeqCst);
        // Until a read succeeds (a cordoned node restarting must not claim
        // in the meantime), and while a drain has sessions left, every pass.
        if core::control_due(
            nudged,
            self.control.read,
            self.control.draining && !self.owned.is_empty(),
            self.pass,
            crate::fleet::control::CONTROL_EVERY,
        ) && self.apply_control().await
        {
            control_changed = true;
            self.next.rescan(Why::ControlChanged);
        }
        // A pass that failed half-way may have consumed state that says
        // what to look at (the fleet's change, names left waiting): look at
        // everything this time.
        if std::mem::replace(&mut self.pass_incomplete, true) {
            self.next.rescan(Why::PassFailed);
            self.next.list_nodes(Why::PassFailed);
        }
        Ok((nudged, control_changed))
    }

    /// Lists what changed: everything (a full listing) or the feed's hints,
    /// and `nodes/` when due; reads what the listings show changed.
    async fn list(&mut self, nudged: bool) -> Result<PassListings> {
        let mut changed = false;
        self.take_published_pace();
        let now = self.deps.clock.now();
        let full = core::full_listing_due(
            self.cfg.feed_on(),
            self.pace.last_full.map(|t| now.saturating_since(t)),
            self.pace.full_every,
            self.cfg.max_poll,
            self.next.full_asked()
                // Hints older than the retention may be gone unread.
                || self.feed.read_at.is_some_and(|t| {
                    now.saturating_since(t).saturating_add(core::feed_skew(self.cfg.ttl))
                        >= crate::fleet::feed::RETENTION
                }),
        );
        let listed_at = self.deps.clock.now();
        // Sent before the listings below: every hint stamped from then on
        // (less the skew window) is for a write they may not have shown.
        let wall_at = self.deps.clock.wall_ms();
        // The feed, from the cursor: on a full pass for node records only
        // (a full listing covers manifests and claims, not peers'
        // attributes). Committed at the end of the pass, once acted on.
        // Read before `nodes/`, whose listing a hint naming an unknown
        // peer makes due.
        let read = if self.cfg.feed_on() {
            Some(
                self.feed
                    .cursor
                    .read(&self.deps.store, wall_at)
                    .await
                    .map_err(|e| Error::from_store("list", crate::keys::CHANGES, e))?,
            )
        } else {
            None
        };
        let hinted_keys: Vec<String> = read
            .as_ref()
            .map(|r| r.keys.iter().cloned().collect())
            .unwrap_or_default();
        let (node_keys, keys): (Vec<String>, Vec<String>) = hinted_keys
            .into_iter()
            .partition(|k| k.starts_with(crate::keys::NODES));
        let mine = crate::keys::node(&self.me.node);
        // A peer's record changed (a fence, a release, news in its
        // attributes), or one we do not know yet: `nodes/` is listed this
        // pass. The record the hint makes us read counts as a release only
        // at the version a listing showed (`peer_evidence`: a release read
        // at another version may be a new instance's), so without the
        // listing a hinted tombstone would be read and not acted on until
        // the slow `nodes/` listing (`NodeConfig::nodes_every`) or the bell.
        // Node hints are rare (at most a few per peer and hour), so this
        // is not a listing per pass.
        let peer_hinted = node_keys.iter().any(|k| *k != mine);
        // `nodes/` (see `NodeConfig::nodes_every`). A pass that does not
        // list it judges peers as of the last listing that did
        // (`nodes_listed_at`): later than it could have, never earlier.
        let node_entries = if core::nodes_listing_due(
            full || !self.cfg.feed_on(),
            self.next.take_nodes().is_some() || nudged || peer_hinted,
            now.saturating_since(self.peers.listed_at),
            self.cfg.nodes_every,
        ) {
            let at = self.deps.clock.now();
            let entries = self.client.observe_listing(crate::keys::NODES).await?;
            self.peers.listed_at = at;
            Some(entries)
        } else {
            None
        };
        // Names a hint named this pass (light passes only).
        let mut hinted: std::collections::BTreeSet<String> = Default::default();
        // What a full listing counted (`note_fleet_size`, after reconcile).
        let mut fleet_size = None;
        if full {
            // Manifests are never judged by expiry: listed without the
            // observer, which then remembers nodes and claims only.
            let mut manifests_listed = Listed::new(crate::keys::MANIFESTS);
            list_into(
                &self.deps.store,
                &mut manifests_listed,
                &self.manifests,
                &self.corrupt,
            )
            .await?;
            let claims_listed_at = self.deps.clock.now();
            // Only what the absence rules may wait out is observed: a
            // version this node holds as an ordinary claim is never judged
            // by how long it stood (`absent_claim_wait` runs on vanished
            // markers and placeholders only), and when a marker replaces
            // it, that is a version the cache does not know, observed from
            // the first listing that shows it, as before.
            let claims = &self.claims;
            let corrupt = &self.corrupt;
            let mut claims_listed = Listed::new(crate::keys::SESSIONS);
            self.client
                .observe_listing_each(
                    crate::keys::SESSIONS,
                    |e| {
                        !claims.get(&e.key).is_some_and(|(v, c)| {
                            *v == e.version && !c.is_vanished() && !c.is_placeholder()
                        })
                    },
                    |e| claims_listed.take(e, claims, corrupt),
                )
                .await?;
            // Peers renew every ttl/3, so their versions always change: that
            // is not news (it does not reset pacing) and needs no read.
            if let Some(entries) = &node_entries {
                self.refresh_nodes(entries).await?;
            }
            self.read_hinted_nodes(node_keys).await?;
            self.note_hint_form();
            changed |= refresh(
                &self.deps.store,
                manifests_listed,
                &mut self.manifests,
                &mut self.corrupt,
                KnownManifest::decode,
                |_, _, _| {},
            )
            .await?;
            // What this listing observed only because the cache did not
            // know it yet (a node's first listing: every claim), now read:
            // the ordinary claims among it need no observation either.
            // (Only a read can turn a watched version into an ordinary
            // claim at that version: one watched and not read was a marker
            // or placeholder the cache already held, or foreign, or known
            // corrupt, and stays so.)
            let observer = self.client.observer();
            changed |= refresh(
                &self.deps.store,
                claims_listed,
                &mut self.claims,
                &mut self.corrupt,
                decode_claim_view,
                |key, listed, (v, c)| {
                    if v == listed && !c.is_vanished() && !c.is_placeholder() {
                        observer.forget(key);
                    }
                },
            )
            .await?;
            self.observe_claim_absence();
            // Every claim we hold that this listing showed at our version is
            // confirmed as of the listing's send time (see
            // `confirmed_until`); one it did not show is not.
            // (Compared through the refreshed cache, which holds the version
            // a GET returned when the listing's differed: on a versioned
            // bucket listings carry ETags only.)
            let mut ckey = String::new();
            for (name, o) in self.owned.iter_mut() {
                if self
                    .claims
                    .get(crate::keys::key_in(&mut ckey, crate::keys::SESSIONS, name))
                    .is_some_and(|(v, _)| *v == o.version)
                {
                    o.confirmed = o.confirmed.max(claims_listed_at);
                }
            }
            self.pace.last_full = Some(listed_at);
            self.next.listed_all();
            fleet_size = Some((
                (self.manifests.len() + self.claims.len()) as u64,
                claims_listed_at,
            ));
        } else {
            if let Some(entries) = &node_entries {
                self.refresh_nodes(entries).await?;
            }
            self.read_hinted_nodes(node_keys).await?;
            self.note_hint_form();
            // A peer of an older build joined while our interval is grown:
            // the next pass lists everything, which confirms our claims
            // and takes the fixed interval back (`note_fleet_size`).
            // Shrinking here instead would end the beliefs of claims
            // confirmed up to the grown interval ago, and stop them.
            if self.pace.full_every > self.cfg.full_every
                && self.older_peer_live(crate::fleet::attrs::PROTO_READS_HOLDS)
            {
                self.next.list_all(Why::OlderPeer);
            }
            let (manifest_keys, claim_keys): (Vec<String>, Vec<String>) = keys
                .into_iter()
                .partition(|k| k.starts_with(crate::keys::MANIFESTS));
            changed |= refresh_keys(
                &self.deps.store,
                &manifest_keys,
                &mut self.manifests,
                &mut self.corrupt,
                KnownManifest::decode,
            )
            .await?;
            changed |= refresh_keys(
                &self.deps.store,
                &claim_keys,
                &mut self.claims,
                &mut self.corrupt,
                decode_claim_view,
            )
            .await?;
            for k in &claim_keys {
                self.note_claim(k);
            }
            for k in manifest_keys.iter().chain(&claim_keys) {
                hinted.insert(name_of(k).to_string());
            }
        }
        Ok(PassListings {
            full,
            read,
            listed_at,
            wall_at,
            hinted,
            fleet_size,
            changed,
        })
    }

    /// Publishes what the listings established: corrupt keys, the claims'
    /// confirmation, and the deadline every session runs under.
    fn publish_listed(&mut self, full: bool) {
        let nodes = &self.peers.nodes;
        self.ring
            .missing
            .retain(|k, v| nodes.get(k).is_some_and(|n| n.listed == *v));
        self.deps.status.set_corrupt(
            self.corrupt
                .keys()
                .chain(&self.peers.corrupt)
                .cloned()
                .collect(),
        );
        self.recount_confirmed(!full);
        // Every manifest is claimable at once while a fleet is placed; the
        // table that held them is given back once placement is over.
        crate::memory::shrink_if_sparse(&mut self.gate.first_claimable);
        // ZERO: no claims, no bound beyond the lease's.
        self.confirmed_tx
            .send_replace(self.confirmed_until().unwrap_or(MonoTime::ZERO));
        self.deps.runner.announce(self.valid_until());
    }

    /// Judges peers on the listings: who is expiring or unproven (the next
    /// pass lists `nodes/` then), the loads counted from the claims, the
    /// views placement ranks, and who is busy claiming. Returns the time
    /// the judgement was made at, the loads, the views, and whether a peer
    /// is expiring.
    fn judge_peers(&mut self) -> (MonoTime, HashMap<String, u32>, Vec<NodeView>, bool) {
        let now = self.deps.clock.now();
        // Keep the brisk pace while a peer's lease is about to expire (its
        // listed version unchanged for over half its TTL): detecting the
        // expiry then costs one base poll, not one backed-off poll.
        // The next pass lists `nodes/` then, whatever `nodes_every` says:
        // the expiry is judged on a listing.
        let expiring = self.peers.nodes.iter().any(|(key, n)| {
            core::peer_expiring(
                n.record.released,
                self.client
                    .observer()
                    .unchanged_for(key, &n.listed, self.peers.listed_at),
                Duration::from_millis(n.record.ttl_ms),
            )
        });
        if expiring {
            self.next.list_nodes(Why::PeerExpiring);
        }
        // Loads as of this pass's listing, for every node alike (our own
        // claims from this pass are not counted until the next): see
        // `claim_loads`.
        let loads = self.claim_loads();
        let views = self.node_views(&loads);
        // A peer marked unproven that has not stood still yet (a twin, live
        // or ended) holds back the earlier instance's sessions until it
        // has: that is judged on listings, so list `nodes/` every pass
        // until then, not at the slow pace (rare, and bounded by a ttl +
        // margin of stillness or the end of the twin's own wait).
        if views.iter().any(|v| v.unproven) {
            self.next.list_nodes(Why::PeerUnproven);
        }
        self.note_progress(&views, now);
        (now, loads, views, expiring)
    }

    /// Owned sessions: exits, what their claims and manifests require, and
    /// after a full listing the fleet's size (the listing interval).
    async fn keep_owned(&mut self, full: bool, fleet_size: Option<(u64, MonoTime)>) -> bool {
        let mut changed = false;
        changed |= self.handle_exits().await;
        changed |= self.reconcile_owned().await;
        if full {
            let announced = self.confirmed_until();
            if let Some((objects, listed_at)) = fleet_size
                && self.cfg.feed_on()
            {
                // A growth is judged on the records as they stand.
                let grows = core::full_listing_pace(
                    self.cfg.full_every,
                    self.cfg.full_every_objects,
                    objects,
                ) > self.pace.full_every;
                let read = !grows || self.fetch_unread_nodes().await;
                // Every claim we still hold was confirmed by this listing
                // (one it did not show and that could not be read back
                // keeps the listing before's confirmation).
                let confirmed = self.owned.values().all(|o| o.confirmed >= listed_at);
                self.note_fleet_size(objects, read, confirmed);
            }
            // The interval is decided: the belief may be raised to it now,
            // or was shortened with it. Either way, what was announced
            // above, and what the claims below are started with, is
            // measured in it from now on (the floor recounted without what
            // reconcile dropped).
            self.recount_confirmed(true);
            if self.confirmed_until() != announced {
                self.confirmed_tx
                    .send_replace(self.confirmed_until().unwrap_or(MonoTime::ZERO));
                self.deps.runner.announce(self.valid_until());
            }
        }

        changed
    }

    /// Which names this pass looks at: every manifest after a full listing
    /// or a change in the fleet's control, else those hints named, those
    /// left waiting, and those held by peers whose view changed.
    fn names_to_look_at(
        &mut self,
        views: &[NodeView],
        hinted: &std::collections::BTreeSet<String>,
    ) -> Vec<String> {
        // Claim what is claimable, within capacity, in rank order: every
        // manifest after a full listing or a change in the fleet, else only
        // those hints named and those left waiting by the last pass.
        let mut seen: Vec<_> = views
            .iter()
            .map(|v| {
                (
                    v.id.clone(),
                    v.instance.clone(),
                    v.live,
                    v.capacity > 0,
                    v.unproven,
                )
            })
            .collect();
        seen.sort();
        // A change in the fleet is looked at where it matters: the names
        // whose claim names a peer that changed (`core::peers_changed`
        // says why no others), not every manifest. A survivor of a death
        // at 100,000 sessions looks at its dead peer's ~10,000, not all.
        let changed_peers = core::peers_changed(&self.peers.seen, &seen);
        self.peers.seen = seen;
        let scan_all = self.next.take_rescan().is_some();
        let names: Vec<String> = if scan_all {
            let mut all: Vec<String> = self
                .manifests
                .keys()
                .map(|k| name_of(k).to_string())
                .collect();
            all.sort();
            all
        } else {
            let mut some = std::mem::take(&mut self.gate.revisit);
            some.extend(hinted.iter().cloned());
            if !changed_peers.is_empty() {
                some.extend(
                    self.claims
                        .iter()
                        .filter(|(_, (_, c))| changed_peers.contains(c.owner.node.as_str()))
                        .filter_map(|(k, _)| crate::keys::name_in(crate::keys::SESSIONS, k))
                        .map(str::to_string),
                );
            }
            some.into_iter()
                .filter(|n| self.manifests.contains_key(&crate::keys::manifest(n)))
                .collect()
        };
        names
    }

    /// Claims what is claimable, within capacity, in rank order, fencing
    /// each owner first (`fence.rs`); sends the claims in batches.
    async fn claim_round(
        &mut self,
        names: Vec<String>,
        loads: &HashMap<String, u32>,
        views: &mut Vec<NodeView>,
        now: MonoTime,
    ) -> Result<bool> {
        let mut changed = false;
        let mut refetched = std::collections::HashSet::new();
        let mut revisit = std::collections::BTreeSet::new();
        // `load()` walks every owned session: counted once, then by what
        // each claim adds (one that could not start is failed, terminal,
        // and not counted), so the loop is not O(names × owned).
        let mut load = self.load();
        // Claims decided and not yet sent (`claim_batch`).
        let mut batch: Vec<ClaimTry> = Vec::new();
        let (mut mkey, mut ckey, mut okey_buf) = (String::new(), String::new(), String::new());
        for name in names {
            // A pass over 100,000 sessions is hundreds of milliseconds of
            // work with no I/O between claims; without a yield point it
            // holds its worker thread all along, and on a busy or
            // single-threaded runtime the renew task (and every other
            // node's) waits behind it past its deadline. Tokio's coop
            // budget yields once every 128 items, at no cost otherwise.
            tokio::task::coop::consume_budget().await;
            if self.owned.contains_key(&name) {
                continue;
            }
            debug_assert_eq!(load as usize, self.load() as usize + batch.len());
            if load >= self.cfg.capacity {
                // What is left is looked at again once there is room.
                self.next.rescan(Why::CapacityRanOut);
                break;
            }
            // First asked by reference, with keys formatted into buffers:
            // in the rescan after a full listing nearly every name is held
            // by a live peer, and is answered so without an allocation
            // (issue #14: 100,000 names every full listing).
            crate::keys::key_in(&mut mkey, crate::keys::MANIFESTS, &name);
            crate::keys::key_in(&mut ckey, crate::keys::SESSIONS, &name);
            let first = {
                let mv = &self.manifests[mkey.as_str()].1.view;
                let cv = self.claims.get(ckey.as_str()).map(|(_, c)| c);
                let okey = cv
                    .map(|c| crate::keys::key_in(&mut okey_buf, crate::keys::NODES, &c.owner.node));
                self.gate_for(&name, &mkey, &ckey, okey, mv, cv, views, &refetched, now)
            };
            if first == core::Gate::NotClaimable {
                self.gate.first_claimable.remove(&name);
                continue;
            }
            // Unless claimed below, looked at again.
            revisit.insert(name.clone());
            let mv = self.manifests[mkey.as_str()].1.view.clone();
            let claim = self.claims.get(ckey.as_str()).cloned();
            let cv = claim.as_ref().map(|(_, c)| c.clone());
            let owner_key = cv.as_ref().map(|c| crate::keys::node(&c.owner.node));
            // Asked again at most twice: after re-reading a stale owner
            // record, and, for a vanished claim ripe by what we knew, after
            // reading every node record again (`absent_claim_wait`; a failed
            // read leaves the claim waiting, and the pass goes on).
            let mut gate = first;
            let mut holds_tried = false;
            loop {
                match (gate, &owner_key) {
                    (core::Gate::RefetchOwner, Some(key)) if !refetched.contains(key) => {
                        refetched.insert(key.clone());
                        if let Err(e) = self.fetch_node(key, None).await {
                            // What this pass decided is sent before it ends (a
                            // fence already written may be waiting on it).
                            let _ = self.send_claims(&mut batch, &mut revisit, &mut load).await;
                            return Err(e);
                        }
                    }
                    (core::Gate::AbsencePending, _)
                        if !holds_tried && self.holds_unread_for(&name) =>
                    {
                        holds_tried = true;
                        if let Err(e) = self.read_holds().await {
                            tracing::warn!(session = name, error = %crate::error::Chain(&e), "reading node records before a vanished claim");
                        }
                    }
                    _ => break,
                }
                *views = self.node_views(loads);
                gate = self.gate_for(
                    &name,
                    &mkey,
                    &ckey,
                    owner_key.as_deref(),
                    &mv,
                    cv.as_ref(),
                    views,
                    &refetched,
                    now,
                );
            }
            match gate {
                core::Gate::NotClaimable => {
                    self.gate.first_claimable.remove(&name);
                    revisit.remove(&name);
                    continue;
                }
                core::Gate::Skip | core::Gate::RefetchOwner => continue,
                core::Gate::AbsencePending => {
                    // One key's trouble (a write refused or lost) must not
                    // stop the pass for every other session.
                    let r = match &claim {
                        None => self.mark_vanished(&name).await,
                        Some((v, c)) => self.raise_marker(&name, v.clone(), c).await,
                    };
                    if let Err(e) = r {
                        tracing::warn!(session = name, error = %crate::error::Chain(&e), "writing a vanished marker");
                    }
                    if !self.cfg.feed_on() {
                        changed = true; // keep polling briskly meanwhile
                    } else if self.marker_unobserved(&name) {
                        // The wait runs from a listing's first sight of the
                        // marker, then on time alone (the claim is made by
                        // an If-Match on that very version): a full listing
                        // next if none has seen it yet, else the usual pace
                        // (the name is revisited every pass).
                        self.next.list_all(Why::MarkerUnobserved);
                    }
                    continue;
                }
                core::Gate::Unranked => {
                    self.gate.first_claimable.entry(name.clone()).or_insert(now);
                    continue;
                }
                core::Gate::Grace => {
                    self.gate.first_claimable.entry(name.clone()).or_insert(now);
                    changed = true; // keep polling briskly while a claim is pending
                    continue;
                }
                core::Gate::Claim => {
                    self.gate.first_claimable.entry(name.clone()).or_insert(now);
                }
            }
            // A claim no token can follow is left before the fence: its
            // owner's record read at every pass would buy nothing.
            if let Some((_, c)) = &claim
                && core::at_highest_epoch(Some(c))
            {
                if self.gate.stuck.insert(name.clone()) {
                    tracing::warn!(
                        session = %name,
                        epoch = c.epoch,
                        "claim at the highest epoch: no fencing token above it exists; not claimed"
                    );
                }
                continue;
            }
            if let Some((_, c)) = &claim {
                match self.fence_owner(c).await {
                    Ok(true) => {}
                    Ok(false) => {
                        *views = self.node_views(loads);
                        changed = true;
                        continue;
                    }
                    Err(e) => {
                        // As above: the batch goes out before the error.
                        let _ = self.send_claims(&mut batch, &mut revisit, &mut load).await;
                        return Err(e);
                    }
                }
            }
            self.after_fence(views);
            if let Some(t) = self.claim_try(&name, mv.digest.to_string(), claim, None) {
                // Counted as if it lands; recounted once the batch is in.
                load += 1;
                batch.push(t);
                if batch.len() >= CLAIM_BATCH {
                    changed |= self
                        .send_claims(&mut batch, &mut revisit, &mut load)
                        .await?;
                }
            }
        }
        changed |= self
            .send_claims(&mut batch, &mut revisit, &mut load)
            .await?;
        self.gate.revisit = revisit;
        Ok(changed)
    }

    /// Forgets the epochs of deleted sessions a holder released
    /// (`core::forget_epoch`).
    fn forget_epochs(&mut self, hinted: &std::collections::BTreeSet<String>) {
        // As a full listing forgets the epochs of sessions whose manifest
        // is gone (`observe_claim_absence`), by `core::forget_epoch`, read
        // or written this pass: a placeholder over a kept epoch is then a
        // vanished claim, made again above it.
        for name in hinted {
            let ckey = crate::keys::session(name);
            if core::forget_epoch(
                self.manifests.contains_key(&crate::keys::manifest(name)),
                self.claims.get(&ckey).map(|(_, c)| c),
            ) {
                self.memory.seen_claims.remove(&ckey);
            }
        }
    }

    /// The feed's hints acted on are seen: committed, and the coverage
    /// noted.
    fn commit_feed(&mut self, listed: PassListings) {
        let PassListings {
            full,
            read,
            listed_at,
            wall_at,
            ..
        } = listed;
        // Acted on: the feed's hints are seen (a pass that returned early
        // with an error reads them again).
        if let Some(read) = read {
            self.feed.cursor.commit(read);
        }
        if full || self.cfg.feed_on() {
            // Covered by this pass's listings or the feed read.
            self.feed.read_at = Some(listed_at);
        }
        if full {
            self.feed.cursor.covered_until(wall_at);
        }
    }

    /// Expires the change feed's old hints, when this node is the one that
    /// does (`core::runs_retention`).
    fn expire_feed(&mut self, views: &[NodeView]) {
        // Retention of the feed (`core::runs_retention`), in a task of its
        // own. Whether or not this node reads the feed: every CLI writer
        // hints.
        if core::runs_retention(
            self.me.node.as_str(),
            views,
            self.feed
                .expired_at
                .map(|t| self.deps.clock.now().saturating_since(t)),
            crate::fleet::feed::RETENTION / 2,
            self.feed
                .expiring
                .as_ref()
                .is_none_or(|t| t.0.is_finished()),
        ) {
            self.feed.expired_at = Some(self.deps.clock.now());
            let store = self.deps.store.clone();
            let wall = self.deps.clock.wall_ms();
            self.feed.expiring = Some(AbortOnDrop(tokio::spawn(async move {
                match crate::fleet::feed::expire(&store, wall).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(hints = n, "expired change hints"),
                    Err(e) => {
                        tracing::warn!(error = %crate::error::Chain(&e), "expiring change hints")
                    }
                }
            })));
        }
    }
}
