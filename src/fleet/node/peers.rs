//! What this node knows of its peers: their node records (listed, hinted,
//! read), the claim counts per node, and the views placement ranks
//! (`plan::NodeView`).

use super::*;

impl Node {
    /// Reads the records of peers whose nodes hinted an attribute change
    /// (only peers the listing showed: a hint is not a listing).
    pub(super) async fn read_hinted_nodes(&mut self, keys: Vec<String>) -> Result<()> {
        let mine = crate::keys::node(&self.me.node);
        for k in keys {
            if k != mine && self.peers.nodes.contains_key(&k) {
                self.fetch_node(&k, None).await?;
            }
        }
        Ok(())
    }

    /// A claim read outside a full listing (a hint, a write's answer): its
    /// epoch joins `seen_claims` (a vanished claim is made again above
    /// every epoch seen, whichever way it was seen), and if it is gone in
    /// the absence rules' sense the next pass is a full one (those rules
    /// run on listings).
    pub(super) fn note_claim(&mut self, key: &str) {
        let Some(name) = crate::keys::name_in(crate::keys::SESSIONS, key) else {
            return;
        };
        if !self.manifests.contains_key(&crate::keys::manifest(name)) {
            return;
        }
        let seen = self.memory.seen_claims.get(key).copied().unwrap_or(0);
        let claim = self.claims.get(key).map(|(_, c)| c);
        if let Some(c) = claim {
            self.memory
                .seen_claims
                .insert(key.to_string(), seen.max(c.epoch));
        }
        if core::claim_gone(claim, seen) {
            self.next.list_all(Why::ClaimGone);
        }
    }

    /// Sessions held per node instance ("node/instance"), counted from the
    /// claims this node has read: every claim not released, as a node counts
    /// its own against capacity.
    ///
    /// Why from the claims and not from each node's published `load`: placement
    /// weights by free capacity, and every node must compute nearly the same
    /// weights or two nodes each rank themselves first and race. Published
    /// loads are read every `node_refresh` (3 TTLs) and a node knows its own
    /// live, so views diverged (0.085–0.141 conflicts per claim measured).
    /// Every node re-reads changed claims every pass, so counts from claims
    /// differ between nodes only by the claims of the last poll.
    /// Sessions that count against our capacity: every owned claim but the
    /// finished ones (succeeded, failed), which hold no process and run
    /// again only if their manifest changes. A paused session keeps its
    /// slot, to resume into.
    pub(super) fn load(&self) -> u32 {
        self.owned
            .values()
            .filter(|o| !o.record.state.is_terminal())
            .count() as u32
    }

    /// Notes which peers are taking sessions: their count of claims up
    /// since the last pass (`core::gate` holds a lower rank meanwhile).
    /// A peer first seen has shown nothing yet, whatever it holds.
    pub(super) fn note_progress(&mut self, views: &[NodeView], now: MonoTime) {
        let ids: std::collections::HashSet<&str> = views.iter().map(|v| v.id.as_str()).collect();
        self.peers
            .progress
            .retain(|id, _| ids.contains(id.as_str()));
        for v in views.iter().filter(|v| v.id != self.me.node) {
            let e = self
                .peers
                .progress
                .entry(v.id.clone())
                .or_insert((v.load, None));
            if v.load > e.0 {
                e.1 = Some(now);
            }
            e.0 = v.load;
        }
    }

    /// Counted again only when the claims changed since the last count
    /// (`Cached::generation`): a pass that read no claim does no work
    /// proportional to the fleet's sessions here.
    pub(super) fn claim_loads(&mut self) -> HashMap<String, u32> {
        let generation = self.claims.generation();
        if let Some((at, loads)) = &self.memo.loads
            && *at == generation
        {
            return loads.clone();
        }
        // Counted on borrowed names, then one key per owner: a pass over
        // 100,000 claims allocates per node, not per claim.
        let mut by: HashMap<(&str, &str), u32> = HashMap::new();
        for (_, c) in self.claims.values() {
            // As `load`: released and finished claims take no capacity.
            if !matches!(c.state, ClaimState::Released | ClaimState::Sleeping)
                && !c.state.is_terminal()
            {
                *by.entry((&c.owner.node, &c.owner.instance)).or_insert(0) += 1;
            }
        }
        let loads = by
            .into_iter()
            .map(|((node, instance), n)| (format!("{node}/{instance}"), n))
            .collect();
        self.memo.loads.insert((generation, loads)).1.clone()
    }

