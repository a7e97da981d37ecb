//! The lease client: one holder identity (node, host, instance) that creates, acquires, inspects and takes over leases; each write is checked and read back.

use super::*;

pub(super) struct Inner {
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) entropy: Arc<dyn Entropy>,
    pub(super) holder: Holder,
    pub(super) host_lock: Option<Arc<HostLock>>,
    pub(super) observer: Observer,
    /// New records start at `epoch_base + 1`; takeovers never go below it
    /// (see [`crate::fleet::marker::epoch_base`]).
    pub(super) epoch_base: u64,
    /// Per key, the highest epoch and the longest ttl of any record this
    /// client has read or written there: what a vanished marker it writes
    /// carries, so that a deleted lease is neither waited for too briefly
    /// nor taken again at an epoch this client has already seen.
    pub(super) known: Mutex<HashMap<String, Known>>,
}

/// See `Inner::known`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Known {
    pub(super) epoch: u64,
    pub(super) ttl_ms: u64,
}

/// Acquires and inspects leases as one holder identity (node, host, instance).
/// Cheap to clone.
#[derive(Clone)]
pub struct LeaseClient {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for LeaseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseClient")
            .field("store", &self.inner.store.to_string())
            .field("holder", &self.inner.holder)
            .finish()
    }
}

/// Builds a [`LeaseClient`].
pub struct LeaseClientBuilder {
    pub(super) store: Arc<dyn Store>,
    pub(super) node: Name,
    pub(super) host: Option<String>,
    pub(super) instance: Option<String>,
    pub(super) clock: Option<Arc<dyn Clock>>,
    pub(super) entropy: Option<Arc<dyn Entropy>>,
    pub(super) host_lock: Option<Arc<HostLock>>,
    pub(super) epoch_base: u64,
}

impl LeaseClientBuilder {
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }
    /// Adopt an existing instance id (one-shot commands resuming a token).
    pub fn instance(mut self, id: impl Into<String>) -> Self {
        self.instance = Some(id.into());
        self
    }
    pub fn clock(mut self, c: Arc<dyn Clock>) -> Self {
        self.clock = Some(c);
        self
    }
    pub fn entropy(mut self, e: Arc<dyn Entropy>) -> Self {
        self.entropy = Some(e);
        self
    }
    /// Epochs of this client's new records start above `base`: the fleet
    /// marker's generation ([`crate::fleet::marker::epoch_base`]), so tokens
    /// made after a wipe and a new `init` are higher than any before it.
    pub fn epoch_base(mut self, base: u64) -> Self {
        self.epoch_base = base;
        self
    }
    /// With the host lock, leases held by an earlier instance of this node on
    /// this host are taken over at once.
    pub fn host_lock(mut self, l: impl Into<Arc<HostLock>>) -> Self {
        self.host_lock = Some(l.into());
        self
    }
    pub fn build(self) -> Result<LeaseClient> {
        let entropy = self.entropy.unwrap_or_else(|| Arc::new(OsEntropy::new()));
        let host = match (self.host, &self.host_lock) {
            (Some(h), Some(l)) if h != l.host() => {
                return Err(Error::invalid("host", "differs from the host lock's host"));
            }
            (Some(h), _) => h,
            (None, Some(l)) => l.host().to_string(),
            (None, None) => crate::hostlock::hostname(),
        };
        let holder = Holder {
            node: self.node.to_string(),
            host,
            instance: self.instance.unwrap_or_else(|| entropy.hex_id()),
        };
        if holder.instance == crate::record::PLACEHOLDER_INSTANCE {
            return Err(Error::invalid(
                "holder identity",
                "instance \"queued\" names placeholders, never a process",
            ));
        }
        let probe = LeaseRecord {
            schema: SCHEMA.into(),
            kind: Kind::Lease,
            holder: holder.clone(),
            epoch: 1,
            ttl_ms: 1000,
            renewed_at_ms: 0,
            released: false,
            host_locked: false,
            lock_id: None,
            address: None,
            attrs: Default::default(),
            nonce: "x".into(),
        };
        probe
            .validate()
            .map_err(|r| Error::invalid("holder identity", r))?;
        // Every new record starts at the base + 1 (a floor read from the
        // bucket's marker, so bounded on decode): one at the highest epoch
        // leaves no token to issue.
        if crate::record::next_epoch(self.epoch_base).is_none() {
            return Err(Error::invalid(
                "epoch base",
                "at the highest epoch: no fencing token above it exists",
            ));
        }
        Ok(LeaseClient {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock::new())),
                entropy,
                holder,
                host_lock: self.host_lock,
                observer: Observer::default(),
                epoch_base: self.epoch_base,
                known: Default::default(),
            }),
        })
    }
}

