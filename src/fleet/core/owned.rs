//! What an owned session needs: its claim changed, deleted or corrupt; its manifest deleted, paused or given a new spec; a finished run.

use super::*;

/// Our own claim of a session we hold, as this pass saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnClaim {
    /// At the version we wrote (listed, or read back when the listing did
    /// not show it).
    Ours,
    /// Not listed, and the read-back failed: unknown for now. The claim's
    /// confirmation bound (`confirmed_until`) stops us if it stays unknown.
    Unreadable,
    /// At another version: another writer took it; we were judged dead.
    Changed,
    /// Replaced by a vanished claim's marker (someone found it missing):
    /// it was deleted. `below_ours`: the marker's epoch is below ours.
    Vanished { below_ours: bool },
    /// Gone from the bucket.
    Deleted,
    /// Bytes that are not a claim.
    Corrupt,
}

/// The session's manifest, as this pass saw it. A manifest that cannot be
/// decoded is seen as the last good one (never as deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnManifest<'a> {
    Deleted,
    Paused,
    Spec {
        digest: &'a crate::fleet::plan::Digest,
    },
}

/// Everything the owned-session rule looks at.
#[derive(Debug, Clone, Copy)]
pub struct Owned<'a> {
    pub claim: OwnClaim,
    pub manifest: OwnManifest<'a>,
    /// The claim's state and the digest it runs.
    pub state: ClaimState,
    pub digest: &'a str,
    /// A process of it is running here.
    pub running: bool,
    /// A crash-loop back-off is still waiting.
    pub backoff_pending: bool,
    /// Its run finished but the write that records it has not landed: the
    /// claim still says running.
    pub finish_pending: bool,
    /// This node is at capacity.
    pub full: bool,
    /// Its manifest has a schedule: a finished run waits for its next
    /// tick, even with a new spec.
    pub scheduled: bool,
}

