//! Manifests: `manifests/<name>`, the desired session.
//!
//! Admission is idempotent, like `kubectl apply` of an unchanged object:
//! creating is create-if-absent with the spec's digest stored beside it; the
//! same name with the same digest answers with the existing manifest; a
//! different digest is a typed `Conflict` with nothing changed; replacing
//! requires the current version (If-Match).

use super::{Put, json_nonce, put_checked};
use crate::clock::Entropy;
use crate::error::{Error, Result};
use crate::name::Name;
use crate::record::SCHEMA;
use crate::store::{Cond, Store, Version};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Largest encoded manifest.
pub const MAX_MANIFEST_BYTES: usize = 64 * 1024;

/// What to do when a session's process exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum RestartPolicy {
    /// Restart on any exit (a service).
    Always,
    /// Restart on a non-zero exit; a zero exit completes the session.
    #[default]
    OnFailure,
    /// Never restart; the exit completes the session.
    Never,
}

impl RestartPolicy {
    /// The word manifests use (`on-failure`), as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "always",
            RestartPolicy::OnFailure => "on-failure",
            RestartPolicy::Never => "never",
        }
    }
}

/// A session's restart rule, as Nomad's `restart` block and Kubernetes'
/// `restartPolicy` with a Job's `backoffLimit` have it: the policy, how many
/// restarts before it gives up, and the back-off between them.
///
/// Written as the plain policy (`"restart": "always"`) or as an object
/// (`"restart": {"policy": "on-failure", "attempts": 3, "window": "10m",
/// "delay": "1s", "max_delay": "1m"}`). A rule with nothing but its policy
/// is stored as the plain word, so a spec's digest is what it was before
/// the object form existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Restart {
    pub policy: RestartPolicy,
    /// Restarts allowed (within `window` when set, else over the run's
    /// life) before the session is failed with reason "gave up after N
    /// restarts". Default: 6 for `on-failure` (Kubernetes' `backoffLimit`),
    /// no limit for `always`.
    pub attempts: Option<u32>,
    /// The window `attempts` counts in (restarts seen by the node running
    /// it; a takeover starts a new count).
    pub window: Option<std::time::Duration>,
    /// The first back-off after quick exits (default 250 ms): the first
    /// quick exit restarts at once, then `delay`, doubling.
    pub delay: Option<std::time::Duration>,
    /// The longest back-off (default 30 s).
    pub max_delay: Option<std::time::Duration>,
}

/// The default first back-off and its cap (as Kubernetes' CrashLoopBackOff,
/// on a shorter scale).
pub const DEFAULT_RESTART_DELAY: std::time::Duration = std::time::Duration::from_millis(250);
pub const DEFAULT_RESTART_MAX_DELAY: std::time::Duration = std::time::Duration::from_secs(30);
/// Restarts an `on-failure` session gets by default before it gives up.
pub const DEFAULT_ON_FAILURE_ATTEMPTS: u32 = 6;

impl From<RestartPolicy> for Restart {
    fn from(policy: RestartPolicy) -> Self {
        Restart {
            policy,
            ..Restart::default()
        }
    }
}

impl Restart {
    /// Restarts allowed before giving up (None: no limit).
    pub fn attempts(&self) -> Option<u32> {
        self.attempts.or(match self.policy {
            RestartPolicy::OnFailure => Some(DEFAULT_ON_FAILURE_ATTEMPTS),
            _ => None,
        })
    }

    pub fn delay(&self) -> std::time::Duration {
        self.delay.unwrap_or(DEFAULT_RESTART_DELAY)
    }

    pub fn max_delay(&self) -> std::time::Duration {
        self.max_delay.unwrap_or(DEFAULT_RESTART_MAX_DELAY)
    }

    /// Only the policy: stored as the plain word.
    fn plain(&self) -> bool {
        self.attempts.is_none()
            && self.window.is_none()
            && self.delay.is_none()
            && self.max_delay.is_none()
    }

