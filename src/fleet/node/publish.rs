//! What the node publishes of itself (`Node::publish_status`): the
//! session table and readiness the HTTP API and metrics read, rebuilt only
//! when what the node holds differs from what it last published.

use super::*;

impl Node {
    /// Publishes what the node holds for the HTTP status, unless it is what
    /// is published already: each owned session looked up in the published
    /// list (sorted by name), allocating nothing. Rebuilding it every pass
    /// was one string per owned session per pass (issue #14).
    pub(super) fn publish_status(&mut self, ready: bool) {
        // Nothing owned changed since our snapshot, and nobody replaced it:
        // no look at the 10,000 sessions a node may own (issue #14).
        let generation = self.owned.generation();
        if self.memo.published == Some((generation, ready, self.deps.status.sets())) {
            return;
        }
        {
            let published = self
                .deps
                .status
                .inner
                .read()
                .unwrap_or_else(|p| p.into_inner());
            if published.ready == ready
                && published.node == self.me.node
                && published.instance == self.me.instance
                && published.sessions.len() == self.owned.len()
                && self.owned.iter().all(|(name, o)| {
                    // Names are unique on both sides and the counts equal:
                    // every owned session found equal means the same set.
                    published
                        .sessions
                        .binary_search_by(|p| p.name.as_str().cmp(name))
                        .is_ok_and(|i| {
                            let p = &published.sessions[i];
                            p.epoch == o.record.epoch
                                && p.state == o.record.state
                                && p.running == o.running
                                && p.restarts == o.record.restarts
                        })
                })
            {
                // Read under the snapshot's lock, which `set` counts under.
                let sets = self.deps.status.sets();
                drop(published);
                self.memo.published = Some((generation, ready, sets));
                return;
            }
        }
        let mut sessions: Vec<SessionStatus> = self
            .owned
            .iter()
            .map(|(name, o)| SessionStatus {
                name: name.clone(),
                epoch: o.record.epoch,
                state: o.record.state,
                running: o.running,
                restarts: o.record.restarts,
            })
            .collect();
        sessions.sort_by(|a, b| a.name.cmp(&b.name));
        let sets = self.deps.status.set(StatusSnapshot {
            node: self.me.node.clone(),
            instance: self.me.instance.clone(),
            ready,
            sessions,
        });
        self.memo.published = Some((generation, ready, sets));
    }
}
