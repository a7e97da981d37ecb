//! The claim channel between a node's pull loop and its callers: the HTTP
//! claim endpoint and the wake path hold a [`NodeHandle`]; the loop holds
//! the [`ClaimInbox`] and answers between passes.

use crate::error::Result;
use crate::fleet::claim::ClaimRecord;
use crate::name::Name;
use crate::store::Version;
use std::sync::Arc;

/// What a node answered when asked to claim a session now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "claim", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ClaimAnswer {
    /// This node now holds the claim at `epoch` and has started the session.
    Claimed {
        node: String,
        epoch: u64,
        /// Bucket requests the claim cost (fresh reads + the write).
        round_trips: u32,
    },
    /// This node already held it.
    AlreadyOwned { node: String, epoch: u64 },
    /// Not claimed, and why: no free capacity, labels do not match, paused,
    /// completed, no manifest, owner still live, or another node won.
    Declined { node: String, reason: String },
}

#[cfg_attr(not(feature = "node"), allow(dead_code))] // the node takes them
pub(crate) struct ClaimRequest {
    pub(crate) name: Name,
    /// A wake of a sleeping session: the claim as the waker read it, and
    /// its version, which the node claims over directly (If-Match) instead
    /// of reading it again (`NodeHandle::wake_now`).
    pub(crate) asleep: Option<(Version, ClaimRecord)>,
    pub(crate) reply: Reply,
}

/// Where a claim request's answer goes. Shared, so that the claim's write
/// can answer as soon as it commits (`EarlyAnswer`), before the audit's
/// read-back and the session's start; whoever answers first takes it.
pub(crate) type Reply =
    Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<Result<ClaimAnswer>>>>>;

/// Answers a claim request, unless it was answered already.
#[cfg_attr(not(feature = "node"), allow(dead_code))]
pub(crate) fn answer(reply: &Reply, a: Result<ClaimAnswer>) {
    if let Some(tx) = reply.lock().unwrap().take() {
        let _ = tx.send(a);
    }
}

/// The sending side: cheap to clone, usable from any task (the HTTP API, an
/// embedding service's wake path via [`crate::wake::Resolver::with_claimer`]).
#[derive(Debug, Clone)]
pub struct NodeHandle {
    pub(crate) node: String,
    pub(crate) tx: tokio::sync::mpsc::Sender<ClaimRequest>,
}

/// The node's side, put in [`NodeDeps::claims`](super::node::NodeDeps::claims). One receiver that outlives
/// re-registrations: each new instance serves it in turn.
#[derive(Clone)]
#[cfg_attr(not(feature = "node"), allow(dead_code))]
pub struct ClaimInbox(
    pub(crate) Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<ClaimRequest>>>,
);

impl std::fmt::Debug for ClaimInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaimInbox")
    }
}

/// A handle to ask node `id` to claim sessions now, and the inbox it serves.
/// Requests queue (at most 64) while the node is between passes; each is
/// answered after fresh reads of the manifest, the claim and the owner's node
/// record, under the same takeover rules as the pull loop, but without the
/// placement grace delay: the caller chose this node.
pub fn claim_channel(id: &Name) -> (NodeHandle, ClaimInbox) {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    (
        NodeHandle {
            node: id.to_string(),
            tx,
        },
        ClaimInbox(Arc::new(tokio::sync::Mutex::new(rx))),
    )
}

impl NodeHandle {
    /// The node this handle asks.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Asks the node to claim `name` now. A node that is not running (shut
    /// down, or its `run` returned) declines.
    pub async fn claim_now(&self, name: &Name) -> Result<ClaimAnswer> {
        self.ask(name, None).await
    }

    /// Asks the node to claim `name`, asleep in `claim` at `version` as the
    /// caller just read it, by one conditional write on that version: the
    /// wake path's claim (`Resolver::wake`). The node reads nothing first
    /// (it judges the manifest by its last listing, and the claim by what
    /// the caller read), and answers as soon as the write commits, before
    /// the session starts. A claim that moved since the caller read it, or
    /// a node that cannot take it, declines; nothing is written then.
    pub async fn wake_now(
        &self,
        name: &Name,
        version: Version,
        claim: ClaimRecord,
    ) -> Result<ClaimAnswer> {
        self.ask(name, Some((version, claim))).await
    }

    async fn ask(
        &self,
        name: &Name,
        asleep: Option<(Version, ClaimRecord)>,
    ) -> Result<ClaimAnswer> {
        let (tx, answer) = tokio::sync::oneshot::channel();
        let declined = || ClaimAnswer::Declined {
            node: self.node.clone(),
            reason: "the node is not running".into(),
        };
        if self
            .tx
            .send(ClaimRequest {
                name: name.clone(),
                asleep,
                reply: Arc::new(std::sync::Mutex::new(Some(tx))),
            })
            .await
            .is_err()
        {
            return Ok(declined());
        }
        answer.await.unwrap_or_else(|_| Ok(declined()))
    }
}

/// The next claim request, or never when this node has no inbox.
#[cfg(feature = "node")]
pub(crate) async fn recv(
    inbox: &mut Option<tokio::sync::OwnedMutexGuard<tokio::sync::mpsc::Receiver<ClaimRequest>>>,
) -> Option<ClaimRequest> {
    match inbox {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
