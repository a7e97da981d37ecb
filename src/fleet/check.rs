//! A session's health check: `check: {tcp: PORT} | {http: URL} | {exec:
//! [...]}` with `interval`, `timeout`, `threshold` and `grace`.
//!
//! What it means, as Kubernetes' probes and Nomad's `check_restart` have it:
//! a session with a check is `starting` from each start until its check
//! first passes, then `running`; when it fails `threshold` times in a row
//! (failures within `grace` of the start not counted) the run is
//! `unhealthy`: it is stopped and its restart policy applies, as to a run
//! that failed (a restart, a back-off, or with `never` the end, `failed`
//! with the reason). So "running" means a process runs *and* answers.
//!
//! This file holds the spec type, the rule that turns probe results into
//! transitions ([`Tracker`], pure: no clock, no I/O), and the tcp and http
//! probes. The node runs one probe task per checked run
//! (`fleet::node::checks`); an exec check runs through the runner, as the
//! session's user, in its working directory and cgroups.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Defaults, as Consul's and Nomad's checks.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_THRESHOLD: u32 = 3;

/// What is probed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Probe {
    /// A TCP connect to 127.0.0.1:PORT.
    Tcp(u16),
    /// A GET of an `http://` URL; any 2xx or 3xx answer passes. A path
    /// alone (`/healthz`) is on 127.0.0.1 at the spec's `port`.
    Http(String),
    /// A command run as the session (its user, workdir, environment and
    /// cgroups); exit 0 passes.
    Exec(Vec<String>),
}

/// A session's check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub probe: Probe,
    pub interval: Option<Duration>,
    pub timeout: Option<Duration>,
    pub threshold: Option<u32>,
    /// Failures this soon after a start do not count (a slow starter).
    pub grace: Option<Duration>,
}

impl Check {
    pub fn interval(&self) -> Duration {
        self.interval.unwrap_or(DEFAULT_INTERVAL)
    }
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(DEFAULT_TIMEOUT).min(self.interval())
    }
    pub fn threshold(&self) -> u32 {
        self.threshold.unwrap_or(DEFAULT_THRESHOLD)
    }
    pub fn grace(&self) -> Duration {
        self.grace.unwrap_or(Duration::ZERO)
    }

    /// Bounds and forms; the error names the field (`check.interval`).
    pub fn validate(&self, port: Option<u16>) -> Result<(), (&'static str, String)> {
        match &self.probe {
            Probe::Tcp(0) => return Err(("check.tcp", "a port from 1 to 65535".into())),
            Probe::Tcp(_) => {}
            Probe::Http(u) => {
                if u.starts_with('/') {
                    if port.is_none() {
                        return Err((
                            "check.http",
                            "a path alone needs the spec's port; or write the whole http:// URL"
                                .into(),
                        ));
                    }
                } else {
                    let parsed = url::Url::parse(u)
                        .map_err(|e| ("check.http", format!("{u:?} is not a URL: {e}")))?;
                    if parsed.scheme() != "http" || parsed.host_str().is_none() {
                        return Err((
                            "check.http",
                            "an http:// URL with a host, or a path such as /healthz".into(),
                        ));
                    }
                    // The node sends it: a spec must not aim its node at
                    // other hosts (a cloud's metadata service, an internal
                    // API) and read their answers from its reason.
                    let loopback = match parsed.host() {
                        Some(url::Host::Ipv4(a)) => a.is_loopback(),
                        Some(url::Host::Ipv6(a)) => a.is_loopback(),
                        Some(url::Host::Domain(d)) => d == "localhost",
                        None => false,
                    };
                    if !loopback {
                        return Err((
                            "check.http",
                            "the session's own host only: 127.0.0.1, [::1] or localhost".into(),
                        ));
                    }
                }
                if u.len() > 2048 || u.chars().any(char::is_control) {
                    return Err((
                        "check.http",
                        "at most 2048 bytes, no control characters".into(),
                    ));
                }
            }
            Probe::Exec(argv) => {
                if argv.is_empty() || argv[0].trim().is_empty() {
                    return Err(("check.exec", "a command and its arguments".into()));
                }
                if argv.len() > 64 || argv.iter().any(|a| a.len() > 4096 || a.contains('\0')) {
                    return Err((
                        "check.exec",
                        "at most 64 arguments of 4096 bytes, no NUL".into(),
                    ));
                }
            }
        }
        let ms = Duration::from_millis;
        if let Some(i) = self.interval
            && !(ms(100)..=Duration::from_secs(3600)).contains(&i)
        {
            return Err(("check.interval", "from 100ms to 1h".into()));
        }
        if let Some(t) = self.timeout
            && !(ms(10)..=Duration::from_secs(600)).contains(&t)
        {
            return Err(("check.timeout", "from 10ms to 10m".into()));
        }
        if let Some(n) = self.threshold
            && !(1..=100).contains(&n)
        {
            return Err(("check.threshold", "from 1 to 100".into()));
        }
        if let Some(g) = self.grace
            && g > Duration::from_secs(3600)
        {
            return Err(("check.grace", "at most 1h".into()));
        }
        Ok(())
    }

    /// How `describe` shows it: `tcp 8080 every 10s (timeout 2s, 3 failures)`.
    pub fn describe(&self) -> String {
        let what = match &self.probe {
            Probe::Tcp(p) => format!("tcp {p}"),
            Probe::Http(u) => format!("http {u}"),
            Probe::Exec(a) => format!("exec {}", a.join(" ")),
        };
        format!(
            "{what} every {} (timeout {}, {} failure{}{})",
            humantime::format_duration(self.interval()),
            humantime::format_duration(self.timeout()),
            self.threshold(),
            if self.threshold() == 1 { "" } else { "s" },
            if self.grace().is_zero() {
                String::new()
            } else {
                format!(", grace {}", humantime::format_duration(self.grace()))
            }
        )
    }
}

