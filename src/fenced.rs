//! Fenced data: a session's writes to the bucket, checked against its epoch
//! where they land.
//!
//! The design of record: data a session writes elsewhere in the bucket goes
//! under its epoch, and is acknowledged only while its claim still names its
//! run. Here, as SlateDB fences writers through an epoch in its manifest:
//!
//! - a run's objects go under `data/<session>/e<epoch>/...` ([`FencedData::put`]),
//!   each written once (create-if-absent): no run ever writes into
//!   another's prefix, and no object readers may see ever changes;
//! - one object per session, `data/<session>/pointer`, names the epoch that
//!   owns the data and the object that is current. A run **opens** it
//!   before anything else ([`FencedData::open`]): a conditional write that
//!   raises the pointer's epoch to its own, refused if the pointer already
//!   names a higher one. Every later write of the pointer by an older run
//!   is then a conditional write on a version that no longer exists, and
//!   fails;
//! - a run **publishes** an object ([`FencedData::publish`]) by a
//!   conditional write of the pointer on the version it opened or last
//!   wrote, after the ack gate ([`AckGate`], the node's answer that the
//!   claim still names the run) when it is given one;
//! - readers follow the pointer ([`current`]): they see the object of the
//!   highest epoch that has published, never an object of a run that was
//!   superseded before it published.
//!
//! A corrupt or foreign pointer is an error, never overwritten; a pointer
//! that names an object outside its epoch's prefix is corrupt.

use crate::error::{Error, Result};
use crate::name::Name;
use crate::store::{Cond, Store, Version};
use bytes::Bytes;
use std::sync::Arc;

/// The prefix of every session's fenced data.
pub const DATA: &str = "data/";

/// The ack gate a publish asks first: Ok only while the session's claim
/// names the run (see [`crate::fleet::channel`]).
#[async_trait::async_trait]
pub trait AckGate: Send + Sync {
    async fn ack(&self) -> Result<()>;
}

#[async_trait::async_trait]
impl AckGate for crate::fleet::channel::client::SessionClient {
    async fn ack(&self) -> Result<()> {
        crate::fleet::channel::client::SessionClient::ack(
            self,
            crate::fleet::channel::DEFAULT_MARGIN,
        )
        .await
        .map(|_| ())
    }
}

/// `data/<session>/pointer`.
pub fn pointer_key(session: &Name) -> String {
    format!("{DATA}{session}/pointer")
}

/// `data/<session>/e<epoch>/`.
pub fn epoch_prefix(session: &Name, epoch: u64) -> String {
    format!("{DATA}{session}/e{epoch}/")
}

/// The stored pointer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pointer {
    pub schema: String,
    pub kind: String,
    pub session: String,
    /// The epoch that owns the data: only a run at this epoch may publish.
    pub epoch: u64,
    /// The current object (under its epoch's prefix), if one was published.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub nonce: String,
}

impl Pointer {
    pub fn decode(key: &str, session: &Name, bytes: &[u8]) -> Result<Pointer> {
        let p: Pointer =
            crate::record::decode_as(key, bytes, "data-pointer", 4096, "data pointer")?;
        let corrupt = |r: String| Error::corrupt(key, r);
        if p.session != session.as_str() {
            return Err(corrupt(format!("names session {:?}", p.session)));
        }
        if p.epoch == 0 || p.epoch > crate::record::MAX_EPOCH {
            return Err(corrupt(format!("epoch {} is not a session epoch", p.epoch)));
        }
        // The current object is under the prefix of the epoch that
        // published it: this one, or an older one whose data a newer run
        // opened and has not replaced yet.
        if let Some(k) = &p.key {
            let published = key_epoch(session, k);
            if !published.is_some_and(|e| e >= 1 && e <= p.epoch) || k.len() > 1024 {
                return Err(corrupt(format!(
                    "names {k:?}, not under the prefix of epoch {} or an older one",
                    p.epoch
                )));
            }
        }
        Ok(p)
    }

    fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("pointer serialises"))
    }
}

/// The epoch whose prefix `key` is under (`data/<session>/e<N>/...`).
fn key_epoch(session: &Name, key: &str) -> Option<u64> {
    let rest = key.strip_prefix(&format!("{DATA}{session}/e"))?;
    let (e, rel) = rest.split_once('/')?;
    if rel.is_empty() || e.starts_with('0') {
        return None;
    }
    e.parse().ok()
}

