//! How a takeover is fenced: before a session of a peer is claimed, its
//! owner's node record is judged (expired by observation, released,
//! superseded) and, where the owner is dead, its record is fenced so that
//! it can never renew again; then every node hears of it. `core` decides
//! each step; this file does the reads and writes in order.

use super::*;

/// The final verdicts about a claim owner's record (superseded, released,
/// fenced) need no evidence beyond the record itself; expiry is judged in
/// `node_views` with the observer's evidence.
fn owner_liveness(record: &LeaseRecord, instance: &str) -> Liveness {
    crate::liveness::judge(
        Some(record),
        Some(instance),
        crate::liveness::Evidence::Observed {
            unchanged_for: Duration::ZERO,
            margin: Duration::ZERO,
        },
    )
}

impl Node {
    /// Is `c` owned by another instance of this node id whose end nothing
    /// proves yet (see `predecessor_unproven_until`)?
    pub(super) fn predecessor_unproven(&self, c: Option<&plan::ClaimView>) -> bool {
        c.is_some_and(|c| {
            c.owner.node == self.me.node
                && c.owner.instance != self.me.instance
                && self.predecessor.proven.as_ref() != Some(&c.owner.instance)
        }) && self
            .predecessor
            .unproven_until
            .is_some_and(|t| self.deps.clock.now() < t)
    }

    /// Before taking over `c`, makes its owner's death final in the bucket.
    ///
    /// A claim is attached to its owner's node lease, but the takeover is a
    /// conditional write on the *claim*, which the owner's renewals never
    /// touch. Expiry by observation says the owner's validity for the version
    /// we watched has ended; it cannot say that no renewal of that version is
    /// still in flight, or that the owner did not renew after the listing we
    /// judged by. So when the owner's lease is judged expired (not released,
    /// not superseded), write a tombstone over it with If-Match on that very
    /// version. If it lands, the owner's own renewals (If-Match on the same
    /// version) can never succeed again: it is fenced, and its deadline has
    /// passed. If it is rejected, the owner renewed after all: no takeover.
    ///
    /// One write per dead node (the first node to take any of its sessions),
    /// not per session. Returns whether the takeover may proceed.
    pub(super) async fn fence_owner(&mut self, c: &ClaimView) -> Result<bool> {
        let key = crate::keys::node(&c.owner.node);
        let cached = self.peers.nodes.get(&key).cloned();
        let view = match &cached {
            None => core::OwnerRecord::Unknown,
            Some(n) => core::OwnerRecord::Known {
                judged: owner_liveness(&n.record, &c.owner.instance),
                at_listed: n.fetched == n.listed,
            },
        };
        let n = match core::fence(
            c.state == ClaimState::Released,
            c.owner.node == self.me.node,
            view,
        ) {
            core::Fence::Go => return Ok(true),
            core::Fence::ReadOwner => {
                // Not in our view: read it (see `core::after_owner_read`).
                // Absent, the owner may still be acting on the validity of
                // its last renewal (its next one fails on the missing record
                // and it stops). The next pass lists `nodes/` too: a peer
                // not in our view may be one the slow listing missed.
                self.next.list_nodes(Why::OwnerNotInView);
                self.fetch_node(&key, None).await?;
                return Ok(core::after_owner_read(
                    self.peers.nodes.contains_key(&key),
                    self.peers.corrupt.contains(&key),
                    self.node_absent_long_enough(&key),
                ));
            }
            core::Fence::Tombstone | core::Fence::ReadAtListed => cached,
        };
        let Some(n) = n else {
            return Ok(false); // (only a known owner is fenced)
        };
        // Build the tombstone from the record at the watched version: the
        // cached one if we read that very version (claim_now just did),
        // else read it now.
        let record = if n.fetched == n.listed {
            n.record
        } else {
            let current = self
                .deps
                .store
                .get(&key)
                .await
                .map_err(|e| Error::from_store("get", &key, e))?;
            let mut read = None;
            let seen = match &current {
                None => core::OwnerRead::Missing,
                Some(o) if o.version != n.listed => core::OwnerRead::Other,
                Some(o) => {
                    let Ok(record) = LeaseRecord::decode(&key, &o.bytes, Kind::Node) else {
                        // Unreadable: never fenced, never taken over (as a
                        // corrupt record met by a listing).
                        self.peers.corrupt.insert(key.clone());
                        return Ok(false);
                    };
                    let judged = owner_liveness(&record, &c.owner.instance);
                    let still =
                        self.client
                            .observer()
                            .unchanged_for(&key, &n.listed, self.peers.listed_at);
                    if !core::dead_at_listed(
                        judged.is_final(),
                        still,
                        Duration::from_millis(record.ttl_ms),
                    ) {
                        return Ok(false);
                    }
                    read = Some(record);
                    core::OwnerRead::AtListed(judged)
                }
            };
            match core::after_fresh_read(seen) {
                // Not dead after all, or gone: the next pass judges on a
                // fresh `nodes/` listing, not again on the one that was
                // overtaken (at most `nodes_every` old).
                core::FreshRead::Absent => {
                    self.next.list_nodes(Why::OwnerOvertaken);
                    let now = self.deps.clock.now();
                    let ttl = Duration::from_millis(n.record.ttl_ms);
                    self.peers.nodes.remove(&key);
                    self.memory.absent_nodes.entry(key).or_insert((now, ttl));
                    return Ok(false);
                }
                core::FreshRead::Changed => {
                    self.next.list_nodes(Why::OwnerOvertaken);
                    self.fetch_node(&key, None).await?;
                    return Ok(false);
                }
                core::FreshRead::Final => {
                    self.fetch_node(&key, None).await?;
                    return Ok(true);
                }
                core::FreshRead::Tombstone => match read {
                    Some(record) => record,
                    None => return Ok(false), // (judged only at the listed version)
                },
            }
        };
        self.ensure_marker().await?;
        let mut tomb = record;
        tomb.released = true;
        tomb.nonce = self.deps.entropy.hex_id();
        tomb.attrs = NodeAttrs {
            released_by: Some(self.me.node.clone()),
            ..NodeAttrs::of(&tomb)
        }
        .to_map();
        let put = put_checked(
            &self.deps.store,
            &key,
            Bytes::from(tomb.encode()?),
            Cond::Match(n.listed.clone()),
            &tomb.nonce,
            json_nonce,
        )
        .await?;
        match put {
            Put::Committed(version) => {
                self.audit(&key, &tomb.nonce, tomb.epoch).await;
                self.peers.fenced_now.push(tomb.holder.node.clone());
                self.event(
                    EventKind::Fenced,
                    None,
                    Some(tomb.epoch),
                    format!(
                        "node {} instance {} expired by observation; its lease released",
                        tomb.holder.node, tomb.holder.instance
                    ),
                );
                self.peers.nodes.insert(
                    key,
                    PeerNode {
                        listed: version.clone(),
                        listed_since: self.deps.clock.now(),
                        listed_last: self.deps.clock.now(),
                        fetched: version,
                        fetched_at: self.deps.clock.now(),
                        record: tomb,
                    },
                );
                Ok(true)
            }
            Put::Rejected(_) => {
                self.next.list_nodes(Why::TombstoneRejected);
                self.fetch_node(&key, None).await?;
                Ok(core::after_tombstone_rejected(
                    self.peers
                        .nodes
                        .get(&key)
                        .map(|n| owner_liveness(&n.record, &c.owner.instance)),
                ))
            }
        }
    }

