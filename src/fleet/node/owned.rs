//! The sessions this node holds: starting them, their exits and restart
//! policy, and keeping each in line with its claim and manifest
//! (`core::reconcile_owned` decides; this file reads and acts).

use super::*;

/// An owned session's manifest (paused, digest) as the rules see it: one
/// mapping for `owned_due`'s scan and the close look, which must agree.
fn own_manifest(m: Option<(bool, &plan::Digest)>) -> OwnManifest<'_> {
    match m {
        None => OwnManifest::Deleted,
        Some((true, _)) => OwnManifest::Paused,
        Some((false, digest)) => OwnManifest::Spec { digest },
    }
}

/// The placement view of a manifest (also for the CLI's nudge targets).
pub fn manifest_view(m: &ManifestRecord) -> ManifestView {
    ManifestView {
        name: m.name.clone(),
        digest: plan::Digest::new(&m.digest),
        selector: m.spec.selector.clone(),
        preferred: m.spec.preferred_nodes.clone(),
        paused: m.spec.paused,
    }
}

impl Node {
    /// A manifest read for the claim of `name` (with the claim, or by
    /// `spec_for`): what we know of it is updated, and its spec kept beside
    /// the claim if its digest is the claim's.
    pub(super) fn take_manifest(&mut self, name: &str, read: ManifestRead) {
        let mkey = crate::keys::manifest(name);
        match read {
            Ok(Some((m, v))) => {
                let known = KnownManifest::of(&m);
                self.manifests.insert(mkey, (v, known));
                if let Some(o) = self.owned.get_mut(name)
                    && o.record.digest == m.digest
                {
                    o.spec = Some((plan::Digest::new(&m.digest), Arc::new(m.spec)));
                }
            }
            Ok(None) => {
                self.manifests.remove(&mkey);
            }
            // Read again when it is started (`spec_for`).
            Err(e) => {
                tracing::warn!(session = name, error = %e, "reading the manifest to start it")
            }
        }
    }

    /// The spec to start `name` with: the one kept beside its claim if its
    /// digest is the manifest's we know, else read now. A read that finds
    /// another digest (the manifest changed since our last listing) or no
    /// manifest updates what we know and starts nothing: the next pass
    /// reconciles the claim with it, as for any change. An unreadable one is
    /// tried again by the next pass (the session is owned and not running).
    pub(super) async fn spec_for(&mut self, name: &str) -> Option<Arc<Spec>> {
        let mkey = crate::keys::manifest(name);
        let digest = self.manifests.get(&mkey)?.1.view.digest.clone();
        // Only under the claim made for it: a manifest changed since is
        // the next reconcile's (stop, adopt the digest, start), which
        // would otherwise start the session twice.
        if digest != self.owned.get(name)?.record.digest {
            return None;
        }
        if let Some((d, spec)) = self.owned.get(name).and_then(|o| o.spec.as_ref())
            && *d == digest
        {
            return Some(spec.clone());
        }
        // Unreadable now (the listing found it corrupt): nothing to start
        // but a spec kept above. (The claim loop does not take a session
        // whose manifest is corrupt: `Candidate::manifest_corrupt`.)
        if self.corrupt.contains_key(&mkey) {
            return None;
        }
        let n = Name::new(name).ok()?;
        let read = crate::fleet::manifest::get(&self.deps.store, &n).await;
        self.take_manifest(name, read);
        // Kept only if the manifest read has the claim's digest.
        let (d, spec) = self.owned.get(name)?.spec.as_ref()?;
        (*d == digest).then(|| spec.clone())
    }

