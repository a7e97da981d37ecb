//! Writes of this node's own claims (state changes, restarts, releases):
//! one If-Match on the version we hold, its outcome read back when
//! ambiguous, and the caches kept in line. A rejection means a peer took the
//! claim over: the session is stopped and forgotten.

use super::*;

/// A write over one of our claims (If-Match on the version we hold), as
/// sent, and what came of it (`Node::apply_claim_write`).
pub(super) struct ClaimWrite {
    /// Taken before the write was sent.
    pub(super) sent: MonoTime,
    pub(super) next: ClaimRecord,
    pub(super) put: Result<Put>,
}

impl ClaimWrite {
    /// The write's round trip, touching no node state (so that a shutdown
    /// or drain can have several in flight).
    pub(super) fn send(
        deps: ClaimIo,
        name: &str,
        version: Version,
        mut next: ClaimRecord,
    ) -> futures::future::BoxFuture<'static, Self> {
        let key = crate::keys::session(name);
        async move {
            let sent = deps.clock.now();
            next.updated_at_ms = deps.clock.wall_ms();
            next.nonce = deps.entropy.hex_id();
            // A reason holds words from the spec (a check's command or
            // URL, a path): kept to what a claim may hold, or the node
            // would write a claim it then reads as corrupt.
            next.reason = next.reason.map(|r| crate::fleet::claim::clean_reason(&r));
            let put = put_checked(
                &deps.store,
                &key,
                Bytes::from(next.encode()),
                Cond::Match(version),
                &next.nonce,
                json_nonce,
            )
            .await;
            ClaimWrite { sent, next, put }
        }
        .boxed()
    }
}

/// What a claim's round trips use of a node's deps, owned (cheap clones).
#[derive(Clone)]
pub(super) struct ClaimIo {
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) entropy: Arc<dyn Entropy>,
}

impl ClaimIo {
    pub(super) fn of(deps: &NodeDeps) -> Self {
        ClaimIo {
            store: deps.store.clone(),
            clock: deps.clock.clone(),
            entropy: deps.entropy.clone(),
        }
    }
}

impl Node {
    /// Fenced state change of an owned claim (If-Match on our last version).
    /// A rejection means a peer took the claim over: stop and forget it.
    pub(super) async fn set_state(
        &mut self,
        name: &str,
        state: ClaimState,
        exit_code: Option<i32>,
    ) -> Result<()> {
        self.set_state_why(name, state, exit_code, None).await
    }

    /// `set_state` with the reason recorded in the claim (`reason`: why a
    /// run ended where its exit code does not say).
    pub(super) async fn set_state_why(
        &mut self,
        name: &str,
        state: ClaimState,
        exit_code: Option<i32>,
        reason: Option<String>,
    ) -> Result<()> {
        let Some((version, mut next)) = self.state_change(name, state, exit_code)? else {
            return Ok(());
        };
        next.reason = reason;
        let w = ClaimWrite::send(ClaimIo::of(&self.deps), name, version, next).await;
        self.apply_state_change(name, w).await
    }

    /// The write that moves our claim `name` to `state` (If-Match on the
    /// version we hold), or `None` if we do not hold it; an error if the
    /// claim may not become `state`.
    pub(super) fn state_change(
        &self,
        name: &str,
        state: ClaimState,
        exit_code: Option<i32>,
    ) -> Result<Option<(Version, ClaimRecord)>> {
        let Some(o) = self.owned.get(name) else {
            return Ok(None);
        };
        if !o.record.state.can_become(state) {
            return Err(Error::invalid(
                "claim transition",
                format!("{:?} -> {:?} for {name}", o.record.state, state),
            ));
        }
        let mut next = o.record.clone();
        next.state = state;
        next.exit_code = exit_code;
        next.reason = None; // a reason is the state's it was written with
        if state != ClaimState::Running {
            next.health = None; // a health is a running process's
        }
        Ok(Some((o.version.clone(), next)))
    }

    /// A state change's write applied (`apply_claim_write`), then its event.
    pub(super) async fn apply_state_change(&mut self, name: &str, w: ClaimWrite) -> Result<()> {
        let (state, epoch, exit_code) = (w.next.state, w.next.epoch, w.next.exit_code);
        self.apply_claim_write(name, w).await?;
        let kind = match state {
            ClaimState::Running => EventKind::Running,
            ClaimState::Paused => EventKind::Paused,
            ClaimState::Succeeded => EventKind::Succeeded,
            ClaimState::Failed => EventKind::Failed,
            ClaimState::Released => EventKind::Released,
            ClaimState::Sleeping => EventKind::Sleeping,
        };
        self.event(
            kind,
            Some(name),
            Some(epoch),
            exit_code.map(|c| format!("exit {c}")).unwrap_or_default(),
        );
        Ok(())
    }

    /// Writes `next` over our claim `name` (If-Match on the version we
    /// hold), and keeps the caches in line. A rejection means a peer took the
    /// claim over: stop the session and forget it.
    pub(super) async fn write_claim(
        &mut self,
        name: &str,
        o: &Owned,
        next: ClaimRecord,
    ) -> Result<()> {
        let w = ClaimWrite::send(ClaimIo::of(&self.deps), name, o.version.clone(), next).await;
        self.apply_claim_write(name, w).await
    }

    /// What a write of our claim `name` came to (`ClaimWrite::send`),
    /// applied: the caches follow a committed one; a rejected one means a
    /// peer took the claim over, so the session is stopped and forgotten.
    pub(super) async fn apply_claim_write(&mut self, name: &str, w: ClaimWrite) -> Result<()> {
        let ClaimWrite { sent, next, put } = w;
        let key = crate::keys::session(name);
        match put? {
            Put::Committed(v) => {
                self.audit.claim_writes += 1;
                if self.audit.claim_writes.is_multiple_of(AUDIT_SAMPLE) {
                    self.audit(&key, &next.nonce, next.epoch).await;
                }
                self.claims.insert(key, (v.clone(), ClaimView::from(&next)));
                if matches!(next.state, ClaimState::Released | ClaimState::Sleeping) {
                    self.owned.remove(name);
                } else if let Some(o) = self.owned.get_mut(name) {
                    o.record = next;
                    o.version = v;
                    o.confirmed = o.confirmed.max(sent);
                }
                Ok(())
            }
            Put::Rejected(_) => {
                self.lose(name, "claim changed by another writer").await;
                Err(Error::Lost {
                    key,
                    epoch: next.epoch,
                    reason: "claim taken over".into(),
                })
            }
        }
    }
}
