//! Each step of the fence before a takeover.

use super::*;

/// What this node has of a claim's owner's node record, before a takeover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerRecord {
    /// Not in the node's view (neither listed nor read).
    Unknown,
    /// In the view: its judgement for the claim's instance, and whether the
    /// cached bytes are of the version the listing showed.
    Known { judged: Liveness, at_listed: bool },
}

/// The first step of the fence before a takeover (the gate said `Claim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Nothing to fence: take over.
    Go,
    /// Read the owner's record (not in the view), then ask
    /// `after_owner_read`.
    ReadOwner,
    /// Read the owner's record again (the cache is not of the watched
    /// version), then ask `after_fresh_read`.
    ReadAtListed,
    /// Write the tombstone over the watched version, from the cached record.
    Tombstone,
}

/// The fence: a released claim, or one of our own node (a predecessor of
/// this instance, which the host lock proves gone), needs none; an owner
/// superseded, or released or fenced at the watched version, is final
/// already; else the owner's lease is released in its name (If-Match on
/// the version watched unchanged) before its sessions are taken.
pub fn fence(claim_released: bool, owner_is_me: bool, owner: OwnerRecord) -> Fence {
    if claim_released || owner_is_me {
        return Fence::Go;
    }
    match owner {
        OwnerRecord::Unknown => Fence::ReadOwner,
        OwnerRecord::Known { judged, at_listed } => {
            if judged == Liveness::Superseded || (judged.is_final() && at_listed) {
                Fence::Go
            } else if at_listed {
                Fence::Tombstone
            } else {
                Fence::ReadAtListed
            }
        }
    }
}

/// What a read of an owner that was not in the view allows. Present (just
/// written or just listed): not watched for a ttl, so not yet. Unreadable:
/// never. Absent: only once observed absent long enough.
pub fn after_owner_read(present: bool, corrupt: bool, absent_long_enough: bool) -> bool {
    !present && !corrupt && absent_long_enough
}

/// What the fresh read of the owner's record shows, against the version
/// the listing showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreshRead {
    /// Vanished since the listing: an absence to observe (the owner may
    /// have renewed just before), not a death. Not yet.
    Absent,
    /// Another version: renewed after all. Not yet (refresh the view).
    Changed,
    /// Released, fenced or superseded at that version: go.
    Final,
    /// Still the watched version, still held: write the tombstone over it.
    Tombstone,
}

/// A fresh read of the owner's record, against the version the listing
/// showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerRead {
    Missing,
    /// Another version than the listed one.
    Other,
    /// The listed version, judged for the claim's instance.
    AtListed(Liveness),
}

/// Classifies the fresh read.
pub fn after_fresh_read(read: OwnerRead) -> FreshRead {
    match read {
        OwnerRead::Missing => FreshRead::Absent,
        OwnerRead::Other => FreshRead::Changed,
        OwnerRead::AtListed(judged) if judged.is_final() => FreshRead::Final,
        OwnerRead::AtListed(_) => FreshRead::Tombstone,
    }
}

/// A tombstone rejected: the owner renewed (no takeover), or another node
/// fenced it a moment ago, which is final all the same. Judged on the record
/// read after the rejection.
pub fn after_tombstone_rejected(judged: Option<Liveness>) -> bool {
    matches!(judged, Some(Liveness::Released | Liveness::Fenced))
}

/// A peer's node record as this node listed it, for [`fence_peer`].
#[derive(Debug, Clone, Copy)]
pub struct PeerRecord<'a> {
    pub id: &'a str,
    pub instance: &'a str,
    /// Listed under its own key (`nodes/<id>`): a record copied under
    /// another key must not get its namesake fenced.
    pub under_own_key: bool,
    /// Final (released): nothing left to fence.
    pub released: bool,
    /// Claims this instance holds, counted from the claims listed.
    pub claims: u32,
}