    fn validate(&self) -> std::result::Result<(), (&'static str, String)> {
        use std::time::Duration;
        if self.policy == RestartPolicy::Never && !self.plain() {
            return Err((
                "restart",
                "attempts, window, delay and max_delay mean nothing with policy never".into(),
            ));
        }
        if let Some(a) = self.attempts
            && a > 10_000
        {
            return Err(("restart.attempts", "at most 10000".into()));
        }
        if let Some(w) = self.window
            && !(Duration::from_secs(1)..=Duration::from_secs(30 * 86_400)).contains(&w)
        {
            return Err(("restart.window", "from 1s to 30 days".into()));
        }
        for (field, d) in [
            ("restart.delay", self.delay),
            ("restart.max_delay", self.max_delay),
        ] {
            if let Some(d) = d
                && d > Duration::from_secs(3600)
            {
                return Err((field, "at most 1h".into()));
            }
        }
        if self.max_delay() < self.delay() {
            return Err((
                "restart.max_delay",
                "must not be below restart.delay".into(),
            ));
        }
        Ok(())
    }

    /// How the rule reads in `describe`: `on-failure (6 attempts, back-off
    /// 250ms to 30s)`.
    pub fn describe(&self) -> String {
        if self.policy == RestartPolicy::Never {
            return "never".into();
        }
        let attempts = match (self.attempts(), self.window) {
            (None, _) => "no limit".to_string(),
            (Some(a), None) => format!("{a} attempts"),
            (Some(a), Some(w)) => format!("{a} attempts in {}", humantime::format_duration(w)),
        };
        format!(
            "{} ({attempts}, back-off {} to {})",
            self.policy.as_str(),
            humantime::format_duration(self.delay()),
            humantime::format_duration(self.max_delay())
        )
    }
}

/// The object form's fields (durations as `humantime` strings: "250ms",
/// "10m").
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RestartObject {
    #[serde(default)]
    policy: RestartPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attempts: Option<u32>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_duration"
    )]
    window: Option<std::time::Duration>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_duration"
    )]
    delay: Option<std::time::Duration>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_duration"
    )]
    max_delay: Option<std::time::Duration>,
}

impl Serialize for Restart {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        if self.plain() {
            return self.policy.serialize(s);
        }
        RestartObject {
            policy: self.policy,
            attempts: self.attempts,
            window: self.window,
            delay: self.delay,
            max_delay: self.max_delay,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Restart {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Restart;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "always, on-failure, never, or {policy, attempts, window, delay, max_delay}",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Restart, E> {
                RestartPolicy::deserialize(serde::de::value::StrDeserializer::<E>::new(v))
                    .map(Restart::from)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> std::result::Result<Restart, A::Error> {
                let o =
                    RestartObject::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(Restart {
                    policy: o.policy,
                    attempts: o.attempts,
                    window: o.window,
                    delay: o.delay,
                    max_delay: o.max_delay,
                })
            }
        }
        d.deserialize_any(V)
    }
}

/// The desired session. Unknown fields are refused (a typo is not silently
/// ignored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Program for the exec runner (looked up in PATH).
    pub command: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Only nodes whose labels include all of these.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
    /// Ranked ahead of other eligible nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_nodes: Vec<String>,
    #[serde(default)]
    pub restart: Restart,
    #[serde(default)]
    pub paused: bool,
    /// The user the session runs as: a name or a numeric id, looked up on
    /// the node (see [`super::identity`]). Default: the node's session user
    /// (`nobody` on a node running as root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The session's group: a name or a numeric id. Default: the user's
    /// primary group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The session's working directory, an absolute path that must exist on
    /// the node. Default: the node's working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The signal that asks the session to stop (`SIGTERM` by default; also
    /// `SIGINT`, `SIGQUIT`, `SIGHUP`, `SIGUSR1`, `SIGUSR2`, with or without
    /// the `SIG` prefix), sent to every process of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    /// How long after the stop signal the session is killed (at most 1 h;
    /// default: the node's `--stop-grace`). The lease's deadline binds
    /// before it: a session never outlives the lease that admitted it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_duration"
    )]
    pub stop_grace: Option<std::time::Duration>,
    /// The port the session listens on, on its node's host. Recorded in its
    /// claim as `<node host>:<port>` (its `endpoint`), so `resolve` and the
    /// wake path return the session's own address beside its node's; passed
    /// to the session as LEASEHOLD_PORT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The health check (see [`super::check`]): `starting` until it first
    /// passes, and a run that fails it `threshold` times in a row is
    /// stopped and restarted by its policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<super::check::Check>,
    /// When the session falls asleep (see [`super::sleep`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sleep: Option<super::sleep::SleepRule>,
    /// Run once per tick of this schedule (see [`super::cron`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<super::cron::Schedule>,
    /// Memory, CPU and process limits, enforced through the session's
    /// cgroup (see [`super::limits`]). A node that cannot enforce them does
    /// not start the session, and its reason says why.
    #[serde(default, skip_serializing_if = "super::limits::Limits::is_empty")]
    pub limits: super::limits::Limits,
    /// Set by `leasehold restart` (when, by the operator's wall clock, as
    /// `kubectl rollout restart` stamps its template): a changed value is a
    /// changed spec, so the session runs again, at a higher epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarted_at: Option<String>,
}