/// The relative name of an object under an epoch's prefix: 1-512 bytes of
/// `[A-Za-z0-9._-]` segments separated by `/`, none empty, `.` or `..`.
fn check_rel(rel: &str) -> Result<()> {
    let ok = !rel.is_empty()
        && rel.len() <= 512
        && rel.split('/').all(|s| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        });
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "fenced object name",
            format!("{rel:?}: 1-512 bytes of [A-Za-z0-9._-] segments separated by /"),
        ))
    }
}

/// A run's handle on its session's fenced data: opened at its epoch.
#[derive(Debug)]
pub struct FencedData {
    store: Arc<dyn Store>,
    session: Name,
    epoch: u64,
    /// The pointer's version as this run last wrote (or opened) it.
    version: Version,
    pointer: Pointer,
}

impl FencedData {
    /// Opens `session`'s data at `epoch`: raises the pointer to it (creates
    /// it if none), so that no older run can publish again. Refused
    /// (`Fenced`) when the pointer already names a higher epoch; a corrupt
    /// pointer is `Data` and is left as it is.
    pub async fn open(store: Arc<dyn Store>, session: &Name, epoch: u64) -> Result<FencedData> {
        if epoch == 0 || epoch > crate::record::MAX_EPOCH {
            return Err(Error::invalid(
                "epoch",
                "a session's epoch (LEASEHOLD_EPOCH), from 1",
            ));
        }
        let key = pointer_key(session);
        for _ in 0..8 {
            let current = read(&store, session).await?;
            let (cond, key_now) = match &current {
                Some((p, _)) if p.epoch > epoch => {
                    return Err(fenced(
                        session,
                        epoch,
                        format!("its data pointer names epoch {}", p.epoch),
                    ));
                }
                Some((p, v)) if p.epoch == epoch => {
                    // Opened before by this run (or its earlier start at
                    // the same epoch): carry on from it.
                    return Ok(FencedData {
                        store,
                        session: session.clone(),
                        epoch,
                        version: v.clone(),
                        pointer: p.clone(),
                    });
                }
                Some((p, v)) => (Cond::Match(v.clone()), p.key.clone()),
                None => {
                    // No pointer: a first open, or one deleted by hand. A
                    // higher epoch's objects mean a newer run has written
                    // here: refused, as if its pointer were there.
                    if let Some(higher) = highest_epoch(&store, session).await?
                        && higher > epoch
                    {
                        return Err(fenced(
                            session,
                            epoch,
                            format!("its data has objects of epoch {higher} (and no pointer)"),
                        ));
                    }
                    (Cond::Create, None)
                }
            };
            let next = Pointer {
                schema: crate::record::SCHEMA.into(),
                kind: "data-pointer".into(),
                session: session.to_string(),
                epoch,
                // The data stays what the last run published until this one
                // publishes: readers keep seeing it.
                key: key_now,
                nonce: crate::clock::OsEntropy::new().hex_id(),
            };
            use crate::clock::Entropy as _;
            match crate::fleet::put_checked(
                &store,
                &key,
                next.encode(),
                cond,
                &next.nonce,
                crate::fleet::json_nonce,
            )
            .await?
            {
                crate::fleet::Put::Committed(v) => {
                    return Ok(FencedData {
                        store,
                        session: session.clone(),
                        epoch,
                        version: v,
                        pointer: next,
                    });
                }
                crate::fleet::Put::Rejected(_) => continue, // read again, decide again
            }
        }
        Err(Error::Conflict { key })
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The key `rel` has under this run's prefix.
    pub fn key(&self, rel: &str) -> Result<String> {
        check_rel(rel)?;
        Ok(format!("{}{rel}", epoch_prefix(&self.session, self.epoch)))
    }

    /// Writes `bytes` as `rel` under this run's prefix, once (objects are
    /// immutable: a name already written is `Conflict`; write each version
    /// under a new name). Not visible to readers until
    /// [`publish`](Self::publish)ed. Returns its key.
    pub async fn put(&self, rel: &str, bytes: Bytes) -> Result<String> {
        let key = self.key(rel)?;
        // Written once: a published object is what readers see, and even
        // its own run, once superseded, must not change it under them.
        match self.store.put(&key, bytes, Cond::Create).await {
            Ok(_) => Ok(key),
            Err(e) if e.is_rejection() => Err(Error::Conflict { key }),
            Err(e) => Err(Error::from_store("put", &key, e)),
        }
    }

    /// Makes `rel` (written by [`put`](Self::put)) the session's current
    /// object: asks `gate` first (when given), then writes the pointer on
    /// the version this run holds. Refused (`Fenced`) when the gate says
    /// no, or the pointer changed since (a later run opened it).
    pub async fn publish(&mut self, rel: &str, gate: Option<&dyn AckGate>) -> Result<()> {
        let object = self.key(rel)?;
        if let Some(g) = gate {
            g.ack().await?;
        }
        let key = pointer_key(&self.session);
        let next = Pointer {
            key: Some(object),
            nonce: {
                use crate::clock::Entropy as _;
                crate::clock::OsEntropy::new().hex_id()
            },
            ..self.pointer.clone()
        };
        match crate::fleet::put_checked(
            &self.store,
            &key,
            next.encode(),
            Cond::Match(self.version.clone()),
            &next.nonce,
            crate::fleet::json_nonce,
        )
        .await?
        {
            crate::fleet::Put::Committed(v) => {
                self.version = v;
                self.pointer = next;
                Ok(())
            }
            crate::fleet::Put::Rejected(now) => {
                let why = match now.map(|(b, _)| Pointer::decode(&key, &self.session, &b)) {
                    // Another handle of this same run published first: not
                    // a fence, a race to open again.
                    Some(Ok(p)) if p.epoch == self.epoch => {
                        return Err(Error::Conflict { key });
                    }
                    Some(Ok(p)) => format!("its data pointer now names epoch {}", p.epoch),
                    Some(Err(e)) => format!("its data pointer was overwritten ({e})"),
                    None => "its data pointer was deleted".into(),
                };
                Err(fenced(&self.session, self.epoch, why))
            }
        }
    }
}

fn fenced(session: &Name, epoch: u64, reason: String) -> Error {
    Error::Lost {
        key: pointer_key(session),
        epoch,
        reason,
    }
}

/// The highest epoch with objects under `data/<session>/` (one listing).
async fn highest_epoch(store: &Arc<dyn Store>, session: &Name) -> Result<Option<u64>> {
    use futures::StreamExt;
    let prefix = format!("{DATA}{session}/e");
    let mut list = store.list(&prefix);
    let mut highest = None;
    while let Some(e) = list.next().await {
        let e = e.map_err(|e| Error::from_store("list", &prefix, e))?;
        if let Some(n) = key_epoch(session, &e.key) {
            highest = Some(highest.map_or(n, |h: u64| h.max(n)));
        }
    }
    Ok(highest)
}

async fn read(store: &Arc<dyn Store>, session: &Name) -> Result<Option<(Pointer, Version)>> {
    let key = pointer_key(session);
    match store
        .get(&key)
        .await
        .map_err(|e| Error::from_store("get", &key, e))?
    {
        None => Ok(None),
        Some(o) => Ok(Some((Pointer::decode(&key, session, &o.bytes)?, o.version))),
    }
}

/// What a reader sees of a session's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// The epoch that published it.
    pub epoch: u64,
    pub key: String,
    pub bytes: Bytes,
}