    pub(super) async fn start(&mut self, name: &str) {
        // None for a session not owned, too.
        let Some(spec) = self.spec_for(name).await else {
            return;
        };
        let Some(o) = self.owned.get(name) else {
            return;
        };
        let epoch = o.record.epoch;
        let valid_until = self.valid_until();
        if self.deps.clock.now() >= valid_until {
            // Our validity ended: not the session's failure. It stays
            // unstarted; the lease-loss path stops everything and the next
            // instance reclaims it.
            return;
        }
        // The claim names the session's endpoint, and a checked run is
        // `starting`, before it runs: one write, only where the claim does
        // not say so already (the claim's own write or a restart's usually
        // did).
        let endpoint = self.endpoint_of(&spec);
        let health = spec
            .check
            .as_ref()
            .map(|_| crate::fleet::check::Health::Starting);
        if o.record.endpoint != endpoint || o.record.health != health {
            let (o, mut next) = (o.clone(), o.record.clone());
            next.endpoint = endpoint;
            next.health = health;
            if self.write_claim(name, &o, next).await.is_err() {
                return; // taken over, or the store is unreachable
            }
        }
        // A credential for this run on the node's channel.
        let channel = self.deps.channel.as_ref().map(|reg| {
            let token = crate::fleet::channel::new_token();
            reg.register(
                &token,
                crate::fleet::channel::RunId {
                    session: name.to_string(),
                    epoch,
                    instance: self.me.instance.clone(),
                    may_sleep: spec.sleep.is_some(),
                },
            );
            crate::fleet::channel::RunChannel {
                address: reg.address().to_string(),
                token,
            }
        });
        let start = SessionStart {
            name: name.to_string(),
            node: self.me.node.clone(),
            epoch,
            spec: (*spec).clone(),
            deadline: valid_until,
            channel,
        };
        match self.deps.runner.start(start).await {
            Ok(()) => {
                let now = self.deps.clock.now();
                if let Some(o) = self.owned.get_mut(name) {
                    o.running = true;
                    o.started_at = now;
                    o.active_at = now;
                    o.restart_at = None;
                }
                self.event(EventKind::Started, Some(name), Some(epoch), "");
                self.start_check(name, epoch, &spec);
                if spec.sleep.is_some_and(|r| r.after_idle.is_some()) {
                    self.sleepers.insert(name.to_string());
                }
            }
            Err(e) if e.kind() == crate::ErrorKind::Fenced => {
                tracing::warn!(session = name, error = %e, "not started: the node's deadline passed");
            }
            Err(e) => {
                self.event(
                    EventKind::Failed,
                    Some(name),
                    Some(epoch),
                    format!("could not start: {e}"),
                );
                // What this node found (a user or workdir it does not
                // have), named with the node: another node may have it.
                let reason = match &e {
                    Error::Invalid { reason, .. } => reason.clone(),
                    e => e.to_string(),
                };
                let reason = format!("could not start on {}: {reason}", self.me.node);
                let _ = self
                    .set_state_why(name, ClaimState::Failed, Some(127), Some(reason))
                    .await;
            }
        }
    }

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
                tracing::warn!(session = name, error = %e, "putting it to sleep: retried each pass; it is not started meanwhile");
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
        if let Some(reg) = &self.deps.channel {
            for run in reg.take_sleep_requests() {
                if run.instance == self.me.instance
                    && self
                        .owned
                        .get(&run.session)
                        .is_some_and(|o| o.running && o.record.epoch == run.epoch)
                {
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
        for (name, why) in due {
            any |= self.put_to_sleep(&name, why).await;
        }
        any
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

    /// Where session `spec` can be reached on this node: `<host>:<port>`
    /// (see [`NodeConfig::session_host`]), when it names a port.
    pub(super) fn endpoint_of(&self, spec: &Spec) -> Option<String> {
        let port = spec.port?;
        let host = match (&self.cfg.session_host, &self.cfg.address) {
            (Some(h), _) => h.clone(),
            (None, Some(a)) => host_of(a).to_string(),
            (None, None) => crate::hostlock::hostname(),
        };
        Some(if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        })
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

    /// Our own claim as the cache shows it, in the order the rules apply
    /// (a corrupt key keeps its last good record in `claims`: bytes we
    /// cannot read where our claim was mean we cannot show we hold it).
    /// None: not cached, so not in the last listing; it must be read.
    pub(super) fn cached_own_claim(&self, key: &str, o: &Owned) -> Option<OwnClaim> {
        Some(match self.claims.get(key) {
            Some((v, c)) if *v != o.version && c.is_vanished() => OwnClaim::Vanished {
                below_ours: c.epoch < o.record.epoch,
            },
            Some((v, _)) if *v != o.version => OwnClaim::Changed,
            _ if self.corrupt.contains_key(key) => OwnClaim::Corrupt,
            Some(_) => OwnClaim::Ours,
            None => return None,
        })
    }

    /// The owned sessions this pass must look at closely, in name order:
    /// those whose claim is not cached (to be read), and those for which
    /// `core::reconcile_owned` asks anything.
    ///
    /// Why a scan first: at steady state nothing is asked of nearly every
    /// owned session, and the close look (a clone of the session, its keys
    /// formatted, its manifest's digest copied) cost allocations per owned
    /// session per pass, the largest share of an idle node's CPU at 10,000
    /// sessions (issue #14). This scan allocates nothing per session.
    ///
    /// Skipping a session here changes nothing: whether the rules ask
    /// anything does not depend on `full` (it picks only between actions),
    /// a back-off that is not pending now is not pending later in the pass,
    /// and what the close look does to one session changes no other
    /// session's facts but `full`.
    ///
    /// And no scan at all when the last one found nothing due and nothing
    /// it looks at has changed since (`owned_inputs`): at steady state this
    /// scan over every owned session was a tenth of an idle node's CPU at
    /// 10,000 sessions.
    pub(super) fn owned_due(&mut self, full: bool) -> Vec<String> {
        let now = self.deps.clock.now();
        let inputs = self.owned_inputs();
        if self.owned_idle == Some(inputs) {
            return Vec::new();
        }
        let (mut ckey, mut mkey) = (String::new(), String::new());
        let mut due: Vec<String> = self
            .owned
            .iter()
            .filter(|(name, o)| {
                let ckey = crate::keys::key_in(&mut ckey, crate::keys::SESSIONS, name);
                let Some(claim) = self.cached_own_claim(ckey, o) else {
                    return true;
                };
                let mkey = crate::keys::key_in(&mut mkey, crate::keys::MANIFESTS, name);
                !core::reconcile_owned(&core::Owned {
                    claim,
                    manifest: own_manifest(
                        self.manifests
                            .get(mkey)
                            .map(|(_, m)| (m.view.paused, &m.view.digest)),
                    ),
                    state: o.record.state,
                    digest: &o.record.digest,
                    running: o.running,
                    backoff_pending: o.restart_at.is_some_and(|t| now < t),
                    finish_pending: o.pending_finish.is_some(),
                    full,
                })
                .is_empty()
            })
            .map(|(name, _)| name.clone())
            .collect();
        // Time alone never makes an idle answer stale: the one fact time
        // changes is a back-off ending, and a pending back-off is itself
        // asked of (`Wait`; checked over every combination in `core`).
        self.owned_idle = due.is_empty().then_some(inputs);
        due.sort_unstable(); // see `stop_all`
        due
    }

    /// The generations of everything `owned_due`'s scan reads.
    pub(super) fn owned_inputs(&self) -> [u64; 4] {
        [
            self.owned.generation(),
            self.claims.generation(),
            self.manifests.generation(),
            self.corrupt.generation(),
        ]
    }

    /// Keeps owned sessions in line with their manifests and claims: the
    /// shell of `core::reconcile_owned`, which decides; here only the read
    /// of a claim the listing did not show, and the actions.
    pub(super) async fn reconcile_owned(&mut self) -> bool {
        let mut changed = false;
        // Counted once, then adjusted by each session's actions (which may
        // finish, lose, release or restart it): not once per owned session
        // (O(owned²) at 10,000 owned).
        let mut load = self.load();
        // A draining node takes on nothing: a finished session whose spec
        // changes is handed over (released), as on a full node.
        let (capacity, draining) = (self.cfg.capacity, self.draining);
        let full = move |load: u32| load >= capacity || draining;
        for name in self.owned_due(full(load)) {
            let key = crate::keys::session(&name);
            let Some(o) = self.owned.get(&name).cloned() else {
                continue;
            };
            let claim = match self.cached_own_claim(&key, &o) {
                Some(claim) => claim,
                // Not in the listing: read it (a listing may lag a write on
                // some stores). Gone, it is lost at once: a holder whose own
                // record vanishes has lost it.
                None => {
                    let sent = self.deps.clock.now();
                    match crate::fleet::claim::get(&self.deps.store, &name).await {
                        Ok(Some((c, v))) if v == o.version => {
                            self.claims.insert(key.clone(), (v, ClaimView::from(&c)));
                            if let Some(x) = self.owned.get_mut(&name) {
                                x.confirmed = x.confirmed.max(sent);
                            }
                            OwnClaim::Ours
                        }
                        Ok(Some((c, v))) if c.is_vanished() => {
                            let below_ours = c.epoch < o.record.epoch;
                            // Cached, so that RaiseMarker matches its version.
                            self.claims.insert(key.clone(), (v, ClaimView::from(&c)));
                            OwnClaim::Vanished { below_ours }
                        }
                        Ok(Some(_)) => OwnClaim::Changed,
                        Ok(None) => OwnClaim::Deleted,
                        Err(e) => {
                            // Unreadable now; `confirmed_until` bounds us.
                            tracing::warn!(session = name, error = %e, "reading our own claim");
                            OwnClaim::Unreadable
                        }
                    }
                }
            };
            let manifest = self
                .manifests
                .get(&crate::keys::manifest(&name))
                .map(|(_, m)| (m.view.paused, m.view.digest.clone()));
            let facts = core::Owned {
                claim,
                manifest: own_manifest(manifest.as_ref().map(|(p, d)| (*p, d))),
                state: o.record.state,
                digest: &o.record.digest,
                running: o.running,
                backoff_pending: o.restart_at.is_some_and(|t| self.deps.clock.now() < t),
                finish_pending: o.pending_finish.is_some(),
                full: full(load),
            };
            let actions = core::reconcile_owned(&facts);
            // Changed means something was done: a state write that failed
            // (a store outage) leaves the pace to back off.
            let was_changed = changed;
            for action in actions {
                changed = true;
                match action {
                    OwnedAction::Lose(why) => self.lose(&name, why).await,
                    OwnedAction::MarkVanished | OwnedAction::RaiseMarker => {
                        // We know the epoch it had, and have just stopped.
                        // Someone else's claim already there wins; a failure
                        // here only costs that floor.
                        let cond = match (action, self.claims.get(&key)) {
                            (OwnedAction::RaiseMarker, Some((v, _))) => Cond::Match(v.clone()),
                            _ => Cond::Create,
                        };
                        let _ = self.put_marker(&key, o.record.epoch, cond).await;
                    }
                    OwnedAction::Stop(detail) => {
                        self.deps.runner.stop(&name).await;
                        if let Some(x) = self.owned.get_mut(&name) {
                            x.running = false;
                        }
                        if let Some(detail) = detail {
                            self.event(
                                EventKind::Stopped,
                                Some(&name),
                                Some(o.record.epoch),
                                detail,
                            );
                        }
                    }
                    OwnedAction::AdoptDigest => {
                        if let (Some(x), Some((_, digest))) = (self.owned.get_mut(&name), &manifest)
                        {
                            // A new spec is a new run: its restarts
                            // count from nothing, and it runs under a
                            // fencing token no earlier run had (the claim's
                            // epoch + 1, written with the state below, by
                            // If-Match on the version we hold). At the
                            // highest epoch it keeps its own.
                            x.record.digest = digest.to_string();
                            if let Some(e) = crate::record::next_epoch(x.record.epoch) {
                                x.record.epoch = e;
                            }
                            x.record.restarts = 0;
                            x.record.backoff_until_ms = None;
                            x.restart_times.clear();
                            x.pending_finish = None; // a new run
                        }
                    }
                    OwnedAction::SetState(state) => {
                        if self.set_state(&name, state, None).await.is_err() {
                            // Unwritten, what `AdoptDigest` changed in
                            // memory is undone: the next pass adopts the
                            // digest again, and no run ever starts under an
                            // epoch the bucket does not hold (a peer taking
                            // over would hand that token out again).
                            if let Some(x) = self.owned.get_mut(&name) {
                                x.record = o.record.clone();
                            }
                            changed = was_changed;
                            break; // lost (rejected) or unwritable: no more steps
                        }
                    }
                    OwnedAction::Finish => {
                        if !self.write_pending_finish(&name).await {
                            changed = was_changed; // the store is still down
                            break;
                        }
                    }
                    OwnedAction::Start => {
                        if manifest.is_some() {
                            self.start(&name).await;
                        }
                    }
                    OwnedAction::Wait => {} // the pass stays at its base pace
                }
            }
            // Only this session's entry changed: adjust by it.
            let counted =
                |x: Option<&Owned>| u32::from(x.is_some_and(|x| !x.record.state.is_terminal()));
            load = load - counted(Some(&o)) + counted(self.owned.get(&name));
            debug_assert_eq!(load, self.load());
        }
        changed
    }
}

/// The host of an address (`http://host:port/path`, `host:port`,
/// `[v6]:port`), brackets kept for IPv6.
fn host_of(address: &str) -> &str {
    let rest = address.split_once("://").map_or(address, |x| x.1);
    let authority = rest.split('/').next().unwrap_or(rest);
    if authority.starts_with('[') {
        return authority
            .split_once(']')
            .map_or(authority, |x| &authority[..x.0.len() + 1]);
    }
    authority.rsplit_once(':').map_or(authority, |x| x.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn hosts_of_addresses() {
        use super::host_of;
        assert_eq!(host_of("http://127.0.0.1:7401"), "127.0.0.1");
        assert_eq!(host_of("http://n1.internal:7401/x"), "n1.internal");
        assert_eq!(host_of("https://[::1]:7401"), "[::1]");
        assert_eq!(host_of("n2"), "n2");
        assert_eq!(host_of("n2:80"), "n2");
    }
}