pub use super::stop_signal::number as stop_signal_number;

fn label_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
}

impl Spec {
    /// A spec that runs `command` with `args` under the default restart
    /// policy (on-failure), with no env, selector or preference. Set the
    /// other public fields as needed.
    pub fn new(command: impl Into<String>, args: &[&str]) -> Spec {
        Spec {
            command: command.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            env: BTreeMap::new(),
            selector: BTreeMap::new(),
            preferred_nodes: vec![],
            restart: Restart::default(),
            paused: false,
            user: None,
            group: None,
            workdir: None,
            stop_signal: None,
            stop_grace: None,
            port: None,
            check: None,
            sleep: None,
            schedule: None,
            limits: Default::default(),
            restarted_at: None,
        }
    }

    /// The selector as operators write it: `k=v,k2=v2` ("" for none).
    pub fn selector_text(&self) -> String {
        self.selector
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Validates every field; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, reason: &str| Error::invalid(format!("spec.{field}"), reason);
        if self.command.trim().is_empty() {
            return Err(bad("command", "must not be empty"));
        }
        if self.command.len() > 4096 || self.command.contains('\0') {
            return Err(bad("command", "at most 4096 bytes, no NUL"));
        }
        if self.args.len() > 256 {
            return Err(bad("args", "at most 256 arguments"));
        }
        if let Some(i) = self
            .args
            .iter()
            .position(|a| a.len() > 4096 || a.contains('\0'))
        {
            return Err(bad(&format!("args[{i}]"), "at most 4096 bytes, no NUL"));
        }
        if self.env.len() > 256 {
            return Err(bad("env", "at most 256 variables"));
        }
        for (k, v) in &self.env {
            let name_ok = k
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
                && k.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                && k.len() <= 128;
            if !name_ok {
                return Err(bad(
                    &format!("env.{k}"),
                    "names are [A-Z_][A-Z0-9_]*, at most 128 bytes",
                ));
            }
            if k.starts_with("LEASEHOLD_") {
                return Err(bad(&format!("env.{k}"), "LEASEHOLD_* is set by the runner"));
            }
            if v.len() > 4096 || v.contains('\0') {
                return Err(bad(
                    &format!("env.{k}"),
                    "values are at most 4096 bytes, no NUL",
                ));
            }
        }
        for (k, v) in &self.selector {
            if !label_ok(k) || !label_ok(v) {
                return Err(bad(
                    &format!("selector.{k}"),
                    "labels are 1-63 of [A-Za-z0-9._/-]",
                ));
            }
        }
        if self.preferred_nodes.len() > 64 {
            return Err(bad("preferred_nodes", "at most 64 nodes"));
        }
        for n in &self.preferred_nodes {
            Name::new(n.clone()).map_err(|e| bad("preferred_nodes", &e.to_string()))?;
        }
        self.restart
            .validate()
            .map_err(|(field, why)| bad(field, &why))?;
        for (field, v) in [("user", &self.user), ("group", &self.group)] {
            if let Some(v) = v
                && !super::identity::valid_name(v)
            {
                return Err(bad(
                    field,
                    "a name of 1-32 of [a-z_][a-z0-9_-]* (a trailing $ allowed), or a numeric id below 2^31",
                ));
            }
        }
        if let Some(sig) = &self.stop_signal
            && stop_signal_number(sig).is_none()
        {
            return Err(bad(
                "stop_signal",
                "one of SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGUSR1, SIGUSR2 (the SIG prefix is optional)",
            ));
        }
        if let Some(g) = self.stop_grace
            && g > std::time::Duration::from_secs(3600)
        {
            return Err(bad("stop_grace", "at most 1h"));
        }
        if self.port == Some(0) {
            return Err(bad("port", "a port from 1 to 65535"));
        }
        if let Some(r) = &self.sleep {
            r.validate().map_err(|(field, why)| bad(field, &why))?;
        }
        if let Some(s) = &self.schedule {
            s.validate_for(self.restart.policy == RestartPolicy::Always)
                .map_err(|(field, why)| bad(field, &why))?;
        }
        if let Some(c) = &self.check {
            c.validate(self.port)
                .map_err(|(field, why)| bad(field, &why))?;
        }
        self.limits
            .validate()
            .map_err(|(field, why)| bad(field, &why))?;
        if let Some(r) = &self.restarted_at
            && !crate::record::printable(r, 64)
        {
            return Err(bad("restarted_at", "1-64 printable characters"));
        }
        if let Some(w) = &self.workdir {
            if !w.starts_with('/') {
                return Err(bad("workdir", "must be an absolute path"));
            }
            if w.len() > 4096 || w.contains('\0') || w.chars().any(char::is_control) {
                return Err(bad(
                    "workdir",
                    "at most 4096 bytes, no NUL or control characters",
                ));
            }
        }
        Ok(())
    }

