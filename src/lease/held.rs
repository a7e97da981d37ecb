//! A held lease: renew, release, and what its holder may believe.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Held,
    /// From a token: validity unknown until renewed.
    Resumed,
    Lost,
    Released,
}

/// A lease this process holds (or held). Renew it every ttl/3 or so.
///
/// Dropping a `Lease` does not release it (that needs a write); the lease then
/// expires by observation after its TTL.
#[derive(Debug)]
pub struct Lease {
    pub(super) client: LeaseClient,
    pub(super) key: String,
    pub(super) record: LeaseRecord,
    pub(super) version: Version,
    pub(super) valid_until: MonoTime,
    pub(super) margin: Duration,
    pub(super) state: State,
    /// Attempts of the renew in progress, to recognise a late landing.
    pub(super) pending: Vec<Attempt>,
    /// Acquired by creating a record where none was: nothing proves that
    /// an earlier holder (whose record was deleted) has stopped.
    pub(super) created: bool,
    /// The record this lease's takeover replaced, if it was a takeover.
    pub(super) replaced: Option<Box<LeaseRecord>>,
}

impl Lease {
    /// Whether this lease was acquired by creating its record where none
    /// was (rather than by taking over a released, expired or proven-dead
    /// holder's). A node whose record was deleted under it may still be
    /// running until its own deadline: see the fleet's predecessor rule.
    pub fn created(&self) -> bool {
        self.created
    }