    pub(super) fn node_views(&self, loads: &HashMap<String, u32>) -> Vec<NodeView> {
        let load_of = |node: &str, instance: &str| {
            loads
                .get(&format!("{node}/{instance}"))
                .copied()
                .unwrap_or(0)
        };
        // A cordoned node offers no capacity: placement ranks it out, so
        // peers never wait for it to claim.
        let mut out = vec![NodeView {
            id: self.me.node.clone(),
            instance: self.me.instance.clone(),
            capacity: if self.deps.status.cordoned() {
                0
            } else {
                self.cfg.capacity
            },
            load: load_of(&self.me.node, &self.me.instance),
            labels: self.cfg.labels.clone(),
            live: true,
            // Our own wait is the gate's (`predecessor_unproven`), which
            // knows the instance our takeover proved gone; the mark is for
            // peers.
            unproven: false,
        }];
        for (key, n) in &self.peers.nodes {
            let rec = &n.record;
            let (judged, evidence) = self.peer_evidence(key, n);
            let judged = judged.as_ref();
            let liveness = crate::liveness::judge(Some(judged), None, evidence);
            let attrs = NodeAttrs::of(rec);
            out.push(NodeView {
                id: rec.holder.node.clone(),
                instance: rec.holder.instance.clone(),
                capacity: if attrs.cordoned { 0 } else { attrs.capacity },
                load: load_of(&rec.holder.node, &rec.holder.instance),
                labels: attrs.labels,
                live: liveness == crate::liveness::Liveness::Live,
                // Holding back an earlier instance of its id: judged as
                // that instance would be (a peer's fence ends it at once).
                unproven: crate::liveness::judge_earlier(judged, evidence)
                    == crate::liveness::Liveness::Live,
            });
        }
        out
    }