    /// SHA-256 of the canonical JSON encoding (maps are ordered), hex.
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let bytes = serde_json::to_vec(self).expect("spec serialises");
        hex::encode(sha2::Sha256::digest(&bytes))
    }

    /// Parses a spec from user input (JSON), validating it.
    pub fn parse(bytes: &[u8]) -> Result<Spec> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(Error::TooLarge {
                what: "manifest spec".into(),
                size: bytes.len(),
                limit: MAX_MANIFEST_BYTES,
            });
        }
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let spec: Spec = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let what = if path == "." {
                "spec".to_string()
            } else {
                format!("spec.{path}")
            };
            Error::invalid(what, e.into_inner().to_string())
        })?;
        spec.validate()?;
        Ok(spec)
    }
}

/// The stored manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestRecord {
    pub schema: String,
    pub kind: String,
    pub name: String,
    pub digest: String,
    pub spec: Spec,
    /// The operator's labels, for grouping (`ls -l team=a`). Beside the
    /// spec, not in it: they are not part of the digest, so relabelling a
    /// session writes a new version of its manifest but never runs it
    /// again (as relabelling a Kubernetes pod does not restart it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
    pub nonce: String,
}

/// A manifest's labels: `k=v` pairs, keys and values 1-63 of
/// `[A-Za-z0-9._/-]`, at most [`MAX_LABELS`].
pub type Labels = BTreeMap<String, String>;

/// Most labels on one manifest.
pub const MAX_LABELS: usize = 64;

