//! Between passes: the ring watch (the next peers' records read as their
//! renewals are due, so a dead peer is noticed about ttl + margin after its
//! last renewal) and the bell (the fleet-wide change signal).

use super::*;

/// What one round of the ring watch found (see `Node::watch_peers`).
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// Run a pass now.
    pub(super) pass: bool,
    /// Watched records found missing, with the version the listing showed.
    pub(super) missing: Vec<(String, Version)>,
    /// The peers read, when each response arrived, and (for a new version
    /// whose record decoded) when its next renewal is expected.
    pub(super) read: Vec<(String, MonoTime, Option<Option<MonoTime>>)>,
    /// The bell, if read: when, and the version it showed.
    pub(super) bell: Option<(MonoTime, Option<Version>)>,
    /// The bell rang.
    pub(super) rang: bool,
}

impl Node {
    /// The peers the ring watch reads, with their place among our ring
    /// successors and their ttl: the peers the last pass judged live (one
    /// already expired, a dead node with no sessions that nobody fenced,
    /// was dealt with, and must not hurry every pause from now on).
    pub(super) fn watched(&self) -> Vec<(String, usize, Duration)> {
        let observer = self.client.observer();
        let ids: Vec<&str> = self
            .peers
            .nodes
            .iter()
            .filter(|(key, n)| {
                let ttl = Duration::from_millis(n.record.ttl_ms);
                !n.record.released
                    && observer
                        .unchanged_for(key, &n.listed, self.peers.listed_at)
                        .is_none_or(|d| {
                            !crate::liveness::stood_still_long_enough(d, ttl, default_margin(ttl))
                        })
            })
            .map(|(_, n)| n.record.holder.node.as_str())
            .collect();
        core::ring_successors(&self.me.node, &ids, core::WATCHED)
            .into_iter()
            .enumerate()
            .filter_map(|(position, id)| {
                let key = crate::keys::node(id);
                let ttl = Duration::from_millis(self.peers.nodes.get(&key)?.record.ttl_ms);
                Some((key, position, ttl))
            })
            .collect()
    }

    /// How long until the watched peer `key` is due a read (`core::watch_wait`).
    pub(super) fn watch_wait_for(
        &self,
        key: &str,
        position: usize,
        ttl: Duration,
        now: MonoTime,
    ) -> Duration {
        let observer = self.client.observer();
        let unchanged = observer
            .version(key)
            .and_then(|v| observer.unchanged_for(key, &v, now));
        let peer = self.ring.read.get(key);
        let since_read = peer.map(|p| now.saturating_since(p.read_at));
        let foreseen = match peer.and_then(|p| p.expect_at) {
            None => core::Foreseen::Unknown,
            Some(t) if t > now => core::Foreseen::In(t.saturating_since(now)),
            Some(t) => core::Foreseen::Overdue(now.saturating_since(t)),
        };
        core::watch_wait(ttl, position, since_read, unchanged, foreseen)
    }

    /// How long until the next watch read is due: a watched peer's or the
    /// bell's. A lone node, which watches no peer, reads the bell all the
    /// same: it is how an `apply` without a token reaches it within about
    /// ttl/6 rather than an idle pause (issue #44; 1.2-3.9 s before).
    pub(super) fn watch_wait(&self) -> Duration {
        let now = self.deps.clock.now();
        let bell = self.bell_wait(now);
        self.watched()
            .into_iter()
            .map(|(key, position, ttl)| self.watch_wait_for(&key, position, ttl, now))
            .min()
            .map_or(bell, |peers| peers.min(bell))
    }

    /// How long until the bell is due a read (now if never read).
    pub(super) fn bell_wait(&self, now: MonoTime) -> Duration {
        self.ring.bell.as_ref().map_or(Duration::ZERO, |(at, _)| {
            core::bell_period(self.cfg.ttl).saturating_sub(now.saturating_since(*at))
        })
    }

