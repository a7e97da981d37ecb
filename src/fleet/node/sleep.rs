//! Sleep: an owned session put to sleep (its idle time passed, or it asked), and the idle check.

use super::*;

impl Node {
    /// Puts `name` to sleep: stops its run, and writes its claim asleep:
    /// naming no node, its epoch kept (the next run's token is higher), its
    /// addresses forgotten, `why` as its reason. Whether it landed.
    pub(super) async fn put_to_sleep(&mut self, name: &str, why: String) -> bool {
        let Some(o) = self.owned.get(name).cloned() else {
            return false;
        };
        self.checks.stop(name);
        if o.running {
            self.deps.runner.stop(name).await;
            if let Some(x) = self.owned.get_mut(name) {
                x.running = false;
            }
        }
        if let Some(reg) = &self.deps.channel {
            reg.retire(name, o.record.epoch, "it fell asleep");
        }
        let mut next = o.record.clone();
        next.state = ClaimState::Sleeping;
        next.owner = Owner {
            node: crate::fleet::claim::QUEUED.into(),
            instance: crate::fleet::claim::QUEUED.into(),
        };
        next.address = None;
        next.endpoint = None;
        next.health = None;
        next.backoff_until_ms = None;
        next.reason = Some(why.clone());
        let w = ClaimWrite::send(ClaimIo::of(&self.deps), name, o.version.clone(), next).await;
        match self.apply_claim_write(name, w).await {
            Ok(()) => {
                self.event(EventKind::Sleeping, Some(name), Some(o.record.epoch), why);
                true
            }
            Err(e) => {
                tracing::warn!(session = name, error = %crate::error::Chain(&e), "putting it to sleep: retried each pass; it is not started meanwhile");
                // Unwritten, the claim still says running: kept as a
                // pending end (`core::reconcile_owned` asks to write it,
                // and nothing starts the session meanwhile).
                if let Some(x) = self.owned.get_mut(name) {
                    x.pending_finish = Some(PendingFinish {
                        state: ClaimState::Sleeping,
                        exit_code: x.record.exit_code,
                        reason: Some(why),
                    });
                }
                false
            }
        }
    }

    /// Puts to sleep the sessions that asked (on the channel) and those
    /// idle past their `sleep.after_idle`. Whether any fell asleep.
    pub(super) async fn sleep_due(&mut self) -> bool {
        let mut due: Vec<(String, String)> = Vec::new();
        // Alarms asked for with a sleep, set once the session is asleep.
        let mut wake_at: HashMap<String, (u64, u64)> = HashMap::new();
        if let Some(reg) = &self.deps.channel {
            for (run, at) in reg.take_sleep_requests() {
                if run.instance == self.me.instance
                    && self
                        .owned
                        .get(&run.session)
                        .is_some_and(|o| o.running && o.record.epoch == run.epoch)
                {
                    if let Some(at) = at {
                        wake_at.insert(run.session.clone(), (run.epoch, at));
                    }
                    due.push((run.session, "it asked to sleep".into()));
                }
            }
        }
        let now = self.deps.clock.now();
        // Wakes that reached this node: in use.
        for name in self.deps.status.take_touches() {
            if let Some(o) = self.owned.get_mut(&name) {
                o.active_at = now;
            }
        }
        let owned = &self.owned;
        self.sleepers.retain(|n| owned.get(n).is_some());
        for name in &self.sleepers {
            let Some(o) = self.owned.get(name) else {
                continue;
            };
            let Some(idle) = o
                .spec
                .as_ref()
                .and_then(|s| s.1.sleep)
                .and_then(|r| r.after_idle)
            else {
                continue;
            };
            if o.running
                && now.saturating_since(o.active_at) >= idle
                && !due.iter().any(|d| d.0 == *name)
            {
                due.push((
                    name.clone(),
                    format!("idle for {}", humantime::format_duration(idle)),
                ));
            }
        }
        due.sort();
        let mut any = false;
        let asked = !wake_at.is_empty();
        self.alarms.after_sleep.extend(wake_at);
        for (name, why) in due {
            any |= self.put_to_sleep(&name, why).await;
        }
        // The alarms asked for with these sleeps, now that they are written
        // (or kept for the next pass while a write is pending).
        if asked {
            self.settle_sleep_alarms().await;
        }
        any
    }
}