/// Checks a manifest's labels; the error names the label.
pub fn validate_labels(labels: &Labels) -> Result<()> {
    if labels.len() > MAX_LABELS {
        return Err(Error::invalid(
            "labels",
            format!("at most {MAX_LABELS} labels"),
        ));
    }
    for (k, v) in labels {
        if !label_ok(k) || !label_ok(v) {
            return Err(Error::invalid(
                format!("labels.{k}"),
                "keys and values are 1-63 of [A-Za-z0-9._/-]",
            ));
        }
    }
    Ok(())
}

impl ManifestRecord {
    /// The record `apply` stores for `spec` under `name`, with `labels`.
    pub fn new(name: &Name, spec: &Spec, labels: &Labels, nonce: String) -> Self {
        ManifestRecord {
            schema: SCHEMA.into(),
            kind: "manifest".into(),
            name: name.to_string(),
            digest: spec.digest(),
            spec: spec.clone(),
            labels: labels.clone(),
            nonce,
        }
    }

    /// Its size as `apply` stores it (with a nonce of the usual length),
    /// for checking a batch against [`MAX_MANIFEST_BYTES`] before any of
    /// it is written.
    pub fn stored_len(name: &Name, spec: &Spec, labels: &Labels) -> usize {
        let rec = ManifestRecord::new(name, spec, labels, "0".repeat(16));
        serde_json::to_vec(&rec).map_or(0, |b| b.len())
    }

    pub fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        let corrupt = |r: String| Error::corrupt(key, r);
        let r: ManifestRecord =
            crate::record::decode_as(key, bytes, "manifest", MAX_MANIFEST_BYTES, "manifest")?;
        r.spec.validate().map_err(|e| corrupt(e.to_string()))?;
        validate_labels(&r.labels).map_err(|e| corrupt(e.to_string()))?;
        if r.digest != r.spec.digest() {
            return Err(corrupt("digest does not match the spec".into()));
        }
        if key.rsplit('/').next() != Some(r.name.as_str()) {
            return Err(corrupt(format!("name {:?} does not match the key", r.name)));
        }
        Ok(r)
    }
}

/// The key of manifest `name`.
pub fn key(name: &Name) -> String {
    crate::keys::manifest(name)
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Created(Version),
    /// Same name, same digest: nothing written.
    Unchanged(Version),
    Replaced(Version),
}

/// Creates manifest `name` or, if it exists with the same digest, answers
/// `Unchanged`. A different digest is `Conflict` and nothing changes; pass
/// `replace` (the current version) to replace it.
pub async fn apply(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    name: &Name,
    spec: &Spec,
    replace: Option<&Version>,
) -> Result<Applied> {
    apply_labelled(store, entropy, name, spec, &Labels::new(), replace).await
}