/// The error for a write whose read-back shows it did not land: transient,
/// and safe to retry (a late landing is recognised by its nonce).
pub(super) fn not_landed(op: &'static str, key: &str, advice: &str) -> Error {
    Error::Unavailable {
        op,
        key: key.to_string(),
        source: crate::store::StoreError::Unavailable {
            message: format!("the {op} did not land; {advice}"),
        },
    }
}

/// One attempted write: its nonce and when it was sent.
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    pub(super) nonce: String,
    pub(super) sent: MonoTime,
}

/// The outcome of a write after any read-back.
pub(super) enum Written {
    Committed {
        version: Version,
        sent: MonoTime,
        record: LeaseRecord,
    },
    /// Someone else's write is in place (or the object is gone).
    Rejected {
        current: Option<(LeaseRecord, Version, MonoTime)>,
    },
    /// The write failed in transport and the read-back shows it did not land
    /// (yet). Retrying is safe: a late landing is recognised by its nonce.
    NotLanded,
}

impl LeaseClient {
    pub fn builder(store: Arc<dyn Store>, node: Name) -> LeaseClientBuilder {
        LeaseClientBuilder {
            store,
            node,
            host: None,
            instance: None,
            clock: None,
            entropy: None,
            host_lock: None,
            epoch_base: 0,
        }
    }