/// The stored form: one of `tcp`, `http`, `exec`, and the timings as
/// `humantime` strings.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckObject {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tcp: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    http: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exec: Option<Vec<String>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_duration"
    )]
    interval: Option<Duration>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_duration"
    )]
    timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    threshold: Option<u32>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_duration"
    )]
    grace: Option<Duration>,
}

impl Serialize for Check {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (tcp, http, exec) = match &self.probe {
            Probe::Tcp(p) => (Some(*p), None, None),
            Probe::Http(u) => (None, Some(u.clone()), None),
            Probe::Exec(a) => (None, None, Some(a.clone())),
        };
        CheckObject {
            tcp,
            http,
            exec,
            interval: self.interval,
            timeout: self.timeout,
            threshold: self.threshold,
            grace: self.grace,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Check {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let o = CheckObject::deserialize(d)?;
        let probe = match (o.tcp, o.http, o.exec) {
            (Some(p), None, None) => Probe::Tcp(p),
            (None, Some(u), None) => Probe::Http(u),
            (None, None, Some(a)) => Probe::Exec(a),
            _ => {
                return Err(D::Error::custom(
                    "a check is exactly one of {\"tcp\": PORT}, {\"http\": URL}, {\"exec\": [COMMAND, ARGS...]}",
                ));
            }
        };
        Ok(Check {
            probe,
            interval: o.interval,
            timeout: o.timeout,
            threshold: o.threshold,
            grace: o.grace,
        })
    }
}

/// A run's health as its claim records it (absent: no check, or passing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Health {
    /// Started; its check has not passed yet.
    Starting,
    /// Its check failed `threshold` times in a row: being stopped, then
    /// its restart policy applies.
    Unhealthy,
}

/// What a probe result asks of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to write.
    Same,
    /// The check passed where the claim says `starting` (or has not said
    /// `running` since): record it running.
    Passing,
    /// Failed `threshold` times in a row past the grace: record it
    /// unhealthy, stop the run, apply its restart policy.
    Unhealthy { failures: u32, last: String },
}

/// One run's check results, folded: the rule, with nothing but its inputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracker {
    /// Has the claim been told this run passes?
    pub passing: bool,
    /// Failures in a row (counted ones: past the grace).
    pub failures: u32,
    /// Set once the run was found unhealthy: later results change nothing.
    pub done: bool,
}

impl Tracker {
    /// Folds one result. `since_start` is how long the run has run when
    /// the probe ended.
    pub fn after(
        &mut self,
        check: &Check,
        result: &Result<(), String>,
        since_start: Duration,
    ) -> Verdict {
        if self.done {
            return Verdict::Same;
        }
        match result {
            Ok(()) => {
                self.failures = 0;
                if self.passing {
                    Verdict::Same
                } else {
                    self.passing = true;
                    Verdict::Passing
                }
            }
            Err(_) if since_start < check.grace() => Verdict::Same,
            Err(why) => {
                self.failures += 1;
                if self.failures >= check.threshold() {
                    self.done = true;
                    Verdict::Unhealthy {
                        failures: self.failures,
                        last: why.clone(),
                    }
                } else {
                    Verdict::Same
                }
            }
        }
    }
}

/// The reason an unhealthy run carries: `unhealthy: check failed 3 times
/// (tcp 8080: connection refused)`.
pub fn unhealthy_reason(check: &Check, failures: u32, last: &str) -> String {
    let what = match &check.probe {
        Probe::Tcp(p) => format!("tcp {p}"),
        Probe::Http(u) => format!("http {u}"),
        Probe::Exec(a) => format!("exec {}", a.first().map_or("", |s| s.as_str())),
    };
    let mut last: String = last.chars().filter(|c| !c.is_control()).take(300).collect();
    if last.is_empty() {
        last = "failed".into();
    }
    format!(
        "unhealthy: check failed {failures} time{} in a row ({what}: {last})",
        if failures == 1 { "" } else { "s" }
    )
}

/// A TCP connect to 127.0.0.1:`port` within `timeout`.
#[allow(clippy::disallowed_methods)] // an I/O bound on a probe, not protocol time
pub async fn probe_tcp(port: u16, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(("127.0.0.1", port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.kind().to_string()),
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        )),
    }
}

