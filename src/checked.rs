//! The one decision of a conditional write with read-back, shared by the
//! lease protocol (`LeaseClient::write`) and the fleet (`fleet::put_checked`).
//!
//! A conditional PUT that fails does not say whether it landed: a timeout
//! may hide a write the store applied, and a rejection may be answered to a
//! retry of a write that landed the first time. So every failure is followed
//! by a read, and the decision is made on what the read shows, by the rules
//! below. Each caller does its own I/O (the lease decodes a lease record and
//! notes when it arrived; the fleet reads a JSON nonce), classifies the
//! read-back with [`read_back`], and asks [`outcome`]. No clock, no store:
//! the table test below is the whole of it.
//!
//! # Rules
//!
//! | the PUT said | the read-back shows | outcome |
//! |---|---|---|
//! | anything | our nonce | committed (a landing we were not told of) |
//! | 412, or 409 on a create | anything else | rejected: another writer won |
//! | 409 on an If-Match | the very version we matched | not landed: nothing was written (AWS S3 answers concurrent conditional writes so) |
//! | 409 on an If-Match | another version, or nothing | rejected |
//! | transport failure (ambiguous) | another writer's version | rejected |
//! | transport failure (ambiguous) | the version we matched, or nothing | not landed: safe to retry, a late landing is recognised by its nonce |
//!
//! A 412 with the matched version still there stays a rejection, not "not
//! landed": that is a store refusing our ETag form (RGW's dialect), which
//! must not look transient (see docs/stores.md).

use crate::store::{StoreError, Version};

/// How a conditional PUT failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The store refused the condition. `conflict`: it said so with 409
    /// (AlreadyExists) rather than 412.
    Rejected { conflict: bool },
    /// Transport failure or timeout: the write may or may not have landed.
    Ambiguous,
}

impl Failure {
    /// Sorts a store error into a failure to read back after, or gives it
    /// back when it is neither (a bad key, permissions, corruption): those
    /// are errors of their own.
    pub fn of(e: StoreError) -> Result<Failure, StoreError> {
        match e {
            StoreError::AlreadyExists => Ok(Failure::Rejected { conflict: true }),
            e if e.is_rejection() => Ok(Failure::Rejected { conflict: false }),
            StoreError::Ambiguous { .. } => Ok(Failure::Ambiguous),
            e => Err(e),
        }
    }
}

/// What the read after the failure showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBack {
    /// Our write (its nonce; for a lease, one of this operation's attempts).
    Ours,
    /// The version the write was conditional on, unchanged.
    Unchanged,
    /// Some other version.
    Other,
    /// Nothing at the key.
    Absent,
}

/// Classifies a read-back: `ours` when it carries our nonce; `current` the
/// version read (None: absent); `matched` the version an If-Match named
/// (None for a create).
pub fn read_back(ours: bool, current: Option<&Version>, matched: Option<&Version>) -> ReadBack {
    match current {
        _ if ours => ReadBack::Ours,
        None => ReadBack::Absent,
        Some(v) if matched == Some(v) => ReadBack::Unchanged,
        Some(_) => ReadBack::Other,
    }
}

/// The decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Ours is in place.
    Committed,
    /// Another writer's record is in place (or none is, after a rejection).
    Rejected,
    /// Nothing of ours landed (yet); retrying is safe.
    NotLanded,
}

/// The three-outcome rule (see the module's table).
pub fn outcome(failure: Failure, read: ReadBack) -> Outcome {
    match (failure, read) {
        (_, ReadBack::Ours) => Outcome::Committed,
        (Failure::Rejected { conflict: true }, ReadBack::Unchanged) => Outcome::NotLanded,
        (Failure::Rejected { .. }, _) => Outcome::Rejected,
        (Failure::Ambiguous, ReadBack::Other) => Outcome::Rejected,
        (Failure::Ambiguous, ReadBack::Unchanged | ReadBack::Absent) => Outcome::NotLanded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[rustfmt::skip]
    fn the_table() {
        use Failure::*;
        use Outcome::*;
        use ReadBack::*;
        let (r412, r409) = (Failure::Rejected { conflict: false }, Failure::Rejected { conflict: true });
        let rows = [
            (r412, Ours, Committed), (r409, Ours, Committed), (Ambiguous, Ours, Committed),
            (r412, Unchanged, Outcome::Rejected),
            (r412, Other, Outcome::Rejected),
            (r412, Absent, Outcome::Rejected),
            (r409, Unchanged, NotLanded),
            (r409, Other, Outcome::Rejected),
            (r409, Absent, Outcome::Rejected),
            (Ambiguous, Other, Outcome::Rejected),
            (Ambiguous, Unchanged, NotLanded),
            (Ambiguous, Absent, NotLanded),
        ];
        for (f, r, want) in rows {
            assert_eq!(outcome(f, r), want, "{f:?} then {r:?}");
        }
    }

    #[test]
    fn read_backs_and_failures_are_sorted() {
        let v = |e: &str| Version {
            etag: Some(e.into()),
            version: None,
        };
        assert_eq!(read_back(true, None, None), ReadBack::Ours);
        assert_eq!(read_back(false, None, Some(&v("a"))), ReadBack::Absent);
        assert_eq!(
            read_back(false, Some(&v("a")), Some(&v("a"))),
            ReadBack::Unchanged
        );
        assert_eq!(
            read_back(false, Some(&v("b")), Some(&v("a"))),
            ReadBack::Other
        );
        assert_eq!(read_back(false, Some(&v("a")), None), ReadBack::Other);
        assert!(matches!(
            Failure::of(StoreError::AlreadyExists),
            Ok(Failure::Rejected { conflict: true })
        ));
        assert!(matches!(
            Failure::of(StoreError::Precondition),
            Ok(Failure::Rejected { conflict: false })
        ));
        assert!(matches!(
            Failure::of(StoreError::Ambiguous {
                message: "timeout".into()
            }),
            Ok(Failure::Ambiguous)
        ));
        assert!(
            Failure::of(StoreError::Unavailable {
                message: "x".into()
            })
            .is_err()
        );
    }
}
