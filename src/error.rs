//! Errors.
//!
//! Callers match on [`ErrorKind`], a compact classification in the manner of
//! SlateDB (`Conflict`, `Fenced`, `Unavailable`, `Invalid`, `Data`, ...). The
//! [`Error`] enum carries the detail an operator needs to act: which key, which
//! epoch, which probe step. Messages never include credentials: store errors are
//! rendered through [`crate::store::StoreError`], which keeps only the operation,
//! the key and the backend's own message.

/// What a store operation can answer besides success.
///
/// Messages carry the backend's text but never credentials: object_store's
/// errors name the request, not the signing secrets, and our own stores have
/// none.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A create found an object already there.
    #[error("object already exists")]
    AlreadyExists,
    /// An If-Match write found another version (or no object).
    #[error("precondition failed: the object changed")]
    Precondition,
    /// No object at the key (reads and deletes).
    #[error("not found")]
    NotFound,
    /// A write whose outcome is unknown: it may have landed.
    #[error("outcome unknown, the write may have landed: {message}")]
    Ambiguous { message: String },
    /// A transport failure on a read (or a write known not to have landed).
    #[error("unavailable: {message}")]
    Unavailable { message: String },
    /// Authentication or authorisation refused.
    #[error("permission denied: {message}")]
    Denied { message: String },
    /// The key or request is invalid for this store.
    #[error("invalid request: {reason}")]
    Invalid { reason: String },
    /// Bytes on disk that are not a complete object of ours.
    #[error("corrupt: {reason}")]
    Corrupt { reason: String },
    /// The backend cannot do what was asked (e.g. conditional put disabled).
    #[error("not supported: {message}")]
    NotSupported { message: String },
}

impl StoreError {
    pub fn is_rejection(&self) -> bool {
        matches!(self, StoreError::AlreadyExists | StoreError::Precondition)
    }
}

/// What kind of failure happened, for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Another writer won a conditional write. Not retryable blindly: re-read
    /// and decide again.
    Conflict,
    /// We held a lease and no longer do (renew rejected or validity deadline
    /// passed). Stop acting on it.
    Fenced,
    /// The bucket could not be reached or answered with a transient error.
    Unavailable,
    /// Bad input from the caller: a name, a flag, a size.
    Invalid,
    /// An object in the bucket is corrupt, foreign or breaks an invariant.
    Data,
    /// The store does not honour conditional writes; nothing here is safe on it.
    Unsupported,
    /// The object asked for does not exist.
    NotFound,
    /// Credentials or a bearer token were refused (the store's 401/403, a
    /// node API's 401/403). Not transient: fix the credentials.
    Permission,
    /// A bug or an environment failure that fits no other kind.
    Internal,
}

