//! `leasehold apply`, and the nudges that follow a change.

use super::*;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManifestFile {
    name: String,
    spec: leasehold::fleet::manifest::Spec,
}

pub(super) async fn apply(
    file: &str,
    store: &StoreArgs,
    replace: bool,
    token_file: Option<&std::path::Path>,
    json: bool,
    max_skew: Duration,
) -> Result<(), Failure> {
    use leasehold::fleet::manifest::{self, Applied, Spec};
    use std::io::Read;
    let mut bytes = Vec::new();
    let limit = manifest::MAX_MANIFEST_BYTES as u64 + 1;
    let read = if file == "-" {
        std::io::stdin().take(limit).read_to_end(&mut bytes)
    } else {
        std::fs::File::open(file).and_then(|f| f.take(limit).read_to_end(&mut bytes))
    };
    read.map_err(|e| Error::invalid("manifest file", format!("{file}: {e}")))?;
    if bytes.len() > manifest::MAX_MANIFEST_BYTES {
        return Err(Error::invalid(
            "manifest file",
            format!(
                "{file} is larger than the limit of {} KiB ({} bytes)",
                manifest::MAX_MANIFEST_BYTES / 1024,
                manifest::MAX_MANIFEST_BYTES
            ),
        )
        .into());
    }
    // Parsed once, from the file itself: an error names the field's path
    // (`spec.restart`) and the line and column in *this* file.
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    let parsed: ManifestFile = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let at = if path == "." {
            String::new()
        } else {
            format!(" at {path}")
        };
        Error::invalid("manifest file", format!("{file}{at}: {inner}"))
    })?;
    let name = Name::new(parsed.name)?;
    let spec: Spec = parsed.spec;
    spec.validate()?;
    let store = if replace {
        open_for_match(store).await?
    } else {
        open(store).await?
    };
    let current = if replace {
        manifest::get(&store, &name).await?.map(|(_, v)| v)
    } else {
        None
    };
    let entropy = OsEntropy::new();
    let r = manifest::apply(&store, &entropy, &name, &spec, current.as_ref()).await?;
    let (what, version) = match &r {
        Applied::Created(v) => ("created", v),
        Applied::Unchanged(v) => ("unchanged", v),
        Applied::Replaced(v) => ("replaced", v),
    };
    // Nudge the nodes placement ranks first (best effort, with a token).
    let mut nudged = Vec::new();
    if token_file.is_some()
        && !matches!(r, Applied::Unchanged(_))
        && let Ok(Some((m, _))) = manifest::get(&store, &name).await
    {
        for id in ranked_for(&store, &m, max_skew).await {
            if nudge_nodes(&store, token_file, std::slice::from_ref(&id)).await > 0 {
                nudged.push(id);
            }
        }
    }
    if json {
        print_json(
            &serde_json::json!({"key": leasehold::keys::manifest(name), "result": what, "digest": spec.digest(), "version": version, "nudged": nudged}),
        );
    } else {
        println!(
            "{} {what} (digest {}){}",
            leasehold::keys::manifest(name),
            &spec.digest()[..12],
            if !nudged.is_empty() {
                format!("; nudged {}", nudged.join(", "))
            } else if matches!(r, Applied::Unchanged(_)) {
                String::new()
            } else if token_file.is_none() {
                "; the fleet picks it up at its next pass (up to the ttl when idle; --token-file nudges it)".into()
            } else {
                "; no node answered the nudge: the fleet picks it up at its next pass".into()
            }
        );
    }
    Ok(())
}

/// Best effort: asks nodes `ids` (their live records' addresses) to look at
/// the bucket now (`POST /v1/nudge`), when a token file is at hand. Returns
/// how many answered. Never an error: the bucket stays the truth, and a lost
/// nudge only means the node notices at its own pace.
pub(crate) async fn nudge_nodes(
    store: &Arc<dyn Store>,
    token_file: Option<&std::path::Path>,
    ids: &[String],
) -> usize {
    let Some(tf) = token_file else {
        return 0;
    };
    let token = match leasehold::http::read_token(tf) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("warning: not nudging: {e}");
            return 0;
        }
    };
    let Ok(nudge) = leasehold::fleet::nudge::HttpNudge::new(&token) else {
        return 0;
    };
    let mut n = 0;
    for id in ids.iter().take(8) {
        let key = leasehold::keys::node(id);
        let Ok(Some(o)) = store.get(&key).await else {
            continue;
        };
        let Ok(r) = leasehold::record::LeaseRecord::decode(&key, &o.bytes, Kind::Node) else {
            continue;
        };
        if r.released {
            continue;
        }
        use leasehold::fleet::nudge::NudgeAnswer;
        match nudge.send(id, r.address.as_deref()).await {
            NudgeAnswer::Answered => n += 1,
            // The write landed; only the nudge failed, and for a reason the
            // operator can fix (the wrong token file): say so, never the token.
            NudgeAnswer::Refused(status @ (401 | 403)) => eprintln!(
                "warning: node {id} refused the token from {} (HTTP {status}): not nudged",
                tf.display()
            ),
            _ => {}
        }
    }
    n
}

/// The nodes placement ranks first for `m` (at most two), from the node
/// records by wall clock: whom `apply` nudges.
pub(super) async fn ranked_for(
    store: &Arc<dyn Store>,
    m: &leasehold::fleet::manifest::ManifestRecord,
    max_skew: Duration,
) -> Vec<String> {
    use futures::StreamExt;
    use leasehold::fleet::explain::NodeFacts;
    let now = SystemClock::new().wall_ms();
    let mut views = Vec::new();
    let mut list = store.list(leasehold::keys::NODES);
    let mut keys = Vec::new();
    while let Some(Ok(e)) = list.next().await {
        keys.push(e.key);
    }
    for k in keys.iter().take(1000) {
        if let Ok(Some(o)) = store.get(k).await
            && let Ok(r) = leasehold::record::LeaseRecord::decode(k, &o.bytes, Kind::Node)
        {
            let f = NodeFacts::from_record(r, now, max_skew);
            views.push(leasehold::fleet::plan::NodeView {
                id: f.record.holder.node.clone(),
                instance: f.record.holder.instance.clone(),
                capacity: if f.cordoned { 0 } else { f.capacity },
                load: f.load,
                labels: f.labels.clone(),
                live: f.liveness == leasehold::liveness::Liveness::Live,
                unproven: leasehold::fleet::attrs::NodeAttrs::of(&f.record).unproven,
            });
        }
    }
    let mv = leasehold::fleet::node::manifest_view(m);
    leasehold::fleet::plan::rank(&mv, &views)
        .into_iter()
        .take(2)
        .map(|n| n.id.clone())
        .collect()
}
