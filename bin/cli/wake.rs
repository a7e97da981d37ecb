//! `leasehold wake NAME`: wake a session and wait until it is ready (a
//! live owner runs it and its health check, if any, passes); and
//! `leasehold sleep`, a session's request to fall asleep.

use super::{Failure, StoreArgs, hinting, open, print_json};
use leasehold::clock::{Clock, SystemClock};
use leasehold::wake::{Ready, Resolver};
use leasehold::{Error, Name};
use std::time::Duration;

pub async fn wake(
    name: String,
    store: &StoreArgs,
    wait: Duration,
    token_file: Option<&std::path::Path>,
    json: bool,
    max_skew: Duration,
) -> Result<(), Failure> {
    let name = Name::new(name)?;
    // Its wake request is a claim write: hinted, so nodes see it at once.
    let store = hinting(open(store).await?);
    let mut resolver = Resolver::new(store).with_max_skew(max_skew);
    if let Some(f) = token_file {
        resolver = resolver.with_token(leasehold::http::read_token(f)?);
    }
    let clock = SystemClock::new();
    let start = clock.now();
    match resolver.wake_ready(&name, wait).await? {
        Ready::Ready {
            node,
            epoch,
            endpoint,
            address,
            woken,
        } => {
            let took = clock.now().saturating_since(start);
            if json {
                print_json(&serde_json::json!({
                    "name": name.as_str(), "ready": true, "node": node, "epoch": epoch,
                    "endpoint": endpoint, "address": address, "woken": woken,
                    "took_ms": took.as_millis() as u64,
                }));
            } else {
                println!(
                    "{name}: running on {node}, epoch {epoch}{}{} (ready in {:.2}s)",
                    endpoint
                        .as_ref()
                        .map(|e| format!(" at {e}"))
                        .unwrap_or_default(),
                    if woken { ", woken" } else { "" },
                    took.as_secs_f64()
                );
            }
            Ok(())
        }
        Ready::NotFound => Err(Error::NotFound {
            key: leasehold::keys::manifest(&name),
        }
        .into()),
        Ready::Declined { reason } => {
            println!("{name}: not woken: {reason}");
            Err(Failure::Held)
        }
        Ready::TimedOut { last } => {
            println!(
                "{name}: not ready after {} ({last})",
                humantime::format_duration(wait)
            );
            Err(Failure::Held)
        }
        other => {
            println!("{name}: {other:?}");
            Err(Failure::Held)
        }
    }
}

pub async fn sleep() -> Result<(), Failure> {
    let c = leasehold::fleet::channel::client::SessionClient::from_env()?;
    c.sleep().await?;
    Ok(())
}