/// Every failure leasehold reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lease, node or session name failed validation before reaching a key.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },

    /// Some caller-supplied value is out of range or malformed.
    #[error("invalid {what}: {reason}")]
    Invalid { what: String, reason: String },

    /// An object we were about to write (or were handed) exceeds its bound.
    #[error("{what} is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        what: String,
        size: usize,
        limit: usize,
    },

    /// Lost the final compare-and-swap: someone else changed the object between
    /// our read and our write. The bucket holds their write, not ours.
    #[error("conflict on {key}: another writer changed it first")]
    Conflict { key: String },

    /// A manifest exists with another spec, and the caller did not ask to
    /// replace it.
    #[error("{key} exists with a different spec or labels; use `apply --replace` to change it")]
    SpecDiffers { key: String },

    /// The lease is no longer ours: another writer won, or our validity
    /// deadline passed before a renew succeeded.
    #[error("lease {key} lost at epoch {epoch}: {reason}")]
    Lost {
        key: String,
        epoch: u64,
        reason: String,
    },

    /// An object exists but cannot be trusted: malformed, truncated, an
    /// unknown schema, or fields that break an invariant. Never treated as
    /// absent and never overwritten.
    #[error("corrupt object {key}: {reason}")]
    Corrupt { key: String, reason: String },

    /// The store failed the conditional-write probe (`step` names the probe
    /// step), or the continuous audit caught it (`step` is "audit").
    #[error("store {store} refused at step \"{step}\": {detail}")]
    Unsupported {
        store: String,
        step: String,
        detail: String,
    },

    /// No object at that key.
    #[error("{key} not found")]
    NotFound { key: String },

    /// The store holds no fleet: its marker (`fleet`) is missing.
    #[error(
        "no fleet at {store}: its marker `fleet` is missing. For a new fleet, run `leasehold init` once; \
         if this bucket held a fleet, it was wiped or replaced: run `leasehold init --generation <its last generation + 1>`"
    )]
    NoFleet { store: String },

    /// The bucket could not be reached or failed transiently.
    #[error("store unavailable during {op} {key}")]
    Unavailable {
        op: &'static str,
        key: String,
        #[source]
        source: StoreError,
    },

    /// The store rejected the request in a way that is not transient
    /// (permissions, an invalid path).
    #[error("store error during {op} {key}")]
    Store {
        op: &'static str,
        key: String,
        #[source]
        source: StoreError,
    },

    /// Refused for want of permission: the store's credentials, or a node
    /// API's bearer token.
    #[error("permission denied: {what}: {reason}")]
    Denied { what: String, reason: String },

    /// Something that should not happen.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The compact classification of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidName { .. } | Error::Invalid { .. } | Error::TooLarge { .. } => {
                ErrorKind::Invalid
            }
            Error::Conflict { .. } | Error::SpecDiffers { .. } => ErrorKind::Conflict,
            Error::Lost { .. } => ErrorKind::Fenced,
            Error::Corrupt { .. } => ErrorKind::Data,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::NotFound { .. } | Error::NoFleet { .. } => ErrorKind::NotFound,
            Error::Unavailable { .. } => ErrorKind::Unavailable,
            Error::Denied { .. } => ErrorKind::Permission,
            Error::Store { source, .. } => match source {
                StoreError::Corrupt { .. } => ErrorKind::Data,
                StoreError::Invalid { .. } => ErrorKind::Invalid,
                StoreError::Denied { .. } => ErrorKind::Permission,
                StoreError::NotSupported { .. } => ErrorKind::Unsupported,
                _ => ErrorKind::Internal,
            },
            Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// True for failures that may succeed if tried again later.
    pub fn is_transient(&self) -> bool {
        self.kind() == ErrorKind::Unavailable
    }

    /// Bad input: `what` was refused for `reason` (exit 2 in the CLI).
    pub fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Invalid {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// The object at `key` cannot be decoded as what it should be.
    pub fn corrupt(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// Wraps a store error from operation `op` on `key`, keeping corruption
    /// and transience distinguishable.
    pub fn from_store(op: &'static str, key: &str, source: StoreError) -> Self {
        match source {
            StoreError::Corrupt { reason } => Error::Corrupt {
                key: key.to_string(),
                reason,
            },
            StoreError::Unavailable { .. } | StoreError::Ambiguous { .. } => Error::Unavailable {
                op,
                key: key.to_string(),
                source,
            },
            StoreError::NotFound => Error::NotFound {
                key: key.to_string(),
            },
            other => Error::Store {
                op,
                key: key.to_string(),
                source: other,
            },
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its causes on one line (`a: b: c`), for log lines and JSON:
/// a node's log then says "No space left on device" or "SlowDown" where the
/// CLI says it under `Caused by:` (issue #44: a full disk was logged only
/// as "renew failed ... store unavailable"). Store errors keep no
/// credentials (see [`StoreError`]), so the chain holds none either.
pub struct Chain<'a>(pub &'a dyn std::error::Error);

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cur = self.0.source();
        while let Some(c) = cur {
            write!(f, ": {c}")?;
            cur = c.source();
        }
        Ok(())
    }
}

/// What a store failure most likely comes down to, in an operator's words,
/// when its chain says so: a full disk, a refused permission, throttling,
/// a host name that does not resolve, a refused connection. For log lines
/// beside [`Chain`] (`cause="the store's disk is full"`); `None` when the
/// text names none of these. A hint read from messages, never a decision.
pub fn cause_of(e: &dyn std::error::Error) -> Option<&'static str> {
    let text = Chain(e).to_string();
    let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
    Some(if has(&["No space left on device", "os error 28"]) {
        "the store's disk is full"
    } else if has(&["Disk quota exceeded", "os error 122"]) {
        "the store's disk quota is exceeded"
    } else if has(&["Read-only file system", "os error 30"]) {
        "the store's file system is read-only"
    } else if has(&[
        "Permission denied",
        "os error 13",
        "permission denied",
        "AccessDenied",
        "Forbidden",
    ]) {
        "permission denied: check the credentials and the bucket's policy"
    } else if has(&[
        "SlowDown",
        "TooManyRequests",
        "Too Many Requests",
        "RequestLimitExceeded",
        "ServerBusy",
    ]) {
        "the store is throttling requests"
    } else if has(&[
        "dns error",
        "failed to lookup address",
        "Name or service not known",
    ]) {
        "the store's host name does not resolve (a typo in --endpoint or the bucket name?)"
    } else if has(&["Connection refused", "os error 111"]) {
        "nothing listens at the store's address"
    } else {
        return None;
    })
}

#[cfg(test)]
mod cause_tests {
    use super::*;

    fn unavailable(message: &str) -> Error {
        Error::Unavailable {
            op: "put",
            key: "nodes/n1".into(),
            source: StoreError::Unavailable {
                message: message.into(),
            },
        }
    }

    #[test]
    fn causes_are_named_from_the_chain() {
        let cases = [
            (
                "write: No space left on device (os error 28)",
                Some("the store's disk is full"),
            ),
            (
                "open: Permission denied (os error 13)",
                Some("permission denied: check the credentials and the bucket's policy"),
            ),
            (
                "Generic S3 error: 503 SlowDown",
                Some("the store is throttling requests"),
            ),
            (
                "client error (Connect): dns error: failed to lookup address information",
                Some(
                    "the store's host name does not resolve (a typo in --endpoint or the bucket name?)",
                ),
            ),
            (
                "tcp connect error: Connection refused (os error 111)",
                Some("nothing listens at the store's address"),
            ),
            ("something else", None),
        ];
        for (message, want) in cases {
            let e = unavailable(message);
            assert!(Chain(&e).to_string().ends_with(message), "{}", Chain(&e));
            assert_eq!(cause_of(&e), want, "{message}");
        }
    }
}