    /// A peer's record as placement judges it, and the evidence: the
    /// stillness of the *listed* version, as of the send time of the listing
    /// that last showed it (see `nodes_listed_at`); a release counts only if
    /// we read that very version (a newer one may be a renewal by a new
    /// instance).
    pub(super) fn peer_evidence<'a>(
        &self,
        key: &str,
        n: &'a PeerNode,
    ) -> (std::borrow::Cow<'a, LeaseRecord>, crate::liveness::Evidence) {
        let rec = &n.record;
        let unchanged_for = self
            .client
            .observer()
            .unchanged_for(key, &n.listed, self.peers.listed_at)
            .unwrap_or(Duration::ZERO);
        let judged = if n.listed == n.fetched {
            std::borrow::Cow::Borrowed(rec)
        } else {
            std::borrow::Cow::Owned(LeaseRecord {
                released: false,
                ..rec.clone()
            })
        };
        let evidence = crate::liveness::Evidence::Observed {
            unchanged_for,
            margin: default_margin(Duration::from_millis(rec.ttl_ms)),
        };
        (judged, evidence)
    }

    /// Spells hints bucketed unless a live peer reads flat ones only
    /// (`feed::HintForms`), judged on the records as last read. Every
    /// pass, from the peers as this pass left them: the decision stays
    /// current while the node runs, so its `HintingStore` never lists
    /// `nodes/` to decide.
    pub(super) fn note_hint_form(&self) {
        let wall = self.deps.clock.wall_ms();
        // Our own record publishes `PROTO_LEVEL`, never below the level.
        let form = if self.older_peer_live(crate::fleet::attrs::PROTO_BUCKETED_HINTS) {
            crate::keys::HintForm::Flat
        } else {
            crate::keys::HintForm::Bucketed
        };
        self.deps.hint_forms.set(form, wall);
    }

    /// Is a peer of an older build live, as placement judges it: one whose
    /// record publishes a protocol level (`NodeAttrs::proto`) below
    /// `level`? Below `attrs::PROTO_READS_HOLDS`, it does not read every
    /// node record before it makes a vanished claim again: it waits out
    /// one of our vanished claims by the interval it last read from our
    /// record, so while it is live we do not grow ours
    /// (`note_fleet_size`). Below `attrs::PROTO_BUCKETED_HINTS`, it reads
    /// flat hints only (`note_hint_form`).
    pub(super) fn older_peer_live(&self, level: u32) -> bool {
        self.peers.nodes.iter().any(|(key, n)| {
            NodeAttrs::of(&n.record).proto < level && {
                let (judged, evidence) = self.peer_evidence(key, n);
                crate::liveness::judge(Some(judged.as_ref()), None, evidence)
                    == crate::liveness::Liveness::Live
            }
        })
    }

    /// Is a record under `nodes/` corrupt as last read, and has its listed
    /// version not stood still for a ttl and the margin (the longest ttl
    /// any record showed)? Then a live node of unknown build may stand
    /// behind it, and the interval does not grow (as `read_holds` will not
    /// make a vanished claim again on such a read). A stray object stops
    /// counting once it has stood still that long.
    pub(super) fn corrupt_peer_unsettled(&self) -> bool {
        let ttl = self.cfg.ttl.max(self.memory.longest.0);
        let observer = self.client.observer();
        self.peers.corrupt.iter().any(|key| {
            observer.version(key).is_none_or(|v| {
                observer
                    .unchanged_for(key, &v, self.peers.listed_at)
                    .is_none_or(|d| d < ttl.saturating_add(default_margin(ttl)))
            })
        })
    }

    /// Reads again every peer record whose listed version we have not read
    /// (peers renew every ttl/3, and a light pass reads a record only on a
    /// hint or every `peer_refresh`): the gate on growing the interval
    /// (`older_peer_live`) judges attributes as they stand, so a node id
    /// rolled back to an older build is not taken for the newer one it was.
    /// Only at a full pass whose count calls for a growth (with the feed
    /// on): once or twice per growth, or once per full pass while an older
    /// peer holds the interval back. Whether every read succeeded.
    pub(super) async fn fetch_unread_nodes(&mut self) -> bool {
        let mut unread: Vec<(String, Version)> = self
            .peers
            .nodes
            .iter()
            .filter(|(_, n)| n.listed != n.fetched)
            .map(|(k, n)| (k.clone(), n.listed.clone()))
            .collect();
        // In key order: each read draws the store's faults in a seeded
        // simulation, which must replay (`nodes` is a HashMap).
        unread.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, listed) in unread {
            if let Err(e) = self.fetch_node(&key, Some(listed)).await {
                tracing::debug!(error = %crate::error::Chain(&e), key, "reading a node record before growing the interval");
                return false;
            }
            // Corrupt as read (a truncated response, foreign bytes): its
            // build is unknown, so it counts as not read.
            if self.peers.corrupt.contains(&key) {
                return false;
            }
        }
        true
    }

    /// Reads a peer's node record now. `listed` is the version the listing
    /// showed (None: keep the one we had).
    pub(super) async fn fetch_node(&mut self, key: &str, listed: Option<Version>) -> Result<()> {
        let got = self.deps.store.get(key).await;
        // As of the response's arrival: absence is observed from then on.
        let now = self.deps.clock.now();
        match got {
            Ok(Some(o)) => match LeaseRecord::decode(key, &o.bytes, Kind::Node) {
                Ok(record) => {
                    self.peers.corrupt.remove(key);
                    self.memory.absent_nodes.remove(key);
                    let mp = NodeAttrs::of(&record).max_poll_ms;
                    self.memory.longest = (
                        self.memory
                            .longest
                            .0
                            .max(Duration::from_millis(record.ttl_ms)),
                        self.memory.longest.1.max(Duration::from_millis(mp)),
                    );
                    let listed = listed
                        .or_else(|| self.peers.nodes.get(key).map(|n| n.listed.clone()))
                        .unwrap_or_else(|| o.version.clone());
                    let (listed_since, listed_last) = match self.peers.nodes.get(key) {
                        Some(n) if n.listed == listed => (n.listed_since, n.listed_last),
                        _ => (now, now),
                    };
                    self.peers.nodes.insert(
                        key.to_string(),
                        PeerNode {
                            listed,
                            listed_since,
                            listed_last,
                            fetched: o.version,
                            fetched_at: now,
                            record,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(key, error = %crate::error::Chain(&e), "corrupt node record; its sessions are left alone");
                    self.peers.corrupt.insert(key.to_string());
                    self.peers.nodes.remove(key);
                }
            },
            Ok(None) => {
                let ttl = self
                    .peers
                    .nodes
                    .remove(key)
                    .map_or(self.cfg.ttl, |n| Duration::from_millis(n.record.ttl_ms));
                self.memory
                    .absent_nodes
                    .entry(key.to_string())
                    .or_insert((now, ttl));
            }
            Err(
                e @ (crate::store::StoreError::Corrupt { .. }
                | crate::store::StoreError::Invalid { .. }),
            ) => {
                tracing::warn!(key, error = %crate::error::Chain(&e), "unreadable node record; its sessions are left alone");
                self.peers.corrupt.insert(key.to_string());
                self.peers.nodes.remove(key);
            }
            Err(e) => return Err(Error::from_store("get", key, e)),
        }
        Ok(())
    }

    /// Brings peers' node records in line with a listing: new peers are read,
    /// known ones only every `node_refresh` (their versions change at every
    /// renewal, which is no news), except a peer whose version changes after
    /// standing still (unchanged in our listings over half its TTL apart):
    /// that change is a release, a
    /// fence by another node, a re-registration or a late renewal, and peers
    /// must see which at once (a released record reads as live again until
    /// read, which would hold up failover for a TTL).
    pub(super) async fn refresh_nodes(&mut self, entries: &[Entry]) -> Result<()> {
        let mine = crate::keys::node(&self.me.node);
        let listed: std::collections::HashSet<&str> =
            entries.iter().map(|e| e.key.as_str()).collect();
        let now = self.deps.clock.now();
        // A peer that vanished from the listing is absent as of now (after
        // the listing arrived), not dead: see `node_absent_long_enough`.
        for (k, n) in &self.peers.nodes {
            if !listed.contains(k.as_str()) {
                self.memory
                    .absent_nodes
                    .entry(k.clone())
                    .or_insert((now, Duration::from_millis(n.record.ttl_ms)));
            }
        }
        self.memory
            .absent_nodes
            .retain(|k, _| !listed.contains(k.as_str()));
        // Bounded: only keys some claim still names are worth remembering.
        // Looked for only while some node is absent (rarely), and without
        // formatting a key per claim: this ran every pass over every claim
        // in the fleet, a fifth of an idle node's CPU at 100,000 sessions
        // (issue #14).
        if !self.memory.absent_nodes.is_empty() {
            let named: std::collections::HashSet<&str> = self
                .claims
                .values()
                .map(|(_, c)| c.owner.node.as_str())
                .collect();
            self.memory.absent_nodes.retain(|k, _| {
                k.strip_prefix(crate::keys::NODES)
                    .is_some_and(|id| named.contains(id))
            });
        }
        self.peers.nodes.retain(|k, _| listed.contains(k.as_str()));
        self.peers.corrupt.retain(|k| listed.contains(k.as_str()));
        for e in entries {
            if e.key == mine {
                continue;
            }
            let due = match self.peers.nodes.get_mut(&e.key) {
                Some(n) => {
                    // Stood still: two of our listings more than ttl/2
                    // apart showed the same version. (Not merely "changed
                    // since our last listing": an idle node lists every TTL
                    // and would read every peer every time.)
                    let mut stalled = false;
                    if n.listed == e.version {
                        n.listed_last = now;
                    } else {
                        stalled = n.listed_last.saturating_since(n.listed_since)
                            > Duration::from_millis(n.record.ttl_ms) / 2;
                        n.listed = e.version.clone();
                        n.listed_since = now;
                        n.listed_last = now;
                    }
                    stalled
                        || (n.fetched != e.version
                            && now.saturating_since(n.fetched_at) >= self.cfg.peer_refresh())
                }
                None => true,
            };
            if due {
                self.fetch_node(&e.key, Some(e.version.clone())).await?;
            }
        }
        Ok(())
    }
}