/// As [`apply`], with the manifest's `labels`. A manifest is unchanged when
/// both its spec and its labels are; a change of labels alone is a replace
/// (a new version, the same digest: the session is not run again).
pub async fn apply_labelled(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    name: &Name,
    spec: &Spec,
    labels: &Labels,
    replace: Option<&Version>,
) -> Result<Applied> {
    spec.validate()?;
    validate_labels(labels)?;
    let key = key(name);
    let rec = ManifestRecord::new(name, spec, labels, entropy.hex_id());
    let bytes = serde_json::to_vec(&rec).expect("manifest serialises");
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(Error::TooLarge {
            what: "manifest".into(),
            size: bytes.len(),
            limit: MAX_MANIFEST_BYTES,
        });
    }
    let cond = match replace {
        Some(v) => Cond::Match(v.clone()),
        None => Cond::Create,
    };
    let current = store
        .get(&key)
        .await
        .map_err(|e| Error::from_store("get", &key, e))?;
    // The same spec is already there: nothing to write. Answered from the
    // read, not from a refused create: a refused write is still hinted in
    // the change feed and rings the bell (a retried write may have landed;
    // see `feed::HintingStore`), so an apply loop of unchanged manifests (a
    // GitOps controller) woke every node each round. With `--replace`
    // too: a replace by the same spec changes nothing, and says so.
    if let Some(o) = &current
        && let Ok(m) = ManifestRecord::decode(&key, &o.bytes)
        && m.digest == rec.digest
        && m.labels == rec.labels
    {
        return Ok(Applied::Unchanged(o.version.clone()));
    }
    let exists = current.is_some();
    if replace.is_none() && !exists {
        // The claim object first (create-if-absent; an existing claim or
        // tombstone stays as it is), then the manifest: a session never
        // exists without one (see `ClaimRecord::placeholder`). Never for a
        // manifest that exists: a placeholder over a deleted claim would
        // read as "never claimed" to a node that did not see the claim.
        let ckey = crate::keys::session(name);
        let tomb = super::claim::ClaimRecord::placeholder(entropy.hex_id(), 0);
        match store
            .put(&ckey, Bytes::from(tomb.encode()), Cond::Create)
            .await
        {
            Ok(_) | Err(crate::store::StoreError::AlreadyExists) => {}
            // Landed or not, a read-back settles it: the claim exists or
            // the next apply writes it.
            Err(crate::store::StoreError::Ambiguous { .. }) => {}
            Err(e) => return Err(Error::from_store("put", &ckey, e)),
        }
    }
    match put_checked(
        store,
        &key,
        Bytes::from(bytes),
        cond,
        &rec.nonce,
        json_nonce,
    )
    .await?
    {
        Put::Committed(v) if replace.is_some() => Ok(Applied::Replaced(v)),
        Put::Committed(v) => Ok(Applied::Created(v)),
        Put::Rejected(Some((bytes, version))) => {
            let existing = ManifestRecord::decode(&key, &bytes)?;
            if replace.is_none() && existing.digest == rec.digest && existing.labels == rec.labels {
                Ok(Applied::Unchanged(version))
            } else if replace.is_none() {
                Err(Error::SpecDiffers { key })
            } else {
                Err(Error::Conflict { key })
            }
        }
        Put::Rejected(None) => Err(Error::NotFound { key }),
    }
}

/// What [`edit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edited {
    /// The spec changed: written at this version.
    Changed(Version),
    /// The edit asked for nothing new: nothing written.
    Unchanged,
}

