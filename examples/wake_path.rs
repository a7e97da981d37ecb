//! A service that finds a session's owner in one round trip, the way a
//! request router embeds leasehold: resolve the session's claim (one GET,
//! conditional on repeat), then wake it (the owner's API must answer).
//!
//! ```sh
//! cargo run --example wake_path -- file:///tmp/fleet web
//! ```
//!
//! It only reads the bucket: no node runs here, nothing is claimed.

use leasehold::store::{OpenOptions, open_store};
use leasehold::wake::{Owned, Resolver, WakeOutcome};
use std::time::Duration;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(name)) = (args.next(), args.next()) else {
        eprintln!("usage: wake_path STORE_URL SESSION");
        std::process::exit(2);
    };
    let store = open_store(&url, &OpenOptions::default()).await?;
    let resolver = Resolver::new(store);
    let name = leasehold::Name::new(name)?;

    // One GET of sessions/<name>: who owns it, at which epoch (its fencing
    // token), and where its owner's API is.
    let r = resolver.resolve(&name).await?;
    match &r.owner {
        Owned::Claimed {
            node,
            address,
            epoch,
            status,
            ..
        } => println!(
            "{name}: {} on {node} at epoch {epoch}, owner API {}",
            status.as_str(),
            address.as_deref().unwrap_or("(none published)")
        ),
        Owned::Released { epoch } => println!("{name}: released at epoch {epoch}, queued"),
        Owned::Unowned => println!("{name}: queued, never claimed"),
        Owned::NoManifest => println!("{name}: no such session"),
        other => println!("{name}: {other:?}"),
    }

    // The owner must answer itself (a frozen node's kernel still accepts
    // TCP): only then is the session's owner reachable.
    let w = resolver.wake(&name, Duration::from_secs(1)).await?;
    match w.outcome {
        WakeOutcome::Reachable { node, address, .. } => {
            println!("route requests for {name} to {node} at {address}")
        }
        other => println!("not routable now: {other:?}"),
    }
    Ok(())
}
