//! Handing sessions over: stopping them all (shutdown, drain, a lost lease),
//! recording the runs that ended by themselves first, applying the node's
//! control object (cordon, drain), and releasing claims. A finished
//! run-to-completion session keeps its terminal claim (DESIGN.md, "Session
//! lifecycle").

use super::*;

/// Sessions stopped at once when a node stops them all (`Node::stop_all`).
const STOP_CONCURRENCY: usize = 256;

impl Node {
    /// Stops every running session (`why` goes into the journal); the claims
    /// stay owned until released or forgotten by the caller. Returns the
    /// runs that had ended by themselves before their stop reached them
    /// (see the runner's contract): a caller that goes on to release claims
    /// records them first (`finish_exits`), so a job that finished is not
    /// released to run again.
    pub(super) async fn stop_all(&mut self, why: &str) -> Vec<Exit> {
        // In name order, as every loop over `owned` that acts: a HashMap's
        // order is random per process, and a seeded simulation must replay
        // the same requests in the same order in any process.
        let mut names: Vec<String> = self
            .owned
            .iter()
            .filter(|(_, o)| o.running)
            .map(|(n, _)| n.clone())
            .collect();
        names.sort_unstable();
        // Stopped together, STOP_CONCURRENCY at a time: a stop waits for
        // the session to exit, up to the runner's grace (a session that
        // ignores the request takes all of it), so one after the other a
        // node shutting down with a thousand sessions took a thousand
        // graces. Each is stopped before anything is written of it (its
        // claim is released after this returns), as before.
        let runner = self.deps.runner.clone();
        // In the runner's order: `finish_exits` sorts what it records.
        let ended: Vec<Exit> = futures::stream::iter(names.clone())
            .map(move |name| {
                let runner = runner.clone();
                async move { runner.stop(&name).await }
            })
            .buffer_unordered(STOP_CONCURRENCY)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        for name in &names {
            let Some(o) = self.owned.get_mut(name) else {
                continue;
            };
            o.running = false;
            if ended.iter().any(|x| x.name == *name) {
                continue; // journalled as its exit by `finish_exits`
            }
            self.deps.journal.record(
                self.deps.clock.wall_ms(),
                EventKind::Stopped,
                Some(name),
                Some(o.record.epoch),
                why.to_string(),
            );
        }
        ended
    }

    /// Records the runs that ended by themselves, `ended` (from `stop_all`)
    /// and whatever the runner reported since the last pass, before their
    /// claims are released: a run its policy finishes gets its terminal
    /// state, and nothing is restarted (the node is handing its sessions
    /// over). A finished run-to-completion job is then never released to run
    /// again, however its end and the node's stop were ordered.
    pub(super) async fn finish_exits(&mut self, ended: Vec<Exit>) {
        let mut exits = self.deps.runner.take_exits();
        exits.extend(ended);
        exits.sort_by(|a, b| a.name.cmp(&b.name)); // see `stop_all`
        for x in exits {
            self.on_exit(x, false).await;
        }
    }