    /// Fences, once per pass, each peer this pass judges dead that still
    /// holds sessions: its listed version has stood still for its ttl +
    /// margin (no view of its id `live`), its record is not a release or a
    /// fence already, and `loads` counts claims of its current instance.
    /// Then hints the tombstones, rings the bell and nudges the ranked
    /// takers (`after_fence`). Best effort: a failure is logged and the
    /// pass goes on (the takers fence it themselves).
    ///
    /// Why here, before the claims and whatever this node's rank, room or
    /// cordon: a dead node's record is read closely only by its ring
    /// watchers, and the nodes ranked for its sessions are mostly others,
    /// who would judge it dead themselves only at their own next pass and
    /// a ttl + margin after their own first sight of its last version. The
    /// fence is the same write, under the same rule, as the first taker's
    /// (`fence_owner`: If-Match on the version judged); fencing is not
    /// claiming, so a full or cordoned node may do it. A peer that renewed
    /// after all rejects it, and the pass goes on.
    pub(super) async fn fence_dead_peers(
        &mut self,
        views: &[NodeView],
        loads: &HashMap<String, u32>,
    ) {
        let mut dead: Vec<(String, String)> = self
            .peers
            .nodes
            .iter()
            .filter(|(key, n)| {
                let (id, instance) = (&n.record.holder.node, &n.record.holder.instance);
                let record = core::PeerRecord {
                    id,
                    instance,
                    under_own_key: **key == crate::keys::node(id),
                    released: n.record.released,
                    claims: loads.get(&format!("{id}/{instance}")).copied().unwrap_or(0),
                };
                core::fence_peer(self.me.node.as_str(), &record, views)
            })
            .map(|(_, n)| {
                (
                    n.record.holder.node.clone(),
                    n.record.holder.instance.clone(),
                )
            })
            .collect();
        // In key order: a seeded simulation replays the same writes.
        dead.sort();
        for (id, instance) in dead {
            let claim = self
                .claims
                .values()
                .find(|(_, c)| {
                    c.owner.node == id
                        && c.owner.instance == instance
                        && c.state != ClaimState::Released
                        && !c.state.is_terminal()
                })
                .map(|(_, c)| c.clone());
            if let Some(c) = claim {
                // Best effort: the takers fence it themselves if this fails
                // (an unreadable record must not stall the whole pass).
                if let Err(e) = self.fence_owner(&c).await {
                    tracing::warn!(peer = id, error = %crate::error::Chain(&e), "fencing a dead peer");
                }
            }
        }
        self.after_fence(views);
    }

