//! `leasehold fence check|ack`: a shell session's way to ask its node
//! whether its run still holds its claim (see `leasehold::fleet::channel`).
//! Exit 0: yes; 3: no (the run was superseded or stopped, or its node's
//! lease is too short for the margin); 4: no answer (the node is frozen or
//! gone: do not acknowledge); 2: not inside a session; 8: the credential
//! was refused.

use super::{Failure, print_json};
use leasehold::fleet::channel::client::SessionClient;
use std::time::Duration;

pub async fn check(json: bool) -> Result<(), Failure> {
    let c = SessionClient::from_env()?;
    let v = c.check().await?;
    if json {
        print_json(&serde_json::to_value(&v).expect("json"));
    } else {
        println!(
            "{} epoch {} on {}: running, the node's lease valid for {}",
            v.session,
            v.epoch,
            v.node,
            humantime::format_duration(Duration::from_millis(v.valid_for_ms))
        );
    }
    Ok(())
}

pub async fn ack(margin: Duration, json: bool) -> Result<(), Failure> {
    let c = SessionClient::from_env()?;
    let a = c.ack(margin).await?;
    if json {
        print_json(&serde_json::to_value(&a).expect("json"));
    } else {
        println!(
            "{} epoch {}: acknowledged (the claim names this run; the node's lease valid for {})",
            a.session,
            a.epoch,
            humantime::format_duration(Duration::from_millis(a.valid_for_ms.unwrap_or(0)))
        );
    }
    Ok(())
}
