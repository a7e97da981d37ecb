//! The sessions this node holds: starting them, and keeping each in line
//! with its claim and manifest (`core::reconcile_owned` decides; this file
//! reads and acts). Their exits are in `exits.rs`, their sleep in `sleep.rs`.

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
        scheduled: m.spec.schedule.is_some(),
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
                tracing::warn!(session = name, error = %crate::error::Chain(&e), "reading the manifest to start it")
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
                tracing::warn!(session = name, error = %crate::error::Chain(&e), "not started: the node's deadline passed");
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

    /// Where session `spec` can be reached on this node: `<host>:<port>`
    /// (see [`NodeConfig::session_host`]), when it names a port.
    pub(super) fn endpoint_of(&self, spec: &Spec) -> Option<String> {
        spec.port.map(|p| self.endpoint_at(p))
    }

    /// The session's address on this node for `port`.
    pub(super) fn endpoint_at(&self, port: u16) -> String {
        let host = match (&self.cfg.session_host, &self.cfg.address) {
            (Some(h), _) => h.clone(),
            (None, Some(a)) => host_of(a).to_string(),
            (None, None) => crate::hostlock::hostname(),
        };
        if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
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
        if self.memo.owned_idle == Some(inputs) {
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
                    scheduled: self
                        .manifests
                        .get(mkey)
                        .is_some_and(|(_, m)| m.view.scheduled),
                })
                .is_empty()
            })
            .map(|(name, _)| name.clone())
            .collect();
        // Time alone never makes an idle answer stale: the one fact time
        // changes is a back-off ending, and a pending back-off is itself
        // asked of (`Wait`; checked over every combination in `core`).
        self.memo.owned_idle = due.is_empty().then_some(inputs);
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
        let (capacity, draining) = (self.cfg.capacity, self.control.draining);
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
                            tracing::warn!(session = name, error = %crate::error::Chain(&e), "reading our own claim");
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
                scheduled: self
                    .manifests
                    .get(&crate::keys::manifest(&name))
                    .is_some_and(|(_, m)| m.view.scheduled),
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
                        // A deleted manifest's tombstone is no run of a
                        // tick: a scheduled session applied again over it
                        // waits for its next tick (`fleet::cron`).
                        if state == ClaimState::Released
                            && manifest.is_none()
                            && let Some(x) = self.owned.get_mut(&name)
                        {
                            x.record.tick_ms = None;
                        }
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