    /// Reads the bell (a conditional GET on the version last seen). Returns
    /// what to remember, and whether it rang: a version other than the one
    /// an earlier read showed, a first one where it was missing included
    /// (this node's first read only learns it; a bell found missing is no
    /// ring).
    pub(super) async fn read_bell(&self) -> ((MonoTime, Option<Version>), bool) {
        let read_before = self.ring.bell.is_some();
        let known = self.ring.bell.as_ref().and_then(|(_, v)| v.clone());
        let read = match &known {
            Some(v) => self.deps.store.get_if_changed(crate::keys::BELL, v).await,
            None => self
                .deps
                .store
                .get(crate::keys::BELL)
                .await
                .map(|o| o.map_or(Conditional::Missing, Conditional::Changed)),
        };
        let at = self.deps.clock.now();
        match read {
            Ok(Conditional::NotModified) => ((at, known), false),
            Ok(Conditional::Changed(o)) => ((at, Some(o.version)), read_before),
            // Never rung since `init` made it, or deleted: a plain GET
            // each time until a ring creates it again (a reader does not:
            // it must not write into a bucket that may have been wiped).
            Ok(Conditional::Missing) => ((at, None), false),
            Err(e) => {
                tracing::debug!(error = %crate::error::Chain(&e), "reading the bell");
                ((at, known), false)
            }
        }
    }

    /// Reads the watched peers' node records (a conditional GET each, on
    /// the version the last listing showed), feeding what they show to the
    /// same observer the listings feed. Returns whether a pass should run
    /// now: a watched peer has stood still past its ttl + margin, or its
    /// record is missing. A hint only: the pass judges again from its own
    /// listing, and the observation it adds is a response's arrival like
    /// any other (never earlier than the write that made the version).
    pub(super) async fn watch_peers(&self) -> Watch {
        let now = self.deps.clock.now();
        let watched: Vec<String> = self
            .watched()
            .into_iter()
            .filter(|(key, position, ttl)| {
                self.watch_wait_for(key, *position, *ttl, now) == Duration::ZERO
            })
            .map(|(key, _, _)| key)
            .collect();
        let observer = self.client.observer();
        // Both reads at once: the pause is waiting on them.
        let reads = watched.into_iter().filter_map(|key| {
            let n = self.peers.nodes.get(&key)?;
            let ttl = Duration::from_millis(n.record.ttl_ms);
            // The latest version any response showed (a watch read may have
            // seen a renewal the last listing did not).
            let known = observer.version(&key).unwrap_or(n.listed.clone());
            let released = n.record.released && n.fetched == known;
            // A record found missing hurries one pass per listed version: a
            // store whose listings lag its deletes must not make every
            // watch a pass.
            let hurried = self.ring.missing.get(&key) == Some(&n.listed);
            let listed = n.listed.clone();
            Some(async move {
                let read = self.deps.store.get_if_changed(&key, &known).await;
                let arrived = self.deps.clock.now();
                let mut expected = None;
                let seen = match read {
                    Ok(Conditional::NotModified) => core::Watched::Unchanged {
                        for_: observer.observe(&key, &known, arrived),
                        released,
                    },
                    Ok(Conditional::Changed(o)) => {
                        observer.observe(&key, &o.version, arrived);
                        // When its next renewal should land, by its own
                        // record's wall time: only when to read next.
                        expected = Some(
                            LeaseRecord::decode(&key, &o.bytes, Kind::Node)
                                .ok()
                                .and_then(|r| {
                                    core::next_renewal_in(
                                        Duration::from_millis(r.ttl_ms),
                                        r.renewed_at_ms,
                                        self.deps.clock.wall_ms(),
                                    )
                                })
                                .map(|d| arrived + d),
                        );
                        core::Watched::Renewed
                    }
                    Ok(Conditional::Missing) if hurried => core::Watched::Unknown,
                    Ok(Conditional::Missing) => core::Watched::Missing,
                    Err(e) => {
                        tracing::debug!(peer = key, error = %crate::error::Chain(&e), "watching a peer");
                        core::Watched::Unknown
                    }
                };
                (
                    key,
                    listed,
                    seen,
                    core::watch_says_pass(seen, ttl),
                    arrived,
                    expected,
                )
            })
        });
        let bell_due = self.bell_wait(now) == Duration::ZERO;
        let bell = async {
            if bell_due {
                Some(self.read_bell().await)
            } else {
                None
            }
        };
        let (reads, bell) = futures::future::join(futures::future::join_all(reads), bell).await;
        let mut w = Watch::default();
        if let Some((remember, rang)) = bell {
            w.bell = Some(remember);
            if rang {
                tracing::debug!("the bell rang: a pass now");
                w.pass = true;
                w.rang = true;
            }
        }
        for (key, listed, seen, pass, arrived, expected) in reads {
            w.pass |= pass;
            w.read.push((key.clone(), arrived, expected));
            if seen == core::Watched::Missing {
                w.missing.push((key, listed));
            }
        }
        w
    }
}
