//! `leasehold apply`, and the nudges that follow a change.

use super::*;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManifestFile {
    name: String,
    /// For grouping (`ls -l k=v`); not part of the spec's digest.
    #[serde(default)]
    labels: leasehold::fleet::manifest::Labels,
    spec: leasehold::fleet::manifest::Spec,
}

/// Most bytes read from one manifest file (or stdin): many manifests
/// each up to `MAX_MANIFEST_BYTES`.
const MAX_FILE_BYTES: usize = 8 << 20;

/// One manifest as read, with where it came from for messages
/// (`web.yaml`, `all.yaml (document 3)`, `list.json at [2]`).
pub(crate) struct Source {
    pub(crate) from: String,
    pub(crate) manifest: ManifestFile,
}

/// The files `paths` name: files as given, directories as their `*.json`,
/// `*.yaml` and `*.yml` in name order (not recursive), `-` as stdin.
fn expand(paths: &[String]) -> Result<Vec<String>, Error> {
    if paths.is_empty() {
        return Err(Error::invalid(
            "manifest file",
            "none given: `leasehold apply FILE` or `-f FILE|DIR|-` (repeatable)",
        ));
    }
    let mut out = Vec::new();
    for p in paths {
        let path = std::path::Path::new(p);
        if p != "-" && path.is_dir() {
            // Every entry is looked at: one that cannot be read, or a
            // manifest name that is not a regular file (a FIFO would block
            // the read, a dangling link fail it), is refused with its
            // name, not skipped in silence (nothing is written either way).
            let mut found = Vec::new();
            let entries = std::fs::read_dir(path)
                .map_err(|e| Error::invalid("manifest directory", format!("{p}: {e}")))?;
            for entry in entries {
                let entry =
                    entry.map_err(|e| Error::invalid("manifest directory", format!("{p}: {e}")))?;
                let f = entry.path();
                let manifest_name = f.extension().and_then(|x| x.to_str()).is_some_and(|x| {
                    matches!(x.to_ascii_lowercase().as_str(), "json" | "yaml" | "yml")
                });
                if !manifest_name {
                    continue;
                }
                // Followed, as `cat` would (a link to a manifest is one).
                match std::fs::metadata(&f) {
                    Ok(m) if m.is_file() => found.push(f.display().to_string()),
                    Ok(_) => {
                        return Err(Error::invalid(
                            "manifest directory",
                            format!("{} is not a regular file", f.display()),
                        ));
                    }
                    Err(e) => {
                        return Err(Error::invalid(
                            "manifest directory",
                            format!("{}: {e}", f.display()),
                        ));
                    }
                }
            }
            found.sort();
            if found.is_empty() {
                return Err(Error::invalid(
                    "manifest directory",
                    format!("{p} holds no *.json, *.yaml or *.yml file"),
                ));
            }
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    if out.iter().filter(|p| *p == "-").count() > 1 {
        return Err(Error::invalid("manifest file", "stdin (-) given twice"));
    }
    Ok(out)
}

/// The manifests of one file: JSON (an object, or an array of them) or
/// YAML (one or more documents). By extension; stdin and other names by
/// their first character (`{` or `[` is JSON). Every error names the file,
/// the document and the field.
fn parse_file(file: &str, bytes: &[u8]) -> Result<Vec<Source>, Error> {
    // A UTF-8 byte order mark (some editors write one) is not content.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let lower = file.to_ascii_lowercase();
    let yaml = if lower.ends_with(".json") {
        false
    } else if lower.ends_with(".yaml") || lower.ends_with(".yml") {
        true
    } else {
        !matches!(
            bytes.iter().find(|b| !b.is_ascii_whitespace()),
            Some(b'{') | Some(b'[')
        )
    };
    let at = |path: String| {
        if path == "." {
            String::new()
        } else {
            format!(" at {path}")
        }
    };
    if !yaml {
        // Parsed once, from the file itself: an error names the field's
        // path (`spec.restart`, `[2].name`) and the line and column in
        // *this* file.
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let bad = |e: serde_path_to_error::Error<serde_json::Error>| {
            let path = e.path().to_string();
            Error::invalid(
                "manifest file",
                format!("{file}{}: {}", at(path), e.into_inner()),
            )
        };
        // An array of manifests, or one.
        // Nothing may follow the value (two objects back to back would
        // otherwise apply the first alone).
        let trailing = |de: &mut serde_json::Deserializer<serde_json::de::SliceRead<'_>>| {
            de.end()
                .map_err(|e| Error::invalid("manifest file", format!("{file}: {e}")))
        };
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            let ms: Vec<ManifestFile> = serde_path_to_error::deserialize(&mut *de).map_err(bad)?;
            trailing(de)?;
            if ms.is_empty() {
                return Err(Error::invalid(
                    "manifest file",
                    format!("{file} holds no manifest (an empty array)"),
                ));
            }
            return Ok(ms
                .into_iter()
                .enumerate()
                .map(|(i, m)| Source {
                    from: format!("{file} at [{i}]"),
                    manifest: m,
                })
                .collect());
        }
        let m: ManifestFile = serde_path_to_error::deserialize(&mut *de).map_err(bad)?;
        trailing(de)?;
        return Ok(vec![Source {
            from: file.to_string(),
            manifest: m,
        }]);
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| Error::invalid("manifest file", format!("{file}: not UTF-8 text: {e}")))?;
    // No alias at all: a manifest never needs one, and an alias is how a
    // small file expands into gigabytes (the budget refuses it at once).
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! { max_aliases: 0 },
    };
    let docs: Vec<ManifestFile> =
        serde_saphyr::from_multiple_with_options(text, options).map_err(|e| {
            // Its first line says where and what; the rest is a snippet of
            // the file, which the terminal does not need twice.
            let full = e.to_string();
            let first = full
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            let why = if first.contains("budget breached") {
                " (anchors and aliases, `&name` and `*name`, are not accepted in manifests)"
            } else {
                ""
            };
            Error::invalid("manifest file", format!("{file}: {first}{why}"))
        })?;
    let n = docs.len();
    let mut out = Vec::new();
    for (i, m) in docs.into_iter().enumerate() {
        out.push(Source {
            from: if n == 1 {
                file.to_string()
            } else {
                format!("{file} (document {})", i + 1)
            },
            manifest: m,
        });
    }
    if out.is_empty() {
        return Err(Error::invalid(
            "manifest file",
            format!("{file} holds no manifest"),
        ));
    }
    Ok(out)
}