/// Whether this node fences a peer at this pass without waiting for a
/// session of it to come up for claiming (`fence_dead_peers`): under its
/// own key, not final, not us, holding claims, with a view of this very
/// instance and no view of its id live (as `plan::owner_live` asks before a
/// takeover). The fence itself then reads the record again at the listed
/// version and judges that version's own ttl ([`dead_at_listed`]).
pub fn fence_peer(me: &str, r: &PeerRecord, views: &[NodeView]) -> bool {
    r.under_own_key
        && !r.released
        && r.id != me
        && r.claims > 0
        && views
            .iter()
            .any(|v| v.id == r.id && v.instance == r.instance)
        && !views.iter().any(|v| v.id == r.id && v.live)
}

/// After reading the owner's record again at the listed version: may it be
/// fenced? Yes when its judgement is final (released, fenced, superseded),
/// or when the version listed has stood still for its own ttl and margin.
/// The judgement that sent us here used the ttl of the copy we held; the
/// version listed may stand for a longer one (a new instance started with
/// another `--ttl`).
pub fn dead_at_listed(judged_final: bool, still: Option<Duration>, ttl: Duration) -> bool {
    judged_final
        || still
            .is_some_and(|d| crate::liveness::stood_still_long_enough(d, ttl, default_margin(ttl)))
}

