//! The session's side of the channel (see [`super`]): asks its node about
//! its own run.

use super::{AckAnswer, ENV_SOCKET, ENV_TOKEN, SelfView};
use crate::error::{Error, Result};
use crate::store::StoreError;
use axum::http::{Method, Request, StatusCode, header};
use std::time::Duration;

/// How long a call may take before it counts as no answer (a frozen node
/// answers nothing: that is a no, never a wait for ever).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A run's client of its node's channel.
#[derive(Clone)]
pub struct SessionClient {
    address: String,
    token: String,
    /// The epoch the run believes it holds (LEASEHOLD_EPOCH): an ack must
    /// be for it.
    epoch: Option<u64>,
    timeout: Duration,
}

impl std::fmt::Debug for SessionClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionClient")
            .field("address", &self.address)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl SessionClient {
    /// The client of the run this process belongs to, from its
    /// environment (`LEASEHOLD_NODE_SOCKET`, `LEASEHOLD_RUN_TOKEN`,
    /// `LEASEHOLD_EPOCH`).
    pub fn from_env() -> Result<SessionClient> {
        let var = |k: &str| {
            std::env::var(k).map_err(|_| {
                Error::invalid(
                    k.to_string(),
                    "not set: this is not a session run by a leasehold node with a session channel",
                )
            })
        };
        let epoch = std::env::var("LEASEHOLD_EPOCH")
            .ok()
            .map(|e| {
                e.parse::<u64>()
                    .map_err(|_| Error::invalid("LEASEHOLD_EPOCH", "not a number"))
            })
            .transpose()?;
        Ok(SessionClient {
            address: var(ENV_SOCKET)?,
            token: var(ENV_TOKEN)?,
            epoch,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// A client of the channel at `address` with `token`.
    pub fn new(address: impl Into<String>, token: impl Into<String>) -> SessionClient {
        SessionClient {
            address: address.into(),
            token: token.into(),
            epoch: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The epoch an ack must be for.
    pub fn with_epoch(mut self, epoch: u64) -> Self {
        self.epoch = Some(epoch);
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The run as its node sees it. Errors: the run ended (`Fenced`), the
    /// credential is unknown (`Permission`), no answer (`Unavailable`).
    pub async fn check(&self) -> Result<SelfView> {
        let (status, body) = self.call(Method::GET, "/v1/self").await?;
        match status {
            StatusCode::OK => parse(&body),
            s => Err(self.refusal(s, &body)),
        }
    }

    /// The ack gate: Ok only if the node read the claim and it still names
    /// this run, with the node's lease valid for `margin` after the read.
    /// A no is `Fenced` with the node's reason.
    pub async fn ack(&self, margin: Duration) -> Result<AckAnswer> {
        let mut path = format!(
            "/v1/self/ack?margin={}ms",
            u64::try_from(margin.as_millis()).unwrap_or(u64::MAX)
        );
        if let Some(e) = self.epoch {
            path.push_str(&format!("&epoch={e}"));
        }
        let (status, body) = self.call(Method::POST, &path).await?;
        match status {
            StatusCode::OK => {
                let a: AckAnswer = parse(&body)?;
                let short = a
                    .valid_for_ms
                    .is_none_or(|v| u128::from(v) < margin.as_millis());
                if !a.ack {
                    Err(self.lost(a.reason.unwrap_or_default()))
                } else if short || self.epoch.is_some_and(|e| e != a.epoch) {
                    // Whatever answered, its yes does not cover this run for
                    // the margin asked: not a yes.
                    Err(self.lost(format!(
                        "the answer does not cover epoch {:?} for {margin:?}",
                        self.epoch
                    )))
                } else {
                    Ok(a)
                }
            }
            StatusCode::CONFLICT => {
                let a: AckAnswer = parse(&body)?;
                Err(self.lost(a.reason.unwrap_or_else(|| "refused".into())))
            }
            s => Err(self.refusal(s, &body)),
        }
    }

    /// Asks the node to put this run to sleep (its run is then stopped).
    pub async fn sleep(&self) -> Result<()> {
        self.sleep_then_wake(None).await
    }

    /// As [`sleep`](Self::sleep), and to be woken `after` from now: the
    /// node sets the alarm once the session is asleep.
    pub async fn sleep_then_wake(&self, after: Option<std::time::Duration>) -> Result<()> {
        let path = match after {
            Some(d) => format!(
                "/v1/self/sleep?wake_in={}ms",
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
            ),
            None => "/v1/self/sleep".to_string(),
        };
        let (status, body) = self.call(Method::POST, &path).await?;
        match status {
            StatusCode::ACCEPTED | StatusCode::OK => Ok(()),
            StatusCode::CONFLICT | StatusCode::BAD_REQUEST => {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                Err(Error::invalid(
                    "sleep",
                    v["message"].as_str().unwrap_or("refused").to_string(),
                ))
            }
            s => Err(self.refusal(s, &body)),
        }
    }

    /// Sets an alarm for this session `after` from now (`POST
    /// /v1/self/alarm`): a node wakes it then if it is asleep. Returns the
    /// alarm's key. Refused (typed) when the spec has no sleep rule.
    pub async fn alarm_in(&self, after: std::time::Duration) -> Result<String> {
        let path = format!(
            "/v1/self/alarm?in={}ms",
            u64::try_from(after.as_millis()).unwrap_or(u64::MAX)
        );
        let (status, body) = self.call(Method::POST, &path).await?;
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        match status {
            StatusCode::CREATED | StatusCode::OK => {
                Ok(v["alarm"].as_str().unwrap_or("").to_string())
            }
            StatusCode::CONFLICT
            | StatusCode::BAD_REQUEST
            | StatusCode::NOT_FOUND
            | StatusCode::TOO_MANY_REQUESTS => Err(Error::invalid(
                "alarm",
                v["message"].as_str().unwrap_or("refused").to_string(),
            )),
            s => Err(self.refusal(s, &body)),
        }
    }

    fn lost(&self, reason: String) -> Error {
        Error::Lost {
            key: std::env::var("LEASEHOLD_SESSION")
                .map(crate::keys::session)
                .unwrap_or_else(|_| "sessions/?".into()),
            epoch: self.epoch.unwrap_or(0),
            reason,
        }
    }

    fn refusal(&self, status: StatusCode, body: &[u8]) -> Error {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let message = v["message"]
            .as_str()
            .unwrap_or("no message")
            .chars()
            .filter(|c| !c.is_control())
            .take(500)
            .collect::<String>();
        match status {
            StatusCode::GONE => self.lost(message),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Error::Denied {
                what: "the run credential".into(),
                reason: message,
            },
            StatusCode::BAD_REQUEST => Error::invalid("session channel request", message),
            s => unavailable(format!("the node answered HTTP {}: {message}", s.as_u16())),
        }
    }

    #[allow(clippy::disallowed_methods)] // an I/O bound on a local call, not protocol time
    async fn call(&self, method: Method, path: &str) -> Result<(StatusCode, bytes::Bytes)> {
        let work = async {
            let stream = connect(&self.address).map_err(|e| {
                unavailable(format!("cannot reach the node at {}: {e}", self.address))
            })?;
            let io = hyper_util::rt::TokioIo::new(stream);
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| unavailable(format!("the node's channel: {e}")))?;
            let driver = tokio::spawn(conn);
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header(header::HOST, "leasehold")
                .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
                .body(axum::body::Body::empty())
                .map_err(|e| Error::Internal(format!("request: {e}")))?;
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| unavailable(format!("the node's channel: {e}")))?;
            let status = resp.status();
            let body = axum::body::to_bytes(axum::body::Body::new(resp.into_body()), 64 << 10)
                .await
                .map_err(|e| unavailable(format!("reading the node's answer: {e}")))?;
            driver.abort();
            Ok((status, body))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| {
                unavailable(format!(
                    "the node did not answer within {}",
                    humantime::format_duration(self.timeout)
                ))
            })?
    }
}

fn unavailable(message: String) -> Error {
    Error::Unavailable {
        op: "ask",
        key: "the node's session channel".into(),
        source: StoreError::Unavailable { message },
    }
}

fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T> {
    serde_json::from_slice(body)
        .map_err(|e| Error::Internal(format!("the node's answer does not parse: {e}")))
}

/// Connects to `address` (`@name`: the abstract namespace; else a path).
fn connect(address: &str) -> std::io::Result<tokio::net::UnixStream> {
    let std = std::os::unix::net::UnixStream::connect_addr(&super::socket_addr(address)?)?;
    std.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(std)
}