/// A GET of `url` (a path alone: on 127.0.0.1 at `port`) within `timeout`;
/// a 2xx or 3xx answer passes (redirects are not followed).
pub async fn probe_http(
    client: &reqwest::Client,
    url: &str,
    port: Option<u16>,
    timeout: Duration,
) -> Result<(), String> {
    let url = match (url.starts_with('/'), port) {
        (true, Some(p)) => format!("http://127.0.0.1:{p}{url}"),
        _ => url.to_string(),
    };
    match client.get(&url).timeout(timeout).send().await {
        Ok(r) if r.status().is_success() || r.status().is_redirection() => Ok(()),
        Ok(r) => Err(format!("HTTP {}", r.status().as_u16())),
        Err(e) if e.is_timeout() => Err(format!(
            "no answer within {}",
            humantime::format_duration(timeout)
        )),
        Err(e) if e.is_connect() => Err("connection refused".into()),
        Err(_) => Err("request failed".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str) -> Result<Check, String> {
        let c: Check = serde_json::from_str(json).map_err(|e| e.to_string())?;
        c.validate(None).map_err(|(f, w)| format!("{f}: {w}"))?;
        Ok(c)
    }

    #[test]
    fn forms_and_bounds() {
        let c = check(r#"{"tcp": 8080, "interval": "1s", "threshold": 2}"#).unwrap();
        assert_eq!(c.probe, Probe::Tcp(8080));
        assert_eq!(c.describe(), "tcp 8080 every 1s (timeout 1s, 2 failures)");
        let round: Check = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(round, c);
        assert!(check(r#"{"http": "http://127.0.0.1:1/h"}"#).is_ok());
        assert!(check(r#"{"exec": ["true"]}"#).is_ok());
        for (json, field) in [
            (r#"{"tcp": 0}"#, "check.tcp"),
            (r#"{"http": "ftp://x/"}"#, "check.http"),
            (r#"{"http": "/healthz"}"#, "check.http"),
            (
                r#"{"http": "http://169.254.169.254/latest/meta-data/"}"#,
                "check.http",
            ),
            (r#"{"http": "http://10.0.0.1:80/"}"#, "check.http"),
            (r#"{"exec": []}"#, "check.exec"),
            (r#"{"tcp": 1, "interval": "1ms"}"#, "check.interval"),
            (r#"{"tcp": 1, "threshold": 0}"#, "check.threshold"),
        ] {
            let e = check(json).unwrap_err();
            assert!(e.starts_with(field), "{json}: {e}");
        }
        for json in [
            r#"{"tcp": 70000}"#,
            r#"{"tcp": -1}"#,
            r#"{"tcp": 1, "http": "http://h/"}"#,
            r#"{}"#,
            r#"{"tcp": 1, "interval": "soon"}"#,
            r#"{"grpc": 1}"#,
        ] {
            assert!(check(json).is_err(), "{json} accepted");
        }
        // A path alone is fine with the spec's port.
        let c: Check = serde_json::from_str(r#"{"http": "/healthz"}"#).unwrap();
        assert!(c.validate(Some(8080)).is_ok());
    }

    /// The rule, as a table: starting until the first pass; a pass after
    /// failures resets the count; failures within the grace do not count;
    /// `threshold` failures in a row are unhealthy, once.
    #[test]
    fn the_rule() {
        let c = Check {
            probe: Probe::Tcp(1),
            interval: None,
            timeout: None,
            threshold: Some(2),
            grace: Some(Duration::from_secs(5)),
        };
        let s = Duration::from_secs;
        let bad: Result<(), String> = Err("connection refused".into());
        let mut t = Tracker::default();
        assert_eq!(t.after(&c, &bad, s(1)), Verdict::Same, "within the grace");
        assert_eq!(t.after(&c, &bad, s(2)), Verdict::Same, "within the grace");
        assert_eq!(t.failures, 0);
        assert_eq!(t.after(&c, &Ok(()), s(3)), Verdict::Passing);
        assert_eq!(t.after(&c, &Ok(()), s(4)), Verdict::Same, "written once");
        assert_eq!(t.after(&c, &bad, s(10)), Verdict::Same, "one failure");
        assert_eq!(t.after(&c, &Ok(()), s(11)), Verdict::Same, "reset");
        assert_eq!(t.after(&c, &bad, s(12)), Verdict::Same);
        assert_eq!(
            t.after(&c, &bad, s(13)),
            Verdict::Unhealthy {
                failures: 2,
                last: "connection refused".into()
            }
        );
        assert_eq!(t.after(&c, &bad, s(14)), Verdict::Same, "once");
        assert_eq!(t.after(&c, &Ok(()), s(15)), Verdict::Same, "too late");
        // Never passing counts too: a run that never comes up is
        // unhealthy past its grace.
        let mut t = Tracker::default();
        t.after(&c, &bad, s(6));
        assert!(matches!(t.after(&c, &bad, s(7)), Verdict::Unhealthy { .. }));
        assert_eq!(
            unhealthy_reason(&c, 2, "connection\nrefused"),
            "unhealthy: check failed 2 times in a row (tcp 1: connectionrefused)"
        );
    }
}