/// Reads every manifest `paths` name, and checks each (name, spec) before
/// anything is written: one bad document writes nothing.
pub(crate) fn read_manifests(paths: &[String]) -> Result<Vec<Source>, Error> {
    use leasehold::fleet::manifest;
    use std::io::Read;
    let mut all = Vec::new();
    for file in expand(paths)? {
        let mut bytes = Vec::new();
        let limit = MAX_FILE_BYTES as u64 + 1;
        let read = if file == "-" {
            std::io::stdin().take(limit).read_to_end(&mut bytes)
        } else {
            std::fs::File::open(&file).and_then(|f| f.take(limit).read_to_end(&mut bytes))
        };
        let shown = if file == "-" { "stdin" } else { file.as_str() };
        read.map_err(|e| Error::invalid("manifest file", format!("{shown}: {e}")))?;
        if bytes.len() > MAX_FILE_BYTES {
            return Err(Error::invalid(
                "manifest file",
                format!(
                    "{shown} is larger than the limit of {} MiB ({MAX_FILE_BYTES} bytes)",
                    MAX_FILE_BYTES >> 20
                ),
            ));
        }
        for s in parse_file(shown, &bytes)? {
            let name = Name::new(s.manifest.name.as_str())
                .map_err(|e| Error::invalid("manifest file", format!("{}: {e}", s.from)))?;
            // Measured as it will be stored (name, digest and nonce beside
            // the spec), so nothing refuses it after earlier ones are written.
            let size =
                manifest::ManifestRecord::stored_len(&name, &s.manifest.spec, &s.manifest.labels);
            if size > manifest::MAX_MANIFEST_BYTES {
                return Err(Error::invalid(
                    "manifest file",
                    format!(
                        "{}: the manifest {name} is larger than the limit of {} KiB ({} bytes) as stored",
                        s.from,
                        manifest::MAX_MANIFEST_BYTES / 1024,
                        manifest::MAX_MANIFEST_BYTES
                    ),
                ));
            }
            // After the size: a manifest too large says so, whatever else
            // is wrong in it.
            s.manifest
                .spec
                .validate()
                .and_then(|()| manifest::validate_labels(&s.manifest.labels))
                .map_err(|e| Error::invalid("manifest file", format!("{}: {e}", s.from)))?;
            if all
                .iter()
                .any(|o: &Source| o.manifest.name == s.manifest.name)
            {
                return Err(Error::invalid(
                    "manifest file",
                    format!("{}: {name} is given twice", s.from),
                ));
            }
            all.push(s);
        }
    }
    Ok(all)
}

