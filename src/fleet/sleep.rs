//! Sleep: a session with no process and no owner, its epoch kept, until a
//! wake request (`leasehold wake`, [`crate::wake::Resolver::wake`]) releases
//! its claim to be placed again, at a higher epoch.
//!
//! A session falls asleep (its owner stops it and writes its claim
//! `sleeping`, naming no node) when:
//! - its run exits with the code its spec names (`sleep: {on_exit: 75}`);
//! - it asks, on its node's channel (`leasehold sleep` inside a session,
//!   `POST /v1/self/sleep`);
//! - no wake request has reached its owner for `after_idle` (a request
//!   router calls wake before it routes to the session, as the wake path
//!   does; the owner counts from the run's start and from each wake that
//!   reaches it). Checked at each of the owner's passes: a session falls
//!   asleep within `after_idle` plus one pass interval.
//!
//! Asleep, it costs nothing per session: no process, no node lists it as
//! its own, and placement never claims it (`plan::claimable`).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A spec's `sleep` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SleepRule {
    /// Asleep once no wake request reached its owner for this long.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_duration"
    )]
    pub after_idle: Option<Duration>,
    /// Asleep when its run exits with this code (instead of its restart
    /// policy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_exit: Option<i32>,
}

impl SleepRule {
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.after_idle.is_none() && self.on_exit.is_none() {
            return Err((
                "sleep",
                "name after_idle (a duration), on_exit (an exit code), or both".into(),
            ));
        }
        if let Some(d) = self.after_idle
            && !(Duration::from_secs(1)..=Duration::from_secs(30 * 86_400)).contains(&d)
        {
            return Err(("sleep.after_idle", "from 1s to 30 days".into()));
        }
        if let Some(c) = self.on_exit
            && !(1..=255).contains(&c)
        {
            return Err((
                "sleep.on_exit",
                "an exit code from 1 to 255 (0 is success)".into(),
            ));
        }
        Ok(())
    }

    /// How `describe` shows it.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(d) = self.after_idle {
            parts.push(format!("after {} idle", humantime::format_duration(d)));
        }
        if let Some(c) = self.on_exit {
            parts.push(format!("on exit {c}"));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_and_bounds() {
        let r: SleepRule = serde_json::from_str(r#"{"after_idle": "5m", "on_exit": 75}"#).unwrap();
        assert!(r.validate().is_ok());
        assert_eq!(r.describe(), "after 5m idle, on exit 75");
        for json in [
            r#"{}"#,
            r#"{"after_idle": "10ms"}"#,
            r#"{"on_exit": 0}"#,
            r#"{"on_exit": 300}"#,
        ] {
            let r: SleepRule = serde_json::from_str(json).unwrap();
            assert!(r.validate().is_err(), "{json}");
        }
        for json in [r#"{"after_idle": "soon"}"#, r#"{"nap": "1s"}"#] {
            assert!(serde_json::from_str::<SleepRule>(json).is_err(), "{json}");
        }
    }
}