/// One step of keeping an owned session in line, in the order the shell
/// carries them out. A failed `SetState` ends the list (the write was
/// rejected: the claim is lost, and the shell has already stopped it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnedAction {
    /// Stop the session and forget the claim: the reason is logged.
    Lose(&'static str),
    /// Write a vanished marker at our epoch where our deleted claim was
    /// (create-if-absent), so the next holder waits out the hold period and
    /// takes over above our epoch instead of starting at 1 again.
    MarkVanished,
    /// Raise the marker that replaced our claim to our epoch (If-Match on
    /// its version), for the same reason: its writer saw an older epoch.
    RaiseMarker,
    /// Stop the running process; the detail, if any, is journalled.
    Stop(Option<&'static str>),
    /// Record the manifest's digest as the one the claim runs.
    AdoptDigest,
    /// Fenced write of the claim's state.
    SetState(ClaimState),
    /// Retry the write of a finished run's end (its state, code and
    /// reason, kept by the shell). Nothing else happens to the session
    /// until it lands: starting it again, or releasing it, would run a
    /// finished job again.
    Finish,
    /// Start the session.
    Start,
    /// A crash-loop back-off holds the restart; keep the brisk pace.
    Wait,
}

/// What an owned session needs this pass. An empty list: nothing.
pub fn reconcile_owned(o: &Owned) -> Vec<OwnedAction> {
    use OwnedAction::*;
    match o.claim {
        OwnClaim::Changed => return vec![Lose("claim changed by another writer")],
        OwnClaim::Deleted => {
            return vec![Lose("claim deleted from the bucket"), MarkVanished];
        }
        OwnClaim::Vanished { below_ours } => {
            let mut out = vec![Lose("claim deleted from the bucket")];
            if below_ours {
                out.push(RaiseMarker);
            }
            return out;
        }
        OwnClaim::Corrupt => {
            return vec![Lose("claim overwritten with bytes that are not a claim")];
        }
        OwnClaim::Ours | OwnClaim::Unreadable => {}
    }
    // A finished run whose end is not written yet: write it, and nothing
    // more, whatever else changed (a pause, a resume), short of a deleted
    // manifest (released) or a new spec (a new run, which needs no record
    // of the old one's end).
    if o.finish_pending && !o.running {
        match o.manifest {
            OwnManifest::Deleted => {}
            OwnManifest::Spec { digest } if *digest != *o.digest => {}
            _ => return vec![Finish],
        }
    }
    let mut out = Vec::new();
    match o.manifest {
        OwnManifest::Deleted => {
            if o.running {
                out.push(Stop(Some("manifest deleted")));
            }
            out.push(SetState(ClaimState::Released));
        }
        OwnManifest::Paused => {
            if o.running {
                out.push(Stop(None));
            }
            // A finished session stays finished: pausing it changes
            // nothing (and its claim may not become paused).
            if o.state != ClaimState::Paused && !o.state.is_terminal() {
                out.push(SetState(ClaimState::Paused));
            }
        }
        OwnManifest::Spec { digest } => {
            let new_spec = *digest != *o.digest;
            let mut running = o.running;
            if new_spec && running {
                out.push(Stop(Some("manifest changed")));
                running = false;
            }
            // A scheduled session's finished run waits for its next tick,
            // which runs the new spec (as a CronJob's edit starts no Job).
            if o.state.is_terminal() && o.scheduled {
                return out;
            }
            // A finished session takes no capacity; run again (a new spec)
            // on a node that is full since, it would overcommit it. Release
            // it to placement instead.
            if o.state.is_terminal() && new_spec && o.full {
                out.push(SetState(ClaimState::Released));
                return out;
            }
            // A back-off still running holds the restart (a new spec does
            // not wait).
            if !running && !new_spec && o.backoff_pending {
                out.push(Wait);
                return out;
            }
            let finished_same = o.state.is_terminal() && !new_spec;
            if !running && !finished_same {
                if new_spec || o.state != ClaimState::Running {
                    out.push(AdoptDigest);
                    out.push(SetState(ClaimState::Running));
                }
                out.push(Start);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ClaimState::*;
    use OwnedAction::*;

    fn owned<'a>(claim: OwnClaim, manifest: OwnManifest<'a>) -> Owned<'a> {
        Owned {
            claim,
            manifest,
            state: Running,
            digest: "d1",
            running: true,
            backoff_pending: false,
            finish_pending: false,
            full: false,
            scheduled: false,
        }
    }

    #[rustfmt::skip]
    #[test]
    fn reconcile_owned_rules() {
        let (d1, d2) = (crate::fleet::plan::Digest::from("d1"), crate::fleet::plan::Digest::from("d2"));
        let spec1 = OwnManifest::Spec { digest: &d1 };
        let spec2 = OwnManifest::Spec { digest: &d2 };
        let base = owned(OwnClaim::Ours, spec1);
        let rows: Vec<(&str, Owned, Vec<OwnedAction>)> = vec![
            ("steady", base, vec![]),
            ("read-back failed: carry on", Owned { claim: OwnClaim::Unreadable, ..base }, vec![]),
            ("another writer", Owned { claim: OwnClaim::Changed, ..base }, vec![Lose("claim changed by another writer")]),
            ("deleted claim", Owned { claim: OwnClaim::Deleted, ..base }, vec![Lose("claim deleted from the bucket"), MarkVanished]),
            ("marked vanished below our epoch", Owned { claim: OwnClaim::Vanished { below_ours: true }, ..base }, vec![Lose("claim deleted from the bucket"), RaiseMarker]),
            ("marked vanished at our epoch", Owned { claim: OwnClaim::Vanished { below_ours: false }, ..base }, vec![Lose("claim deleted from the bucket")]),
            ("corrupt claim", Owned { claim: OwnClaim::Corrupt, ..base }, vec![Lose("claim overwritten with bytes that are not a claim")]),
            ("manifest deleted", Owned { manifest: OwnManifest::Deleted, ..base }, vec![Stop(Some("manifest deleted")), SetState(Released)]),
            ("manifest deleted, finished", Owned { manifest: OwnManifest::Deleted, running: false, state: Succeeded, ..base }, vec![SetState(Released)]),
            ("paused", Owned { manifest: OwnManifest::Paused, ..base }, vec![Stop(None), SetState(Paused)]),
            ("paused already", Owned { manifest: OwnManifest::Paused, running: false, state: Paused, ..base }, vec![]),
            ("resumed", Owned { running: false, state: Paused, ..base }, vec![AdoptDigest, SetState(Running), Start]),
            ("new spec", Owned { manifest: spec2, ..base }, vec![Stop(Some("manifest changed")), AdoptDigest, SetState(Running), Start]),
            ("restart due", Owned { running: false, ..base }, vec![Start]),
            ("back-off pending", Owned { running: false, backoff_pending: true, ..base }, vec![Wait]),
            ("a new spec does not wait out a back-off", Owned { manifest: spec2, running: false, backoff_pending: true, ..base }, vec![AdoptDigest, SetState(Running), Start]),
            ("finished, same spec: stays finished", Owned { running: false, state: Failed, ..base }, vec![]),
            ("finished, new spec: runs again", Owned { manifest: spec2, running: false, state: Succeeded, ..base }, vec![AdoptDigest, SetState(Running), Start]),
            ("finished, new spec, node full: released", Owned { manifest: spec2, running: false, state: Succeeded, full: true, ..base }, vec![SetState(Released)]),
            ("scheduled, finished, new spec: waits for its tick", Owned { manifest: spec2, running: false, state: Succeeded, scheduled: true, ..base }, vec![]),
            ("scheduled, finished, same spec: waits", Owned { running: false, state: Failed, scheduled: true, ..base }, vec![]),
            ("scheduled, running, new spec: runs it now", Owned { manifest: spec2, scheduled: true, ..base }, vec![Stop(Some("manifest changed")), AdoptDigest, SetState(Running), Start]),
            ("running and full is no reason to release", Owned { manifest: spec2, full: true, ..base }, vec![Stop(Some("manifest changed")), AdoptDigest, SetState(Running), Start]),
            // The end of a finished run not written yet: written, and the
            // session neither started again nor released meanwhile.
            ("finished, end unwritten: write it, start nothing", Owned { running: false, finish_pending: true, ..base }, vec![Finish]),
            ("... even on a full node", Owned { running: false, finish_pending: true, full: true, ..base }, vec![Finish]),
            ("... a new spec is a new run", Owned { manifest: spec2, running: false, finish_pending: true, ..base }, vec![AdoptDigest, SetState(Running), Start]),
            ("... a deleted manifest releases it", Owned { manifest: OwnManifest::Deleted, running: false, finish_pending: true, ..base }, vec![SetState(Released)]),
            ("... a pause waits for it", Owned { manifest: OwnManifest::Paused, running: false, finish_pending: true, ..base }, vec![Finish]),
            ("a finished session is not paused", Owned { manifest: OwnManifest::Paused, running: false, state: Succeeded, ..base }, vec![]),
        ];
        for (what, o, want) in rows {
            assert_eq!(reconcile_owned(&o), want, "{what}");
        }
    }

    /// The node skips owned sessions for which the rules ask nothing
    /// (`Node::owned_due`, a scan made once per pass with one `full`), then
    /// looks closely at the rest as load changes. That is only sound if
    /// whether anything is asked never depends on `full`: checked here over
    /// every combination of facts.
    #[test]
    fn whether_reconcile_asks_anything_does_not_depend_on_full() {
        let claims = [
            OwnClaim::Ours,
            OwnClaim::Unreadable,
            OwnClaim::Changed,
            OwnClaim::Vanished { below_ours: true },
            OwnClaim::Vanished { below_ours: false },
            OwnClaim::Deleted,
            OwnClaim::Corrupt,
        ];
        let (d1, d2) = (
            crate::fleet::plan::Digest::from("d1"),
            crate::fleet::plan::Digest::from("d2"),
        );
        let manifests = [
            OwnManifest::Deleted,
            OwnManifest::Paused,
            OwnManifest::Spec { digest: &d1 },
            OwnManifest::Spec { digest: &d2 },
        ];
        let mut checked = 0;
        for claim in claims {
            for manifest in manifests {
                for state in [Running, Paused, Succeeded, Failed, Released] {
                    for (running, backoff_pending, finish_pending) in [
                        (false, false, false),
                        (false, true, false),
                        (true, false, false),
                        (true, true, false),
                        (false, false, true),
                        (true, false, true),
                    ] {
                        let facts = |full| Owned {
                            claim,
                            manifest,
                            state,
                            digest: "d1",
                            running,
                            backoff_pending,
                            finish_pending,
                            full,
                            scheduled: false,
                        };
                        let (a, b) = (
                            reconcile_owned(&facts(false)),
                            reconcile_owned(&facts(true)),
                        );
                        assert_eq!(
                            a.is_empty(),
                            b.is_empty(),
                            "{:?}: {a:?} / {b:?}",
                            facts(false)
                        );
                        // Nothing asked now stays nothing asked as time
                        // passes (a back-off ending is the only fact that
                        // time changes), so `owned_due` may keep an idle
                        // answer until a map changes: a pending back-off
                        // that holds a restart is itself asked (`Wait`).
                        if backoff_pending && a.is_empty() {
                            let later = Owned {
                                backoff_pending: false,
                                ..facts(false)
                            };
                            assert!(
                                reconcile_owned(&later).is_empty(),
                                "{later:?} asks something once the back-off ends"
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 7 * 4 * 5 * 6);
    }
}