    pub fn holder(&self) -> &Holder {
        &self.inner.holder
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    pub fn observer(&self) -> &Observer {
        &self.inner.observer
    }

    pub(super) fn new_record(&self, kind: Kind, epoch: u64, opts: &AcquireOptions) -> LeaseRecord {
        LeaseRecord {
            schema: SCHEMA.into(),
            kind,
            holder: self.inner.holder.clone(),
            epoch,
            ttl_ms: opts.ttl.as_millis() as u64,
            renewed_at_ms: self.inner.clock.wall_ms(),
            released: false,
            host_locked: self.inner.host_lock.is_some(),
            lock_id: self.inner.host_lock.as_ref().map(|l| l.id().to_string()),
            address: opts.address.clone(),
            attrs: opts.attrs.clone(),
            nonce: self.inner.entropy.hex_id(),
        }
    }

    /// Reads and decodes a lease record; `None` if there is no object.
    pub async fn read(
        &self,
        kind: Kind,
        name: &Name,
    ) -> Result<Option<(LeaseRecord, Version, MonoTime)>> {
        self.read_key(kind, &key_for(kind, name)).await
    }

    pub(super) async fn read_key(
        &self,
        kind: Kind,
        key: &str,
    ) -> Result<Option<(LeaseRecord, Version, MonoTime)>> {
        let obj = self
            .inner
            .store
            .get(key)
            .await
            .map_err(|e| Error::from_store("get", key, e))?;
        // The arrival instant: taken after the response is in hand.
        let arrived = self.inner.clock.now();
        match obj {
            None => Ok(None),
            Some(o) => {
                let rec = LeaseRecord::decode(key, &o.bytes, kind)?;
                self.note(key, &rec);
                Ok(Some((rec, o.version, arrived)))
            }
        }
    }

    /// Remembers `rec`'s epoch and ttl for `key` (see `Inner::known`).
    pub(super) fn note(&self, key: &str, rec: &LeaseRecord) {
        let mut known = self.inner.known.lock().unwrap();
        let k = known.entry(key.to_string()).or_default();
        k.epoch = k.epoch.max(rec.epoch);
        if !rec.is_placeholder() || rec.is_vanished() {
            k.ttl_ms = k.ttl_ms.max(rec.ttl_ms);
        }
    }

    pub(super) fn known(&self, key: &str) -> Known {
        self.inner
            .known
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or_default()
    }

    /// The marker this client writes where `key`'s record is missing: at the
    /// highest epoch it knows (at least `floor`), with the longest ttl it
    /// knows (at least `ttl`).
    pub(super) fn vanished_marker(&self, key: &str, floor: u64, ttl: Duration) -> LeaseRecord {
        let k = self.known(key);
        LeaseRecord::vanished(
            k.epoch.max(floor).max(self.inner.epoch_base),
            k.ttl_ms.max(ttl.as_millis() as u64),
            self.inner.entropy.hex_id(),
            self.inner.clock.wall_ms(),
        )
    }

    /// Our marker (written or raised) landed at `version`: watched from the
    /// arrival of the response that showed it (ours, which came after it
    /// landed), and the whole wait is ahead.
    pub(super) fn marker_written(
        &self,
        key: &str,
        version: &Version,
        marker: &LeaseRecord,
    ) -> Acquire {
        let arrived = self.inner.clock.now();
        self.inner.observer.observe(key, version, arrived);
        let ttl = Duration::from_millis(marker.ttl_ms);
        tracing::debug!(key, epoch = marker.epoch, "vanished marker written");
        Acquire::Absent {
            epoch: marker.epoch,
            observed_for: Duration::ZERO,
            expires_after: ttl + default_margin(ttl),
        }
    }

    /// Declares the standalone lease `leases/<name>` (`leasehold lease
    /// create`): writes its placeholder if the key has no object, so the
    /// first acquire takes it at once. Returns whether this call created it.
    ///
    /// Declaring asserts that the name is new. Without a declaration a
    /// missing record is taken for a deleted one, and the first acquire
    /// waits out a ttl + margin (see [`Acquire::Absent`]); after a deletion
    /// of a held lease, declaring it again would let an acquire take it while
    /// the deleted holder still believes, and restart its epochs (as a new
    /// generation would, without the generation's higher base).
    pub async fn create(&self, name: &Name) -> Result<bool> {
        let key = key_for(Kind::Lease, name);
        let rec = LeaseRecord::declared(
            self.inner.epoch_base,
            self.inner.entropy.hex_id(),
            self.inner.clock.wall_ms(),
        );
        let encoded = rec.encode()?;
        match self
            .inner
            .store
            .put(&key, Bytes::from(encoded.clone()), Cond::Create)
            .await
        {
            Ok(_) => Ok(true),
            Err(crate::store::StoreError::AlreadyExists) => Ok(false),
            Err(crate::store::StoreError::Ambiguous { .. }) => {
                // Landed or not? Read back: our bytes (with their nonce)
                // mean this call created it.
                match self.inner.store.get(&key).await {
                    Ok(Some(o)) => Ok(o.bytes.as_ref() == encoded.as_slice()),
                    Ok(None) => Err(not_landed("create", &key, "try again")),
                    Err(e) => Err(Error::from_store("get", &key, e)),
                }
            }
            Err(e) => Err(Error::from_store("put", &key, e)),
        }
    }

    /// A holder found its record gone or replaced by a marker below its
    /// epoch: writes (or raises) the marker to its epoch, so the next holder's
    /// token is above every token this one handed out. Best effort: a failure
    /// is logged (the marker of whoever finds the key missing next stands).
    pub(super) async fn keep_epoch(
        &self,
        key: &str,
        epoch: u64,
        ttl_ms: u64,
        current: Option<(LeaseRecord, Version)>,
    ) {
        let marker = self.vanished_marker(key, epoch, Duration::from_millis(ttl_ms));
        let cond = match current {
            None => Cond::Create,
            Some((rec, version)) if rec.is_vanished() && rec.epoch < epoch => Cond::Match(version),
            Some(_) => return,
        };
        let Ok(bytes) = marker.encode() else { return };
        match self.inner.store.put(key, Bytes::from(bytes), cond).await {
            Ok(_) => tracing::warn!(
                key,
                epoch,
                "lease record vanished; marker written at its epoch"
            ),
            Err(e) => {
                tracing::warn!(key, epoch, error = %crate::error::Chain(&e), "lease record vanished; could not write its marker")
            }
        }
    }

    /// Writes `record` under `cond` and resolves every non-success by reading
    /// back: a stored nonce matching any of `attempts` means the write (or an
    /// earlier attempt of the same operation) is ours and committed.
    pub(super) async fn write(
        &self,
        key: &str,
        record: LeaseRecord,
        cond: Cond,
        attempts: &mut Vec<Attempt>,
    ) -> Result<Written> {
        let bytes = Bytes::from(record.encode()?);
        let sent = self.inner.clock.now();
        let cond_version = cond.version().cloned();
        attempts.push(Attempt {
            nonce: record.nonce.clone(),
            sent,
        });
        use crate::checked::{self, Failure, Outcome};
        let failure = match self.inner.store.put(key, bytes, cond).await {
            Ok(version) => {
                self.note(key, &record);
                return Ok(Written::Committed {
                    version,
                    sent,
                    record,
                });
            }
            Err(e) => {
                if let crate::store::StoreError::Ambiguous { message } = &e {
                    tracing::debug!(key, %message, "ambiguous write; reading back");
                }
                Failure::of(e).map_err(|e| Error::from_store("put", key, e))?
            }
        };
        // Read back. A failure here leaves the outcome unknown: report it as
        // transient, and the next attempt will recognise a late landing. Ours
        // is our holder with the nonce of any attempt of this operation.
        let current = self.read_key(record.kind, key).await?;
        let ours = current.as_ref().and_then(|(rec, _, _)| {
            (rec.holder == self.inner.holder)
                .then(|| attempts.iter().find(|a| a.nonce == rec.nonce))
                .flatten()
        });
        let read = checked::read_back(
            ours.is_some(),
            current.as_ref().map(|(_, v, _)| v),
            cond_version.as_ref(),
        );
        match (checked::outcome(failure, read), ours, current) {
            (Outcome::Committed, Some(a), Some((rec, version, _))) => Ok(Written::Committed {
                version,
                sent: a.sent,
                record: rec,
            }),
            (Outcome::Rejected, _, current) => Ok(Written::Rejected { current }),
            _ => Ok(Written::NotLanded),
        }
    }

    pub(super) fn lease(
        &self,
        key: String,
        record: LeaseRecord,
        version: Version,
        sent: MonoTime,
        margin: Duration,
    ) -> Lease {
        let ttl = Duration::from_millis(record.ttl_ms);
        Lease {
            client: self.clone(),
            key,
            valid_until: sent + ttl.saturating_sub(margin),
            record,
            version,
            margin,
            state: State::Held,
            pending: Vec::new(),
            created: false,
            replaced: None,
        }
    }

    /// Acquires the standalone lease `leases/<name>`.
    pub async fn acquire(&self, name: &Name, opts: &AcquireOptions) -> Result<Acquire> {
        self.acquire_kind(Kind::Lease, name, opts).await
    }

    /// Acquires the lease of `kind` named `name`.
    ///
    /// A standalone lease: a read, then one If-Match write if a takeover is
    /// allowed; losing that final write is [`Error::Conflict`]. A missing
    /// record is never taken for a fresh key (it may have been deleted under
    /// a holder that still believes): a marker is written in its place and
    /// the answer is [`Acquire::Absent`] until the marker has been watched
    /// for its ttl + margin. [`LeaseClient::create`] declares a new name so
    /// that its first acquire is immediate.
    ///
    /// A node lease keeps one round trip on a fresh key (create-if-absent):
    /// the fleet judges a missing node record by observation itself, and
    /// claims name the node's instance, never its epoch.
    #[tracing::instrument(level = "debug", name = "lease acquire", skip_all, fields(kind = ?kind, name = %name))]
    pub async fn acquire_kind(
        &self,
        kind: Kind,
        name: &Name,
        opts: &AcquireOptions,
    ) -> Result<Acquire> {
        let margin = opts.validate()?;
        let key = key_for(kind, name);
        let mut attempts = Vec::new();
        // Refuse what could never be written (attributes too large, say)
        // before any request.
        self.new_record(kind, self.inner.epoch_base + 1, opts)
            .encode()?;
        let current = if kind == Kind::Lease {
            match self.read_key(kind, &key).await? {
                Some(c) => Some(c),
                None => {
                    let marker = self.vanished_marker(&key, 0, opts.ttl);
                    match self
                        .write(&key, marker, Cond::Create, &mut attempts)
                        .await?
                    {
                        Written::Committed {
                            version, record, ..
                        } => return Ok(self.marker_written(&key, &version, &record)),
                        Written::Rejected { current } => current,
                        Written::NotLanded => {
                            return Err(not_landed("vanished marker", &key, "try again"));
                        }
                    }
                }
            }
        } else {
            let fresh = self.new_record(kind, self.inner.epoch_base + 1, opts);
            match self.write(&key, fresh, Cond::Create, &mut attempts).await? {
                Written::Committed {
                    version,
                    sent,
                    record,
                } => {
                    let mut lease = self.lease(key, record, version, sent, margin);
                    lease.created = true;
                    return Ok(Acquire::Acquired(lease));
                }
                Written::Rejected { current } => current,
                Written::NotLanded => return Err(not_landed("create", &key, "try again")),
            }
        };
        let Some((rec, version, arrived)) = current else {
            // Rejected, yet nothing there: deleted in between (garbage
            // collection). Report a conflict rather than loop.
            return Err(Error::Conflict { key });
        };
        let known = self.known(&key);
        if rec.is_vanished() && (known.epoch > rec.epoch || known.ttl_ms > rec.ttl_ms) {
            // The marker's writer knew less than we do (a lower epoch, a
            // shorter ttl): raise it, so that whoever takes the lease next
            // goes above every epoch we saw and waits long enough. A new
            // version: every watcher starts again.
            let marker = self.vanished_marker(&key, known.epoch, opts.ttl);
            return match self
                .write(&key, marker, Cond::Match(version), &mut attempts)
                .await?
            {
                Written::Committed {
                    version, record, ..
                } => Ok(self.marker_written(&key, &version, &record)),
                Written::Rejected { .. } => Err(Error::Conflict { key }),
                Written::NotLanded => Err(not_landed("vanished marker", &key, "try again")),
            };
        }
        let observed_for = self.inner.observer.observe(&key, &version, arrived);
        // A marker is watched for the longest ttl this client knows for the
        // key, its own included, if that is longer than the marker says: the
        // marker's writer may have known less.
        let mut judged = rec.clone();
        if judged.is_vanished() {
            judged.ttl_ms = judged
                .ttl_ms
                .max(known.ttl_ms)
                .max(opts.ttl.as_millis() as u64);
        }
        let observer_margin = default_margin(Duration::from_millis(judged.ttl_ms));
        let Some(why) = decide_takeover(
            &judged,
            &self.inner.holder,
            self.inner.host_lock.as_ref().map(|l| l.id()),
            observed_for,
            observer_margin,
        ) else {
            let need = Duration::from_millis(judged.ttl_ms) + observer_margin;
            if rec.is_vanished() {
                return Ok(Acquire::Absent {
                    epoch: rec.epoch,
                    observed_for,
                    expires_after: need.saturating_sub(observed_for),
                });
            }
            return Ok(Acquire::Held {
                holder: rec.holder,
                epoch: rec.epoch,
                observed_for,
                expires_after: need.saturating_sub(observed_for),
            });
        };
        // Every new tenure gets a new fencing token. (Our own retried create,
        // recognised by its nonce, never reaches here: it is committed.)
        // Above every epoch this client has seen here too: a record made
        // again after a deletion may carry less than the one deleted.
        let Some(epoch) = crate::record::next_epoch(rec.epoch.max(known.epoch)) else {
            return Err(Error::corrupt(
                &key,
                "epoch at its maximum: no higher token exists".to_string(),
            ));
        };
        let epoch = epoch.max(self.inner.epoch_base + 1);
        tracing::debug!(key, ?why, epoch, "taking over");
        let replaced = rec.clone();
        let next = self.new_record(kind, epoch, opts);
        match self
            .write(&key, next, Cond::Match(version), &mut attempts)
            .await?
        {
            Written::Committed {
                version,
                sent,
                record,
            } => {
                self.inner.observer.forget(&key);
                let mut lease = self.lease(key, record, version, sent, margin);
                lease.replaced = Some(Box::new(replaced));
                Ok(Acquire::Acquired(lease))
            }
            Written::Rejected { .. } => Err(Error::Conflict { key }),
            Written::NotLanded => Err(not_landed("takeover", &key, "try again")),
        }
    }

    /// Picks up a lease from a token issued to an earlier process (a one-shot
    /// `leasehold lease acquire`). The returned lease acts as the holder named
    /// in the record, once the record's instance and version match the token.
    /// Its validity is unknown until the next successful renew (we do not
    /// know when the last write was sent), so [`Lease::is_valid`] is false
    /// until then.
    pub async fn resume(&self, kind: Kind, name: &Name, token: &LeaseToken) -> Result<Lease> {
        let key = key_for(kind, name);
        let current = self.read_key(kind, &key).await?;
        let deleted = match &current {
            None => kind == Kind::Lease,
            Some((rec, _, _)) => rec.is_vanished(),
        };
        if deleted {
            // Deleted under this token's holder: lost, and the token's epoch
            // goes on the marker (raised, or created where none is yet), so
            // that no later holder reuses it. The watch is the acquirers' to
            // lengthen (this one-shot client knows no ttl, so a marker it
            // creates says 1 ms): the only holder of this epoch is the
            // caller, who is told it lost before any taker can have watched.
            match current {
                Some((rec, version, _)) => {
                    let ttl = rec.ttl_ms;
                    self.keep_epoch(&key, token.epoch, ttl, Some((rec, version)))
                        .await
                }
                None => self.keep_epoch(&key, token.epoch, 1, None).await,
            }
            return Err(Error::Lost {
                key,
                epoch: token.epoch,
                reason: "the record was deleted (a marker stands in its place)".into(),
            });
        }
        let Some((rec, version, _)) = current else {
            return Err(Error::NotFound { key });
        };
        if rec.holder.instance == token.instance && rec.released {
            return Err(Error::Lost {
                key,
                epoch: rec.epoch,
                reason: "already released (by this holder)".into(),
            });
        }
        if rec.holder.instance == token.instance && version != token.version {
            // Our own later write (a renew printed a newer token): whoever
            // holds this token must not act on it (fenced), but the message
            // says what happened: not another holder, a newer token.
            return Err(Error::Lost {
                key,
                epoch: token.epoch,
                reason: format!(
                    "this token is stale: the same holder renewed since (epoch {}); use the token from the last renew",
                    rec.epoch
                ),
            });
        }
        if rec.holder.instance != token.instance {
            return Err(Error::Lost {
                key,
                epoch: token.epoch,
                reason: format!(
                    "the lease changed hands since the token was issued (now epoch {} held by {}/{}{})",
                    rec.epoch,
                    rec.holder.node,
                    rec.holder.instance,
                    if rec.released { ", released" } else { "" }
                ),
            });
        }
        if rec.released {
            return Err(Error::Lost {
                key,
                epoch: rec.epoch,
                reason: "already released".into(),
            });
        }
        // Act as the record's holder exactly (node, host, instance), so that
        // read-backs recognise our writes; the token proved the instance.
        let as_holder = LeaseClient {
            inner: Arc::new(Inner {
                store: self.inner.store.clone(),
                clock: self.inner.clock.clone(),
                entropy: self.inner.entropy.clone(),
                holder: rec.holder.clone(),
                host_lock: None,
                observer: Observer::default(),
                epoch_base: self.inner.epoch_base,
                known: Default::default(),
            }),
        };
        let margin = default_margin(Duration::from_millis(rec.ttl_ms));
        let mut l = as_holder.lease(key, rec, version, MonoTime::ZERO, margin);
        l.valid_until = MonoTime::ZERO;
        l.state = State::Resumed;
        Ok(l)
    }

    /// Lists `prefix` and feeds every version seen to the observer; returns
    /// the entries. Listings carry ETags, so expiry by observation costs no
    /// extra requests.
    pub async fn observe_listing(&self, prefix: &str) -> Result<Vec<crate::store::Entry>> {
        self.observe_listing_where(prefix, |_| true).await
    }

    /// As [`observe_listing`](Self::observe_listing), but an entry for which
    /// `watch` answers false is not observed, and what was observed of its
    /// key is forgotten.
    ///
    /// Why: a caller that will never judge a version by how long it stood
    /// (a fleet node's view of a live claim: only a vanished claim's marker
    /// is ever waited out) need not keep an observation per listed key. At
    /// 100,000 sessions those were a sixth of a node's heap (issue #14).
    /// Forgetting is conservative as everywhere here: a version observed
    /// again starts a fresh observation. So `watch` must answer true for
    /// any version it does not know to be one it will never judge.
    pub async fn observe_listing_where(
        &self,
        prefix: &str,
        watch: impl FnMut(&crate::store::Entry) -> bool,
    ) -> Result<Vec<crate::store::Entry>> {
        let mut out = Vec::new();
        self.observe_listing_each(prefix, watch, |e| out.push(e))
            .await?;
        Ok(out)
    }

    /// As [`observe_listing_where`](Self::observe_listing_where), but each
    /// entry is handed to `each` as it is listed instead of being collected.
    ///
    /// Why: a fleet node's full listing at 100,000 sessions collected
    /// 200,000 entries (key, ETag, size, time: about 180 bytes each) to
    /// compare them with its caches, which lifted a node 30-50 MB above its
    /// steady size while it ran (issue #14). A caller that keeps only what
    /// differs from what it knows needs none of that.
    pub async fn observe_listing_each(
        &self,
        prefix: &str,
        mut watch: impl FnMut(&crate::store::Entry) -> bool,
        mut each: impl FnMut(crate::store::Entry),
    ) -> Result<()> {
        let mut s = self.inner.store.list(prefix);
        // The keys observed: the observer forgets every other key under
        // `prefix` (unlisted or declined) once the listing is complete.
        let mut keep: std::collections::HashSet<String> = Default::default();
        while let Some(e) = s.next().await {
            // An in-memory or local listing yields every page at once: a
            // yield point now and then (tokio's coop budget) keeps a long
            // listing from holding its thread (see the node's pass).
            tokio::task::coop::consume_budget().await;
            let e = e.map_err(|e| Error::from_store("list", prefix, e))?;
            if watch(&e) {
                // Taken as each entry is yielded, which is no earlier than
                // the arrival of the page carrying it: conservative.
                let arrived = self.inner.clock.now();
                self.inner.observer.observe(&e.key, &e.version, arrived);
                keep.insert(e.key.clone());
            }
            each(e);
        }
        // One pass under the observer's lock forgets both what the listing
        // no longer shows and what `watch` declined. Only after the last
        // page: a listing that fails half-way forgets nothing.
        self.inner.observer.retain_listed(prefix, &keep);
        Ok(())
    }
}