pub(super) async fn apply(
    paths: &[String],
    store: &StoreArgs,
    replace: bool,
    token_file: Option<&std::path::Path>,
    json: bool,
    max_skew: Duration,
) -> Result<(), Failure> {
    let sources = read_manifests(paths)?;
    let store = if replace {
        open_for_match(store).await?
    } else {
        open(store).await?
    };
    // As kubectl: one manifest the store refuses (a different spec there,
    // a lost race) does not stop the others; each says what came of it,
    // and the command fails with the first error.
    let mut answers = Vec::new();
    let mut first_error = None;
    let many = sources.len() > 1;
    for s in sources {
        let key = leasehold::keys::manifest(s.manifest.name.as_str());
        match apply_one(s.manifest, &store, replace, token_file, json, max_skew).await {
            Ok(a) => answers.push(a),
            Err(Failure::Error(e)) => {
                if json {
                    answers.push(serde_json::json!({
                        "key": key, "result": "error", "error": e.to_string(),
                    }));
                } else if many {
                    eprintln!("{key}: {e}");
                }
                first_error.get_or_insert(e);
            }
            Err(other) => return Err(other),
        }
    }
    if json {
        match answers.len() {
            1 => print_json(&answers[0]),
            _ => print_json(&serde_json::Value::Array(answers)),
        }
    }
    match first_error {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// Applies one manifest (already checked); prints its line, or returns its
/// JSON answer.
async fn apply_one(
    parsed: ManifestFile,
    store: &Arc<dyn Store>,
    replace: bool,
    token_file: Option<&std::path::Path>,
    json: bool,
    max_skew: Duration,
) -> Result<serde_json::Value, Failure> {
    use leasehold::fleet::manifest::{self, Applied, Spec};
    let name = Name::new(parsed.name)?;
    let spec: Spec = parsed.spec;
    spec.validate()?;
    let current = if replace {
        manifest::get(store, &name).await?.map(|(_, v)| v)
    } else {
        None
    };
    let entropy = OsEntropy::new();
    let r = manifest::apply_labelled(
        store,
        &entropy,
        &name,
        &spec,
        &parsed.labels,
        current.as_ref(),
    )
    .await?;
    let (what, version) = match &r {
        Applied::Created(v) => ("created", v),
        Applied::Unchanged(v) => ("unchanged", v),
        Applied::Replaced(v) => ("replaced", v),
    };
    // Nudge the nodes placement ranks first (best effort, with a token).
    let mut nudged = Vec::new();
    if token_file.is_some()
        && !matches!(r, Applied::Unchanged(_))
        && let Ok(Some((m, _))) = manifest::get(store, &name).await
    {
        for id in ranked_for(store, &m, max_skew).await {
            if nudge_nodes(store, token_file, std::slice::from_ref(&id)).await > 0 {
                nudged.push(id);
            }
        }
    }
    let answer = serde_json::json!({"key": leasehold::keys::manifest(&name), "result": what, "digest": spec.digest(), "version": version, "nudged": nudged});
    if !json {
        println!(
            "{} {what} (digest {}){}",
            leasehold::keys::manifest(name),
            &spec.digest()[..12],
            if !nudged.is_empty() {
                format!("; nudged {}", nudged.join(", "))
            } else if matches!(r, Applied::Unchanged(_)) {
                String::new()
            } else if token_file.is_none() {
                "; the fleet picks it up when its nodes next read the bell (every ttl/6; --token-file nudges them at once)".into()
            } else {
                "; no node answered the nudge: the fleet picks it up at its next pass".into()
            }
        );
    }
    Ok(answer)
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