    /// The record a takeover replaced (None when created, or resumed).
    pub fn replaced(&self) -> Option<&LeaseRecord> {
        self.replaced.as_deref()
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: hand it to whatever this holder drives, so that
    /// downstream systems can refuse a stale holder.
    pub fn epoch(&self) -> u64 {
        self.record.epoch
    }

    pub fn record(&self) -> &LeaseRecord {
        &self.record
    }

    pub fn version(&self) -> &Version {
        &self.version
    }

    /// The end of validity on this process's monotonic clock.
    pub fn valid_until(&self) -> MonoTime {
        self.valid_until
    }

    /// True while this holder may act on the lease: held, and before the
    /// validity deadline. Check it before every fenced action.
    pub fn is_valid(&self) -> bool {
        self.state == State::Held && self.client.inner.clock.now() < self.valid_until
    }

    /// Time left before the validity deadline.
    pub fn remaining(&self) -> Duration {
        if self.state != State::Held {
            return Duration::ZERO;
        }
        self.valid_until
            .saturating_since(self.client.inner.clock.now())
    }

    pub fn token(&self) -> LeaseToken {
        LeaseToken {
            instance: self.record.holder.instance.clone(),
            version: self.version.clone(),
            epoch: self.record.epoch,
        }
    }

    pub(super) fn lost(&mut self, reason: impl Into<String>) -> Error {
        self.state = State::Lost;
        Error::Lost {
            key: self.key.clone(),
            epoch: self.record.epoch,
            reason: reason.into(),
        }
    }

    /// One renew attempt: one If-Match write, no read first (a read-back only
    /// when the write is rejected or ambiguous).
    ///
    /// - `Ok(())`: renewed; validity now runs from this write's send time.
    /// - `Err(Lost)`: another writer won, or the deadline passed. Stop acting.
    /// - a transient error: the outcome is not known; try again before the
    ///   deadline ([`Lease::renew`] does).
    #[tracing::instrument(level = "debug", name = "lease renew", skip_all)]
    pub async fn renew_once(&mut self) -> Result<()> {
        self.write_update(|_| {}).await
    }

    /// Replaces the record's attributes, fenced by If-Match (and renewing).
    pub async fn set_attrs(
        &mut self,
        attrs: serde_json::Map<String, serde_json::Value>,
    ) -> Result<()> {
        let size: usize = serde_json::to_vec(&attrs).map(|v| v.len()).unwrap_or(0);
        if size > crate::record::MAX_RECORD_BYTES {
            return Err(Error::TooLarge {
                what: "lease attributes".into(),
                size,
                limit: crate::record::MAX_RECORD_BYTES,
            });
        }
        self.write_update(move |r| r.attrs = attrs).await
    }

    pub(super) async fn write_update(&mut self, edit: impl FnOnce(&mut LeaseRecord)) -> Result<()> {
        match self.state {
            State::Held | State::Resumed => {}
            State::Lost => return Err(self.lost("already lost")),
            State::Released => return Err(self.lost("already released")),
        }
        let clock = self.client.inner.clock.clone();
        if self.state == State::Held && clock.now() >= self.valid_until {
            return Err(self.lost("validity deadline passed before a renew succeeded"));
        }
        let mut next = self.record.clone();
        edit(&mut next);
        next.nonce = self.client.inner.entropy.hex_id();
        next.renewed_at_ms = clock.wall_ms();
        // Whoever writes says whether it holds the host lock (a resumed
        // one-shot holder does not, even if the node that acquired did).
        next.host_locked = self.client.inner.host_lock.is_some();
        next.lock_id = self
            .client
            .inner
            .host_lock
            .as_ref()
            .map(|l| l.id().to_string());
        let mut pending = std::mem::take(&mut self.pending);
        let r = self
            .client
            .write(
                &self.key,
                next,
                Cond::Match(self.version.clone()),
                &mut pending,
            )
            .await;
        match r {
            Ok(Written::Committed {
                version,
                sent,
                record,
            }) => {
                let ttl = Duration::from_millis(record.ttl_ms);
                let until = sent + ttl.saturating_sub(self.margin);
                self.valid_until = self.valid_until.max(until);
                self.version = version;
                self.record = record;
                self.state = State::Held;
                Ok(())
            }
            Ok(Written::Rejected { current }) => {
                let who = match &current {
                    Some((r, _, _)) if r.is_vanished() => {
                        "the record was deleted (a marker stands in its place)".into()
                    }
                    Some((r, _, _)) => format!(
                        "now epoch {} held by {}/{}{}",
                        r.epoch,
                        r.holder.node,
                        r.holder.instance,
                        if r.released { " (released)" } else { "" }
                    ),
                    None => "the object is gone".into(),
                };
                // Stop believing first; then keep our epoch in the bucket.
                let e = self.lost(format!("another writer changed the lease: {who}"));
                self.after_vanished(current).await;
                Err(e)
            }
            Ok(Written::NotLanded) => {
                self.pending = pending;
                Err(not_landed("renew", &self.key, "retry before the deadline"))
            }
            Err(e) => {
                if e.is_transient() {
                    self.pending = pending;
                }
                Err(e)
            }
        }
    }

    /// After a rejected write of a standalone lease: if the record is gone or
    /// a marker below our epoch stands in its place, put our epoch there
    /// (see [`LeaseClient::keep_epoch`]).
    pub(super) async fn after_vanished(&self, current: Option<(LeaseRecord, Version, MonoTime)>) {
        if self.record.kind != Kind::Lease {
            return;
        }
        if current.as_ref().is_some_and(|(r, _, _)| !r.is_vanished()) {
            return;
        }
        self.client
            .keep_epoch(
                &self.key,
                self.record.epoch,
                self.record.ttl_ms,
                current.map(|(r, v, _)| (r, v)),
            )
            .await;
    }

    /// Renews, retrying transport failures with exponential backoff (backon)
    /// until the validity deadline; past it the lease is lost.
    pub async fn renew(&mut self) -> Result<()> {
        let ttl = Duration::from_millis(self.record.ttl_ms);
        let mut delays = backon::ExponentialBuilder::default()
            .with_min_delay((ttl / 50).max(Duration::from_millis(5)))
            .with_max_delay((ttl / 6).max(Duration::from_millis(5)))
            .without_max_times()
            .build();
        let clock = self.client.inner.clock.clone();
        let mut last_error: Option<Error> = None;
        loop {
            if let Some(e) = &last_error
                && self.state == State::Held
                && clock.now() >= self.valid_until
            {
                let reason =
                    format!("bucket unreachable until the validity deadline (last error: {e})");
                return Err(self.lost(reason));
            }
            match self.renew_once().await {
                Ok(()) => return Ok(()),
                // A resumed lease has no known deadline to retry against.
                Err(e) if e.is_transient() && self.state == State::Held => {
                    let remaining = self.valid_until.saturating_since(clock.now());
                    if self.state == State::Held && remaining.is_zero() {
                        return Err(self.lost(format!(
                            "bucket unreachable until the validity deadline ({e})"
                        )));
                    }
                    let d = delays.next().unwrap_or(ttl / 6).min(remaining);
                    tracing::warn!(key = %self.key, error = %crate::error::Chain(&e), cause = crate::error::cause_of(&e).unwrap_or("-"), retry_in = ?d, "renew failed");
                    last_error = Some(e);
                    clock.sleep(d).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Releases: a tombstone with the epoch unchanged, so the next holder's
    /// epoch is higher. This holder stops believing at once, before the write.
    #[tracing::instrument(level = "debug", name = "lease release", skip_all)]
    pub async fn release(mut self) -> Result<()> {
        match self.state {
            State::Held | State::Resumed => {}
            State::Lost => return Err(self.lost("already lost")),
            State::Released => return Ok(()),
        }
        self.state = State::Released;
        let clock = self.client.inner.clock.clone();
        let mut next = self.record.clone();
        next.released = true;
        let mut attempts = Vec::new();
        let ttl = Duration::from_millis(self.record.ttl_ms);
        let mut tries = 0;
        loop {
            next.nonce = self.client.inner.entropy.hex_id();
            next.renewed_at_ms = clock.wall_ms();
            let r = self
                .client
                .write(
                    &self.key,
                    next.clone(),
                    Cond::Match(self.version.clone()),
                    &mut attempts,
                )
                .await;
            match r {
                Ok(Written::Committed { .. }) => return Ok(()),
                Ok(Written::Rejected { current }) => {
                    let e = self.lost("another writer changed the lease before release");
                    self.after_vanished(current).await;
                    return Err(e);
                }
                Ok(Written::NotLanded) if tries < 3 => {
                    tries += 1;
                    clock.sleep(ttl / 20).await;
                }
                Err(e) if e.is_transient() && tries < 3 => {
                    tracing::warn!(key = %self.key, error = %crate::error::Chain(&e), "release failed; retrying");
                    tries += 1;
                    clock.sleep(ttl / 20).await;
                }
                Ok(Written::NotLanded) => {
                    return Err(not_landed(
                        "release",
                        &self.key,
                        "the lease will expire by observation",
                    ));
                }
                Err(e) => return Err(e),
            }
        }
    }
}
