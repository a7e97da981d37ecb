//! Completion of session and node names from the store (issue #44), as
//! kubectl completes pod names: `source <(COMPLETE=bash leasehold)` (zsh,
//! fish, elvish and powershell alike) registers clap_complete's dynamic
//! completion, which calls this binary back with the words typed so far.
//!
//! A name is completed from one listing of `manifests/` (sessions) or
//! `nodes/` (nodes) under the typed prefix, in the store that
//! `LEASEHOLD_STORE` or the config file names (a `--store` typed on the
//! same line is not seen by the completer). Completion never blocks a
//! shell for long and never prints an error into it: a store that is not
//! set, not reachable within [`BUDGET`] or not readable completes nothing.

use clap_complete::engine::CompletionCandidate;
use std::ffi::OsStr;
use std::time::Duration;

/// The most a completion waits for the store.
const BUDGET: Duration = Duration::from_secs(2);

/// Most names offered.
const MAX_NAMES: usize = 1000;

/// Session names (manifests) starting with what is typed.
pub(crate) fn sessions(current: &OsStr) -> Vec<CompletionCandidate> {
    names(leasehold::keys::MANIFESTS, current)
}

/// Node ids starting with what is typed.
pub(crate) fn nodes(current: &OsStr) -> Vec<CompletionCandidate> {
    names(leasehold::keys::NODES, current)
}

fn names(segment: &str, current: &OsStr) -> Vec<CompletionCandidate> {
    let Some(typed) = current.to_str() else {
        return Vec::new();
    };
    let Ok(url) = std::env::var("LEASEHOLD_STORE") else {
        return Vec::new();
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    let listed = rt.block_on(async {
        // Not protocol time: how long a shell waits for a suggestion.
        #[allow(clippy::disallowed_methods)]
        tokio::time::timeout(BUDGET, list(&url, segment, typed))
            .await
            .ok()
            .flatten()
    });
    listed
        .unwrap_or_default()
        .into_iter()
        .map(CompletionCandidate::new)
        .collect()
}

async fn list(url: &str, segment: &str, typed: &str) -> Option<Vec<String>> {
    use futures::StreamExt;
    // As every command opens it (a missing file:// root is not created).
    let args = super::StoreArgs {
        store: Some(url.to_string()),
        endpoint: None,
        request_timeout: BUDGET,
    };
    let store = super::open(&args).await.ok()?;
    let prefix = format!("{segment}{typed}");
    let mut entries = store.list(&prefix);
    let mut out = Vec::new();
    while let Some(e) = entries.next().await {
        let e = e.ok()?;
        let name = leasehold::keys::tail(segment, &e.key);
        // Only our own names (a foreign object is not offered).
        if leasehold::Name::new(name).is_ok() && !name.contains('/') {
            out.push(name.to_string());
        }
        if out.len() >= MAX_NAMES {
            break;
        }
    }
    Some(out)
}