/// The session's current object: the pointer's, read through it. None
/// before anything was published. A pointer to an object that is missing is
/// `Data` (corrupt), as is a corrupt or foreign pointer.
pub async fn current(store: &Arc<dyn Store>, session: &Name) -> Result<Option<Current>> {
    let Some((p, _)) = read(store, session).await? else {
        return Ok(None);
    };
    let Some(key) = p.key else {
        return Ok(None);
    };
    // The epoch that published it is the one its prefix names (a later
    // run that opened but has not published keeps it visible).
    let epoch = key_epoch(session, &key).unwrap_or(p.epoch);
    match store
        .get(&key)
        .await
        .map_err(|e| Error::from_store("get", &key, e))?
    {
        Some(o) => Ok(Some(Current {
            epoch,
            key,
            bytes: o.bytes,
        })),
        None => Err(Error::corrupt(
            pointer_key(session),
            format!("names {key}, which does not exist"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ObjectStoreBackend;

    struct Gate(bool);

    #[async_trait::async_trait]
    impl AckGate for Gate {
        async fn ack(&self) -> Result<()> {
            if self.0 {
                Ok(())
            } else {
                Err(Error::Lost {
                    key: "sessions/web".into(),
                    epoch: 1,
                    reason: "its claim names n2".into(),
                })
            }
        }
    }

    fn store() -> Arc<dyn Store> {
        Arc::new(ObjectStoreBackend::memory())
    }

    #[tokio::test]
    async fn a_superseded_run_never_publishes_and_readers_never_see_it() {
        let s = store();
        let web = Name::new("web").unwrap();
        let mut old = FencedData::open(s.clone(), &web, 1).await.unwrap();
        old.put("state.json", Bytes::from("v1")).await.unwrap();
        old.publish("state.json", Some(&Gate(true))).await.unwrap();
        let c = current(&s, &web).await.unwrap().unwrap();
        assert_eq!((c.epoch, &c.bytes[..]), (1, &b"v1"[..]));
        // A takeover at epoch 2 opens the data: the old run's writes in its
        // own prefix go on landing, but it can never publish again.
        let mut new = FencedData::open(s.clone(), &web, 2).await.unwrap();
        // Published objects are written once, even by their own run.
        let e = old
            .put("state.json", Bytes::from("v1-stale"))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Conflict);
        old.put("state-2.json", Bytes::from("v1-stale"))
            .await
            .unwrap();
        let e = old
            .publish("state-2.json", Some(&Gate(true)))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Fenced, "{e}");
        assert!(
            e.to_string().contains("epoch 2") || format!("{e:?}").contains("epoch 2"),
            "{e:?}"
        );
        // Readers still see epoch 1's last publish (not the stale write),
        // until epoch 2 publishes.
        let c = current(&s, &web).await.unwrap().unwrap();
        assert_eq!((c.epoch, &c.bytes[..]), (1, &b"v1"[..]));
        new.put("state.json", Bytes::from("v2")).await.unwrap();
        new.publish("state.json", None).await.unwrap();
        let c = current(&s, &web).await.unwrap().unwrap();
        assert_eq!((c.epoch, &c.bytes[..]), (2, &b"v2"[..]));
        // An older run that opens late is refused at once.
        let e = FencedData::open(s.clone(), &web, 1).await.unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Fenced);
        // Even with the pointer deleted by hand: epoch 2's objects are there.
        s.delete(&pointer_key(&web)).await.unwrap();
        let e = FencedData::open(s.clone(), &web, 1).await.unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Fenced, "{e:?}");
        // The same run opening again carries on.
        let again = FencedData::open(s.clone(), &web, 2).await.unwrap();
        assert_eq!(again.epoch(), 2);
    }

    #[tokio::test]
    async fn the_gate_saying_no_publishes_nothing() {
        let s = store();
        let web = Name::new("web").unwrap();
        let mut run = FencedData::open(s.clone(), &web, 3).await.unwrap();
        run.put("a", Bytes::from("x")).await.unwrap();
        let e = run.publish("a", Some(&Gate(false))).await.unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Fenced);
        assert_eq!(current(&s, &web).await.unwrap(), None);
    }

    #[tokio::test]
    async fn bad_names_and_foreign_pointers_are_refused_and_kept() {
        let s = store();
        let web = Name::new("web").unwrap();
        let run = FencedData::open(s.clone(), &web, 1).await.unwrap();
        for rel in ["", "../x", "a//b", "a/./b", "a b", "é", &"x".repeat(600)] {
            assert_eq!(
                run.key(rel).unwrap_err().kind(),
                crate::ErrorKind::Invalid,
                "{rel:?}"
            );
        }
        let key = pointer_key(&web);
        for bytes in [
            &b"not json"[..],
            br#"{"schema":"leasehold/v1","kind":"data-pointer","session":"api","epoch":1,"nonce":"n"}"#,
            br#"{"schema":"leasehold/v1","kind":"data-pointer","session":"web","epoch":1,"key":"data/web/e9/x","nonce":"n"}"#,
            br#"{"schema":"leasehold/v1","kind":"data-pointer","session":"web","epoch":0,"nonce":"n"}"#,
        ] {
            let cond = match s.get(&key).await.unwrap() {
                Some(o) => Cond::Match(o.version),
                None => Cond::Create,
            };
            s.put(&key, Bytes::from(bytes.to_vec()), cond).await.unwrap();
            let e = FencedData::open(s.clone(), &web, 5).await.unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
            assert_eq!(current(&s, &web).await.unwrap_err().kind(), crate::ErrorKind::Data);
            let kept = s.get(&key).await.unwrap().unwrap();
            assert_eq!(&kept.bytes[..], bytes, "left as it was");
        }
    }
}
