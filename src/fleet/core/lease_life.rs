//! The node lease: registration (serve, wait, fail), renewal (period, the plain retry, the audit sample) and the sessions' deadline.

use super::*;

/// What one attempt to register (acquire `nodes/<id>`) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    Acquired,
    /// Another instance holds the node id (an earlier one not yet expired,
    /// or a second process misconfigured with the same id elsewhere).
    Held,
    /// No record where one was expected (a standalone-lease answer; node
    /// leases are created where none is, but the rule stays total).
    Absent,
    /// The store could not be reached, or answered 5xx.
    Transient,
    /// Lost the final conditional write to another registrant.
    Conflict,
    /// Anything else: refused credentials, a corrupt record, a store that
    /// broke its conditions.
    Failed,
}

/// What the node does after an attempt to register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRegister {
    /// Serve with the lease.
    Serve,
    /// Try again after one poll. Never a takeover: a held id is waited out
    /// by observation (two hosts with one id never steal from each other),
    /// and a lost race is the winner's.
    Wait,
    /// Give up: the error is the node's.
    Fail,
}

pub fn after_register(r: Registration) -> AfterRegister {
    match r {
        Registration::Acquired => AfterRegister::Serve,
        Registration::Held
        | Registration::Absent
        | Registration::Transient
        | Registration::Conflict => AfterRegister::Wait,
        Registration::Failed => AfterRegister::Fail,
    }
}

/// A node renews its lease every ttl/3 (DESIGN's default): two renewals may
/// fail in a row before the validity (`ttl − margin` from the last send) is
/// in danger.
pub fn renew_period(ttl: Duration) -> Duration {
    ttl / 3
}

/// What a renewal's write answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    Committed,
    /// Unreachable or 5xx, after the write's own retries.
    Transient,
    /// Rejected (another writer won), deleted, or anything else final.
    Lost,
}

/// What follows a renewal's write. `with_attrs`: the write carried the
/// node's attributes (its load, cordon), which is how every renewal starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRenew {
    /// Renewed: announce the new deadline; `audit`: read this one back.
    Renewed { audit: bool },
    /// The attributes write did not get through: renew plainly at once (a
    /// renewal is worth more than fresh attributes; the plain renew retries
    /// with back-off up to the validity deadline itself).
    RenewPlainly,
    /// The lease is lost: stop every session, re-register.
    Lost,
}

/// One in `audit_sample` renewals is read back (`renewals` counts the
/// successful ones, this one included).
pub fn after_renew(
    outcome: RenewOutcome,
    with_attrs: bool,
    renewals: u64,
    audit_sample: u64,
) -> AfterRenew {
    match outcome {
        RenewOutcome::Committed => AfterRenew::Renewed {
            audit: audit_sample > 0 && renewals.is_multiple_of(audit_sample),
        },
        RenewOutcome::Transient if with_attrs => AfterRenew::RenewPlainly,
        RenewOutcome::Transient | RenewOutcome::Lost => AfterRenew::Lost,
    }
}

/// The deadline every session of this node runs under (announced to the
/// dead-man switches, and the loop's own stop): the node lease's validity,
/// never past the confirmation of its claims (`claim_belief` after the
/// oldest confirming request), and nothing at all once the lease is lost.
/// `None`: no deadline, stop now. Generic over the time type so that the
/// core names no clock.
pub fn session_deadline<T: Ord + Copy>(lease: Option<T>, claims: Option<T>) -> Option<T> {
    match (lease, claims) {
        (None, _) => None,
        (Some(l), None) => Some(l),
        (Some(l), Some(c)) => Some(l.min(c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn registration_waits_out_a_holder_and_fails_only_on_final_errors() {
        use AfterRegister::*;
        use Registration as R;
        for (r, want) in [
            (R::Acquired, Serve),
            // Never a takeover from here: a live holder of our id (another
            // host misconfigured, or our predecessor without the host lock)
            // is waited out by observation inside acquire.
            (R::Held, Wait),
            (R::Absent, Wait),
            (R::Transient, Wait),
            (R::Conflict, Wait),
            (R::Failed, Fail),
        ] {
            assert_eq!(after_register(r), want, "{r:?}");
        }
    }

    #[rustfmt::skip]
    #[test]
    fn renewal_retries_plainly_once_then_is_lost_and_audits_a_sample() {
        use AfterRenew::*;
        use RenewOutcome as O;
        let rows: &[(O, bool, u64, AfterRenew)] = &[
            (O::Committed, true, 1, Renewed { audit: false }),
            (O::Committed, false, 15, Renewed { audit: false }),
            (O::Committed, true, 16, Renewed { audit: true }),
            (O::Committed, false, 32, Renewed { audit: true }),
            // Fresh attributes are worth less than the lease: drop them.
            (O::Transient, true, 3, RenewPlainly),
            // The plain renew has retried up to the deadline already.
            (O::Transient, false, 3, Lost),
            (O::Lost, true, 3, Lost),
            (O::Lost, false, 3, Lost),
        ];
        for (i, &(o, attrs, n, want)) in rows.iter().enumerate() {
            assert_eq!(after_renew(o, attrs, n, 16), want, "row {i}");
        }
        assert_eq!(after_renew(O::Committed, true, 16, 0), Renewed { audit: false });
        assert_eq!(renew_period(S * 9), S * 3);
    }

    #[test]
    fn sessions_never_outlive_the_lease_or_the_claims_confirmation() {
        assert_eq!(session_deadline::<u32>(None, None), None);
        assert_eq!(
            session_deadline(None, Some(5)),
            None,
            "a lost lease ends all"
        );
        assert_eq!(
            session_deadline(Some(9), None),
            Some(9),
            "no claims: the lease's"
        );
        assert_eq!(session_deadline(Some(9), Some(5)), Some(5));
        assert_eq!(session_deadline(Some(5), Some(9)), Some(5));
    }
}
