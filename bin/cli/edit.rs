//! `leasehold pause`, `resume` and `restart`: edits of a manifest.

use super::*;

/// The operator verbs that edit a manifest's spec.
#[derive(Clone, Copy)]
pub(crate) enum Verb {
    Pause,
    Resume,
    Restart,
}

/// `pause`, `resume` and `restart`: one If-Match edit of the manifest
/// (`manifest::edit`), then a nudge of the owner when a token is given.
pub(super) async fn edit_verb(
    name: &str,
    store: &StoreArgs,
    token_file: Option<&std::path::Path>,
    verb: Verb,
) -> Result<(), Failure> {
    use leasehold::fleet::manifest::{Edited, edit};
    let name = Name::new(name.to_string())?;
    let store = open(store).await?;
    let entropy = leasehold::clock::OsEntropy::new();
    // Stamped once, so every retry of the edit writes the same spec.
    let wall_ms = leasehold::clock::SystemClock::new().wall_ms();
    let stamp =
        humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(wall_ms))
            .to_string();
    let edited = edit(&store, &entropy, &name, |spec| match verb {
        Verb::Pause => !std::mem::replace(&mut spec.paused, true),
        Verb::Resume => std::mem::replace(&mut spec.paused, false),
        Verb::Restart => {
            spec.restarted_at = Some(stamp.clone());
            true
        }
    })
    .await?;
    let (done, already) = match verb {
        Verb::Pause => ("paused", "is already paused"),
        Verb::Resume => ("resumed", "is not paused"),
        Verb::Restart => ("restarted", ""),
    };
    match edited {
        Edited::Unchanged => println!("{name} {already}"),
        Edited::Changed(_) => {
            let owner = leasehold::fleet::claim::get(&store, name.as_str())
                .await
                .ok()
                .flatten()
                .map(|(c, _)| c.owner.node)
                .filter(|n| {
                    n != leasehold::fleet::claim::QUEUED && n != leasehold::fleet::claim::VANISHED
                });
            let nudged = match owner {
                Some(o) => nudge_nodes(&store, token_file, &[o]).await,
                None => 0,
            };
            println!(
                "{done} {name}{}",
                if nudged > 0 { " (owner nudged)" } else { "" }
            );
        }
    }
    Ok(())
}
