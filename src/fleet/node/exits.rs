//! Exits: what a session's end leads to (restart, finish, loss), and a finish the store has not taken yet.

use super::*;

impl Node {
    /// Applies the restart policy to sessions that ended by themselves.
    pub(super) async fn handle_exits(&mut self) -> bool {
        let mut exits = self.deps.runner.take_exits();
        exits.sort_by(|a, b| a.name.cmp(&b.name)); // see `stop_all`
        let changed = !exits.is_empty();
        for x in exits {
            self.on_exit(x, true).await;
        }
        changed
    }

    /// One run's end: journalled, then its restart policy applied. With
    /// `restart` false (the node is handing its sessions over) a run the
    /// policy would start again is left for the release, and only a
    /// finished one is recorded.
    pub(super) async fn on_exit(&mut self, x: Exit, restart: bool) {
        let Some(o) = self.owned.get_mut(&x.name) else {
            return;
        };
        if o.record.epoch != x.epoch {
            return;
        }
        o.running = false;
        self.checks.stop(&x.name);
        if let Some(reg) = &self.deps.channel {
            reg.retire(&x.name, x.epoch, &format!("it exited (code {})", x.code));
        }
        self.event(
            EventKind::Exited,
            Some(&x.name),
            Some(x.epoch),
            format!(
                "code {}{}",
                x.code,
                if x.deadline {
                    " (deadline)".to_string()
                } else if x.watchdog_lost {
                    " (its watchdog was killed; every process of it was killed)".to_string()
                } else if let Some(r) = &x.reason {
                    format!(": {r}")
                } else {
                    String::new()
                }
            ),
        );
        // Its sleep code: asleep, not restarted (a node handing its
        // sessions over leaves the choice to the release).
        let sleeps = self
            .owned
            .get(&x.name)
            .and_then(|o| o.spec.as_ref())
            .and_then(|s| s.1.sleep)
            .is_some_and(|r| r.on_exit == Some(x.code));
        if sleeps && restart {
            self.put_to_sleep(&x.name, format!("it exited with its sleep code {}", x.code))
                .await;
            return;
        }
        let Some(rule) = self
            .manifests
            .get(&crate::keys::manifest(&x.name))
            .map(|(_, m)| m.restart)
        else {
            return;
        };
        let now = self.deps.clock.now();
        let Some(o) = self.owned.get_mut(&x.name) else {
            return;
        };
        let ran_for = now.saturating_since(o.started_at);
        let quick = o.quick_exits;
        // What `attempts` counts: the restarts in its window (seen here),
        // or every restart of this run (the claim's count).
        let counted = match rule.window {
            Some(w) => {
                o.restart_times.retain(|t| now.saturating_since(*t) < w);
                o.restart_times.len() as u32
            }
            None => o.record.restarts,
        };
        match core::after_exit(&rule, x.code, x.deadline, ran_for, quick, counted) {
            core::AfterExit::LeaseLapsed => {} // the loop notices and stops all
            core::AfterExit::Finish(state) => {
                let reason = x.reason.clone().filter(|_| state == ClaimState::Failed);
                self.finish(&x.name, state, Some(x.code), reason).await;
            }
            core::AfterExit::GiveUp { restarts } => {
                let reason = format!(
                    "gave up after {restarts} restart{}{} (last exit {}{})",
                    if restarts == 1 { "" } else { "s" },
                    rule.window
                        .map(|w| format!(" in {}", humantime::format_duration(w)))
                        .unwrap_or_default(),
                    x.code,
                    x.reason
                        .as_ref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                );
                self.event(
                    EventKind::Failed,
                    Some(&x.name),
                    Some(x.epoch),
                    reason.clone(),
                );
                self.finish(&x.name, ClaimState::Failed, Some(x.code), Some(reason))
                    .await;
            }
            core::AfterExit::Restart { .. } if !restart => {}
            core::AfterExit::Restart { quick_exits, delay } => {
                // Persisted before the restart (one fenced write per
                // restart), so `ls` shows the count and the last exit code.
                // With a back-off, the claim says until when (by this
                // node's wall clock, for readers: `ls` shows `backoff`).
                if let Some(o) = self.owned.get(&x.name).cloned() {
                    let mut next = o.record.clone();
                    next.restarts += 1;
                    next.exit_code = Some(x.code);
                    // The last run's end, where its code does not say it
                    // (a memory limit): `ls` and `describe` show it.
                    next.reason = x.reason.clone();
                    // The next run starts unproven.
                    next.health = o
                        .spec
                        .as_ref()
                        .and_then(|s| s.1.check.as_ref())
                        .map(|_| crate::fleet::check::Health::Starting);
                    next.backoff_until_ms = (!delay.is_zero()).then(|| {
                        self.deps
                            .clock
                            .wall_ms()
                            .saturating_add(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
                    });
                    if self.write_claim(&x.name, &o, next).await.is_err() {
                        return; // taken over, or the store is unreachable
                    }
                }
                // The back-off runs from after the write (a slow store
                // must not shorten it).
                let after_write = self.deps.clock.now();
                if let Some(o) = self.owned.get_mut(&x.name) {
                    o.quick_exits = quick_exits;
                    o.restart_at = (!delay.is_zero()).then_some(after_write + delay);
                    if rule.window.is_some() {
                        o.restart_times.push_back(now);
                    }
                }
                if !delay.is_zero() {
                    let at = after_write + delay;
                    self.next_restart = Some(self.next_restart.map_or(at, |t| t.min(at)));
                }
                if delay.is_zero() {
                    self.start(&x.name).await;
                } else {
                    // The pass that finds the wait over starts it
                    // (`reconcile_owned`).
                    self.event(
                        EventKind::Backoff,
                        Some(&x.name),
                        Some(x.epoch),
                        format!("crash loop: restarting in {delay:?}"),
                    );
                }
            }
        }
    }

    /// Records a finished run's end (a fenced write of its claim). If the
    /// write does not land and the claim is still ours (the store was
    /// unreachable, not a peer's takeover), the end is kept as pending:
    /// each pass retries it, and meanwhile the session is neither started
    /// again nor released (`core::reconcile_owned`, `release_claims`).
    pub(super) async fn finish(
        &mut self,
        name: &str,
        state: ClaimState,
        exit_code: Option<i32>,
        reason: Option<String>,
    ) -> bool {
        let r = self
            .set_state_why(name, state, exit_code, reason.clone())
            .await;
        // Only an unwritten end is kept: a transition the claim refuses
        // would be refused at every retry.
        let refused = matches!(&r, Err(e) if e.kind() == crate::ErrorKind::Invalid);
        if refused {
            tracing::warn!(session = name, "its run's end was not recorded: {:?}", r);
        }
        match self.owned.get_mut(name) {
            Some(o) if refused => {
                o.pending_finish = None;
                false
            }
            Some(o) if r.is_err() || o.record.state != state => {
                tracing::warn!(
                    session = name,
                    "the end of its run is not recorded yet (the store is unreachable): retried each pass; it is not run again meanwhile"
                );
                o.pending_finish = Some(PendingFinish {
                    state,
                    exit_code,
                    reason,
                });
                false
            }
            Some(o) => {
                o.pending_finish = None;
                true
            }
            None => false, // taken over meanwhile
        }
    }

    /// Retries a pending finish (see [`Node::finish`]); whether it landed.
    pub(super) async fn write_pending_finish(&mut self, name: &str) -> bool {
        let Some(p) = self.owned.get(name).and_then(|o| o.pending_finish.clone()) else {
            return true;
        };
        if p.state == ClaimState::Sleeping {
            if let Some(o) = self.owned.get_mut(name) {
                o.pending_finish = None;
            }
            return self
                .put_to_sleep(name, p.reason.unwrap_or_else(|| "asleep".into()))
                .await;
        }
        self.finish(name, p.state, p.exit_code, p.reason).await
    }

    pub(super) async fn lose(&mut self, name: &str, why: &str) {
        self.checks.stop(name);
        if let Some(o) = self.owned.remove(name) {
            if let Some(reg) = &self.deps.channel {
                reg.retire(name, o.record.epoch, &format!("its claim was lost ({why})"));
            }
            if o.running {
                self.deps.runner.stop(name).await;
            }
            self.event(
                EventKind::Lost,
                Some(name),
                Some(o.record.epoch),
                why.to_string(),
            );
        }
    }
}