/// Changes manifest `name`'s spec with `change` (which answers whether it
/// changed anything): read, changed, written back with If-Match. A write
/// that loses to a concurrent one reads and tries again (up to 5 times),
/// so an operator's verb never overwrites a change it did not see. The
/// operator verbs `pause`, `resume` and `restart` are this.
pub async fn edit(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    name: &Name,
    change: impl Fn(&mut Spec) -> bool,
) -> Result<Edited> {
    for _ in 0..5 {
        let Some((m, version)) = get(store, name).await? else {
            return Err(Error::NotFound { key: key(name) });
        };
        let mut spec = m.spec;
        if !change(&mut spec) {
            return Ok(Edited::Unchanged);
        }
        match apply_labelled(store, entropy, name, &spec, &m.labels, Some(&version)).await {
            Ok(Applied::Replaced(v) | Applied::Created(v) | Applied::Unchanged(v)) => {
                return Ok(Edited::Changed(v));
            }
            Err(Error::Conflict { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Conflict { key: key(name) })
}

/// Reads manifest `name`.
pub async fn get(store: &Arc<dyn Store>, name: &Name) -> Result<Option<(ManifestRecord, Version)>> {
    let key = key(name);
    match store
        .get(&key)
        .await
        .map_err(|e| Error::from_store("get", &key, e))?
    {
        None => Ok(None),
        Some(o) => Ok(Some((ManifestRecord::decode(&key, &o.bytes)?, o.version))),
    }
}

/// Deletes manifest `name`. Its owner stops the session and releases the
/// claim; the claim's tombstone stays, so its epochs never restart.
pub async fn delete(store: &Arc<dyn Store>, name: &Name) -> Result<bool> {
    let key = key(name);
    let existed = store
        .get(&key)
        .await
        .map_err(|e| Error::from_store("get", &key, e))?
        .is_some();
    store
        .delete(&key)
        .await
        .map_err(|e| Error::from_store("delete", &key, e))?;
    Ok(existed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(cmd: &str) -> Spec {
        Spec::new(cmd, &[])
    }

    /// Labels sit beside the spec: a change of labels alone is a replace
    /// with the same digest (the session is not run again), the same labels
    /// are unchanged, other labels without `--replace` differ, an edit
    /// (pause, restart) keeps them, and a bad one writes nothing.
    #[tokio::test]
    async fn labels_are_beside_the_spec() {
        let store: Arc<dyn Store> = Arc::new(crate::store::MemoryStore::new());
        let e = crate::clock::OsEntropy::new();
        let name = Name::new("web").unwrap();
        let s = spec("sleep");
        let labels = |kv: &[(&str, &str)]| -> Labels {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let a = labels(&[("team", "a")]);
        let Applied::Created(v1) = apply_labelled(&store, &e, &name, &s, &a, None)
            .await
            .unwrap()
        else {
            panic!("not created")
        };
        assert!(matches!(
            apply_labelled(&store, &e, &name, &s, &a, None)
                .await
                .unwrap(),
            Applied::Unchanged(_)
        ));
        let b = labels(&[("team", "b")]);
        assert!(matches!(
            apply_labelled(&store, &e, &name, &s, &b, None).await,
            Err(Error::SpecDiffers { .. })
        ));
        assert!(matches!(
            apply_labelled(&store, &e, &name, &s, &b, Some(&v1))
                .await
                .unwrap(),
            Applied::Replaced(_)
        ));
        let (m, _) = get(&store, &name).await.unwrap().unwrap();
        assert_eq!(
            (m.labels.clone(), m.digest.clone()),
            (b.clone(), s.digest())
        );
        edit(&store, &e, &name, |sp| {
            sp.paused = true;
            true
        })
        .await
        .unwrap();
        let (m, _) = get(&store, &name).await.unwrap().unwrap();
        assert!(m.spec.paused);
        assert_eq!(m.labels, b, "an edit kept the labels");
        for bad in [
            labels(&[("team", "has space")]),
            labels(&[("", "x")]),
            labels(&[("k", &"v".repeat(64))]),
        ] {
            let other = Name::new("other").unwrap();
            let r = apply_labelled(&store, &e, &other, &s, &bad, None).await;
            assert!(matches!(r, Err(Error::Invalid { .. })), "{r:?}");
            assert!(get(&store, &other).await.unwrap().is_none());
        }
    }

    #[test]
    fn digest_is_canonical_and_sensitive() {
        let a = spec("sleep");
        assert_eq!(a.digest(), spec("sleep").digest());
        assert_ne!(a.digest(), spec("sleeps").digest());
        assert_eq!(a.digest().len(), 64);
    }

    #[test]
    fn bad_specs_name_the_field() {
        let cases: Vec<(&str, &str)> = vec![
            (r#"{"command":""}"#, "spec.command"),
            (r#"{"command":"x","args":["a\u0000"]}"#, "spec.args[0]"),
            (r#"{"command":"x","env":{"lower":"v"}}"#, "spec.env.lower"),
            (
                r#"{"command":"x","env":{"LEASEHOLD_EPOCH":"1"}}"#,
                "spec.env.LEASEHOLD_EPOCH",
            ),
            (
                r#"{"command":"x","selector":{"zone":""}}"#,
                "spec.selector.zone",
            ),
            (
                r#"{"command":"x","preferred_nodes":["a/b"]}"#,
                "spec.preferred_nodes",
            ),
            (r#"{"command":"x","restart":"sometimes"}"#, "spec.restart"),
            (
                r#"{"command":"x","restart":{"policy":"always","delay":"soon"}}"#,
                "\"soon\" is not a duration",
            ),
            (
                r#"{"command":"x","restart":{"policy":"always","tries":3}}"#,
                "unknown field `tries`",
            ),
            (
                r#"{"command":"x","restart":{"policy":"never","attempts":3}}"#,
                "spec.restart: attempts, window",
            ),
            (
                r#"{"command":"x","restart":{"attempts":10001}}"#,
                "spec.restart.attempts",
            ),
            (
                r#"{"command":"x","restart":{"window":"100ms"}}"#,
                "spec.restart.window",
            ),
            (
                r#"{"command":"x","restart":{"delay":"2h"}}"#,
                "spec.restart.delay",
            ),
            (
                r#"{"command":"x","restart":{"delay":"10s","max_delay":"1s"}}"#,
                "spec.restart.max_delay",
            ),
            (
                r#"{"command":"x","restart":{"attempts":-1}}"#,
                "spec.restart",
            ),
            (r#"{"command":"x","restart":7}"#, "spec.restart"),
            (
                r#"{"command":"x","stop_signal":"SIGKILL"}"#,
                "spec.stop_signal",
            ),
            (r#"{"command":"x","stop_signal":"9"}"#, "spec.stop_signal"),
            (r#"{"command":"x","stop_grace":"2h"}"#, "spec.stop_grace"),
            (r#"{"command":"x","stop_grace":"soon"}"#, "spec.stop_grace"),
            (
                r#"{"command":"x","comand":"typo"}"#,
                "unknown field `comand`",
            ),
            (r#"[1]"#, "invalid spec"),
        ];
        for (json, needle) in cases {
            let e = Spec::parse(json.as_bytes()).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Invalid, "{json}");
            assert!(e.to_string().contains(needle), "{json}: {e}");
        }
        let e = Spec::parse(&vec![b' '; MAX_MANIFEST_BYTES + 1]).unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }));
    }

    /// The plain word stays the stored form (a spec's digest does not
    /// change with the object form's arrival); the object form round-trips
    /// with its durations as written.
    #[test]
    fn restart_rules_in_both_forms() {
        let plain = Spec::parse(br#"{"command":"x","restart":"always"}"#).unwrap();
        assert_eq!(plain.restart, Restart::from(RestartPolicy::Always));
        let v = serde_json::to_value(&plain).unwrap();
        assert_eq!(v["restart"], "always");
        let full = Spec::parse(
            br#"{"command":"x","restart":{"policy":"on-failure","attempts":3,"window":"10m","delay":"1s","max_delay":"1m"}}"#,
        )
        .unwrap();
        use std::time::Duration;
        assert_eq!(
            full.restart,
            Restart {
                policy: RestartPolicy::OnFailure,
                attempts: Some(3),
                window: Some(Duration::from_secs(600)),
                delay: Some(Duration::from_secs(1)),
                max_delay: Some(Duration::from_secs(60)),
            }
        );
        let v = serde_json::to_value(&full).unwrap();
        assert_eq!(
            v["restart"],
            serde_json::json!({"policy": "on-failure", "attempts": 3, "window": "10m", "delay": "1s", "max_delay": "1m"})
        );
        assert_eq!(
            Spec::parse(&serde_json::to_vec(&full).unwrap()).unwrap(),
            full
        );
        // An object with the policy alone is the plain word, digest and all.
        let obj = Spec::parse(br#"{"command":"x","restart":{"policy":"always"}}"#).unwrap();
        assert_eq!(obj.digest(), plain.digest());
        // The defaults, as `describe` says them.
        assert_eq!(
            Restart::default().attempts(),
            Some(DEFAULT_ON_FAILURE_ATTEMPTS)
        );
        assert_eq!(Restart::from(RestartPolicy::Always).attempts(), None);
        assert_eq!(
            Restart::default().describe(),
            "on-failure (6 attempts, back-off 250ms to 30s)"
        );
        assert_eq!(
            full.restart.describe(),
            "on-failure (3 attempts in 10m, back-off 1s to 1m)"
        );
    }
}