    /// After this node fenced peers (their tombstones landed): hints each
    /// fenced record in the change feed, then nudges the nodes placement
    /// ranks first for their sessions, from a task beside the pass.
    ///
    /// Why the hint: a light pass sees a peer's record only as a version in
    /// the `nodes/` listing, and reads its body on a hint (or once per
    /// `--full-every`); a hinted peer also makes that pass list `nodes/`,
    /// so the tombstone read is the version listed and counts. Without it
    /// a tombstone looks like one more renewal, and the ranked takers would
    /// wait for it to stand still for a ttl + margin of their own before
    /// taking anything. With it, a lost ring of the bell costs a taker at
    /// most its idle pause.
    ///
    /// Why the nudge (`crate::fleet::nudge`): with it the ranked takers run a pass
    /// within `NUDGE_MIN_GAP`, read the hinted tombstone, and claim at once
    /// by the usual rules, instead of at their next pass (up to an idle
    /// pause later). Two per session, as `apply` nudges (views of load
    /// differ a little between nodes), at most `MAX_NUDGED` in all.
    pub(super) fn after_fence(&mut self, views: &[NodeView]) {
        while self.peers.nudges.try_join_next().is_some() {}
        if self.peers.fenced_now.is_empty() {
            return;
        }
        let dead: Vec<String> = {
            let mut d = std::mem::take(&mut self.peers.fenced_now);
            d.sort();
            d.dedup();
            d
        };
        let takers = if self.deps.nudge.is_some() {
            // The dead's sessions, in the claims' key order.
            let orphaned = self.claims.iter().filter_map(|(ckey, (_, c))| {
                if !dead.contains(&c.owner.node) || c.state == ClaimState::Released {
                    return None;
                }
                let name = crate::keys::name_in(crate::keys::SESSIONS, ckey)?;
                let (_, m) = self.manifests.get(&crate::keys::manifest(name))?;
                Some(&m.view)
            });
            core::takers_to_nudge(
                self.me.node.as_str(),
                &dead,
                orphaned,
                views,
                crate::fleet::nudge::MAX_NUDGED,
            )
        } else {
            Default::default()
        };
        let peers: Vec<(String, Option<String>)> = takers
            .into_iter()
            .map(|id| {
                let address = self
                    .peers
                    .nodes
                    .get(&crate::keys::node(&id))
                    .and_then(|n| n.record.address.clone());
                (id, address)
            })
            .collect();
        let hint = self.cfg.feed_on();
        let (store, entropy) = (self.deps.store.clone(), self.deps.entropy.clone());
        let clock = self.deps.clock.clone();
        let forms = self.deps.hint_forms.clone();
        let wall = self.deps.clock.wall_ms();
        let nudge = self.deps.nudge.clone();
        self.peers.nudges.spawn(async move {
            if hint {
                // Retried: without it a taker that does not watch the dead
                // peer learns of the tombstone only at its slow `nodes/`
                // listing (`NodeConfig::nodes_every`).
                for id in &dead {
                    crate::fleet::feed::write_hint_retried(
                        &store,
                        &forms,
                        clock.as_ref(),
                        wall,
                        entropy.as_ref(),
                        crate::keys::Hinted::Node,
                        id,
                    )
                    .await;
                }
            }
            // After the hints: a rung or nudged pass must find them.
            crate::fleet::feed::ring_bell(&store, entropy.as_ref()).await;
            if let Some(nudge) = nudge
                && !peers.is_empty()
            {
                tracing::debug!(
                    peers = peers.len(),
                    "nudging the ranked takers of a fenced peer"
                );
                let each = peers
                    .iter()
                    .map(|(id, address)| nudge.nudge(id, address.as_deref()));
                futures::future::join_all(each).await;
            }
        });
    }
}