/// Which peers to nudge after this node fenced `dead` ones: for each
/// session the dead held (`orphaned`, in the order of the claims' keys),
/// the two nodes placement ranks first among the living (views of load
/// differ a little between nodes), never this node, at most `max` in all.
/// Nudged, they run a pass at once and claim by the usual rules.
pub fn takers_to_nudge<'a>(
    me: &str,
    dead: &[String],
    orphaned: impl IntoIterator<Item = &'a ManifestView>,
    views: &[NodeView],
    max: usize,
) -> std::collections::BTreeSet<String> {
    let mut takers = std::collections::BTreeSet::new();
    for m in orphaned {
        if takers.len() >= max {
            break;
        }
        for v in crate::fleet::plan::rank(m, views)
            .into_iter()
            .filter(|v| !dead.contains(&v.id))
            .take(2)
        {
            if v.id != me {
                takers.insert(v.id.clone());
            }
        }
    }
    takers.into_iter().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_of_the_fence() {
        use Liveness::*;
        let known = |judged, at_listed| OwnerRecord::Known { judged, at_listed };
        // (claim released, owner is me, owner record, step)
        let table = [
            (true, false, OwnerRecord::Unknown, Fence::Go),
            (false, true, known(Live, false), Fence::Go),
            (false, false, OwnerRecord::Unknown, Fence::ReadOwner),
            (false, false, known(Superseded, false), Fence::Go),
            (false, false, known(Released, true), Fence::Go),
            (false, false, known(Fenced, true), Fence::Go),
            // Final in a cache of another version: read it again first.
            (false, false, known(Released, false), Fence::ReadAtListed),
            (false, false, known(Live, true), Fence::Tombstone),
            (false, false, known(Expired, true), Fence::Tombstone),
            (false, false, known(Expired, false), Fence::ReadAtListed),
        ];
        for (released, me, owner, step) in table {
            assert_eq!(
                fence(released, me, owner),
                step,
                "{released} {me} {owner:?}"
            );
        }
        // A read of an owner not in the view.
        assert!(!after_owner_read(true, false, true));
        assert!(!after_owner_read(false, true, true));
        assert!(!after_owner_read(false, false, false));
        assert!(after_owner_read(false, false, true));
        // The fresh read at the watched version.
        let table = [
            (OwnerRead::Missing, FreshRead::Absent),
            (OwnerRead::Other, FreshRead::Changed),
            (OwnerRead::AtListed(Released), FreshRead::Final),
            (OwnerRead::AtListed(Fenced), FreshRead::Final),
            (OwnerRead::AtListed(Superseded), FreshRead::Final),
            (OwnerRead::AtListed(Live), FreshRead::Tombstone),
            (OwnerRead::AtListed(Expired), FreshRead::Tombstone),
        ];
        for (read, step) in table {
            assert_eq!(after_fresh_read(read), step, "{read:?}");
        }
        // A rejected tombstone: another node's fence is as good as ours;
        // a renewal, or nothing readable, is not.
        for (judged, go) in [
            (Some(Released), true),
            (Some(Fenced), true),
            (Some(Live), false),
            (Some(Expired), false),
            (Some(Superseded), false),
            (None, false),
        ] {
            assert_eq!(after_tombstone_rejected(judged), go, "{judged:?}");
        }
    }

    fn view(id: &str, instance: &str, live: bool) -> NodeView {
        NodeView {
            id: id.into(),
            instance: instance.into(),
            capacity: 10,
            load: 0,
            labels: Default::default(),
            live,
            unproven: false,
        }
    }

    #[test]
    fn which_peers_are_fenced_without_waiting_for_their_sessions() {
        let rec = |id, instance, own, released, claims| PeerRecord {
            id,
            instance,
            under_own_key: own,
            released,
            claims,
        };
        let dead = [view("b", "i1", false)];
        let b = rec("b", "i1", true, false, 3);
        assert!(fence_peer("a", &b, &dead));
        // Each clause, one at a time.
        assert!(
            !fence_peer("a", &rec("b", "i1", false, false, 3), &dead),
            "copied under another key"
        );
        assert!(
            !fence_peer("a", &rec("b", "i1", true, true, 3), &dead),
            "final"
        );
        assert!(!fence_peer("b", &b, &dead), "ourselves");
        assert!(
            !fence_peer("a", &rec("b", "i1", true, false, 0), &dead),
            "holds nothing"
        );
        assert!(
            !fence_peer("a", &b, &[view("b", "i0", false)]),
            "no view of this instance"
        );
        assert!(
            !fence_peer("a", &b, &[view("b", "i1", false), view("b", "i2", true)]),
            "its id is live under a newer instance"
        );
        assert!(!fence_peer("a", &b, &[view("b", "i1", true)]), "live");
    }

    #[test]
    fn a_record_read_at_the_listed_version_is_dead_if_final_or_still_for_its_own_ttl() {
        let ttl = Duration::from_secs(10);
        let enough = ttl + default_margin(ttl);
        assert!(dead_at_listed(true, None, ttl));
        assert!(dead_at_listed(false, Some(enough), ttl));
        assert!(!dead_at_listed(
            false,
            Some(enough - Duration::from_millis(1)),
            ttl
        ));
        assert!(
            !dead_at_listed(false, None, ttl),
            "never watched: not still"
        );
        // A longer ttl in the record than the copy we held: its own counts.
        assert!(!dead_at_listed(false, Some(enough), ttl * 3));
    }

    #[test]
    fn the_takers_of_a_fenced_peers_sessions_are_the_first_two_living_ranked() {
        let views = vec![
            view("a", "1", true),
            view("b", "1", false),
            view("c", "1", true),
            view("d", "1", true),
        ];
        let m = |name: &str| ManifestView {
            name: name.into(),
            digest: crate::fleet::plan::Digest::from("d"),
            selector: Default::default(),
            preferred: vec![],
            paused: false,
            scheduled: false,
        };
        let dead = vec!["b".to_string()];
        let sessions: Vec<ManifestView> = (0..20).map(|i| m(&format!("s{i}"))).collect();
        let all = takers_to_nudge("a", &dead, &sessions, &views, 8);
        // Never the dead, never this node; over 20 sessions both others.
        assert_eq!(all, ["c".to_string(), "d".to_string()].into());
        // One session: its first two living ranked, less this node.
        let one = takers_to_nudge("a", &dead, &sessions[..1], &views, 8);
        let ranked: Vec<&str> = crate::fleet::plan::rank(&sessions[0], &views)
            .into_iter()
            .map(|v| v.id.as_str())
            .take(2)
            .filter(|id| *id != "a")
            .collect();
        assert_eq!(
            one.iter().map(String::as_str).collect::<Vec<_>>().len(),
            ranked.len()
        );
        assert!(ranked.iter().all(|id| one.contains(*id)));
        // At most `max`.
        assert_eq!(takers_to_nudge("a", &dead, &sessions, &views, 1).len(), 1);
        assert!(takers_to_nudge("a", &dead, &sessions, &views, 0).is_empty());
    }
}