    /// Reads this node's control object and applies it: cordon (no new
    /// sessions; published in the node record at the next renewal), drain
    /// (cordon, and hand every session over: stop it, release the claim),
    /// or neither. An unreadable object leaves things as they are.
    pub(super) async fn apply_control(&mut self) -> bool {
        let c = match crate::fleet::control::get(&self.deps.store, &self.me.node).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %crate::error::Chain(&e), "reading this node's control object");
                return false;
            }
        };
        self.control.read = true;
        let (cordon, drain) = c.map_or((false, false), |c| (c.cordon || c.drain, c.drain));
        let was = self
            .deps
            .status
            .cordoned
            .swap(cordon, std::sync::atomic::Ordering::SeqCst);
        let mut changed = false;
        if was != cordon {
            self.event(
                if cordon {
                    EventKind::Cordoned
                } else {
                    EventKind::Uncordoned
                },
                None,
                None,
                if cordon {
                    "taking no new sessions"
                } else {
                    "taking sessions again"
                },
            );
            changed = true;
        }
        self.control.draining = drain;
        // A finished session stays with a draining node (see
        // `release_claims`): only the others are handed over.
        let to_hand = self
            .owned
            .values()
            .filter(|o| o.running || !o.record.state.is_terminal())
            .count();
        if drain && to_hand > 0 {
            self.event(
                EventKind::Draining,
                None,
                None,
                format!("handing {to_hand} sessions over"),
            );
            let ended = self.stop_all("node drained").await;
            self.finish_exits(ended).await;
            self.release_claims(false).await;
            changed = true;
        }
        changed
    }

    /// Releases every owned claim. At shutdown the rest are forgotten (the
    /// node lease is released next, which frees them all); on a drain a
    /// claim whose release did not commit stays owned, stopped, and is
    /// released again at the next pass (`apply_control`), so it is never
    /// left looking owned by a live node that will not run it.
    ///
    /// A finished run-to-completion session (succeeded, failed) is not
    /// released: a released claim is claimable by anyone, so releasing it
    /// ran a finished job again on the next node (DESIGN.md, "Session
    /// lifecycle": a terminal state survives every release). At shutdown
    /// it is forgotten: its claim then names an owner that is gone, which
    /// is harmless (`plan::claimable` never takes a finished claim of the
    /// manifest's digest, and one of a changed manifest is taken over at
    /// epoch + 1 as any orphan). On a drain it stays owned, so that a
    /// changed manifest finds it: `core::reconcile_owned` releases a
    /// finished claim with a new spec on a node that is full or draining
    /// (forgotten by a live node, it waited for that node's end, as peers
    /// take nothing from a live owner).
    pub(super) async fn release_claims(&mut self, forget_the_rest: bool) {
        // A finished run whose end is not written yet is never released
        // (the next node would run it again): its write is tried a few
        // more times, and if the store is still down it is left as it is
        // (forgotten at shutdown, retried by the next pass after a drain).
        let mut pending: Vec<String> = self
            .owned
            .iter()
            .filter(|(_, o)| o.pending_finish.is_some())
            .map(|(n, _)| n.clone())
            .collect();
        pending.sort_unstable();
        for name in pending {
            // Back to back: a stop must not wait on the store (each try is
            // a round trip, and a supervisor's stop timeout is short).
            for _ in 0..3 {
                if self.write_pending_finish(&name).await {
                    break;
                }
            }
        }
        let mut names: Vec<String> = self
            .owned
            .iter()
            .filter(|(_, o)| {
                (o.running || !o.record.state.is_terminal()) && o.pending_finish.is_none()
            })
            .map(|(n, _)| n.clone())
            .collect();
        names.sort_unstable(); // see `stop_all`
        // Written CLAIM_CONCURRENCY at a time (one round trip each, and its
        // hint): one after the other, a node with a thousand sessions took
        // about a minute to shut down or drain at 30 ms per request, past
        // most supervisors' stop timeouts. Each outcome is then applied in
        // name order, as `set_state` would.
        let mut writes = Vec::with_capacity(names.len());
        for name in names {
            match self.state_change(&name, ClaimState::Released, None) {
                Ok(Some((version, next))) => writes.push((name, version, next)),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(session = name, error = %crate::error::Chain(&e), "releasing claim")
                }
            }
        }
        let io = ClaimIo::of(&self.deps);
        let sent: Vec<_> = futures::stream::iter(writes)
            .map(move |(name, version, next)| {
                let io = io.clone();
                async move {
                    let w = ClaimWrite::send(io, &name, version, next).await;
                    (name, w)
                }
            })
            .buffered(CLAIM_CONCURRENCY)
            .collect()
            .await;
        for (name, w) in sent {
            if let Err(e) = self.apply_state_change(&name, w).await {
                tracing::warn!(session = name, error = %crate::error::Chain(&e), "releasing claim");
            }
        }
        if forget_the_rest {
            self.owned.clear();
        }
    }
}
