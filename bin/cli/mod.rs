//! The `leasehold` command line. The binary in `bin/` only calls [`main`].
//!
//! Exit codes (also in README.md):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | a negative answer: the lease is held by someone else |
//! | 2 | usage error or invalid input (names, flags, tokens) |
//! | 3 | conflict or lost: another writer won; this holder is fenced |
//! | 4 | the store is unavailable (network, timeouts, 5xx) |
//! | 5 | corrupt or foreign data in the bucket |
//! | 6 | the store failed the conditional-write probe and is refused |
//! | 7 | not found |
//! | 8 | permission denied: the store's credentials or a node's bearer token |
//! | 70 | internal error |

mod demo;
mod fence;
mod inventory;
mod logs;
mod wake;
mod watch;

use clap::{Args, Parser, Subcommand};
use leasehold::Name;
use leasehold::clock::{Clock, OsEntropy, SystemClock};
use leasehold::error::{Error, ErrorKind};
use leasehold::lease::{Acquire, AcquireOptions, LeaseClient, LeaseToken};
use leasehold::record::Kind;
use leasehold::store::{OpenOptions, Store, open_store};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Fenced leases and fleet coordination in one object-store bucket"
)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "human",
        env = "LEASEHOLD_LOG_FORMAT"
    )]
    log_format: LogFormat,
    /// Wall-clock skew bound for one-shot readers (ls, nodes, resolve): an
    /// owner not renewed for ttl + this, by the clocks, shows as expired.
    /// Advisory only: nodes never take anything over by wall clock.
    #[arg(long, global = true, default_value = "5s", value_parser = parse_duration, allow_hyphen_values = true, env = "LEASEHOLD_MAX_SKEW")]
    max_skew: Duration,
    #[command(subcommand)]
    command: Command,
}

use leasehold::telemetry::LogFormat;

#[derive(Debug, Args, Clone)]
pub(crate) struct StoreArgs {
    /// Store URL: s3://bucket[/prefix], az://container[/prefix], gs://bucket[/prefix],
    /// file:///dir or memory://. Credentials come from the environment, never the URL.
    #[arg(long, env = "LEASEHOLD_STORE")]
    store: String,
    /// S3 endpoint (MinIO, R2, ...); default from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL.
    #[arg(long)]
    endpoint: Option<String>,
    /// Per-request timeout.
    #[arg(long, default_value = "5s", value_parser = parse_duration, allow_hyphen_values = true)]
    request_timeout: Duration,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Probe a store: prove it honours conditional writes, or refuse it.
    Doctor {
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long)]
        json: bool,
    },
    /// Acquire, renew, release or show a standalone lease (leases/<NAME>).
    Lease {
        #[command(subcommand)]
        op: LeaseOp,
    },
    /// Ask this session's node whether its run still holds its claim (inside
    /// a session). Exit 0: yes; 3: no (superseded, stopped, or the node's
    /// lease too short for the margin); 4: no answer (do not acknowledge).
    Fence {
        #[command(subcommand)]
        op: FenceOp,
    },
    /// Run a fleet node: register nodes/<ID>, claim sessions from manifests,
    /// run them under a dead-man switch, until SIGTERM or SIGINT.
    Node {
        #[command(subcommand)]
        op: Box<NodeOp>,
    },
    /// Create or update a manifest from a JSON file (or - for stdin):
    /// {"name": "...", "spec": {"command": "...", "args": [...], ...}}.
    /// The same spec again is a no-op; a different spec needs --replace.
    Apply {
        file: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Replace an existing manifest with a different spec (If-Match on
        /// the version read just before).
        #[arg(long)]
        replace: bool,
        /// The fleet's bearer token: nudges the node placement ranks first,
        /// so the session starts within about a second instead of at the
        /// node's next pass.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Which node owns a session: exit 0 when a live owner runs it, 1
    /// otherwise (none, or not running), 2 on any error.
    Resolve {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Also dial the owner; if it does not answer, check its node lease.
        #[arg(long)]
        wake: bool,
        #[arg(long)]
        json: bool,
    },
    /// Wake a session and wait until it is ready (a live owner runs it and
    /// its health check passes): a sleeping one is released to be placed
    /// (one conditional write; concurrent wakes start one run). Exit 0 when
    /// ready, 1 when not within --wait.
    Wake {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long, default_value = "30s", value_parser = parse_duration, allow_hyphen_values = true)]
        wait: Duration,
        /// The fleet's token: the wake then reaches the owner of a running
        /// session, restarting its idle time (`sleep.after_idle`).
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Inside a session: ask its node to put it to sleep now (its run is
    /// stopped; a wake runs it again, at a higher epoch).
    Sleep,
    /// List sessions (default), nodes or manifests.
    Ls {
        #[arg(value_enum, default_value = "sessions")]
        what: LsWhat,
        #[command(flatten)]
        store: StoreArgs,
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(flatten)]
        view: ListView,
    },
    /// Everything about one session: manifest, claim, owner liveness, status
    /// and reason, restarts, and (with --token-file) its recent events.
    Describe {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// File with the fleet's bearer token, to read the owner's journal.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// The nodes of the fleet (same as `ls nodes`).
    Nodes {
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        view: ListView,
    },
    /// One object: its raw bytes, version and decoded form; corruption is
    /// reported as such (exit 5).
    Inspect {
        key: String,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long)]
        json: bool,
    },
    /// Follow the whole fleet's events: every live node's stream, merged and
    /// tagged by node, following nodes as they join and leave, resuming after
    /// disconnects, showing gaps.
    Watch {
        #[command(flatten)]
        store: StoreArgs,
        /// File with the fleet's bearer token.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: std::path::PathBuf,
        /// Replay each node's retained journal first (default: from now).
        #[arg(long)]
        from_start: bool,
        /// Stop after this long (default: until interrupted).
        #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
        duration: Option<Duration>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Make this bucket (and prefix) a fleet: write its marker, once. Nodes
    /// refuse to serve without it. After a wipe, a new generation makes
    /// every new fencing token higher than any of the last.
    Init {
        #[command(flatten)]
        store: StoreArgs,
        /// The generation (1 for a new fleet; the last + 1 after a wipe).
        /// Checked before anything is made: a typo'd path is never
        /// created by a refused init.
        #[arg(long, default_value_t = 1,
              value_parser = clap::value_parser!(u64).range(1..=leasehold::fleet::marker::MAX_GENERATION))]
        generation: u64,
        #[arg(long)]
        json: bool,
    },
    /// Print a session's output (stdout and stderr), read from its owner
    /// node's API; with --follow, keep printing, following the session to
    /// its next owner.
    Logs {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// File with the fleet's bearer token.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: std::path::PathBuf,
        #[arg(short, long)]
        follow: bool,
        /// Only the last N lines (default: all that is kept).
        #[arg(long)]
        tail: Option<usize>,
    },
    /// Remove what the fleet no longer needs, once older than --older-than:
    /// tombstones of deleted sessions, claims of deleted sessions whose
    /// owner is gone, and released or fenced node records. Never a live
    /// object, and never so that a fencing token could be issued twice (an
    /// epoch floor is raised first). Shows the plan with --dry-run.
    Gc {
        #[command(flatten)]
        store: StoreArgs,
        /// Only objects whose own timestamp is at least this old (wall
        /// clock; advisory, hence the generous default).
        #[arg(long, default_value = "24h", value_parser = parse_duration, allow_hyphen_values = true)]
        older_than: Duration,
        /// Print what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Pause a session: its owner stops it and keeps its claim (`paused`);
    /// no node starts it until `resume`. Exit 7 if there is no manifest.
    Pause {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// The fleet's bearer token: nudges the session's owner, so it acts
        /// at once.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Resume a paused session. Exit 7 if there is no manifest.
    Resume {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// As for `pause`.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Run a session again: a running one is stopped and started, a
    /// finished one (succeeded, failed) runs once more; either way at a
    /// higher epoch (a new fencing token). Stamps the spec's `restarted_at`,
    /// as `kubectl rollout restart` does. Exit 7 if there is no manifest.
    Restart {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// As for `pause`.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Delete a manifest; its owner stops the session and releases the claim.
    /// Exit 7 if there is none (0 with --ignore-not-found).
    Delete {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// A manifest that is already gone is not an error (as kubectl's flag).
        #[arg(long)]
        ignore_not_found: bool,
        /// The fleet's bearer token: nudges the session's owner, so it stops
        /// the session at once.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Three nodes in this process on a local directory store: manifests are
    /// placed, one node is killed abruptly, its sessions move. No server, no
    /// credentials. With --lease: a leader election instead.
    Demo {
        /// Store to use (default: a fresh local directory under the temp dir).
        #[arg(long)]
        store: Option<String>,
        /// Node (or lease) TTL for the demo.
        #[arg(long, default_value = "1s", value_parser = parse_duration, allow_hyphen_values = true)]
        ttl: Duration,
        /// How many manifests to apply (1-100).
        #[arg(long, default_value_t = 6, allow_hyphen_values = true,
              value_parser = clap::value_parser!(u32).range(1..=100))]
        sessions: u32,
        /// Run the leader-election demo instead.
        #[arg(long)]
        lease: bool,
    },
}

/// How list commands print, and which rows (as kubectl's `-o` and `-l`).
#[derive(Debug, Args, Clone)]
pub(crate) struct ListView {
    /// JSON (same as -o json).
    #[arg(long)]
    pub json: bool,
    /// table (default), wide (more columns) or json.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
    /// Only rows matching every k=v: nodes by their labels; sessions and
    /// manifests by their manifest's selector.
    #[arg(short = 'l', long = "selector", value_parser = parse_labels, default_value = "")]
    pub selector: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    Table,
    Wide,
    Json,
}

impl ListView {
    pub fn json(&self) -> bool {
        self.json || self.output == Some(Output::Json)
    }
    pub fn wide(&self) -> bool {
        self.output == Some(Output::Wide)
    }
    /// Does `labels` include every k=v asked?
    pub fn matches(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LsWhat {
    Sessions,
    Nodes,
    Manifests,
}

// Parsed once per process: the size of `Run` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum NodeOp {
    /// Take no new sessions on node ID (running ones stay), as `kubectl
    /// cordon`. Written to control/ID; the node applies it within a few
    /// passes, at once when nudged (with --token-file).
    Cordon {
        id: String,
        #[command(flatten)]
        store: StoreArgs,
        /// The fleet's bearer token, to nudge the node.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Undo cordon and drain: node ID takes sessions again.
    Uncordon {
        id: String,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Cordon node ID and hand its sessions over gracefully (each stopped,
    /// its claim released, so a peer claims it at once); waits until the
    /// node holds none, or --timeout (exit 4).
    Drain {
        id: String,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        #[arg(long, default_value = "2m", value_parser = parse_duration, allow_hyphen_values = true)]
        timeout: Duration,
    },
    /// Run the node in the foreground.
    Run {
        #[command(flatten)]
        store: StoreArgs,
        /// Node id (unique in the fleet).
        #[arg(long, env = "LEASEHOLD_NODE")]
        id: String,
        /// Most sessions at once (1-100000).
        #[arg(long, default_value_t = 16, allow_hyphen_values = true,
              value_parser = clap::value_parser!(u32).range(1..=100_000))]
        capacity: u32,
        /// Labels for manifest selectors: k=v,k2=v2.
        #[arg(long, value_parser = parse_labels, default_value = "")]
        labels: std::collections::BTreeMap<String, String>,
        /// Address published in the node lease and claims.
        #[arg(long)]
        address: Option<String>,
        /// Node lease TTL; sessions move about ttl + ttl/10 + one poll after
        /// this node dies.
        #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
        ttl: Duration,
        /// Longest pause between passes of an idle node (default: the ttl).
        /// Longer is cheaper while idle (fewer list requests) and slower to
        /// notice an un-nudged change or a dead peer; a vanished claim is
        /// also waited out this much longer. `spike cost --sweep` measures
        /// the trade (docs/evidence.md).
        #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
        max_poll: Option<Duration>,
        /// Longest between two passes that list every manifest and claim
        /// (anti-entropy; default: 60 ttls, 10 min at the default ttl).
        /// Passes in between read the change feed (`changes/`) and only
        /// the keys it names, so their cost does not grow with the number
        /// of sessions. A change whose hint is lost waits up to this long;
        /// a claim an operator deletes by hand, about twice as long.
        /// At or below --max-poll every pass lists everything.
        #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
        full_every: Option<Duration>,
        /// The fleet size --full-every is for, in listed objects (a
        /// manifest and a claim per session): a node whose last full
        /// listing counted more lists everything once per --full-every for
        /// each this many, so that listing's cost per hour stays level as
        /// the fleet grows (at 100,000 sessions and the defaults: every
        /// 100 minutes). The longer interval is published in the node
        /// record before it is used, and waited out for a claim deleted by
        /// hand. 0: every --full-every whatever the fleet.
        #[arg(long, default_value_t = leasehold::fleet::node::DEFAULT_FULL_EVERY_OBJECTS)]
        full_every_objects: u64,
        /// Longest between two listings of `nodes/` (default: 6 ttls, a
        /// minute at the default ttl). A peer's death is seen by its ring
        /// watchers, and its news by its hints, without this listing; what
        /// waits for it (about twice this at most) is a dead peer that held
        /// no sessions, a peer whose hint was lost, and a peer that came
        /// back after being judged dead. Each listing is a LIST request per
        /// 1,000 nodes (docs/evidence.md has the cost).
        #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
        nodes_every: Option<Duration>,
        /// A launcher prefixed to every session command, split on spaces
        /// (e.g. 'nice -n 10'). Default: run the spec's command directly.
        #[arg(long)]
        exec: Option<String>,
        /// SIGTERM-to-SIGKILL grace when stopping a session (at most 1h).
        #[arg(long, default_value = "5s", value_parser = parse_duration, allow_hyphen_values = true)]
        stop_grace: Duration,
        /// Serve the node's HTTP API (events, sessions, health, metrics) on
        /// this address. A bare port (7400 or :7400) binds loopback.
        #[arg(long)]
        listen: Option<String>,
        /// File holding the bearer token for /v1/* (required with --listen).
        #[arg(long)]
        token_file: Option<std::path::PathBuf>,
        /// After fencing a dead peer, nudge the nodes ranked for its
        /// sessions (`POST /v1/nudge` with this node's token, at the
        /// addresses their records publish), so they act within 200 ms
        /// rather than at their next read of the bell (ttl/6). Needs
        /// --token-file; every node must accept the same token. The token
        /// goes over plain HTTP to whatever address a node record names:
        /// use it only on a network you trust, with one token per fleet.
        #[arg(long)]
        nudge_peers: bool,
        /// How session process trees are contained: auto (a cgroup v2 per
        /// session where the host allows one, else the subreaper sweep),
        /// cgroup (refuse to run without), subreaper.
        #[arg(long, default_value = "auto")]
        containment: leasehold::fleet::contain::Mode,
        /// Where session logs go (stdout and stderr, rotated by size). Default:
        /// <state>/logs/<node>-<store hash>, state being $LEASEHOLD_STATE_DIR,
        /// else /var/lib/leasehold for root, else $XDG_STATE_HOME/leasehold or
        /// ~/.local/state/leasehold.
        #[arg(long, env = "LEASEHOLD_LOG_DIR")]
        log_dir: Option<std::path::PathBuf>,
        /// Most bytes kept of one session's log (the current file and one
        /// rotated file).
        #[arg(long, default_value_t = 8 << 20)]
        log_max_bytes: u64,
        /// Names of this node's environment variables that sessions also get
        /// (comma-separated, repeatable). Sessions get nothing else of the
        /// node's environment but PATH, HOME, LANG and TZ: credentials reach
        /// a session only when named here.
        #[arg(long, value_delimiter = ',', value_parser = parse_env_name)]
        pass_env: Vec<String>,
        /// The user sessions run as when their spec names none (a name or a
        /// numeric id). Default: nobody when this node runs as root, else
        /// this node's own user (a node that is not root cannot change
        /// users).
        #[arg(long)]
        session_user: Option<String>,
        /// Let a session run as root when its spec says `user: root` (or
        /// --session-user names root). Off by default: a root session can
        /// read this node's credentials and leave its containment.
        #[arg(long)]
        allow_root_sessions: bool,
        /// Most HTTP connections served at once (kept below the descriptor
        /// limit, so idle clients can never starve the node's bucket
        /// connections).
        #[arg(long, default_value_t = 256)]
        max_connections: usize,
    },
}

/// The node's rule for session users (see `leasehold::fleet::identity`),
/// checked at start: a --session-user that does not exist here, or root
/// without --allow-root-sessions, stops the node with exit 2 rather than
/// failing every session.
fn session_users(
    session_user: Option<String>,
    allow_root: bool,
) -> leasehold::Result<leasehold::fleet::identity::SessionUsers> {
    use leasehold::fleet::identity::{SessionUsers, own_ids, resolve, valid_name};
    let (uid, gid) = own_ids();
    if let Some(u) = &session_user
        && !valid_name(u)
    {
        return Err(Error::invalid(
            "--session-user",
            "a name of 1-32 of [a-z_][a-z0-9_-]*, or a numeric id below 2^31",
        ));
    }
    let users = SessionUsers {
        default_user: session_user.or_else(|| (uid == 0).then(|| "nobody".to_string())),
        allow_root,
    };
    resolve(&users, None, None, uid, gid).map_err(|r| Error::invalid("--session-user", r))?;
    Ok(users)
}

fn parse_env_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
        ))
    }
}

/// The default directory for session logs (see `node run --log-dir`).
fn default_log_dir(node: &str, store_identity: &str) -> std::path::PathBuf {
    use std::path::PathBuf;
    let state = std::env::var_os("LEASEHOLD_STATE_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            // SAFETY: getuid has no preconditions.
            (unsafe { libc::getuid() } == 0).then(|| PathBuf::from("/var/lib/leasehold"))
        })
        .or_else(|| {
            std::env::var_os("XDG_STATE_HOME")
                .filter(|d| !d.is_empty())
                .map(|d| PathBuf::from(d).join("leasehold"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/leasehold"))
        })
        .unwrap_or_else(|| PathBuf::from("/tmp/leasehold-state"));
    state.join("logs").join(format!(
        "{node}-{:016x}",
        leasehold::store::local::fnv1a64(store_identity.as_bytes())
    ))
}

fn parse_labels(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut m = std::collections::BTreeMap::new();
    for pair in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not k=v"))?;
        let ok = |x: &str| {
            !x.is_empty()
                && x.len() <= 63
                && x.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
        };
        if !ok(k) || !ok(v) {
            return Err(format!("{pair:?}: labels are 1-63 of [A-Za-z0-9._/-]"));
        }
        m.insert(k.to_string(), v.to_string());
    }
    Ok(m)
}

#[derive(Debug, Subcommand)]
enum LeaseOp {
    /// Declare NAME, a new lease: writes its placeholder, so that the first
    /// acquire takes it at once. Without it, a name with no record (never
    /// created, or deleted under a holder that may still believe in it) is
    /// acquired only after watching it absent for its ttl + margin. Exit 0
    /// whether or not it existed ("exists" says which).
    Create {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long)]
        json: bool,
    },
    /// Acquire NAME. Prints the epoch (the fencing token) and a lease token
    /// for `renew`/`release`. Exit 1 if someone else holds it.
    Acquire {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long, default_value = "10s", value_parser = parse_duration, allow_hyphen_values = true)]
        ttl: Duration,
        /// Holder node id (default: this host's name, sanitised).
        #[arg(long, env = "LEASEHOLD_NODE")]
        node: Option<String>,
        /// Address to publish in the record.
        #[arg(long)]
        address: Option<String>,
        /// Keep observing a held (or absent) lease this long; take it if it
        /// expires (or, absent, once watched for its ttl + margin).
        #[arg(long, value_parser = parse_duration, allow_hyphen_values = true)]
        wait: Option<Duration>,
        /// Skip the conditional-write probe's race rounds (about 300
        /// requests, 32 rounds of concurrent writes); its sequential steps
        /// (about ten requests) still run on an HTTP store, to learn the
        /// ETag form. What it gives up: nothing then checks that the store
        /// serialises concurrent conditional writes, and on one that checks
        /// them without a lock, two callers can both be told they hold the
        /// lease at the same epoch. Only for a store that `leasehold doctor`
        /// has passed.
        #[arg(long)]
        no_probe: bool,
        #[arg(long)]
        json: bool,
    },
    /// Renew NAME with the token from `acquire` (or the last `renew`).
    Renew {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Lease token; not a secret (it names the holder and version, both
        /// readable in the bucket).
        #[arg(long, env = "LEASEHOLD_LEASE_TOKEN")]
        token: String,
        #[arg(long)]
        json: bool,
    },
    /// Release NAME: a tombstone that keeps the epoch.
    Release {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long, env = "LEASEHOLD_LEASE_TOKEN")]
        token: String,
        #[arg(long)]
        json: bool,
    },
    /// Show the record of NAME.
    Show {
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long)]
        json: bool,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    // `--ttl -5s` reaches here (hyphen values are allowed) so that it is
    // told what is wrong, not parsed as an unknown flag `-5`.
    if s.trim_start().starts_with('-') {
        return Err(format!(
            "{s:?}: a duration cannot be negative (examples: 500ms, 10s, 2m)"
        ));
    }
    humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e} (examples: 500ms, 10s, 2m)"))
}

#[derive(Subcommand, Debug)]
enum FenceOp {
    /// This run as its node sees it (session, epoch, node, lease validity
    /// left), from memory: no bucket request.
    Check {
        #[arg(long)]
        json: bool,
    },
    /// The ack gate: the node reads the claim (one GET) and answers yes
    /// only if it still names this run, with the node's lease valid for
    /// --margin after the read.
    Ack {
        #[arg(long, default_value = "1s", value_parser = parse_duration, allow_hyphen_values = true)]
        margin: Duration,
        #[arg(long)]
        json: bool,
    },
}

/// What a command failed with: a library error, or a plain negative answer.
pub(crate) enum Failure {
    Error(Error),
    Held,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Error(e)
    }
}

/// The exit code for an error kind (see the module docs).
pub fn exit_code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::Invalid => 2,
        ErrorKind::Conflict | ErrorKind::Fenced => 3,
        ErrorKind::Unavailable => 4,
        ErrorKind::Data => 5,
        ErrorKind::Unsupported => 6,
        ErrorKind::NotFound => 7,
        ErrorKind::Permission => 8,
        _ => 70,
    }
}

/// Parses arguments, runs the command, prints errors as `error: ...` with
/// `Caused by:` lines, and returns the documented exit code.
pub fn main() -> ExitCode {
    // The dead-man switch re-executes this binary; it needs no runtime.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("__watchdog") {
        return leasehold::fleet::watchdog::main(&args[2..]);
    }
    if let Err(e) = apply_config_file() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    // One-shot commands end quietly when their reader goes away (`ls |
    // head`), as Unix tools do: the default SIGPIPE action, instead of the
    // Rust runtime's "ignore" that turns the next print into a panic. A node
    // keeps ignoring it: its sockets and pipes report EPIPE as an error, and
    // a closed stderr must not kill it without releasing its sessions.
    let serving =
        matches!(&cli.command, Command::Node { op } if matches!(**op, NodeOp::Run { .. }));
    if !serving {
        // SAFETY: restoring a default signal disposition before any thread
        // is started has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    } else {
        // Before any thread exists (see `leasehold::memory`).
        leasehold::memory::limit_arenas();
    }
    // A node reports its journal events at info; one-shot commands stay quiet.
    let telemetry =
        match leasehold::telemetry::init(if serving { "info" } else { "warn" }, cli.log_format) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(exit_code(e.kind()));
            }
        };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(70);
        }
    };
    // `resolve` answers 0 (live owner), 1 (none), 2 (any error), for scripts.
    let resolve = matches!(cli.command, Command::Resolve { .. });
    let result = rt.block_on(run(cli));
    // Stop the runtime before flushing spans: the exporter's blocking client
    // must not run inside it.
    drop(rt);
    telemetry.shutdown();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Held) => ExitCode::from(1),
        Err(Failure::Error(e)) => {
            eprintln!("error: {e}");
            let mut src = std::error::Error::source(&e);
            if src.is_some() {
                eprintln!("\nCaused by:");
            }
            while let Some(s) = src {
                eprintln!("    {s}");
                src = s.source();
            }
            ExitCode::from(if resolve { 2 } else { exit_code(e.kind()) })
        }
    }
}

/// Where the config file lives: `$LEASEHOLD_CONFIG`, else
/// `$XDG_CONFIG_HOME/leasehold/config.json`, else
/// `~/.config/leasehold/config.json`.
fn config_path() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("LEASEHOLD_CONFIG") {
        return Some(p.into());
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".config"))
        })?;
    Some(base.join("leasehold").join("config.json"))
}

/// Settings from the config file, lowest precedence: flags beat the
/// environment, which beats the file. Each file setting fills its
/// environment variable only when that is unset, before any thread starts.
/// The file holds no secrets (credentials come from the usual providers).
fn apply_config_file() -> Result<(), Error> {
    let Some(path) = config_path() else {
        return Ok(());
    };
    let named = std::env::var_os("LEASEHOLD_CONFIG").is_some();
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        // The default location is optional; a file named by LEASEHOLD_CONFIG
        // is not: ignoring it would run with settings nobody asked for.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !named => return Ok(()),
        Err(e) => {
            return Err(Error::invalid(
                "config file",
                format!("{}: {e}", path.display()),
            ));
        }
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        store: Option<String>,
        node: Option<String>,
        token_file: Option<String>,
        log_format: Option<String>,
        max_skew: Option<String>,
    }
    let f: File = serde_json::from_slice(&bytes)
        .map_err(|e| Error::invalid("config file", format!("{}: {e}", path.display())))?;
    for (var, value) in [
        ("LEASEHOLD_STORE", f.store),
        ("LEASEHOLD_NODE", f.node),
        ("LEASEHOLD_TOKEN_FILE", f.token_file),
        ("LEASEHOLD_LOG_FORMAT", f.log_format),
        ("LEASEHOLD_MAX_SKEW", f.max_skew),
    ] {
        if let Some(v) = value
            && std::env::var_os(var).is_none()
        {
            // SAFETY: called from main before the runtime or any other
            // thread exists.
            unsafe { std::env::set_var(var, v) };
        }
    }
    Ok(())
}

/// `node run --full-every`'s default, in ttls.
const DEFAULT_FULL_EVERY_TTLS: u32 = 60;

/// Opens the store of a one-shot command. Refuses `memory://` (every
/// process has its own, so a one-shot command would only ever see an empty
/// store of its own) and a `file://` root that does not exist (a mistyped
/// path would be created and listed as an empty fleet): `init` and `node
/// run` create it ([`open_creating`]).
pub(crate) async fn open(args: &StoreArgs) -> Result<Arc<dyn Store>, Error> {
    let url = args.store.as_str();
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("memory:") {
        return Err(Error::invalid(
            "--store",
            "memory:// lives inside one process, so this command would see an empty store of its own; use file:///dir for a fleet on this machine",
        ));
    }
    if let Some(dir) = lower
        .strip_prefix("file://")
        .map(|_| &url["file://".len()..])
        && dir.starts_with('/')
        && !std::path::Path::new(dir).exists()
    {
        return Err(Error::invalid(
            "--store",
            format!(
                "{dir} does not exist (a typo?); `leasehold init --store {url}` creates a fleet there"
            ),
        ));
    }
    Ok(hinting(open_creating(args).await?))
}

/// Opens the store, creating a `file://` root that does not exist yet (and
/// saying so on stderr): for `init` and `node run`.
pub(crate) async fn open_creating(args: &StoreArgs) -> Result<Arc<dyn Store>, Error> {
    open_creating_on(args, None).await
}

/// As [`open_creating`], with the HTTP stores' socket work on `io` (see
/// `OpenOptions::io_runtime`).
async fn open_creating_on(
    args: &StoreArgs,
    io: Option<tokio::runtime::Handle>,
) -> Result<Arc<dyn Store>, Error> {
    if let Some(dir) = args
        .store
        .to_ascii_lowercase()
        .strip_prefix("file://")
        .map(|_| &args.store["file://".len()..])
        && dir.starts_with('/')
        && !std::path::Path::new(dir).exists()
    {
        eprintln!("creating {dir} (a new local store)");
    }
    let opts = OpenOptions {
        endpoint: args.endpoint.clone(),
        request_timeout: args.request_timeout,
        io_runtime: io,
    };
    open_store(&args.store, &opts).await
}

/// Every command that writes a manifest or a claim hints it in the change
/// feed (`leasehold::fleet::feed`), so nodes find it without a full listing.
/// The hints' key form (`leasehold::fleet::feed::HintForms`): in `node
/// run`, the node decides at each of its listings (`hinting_with`, the
/// forms shared with it). A one-shot command on a local directory decides
/// by listing `nodes/` before its first hint (free there, and the
/// bucketed form is what keeps the directory's feed reads short); on any
/// other store it spells hints flat, which every build reads and which
/// costs a reader there the same, rather than pay a listing and a read of
/// every node record per command.
fn hinting(store: Arc<dyn Store>) -> Arc<dyn Store> {
    let forms = if store
        .identity()
        .starts_with(leasehold::store::LOCAL_IDENTITY_PREFIX)
    {
        leasehold::fleet::feed::HintForms::auto()
    } else {
        leasehold::fleet::feed::HintForms::fixed(leasehold::keys::HintForm::Flat)
    };
    hinting_with(store, forms)
}

fn hinting_with(
    store: Arc<dyn Store>,
    forms: Arc<leasehold::fleet::feed::HintForms>,
) -> Arc<dyn Store> {
    Arc::new(
        leasehold::fleet::feed::HintingStore::new(
            store,
            Arc::new(SystemClock::new()),
            Arc::new(leasehold::clock::OsEntropy::new()),
        )
        .with_forms(forms),
    )
}

fn node_name(node: Option<String>) -> Result<Name, Error> {
    match node {
        Some(n) => Name::new(n),
        None => {
            let h: String = leasehold::hostlock::hostname()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '-'
                    }
                })
                .take(64)
                .collect();
            let h = h
                .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_string();
            Name::new(if h.is_empty() { "node".to_string() } else { h })
        }
    }
}

pub(crate) fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).expect("json"));
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let max_skew = cli.max_skew;
    match cli.command {
        Command::Doctor { store, json } => doctor(&store, json).await,
        Command::Describe {
            name,
            store,
            token_file,
            json,
        } => inventory::describe(name, &store, token_file.as_deref(), json, max_skew).await,
        Command::Lease { op } => lease(op, max_skew).await,
        Command::Fence { op } => match op {
            FenceOp::Check { json } => fence::check(json).await,
            FenceOp::Ack { margin, json } => fence::ack(margin, json).await,
        },
        Command::Demo {
            store,
            ttl,
            lease: true,
            ..
        } => demo::run(store, ttl).await.map_err(Failure::Error),
        Command::Demo {
            store,
            ttl,
            sessions,
            ..
        } => demo::fleet(store, ttl, sessions)
            .await
            .map_err(Failure::Error),
        Command::Node { op } => node(*op).await,
        Command::Apply {
            file,
            store,
            replace,
            token_file,
            json,
        } => {
            apply(
                &file,
                &store,
                replace,
                token_file.as_deref(),
                json,
                max_skew,
            )
            .await
        }
        Command::Resolve {
            name,
            store,
            wake,
            json,
        } => inventory::resolve(name, &store, wake, json, max_skew).await,
        Command::Wake {
            name,
            store,
            wait,
            token_file,
            json,
        } => wake::wake(name, &store, wait, token_file.as_deref(), json, max_skew).await,
        Command::Sleep => wake::sleep().await,
        Command::Ls {
            what,
            store,
            prefix,
            view,
        } => inventory::ls(what, &store, &prefix, &view, max_skew).await,
        Command::Nodes { store, view } => {
            inventory::ls(LsWhat::Nodes, &store, "", &view, max_skew).await
        }
        Command::Inspect { key, store, json } => inventory::inspect(&key, &store, json).await,
        Command::Watch {
            store,
            token_file,
            from_start,
            duration,
            json,
        } => watch::run(&store, &token_file, from_start, duration, json).await,
        Command::Init {
            store,
            generation,
            json,
        } => {
            let store = open_creating(&store).await?;
            let (m, created) = leasehold::fleet::marker::init(
                &store,
                &OsEntropy::new(),
                SystemClock::new().wall_ms(),
                generation,
            )
            .await?;
            if json {
                print_json(&serde_json::json!({
                    "store": store.to_string(), "fleet_id": m.fleet_id,
                    "generation": m.generation, "created": created,
                    "first_epoch": leasehold::fleet::marker::epoch_base(m.generation) + 1,
                }));
            } else if created {
                println!(
                    "{store}: initialised {} (fencing tokens start at {})",
                    m.describe(),
                    leasehold::fleet::marker::epoch_base(m.generation) + 1
                );
            } else {
                println!("{store}: already {}", m.describe());
            }
            Ok(())
        }
        Command::Logs {
            name,
            store,
            token_file,
            follow,
            tail,
        } => logs::run(name, &store, &token_file, follow, tail).await,
        Command::Gc {
            store,
            older_than,
            dry_run,
            json,
        } => {
            // The floor is an If-Match write: learn the ETag form.
            let store = if dry_run {
                open(&store).await?
            } else {
                open_for_match(&store).await?
            };
            let now = SystemClock::new().wall_ms();
            let plan = leasehold::fleet::gc::scan(&store, now, older_than).await?;
            let removed = if dry_run {
                Vec::new()
            } else {
                leasehold::fleet::gc::apply(&store, &OsEntropy::new(), &plan).await?
            };
            if json {
                print_json(&serde_json::json!({
                    "dry_run": dry_run, "candidates": plan, "removed": removed.len(),
                    "removed_keys": removed,
                    "epoch_floor": leasehold::fleet::gc::floor(&store).await?,
                }));
            } else {
                for r in &plan {
                    let verb = if dry_run {
                        "would remove"
                    } else if removed.contains(&r.key) {
                        "removed"
                    } else {
                        "kept (changed since the plan)"
                    };
                    println!("{verb} {:<32} epoch {:<6} {}", r.key, r.epoch, r.reason);
                }
                println!(
                    "{} of {} candidates {}; older than {}",
                    if dry_run { plan.len() } else { removed.len() },
                    plan.len(),
                    if dry_run {
                        "would be removed (dry run)"
                    } else {
                        "removed"
                    },
                    humantime::format_duration(older_than)
                );
            }
            Ok(())
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "leasehold",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Pause {
            name,
            store,
            token_file,
        } => edit_verb(&name, &store, token_file.as_deref(), Verb::Pause).await,
        Command::Resume {
            name,
            store,
            token_file,
        } => edit_verb(&name, &store, token_file.as_deref(), Verb::Resume).await,
        Command::Restart {
            name,
            store,
            token_file,
        } => edit_verb(&name, &store, token_file.as_deref(), Verb::Restart).await,
        Command::Delete {
            name,
            store,
            ignore_not_found,
            token_file,
        } => {
            let name = Name::new(name)?;
            let store = open(&store).await?;
            let owner = leasehold::fleet::claim::get(&store, name.as_str())
                .await
                .ok()
                .flatten()
                .map(|(c, _)| c.owner.node)
                .filter(|n| n != "queued");
            if leasehold::fleet::manifest::delete(&store, &name).await? {
                let nudged = match owner {
                    Some(o) => nudge_nodes(&store, token_file.as_deref(), &[o]).await,
                    None => 0,
                };
                println!(
                    "deleted manifests/{name}{}",
                    if nudged > 0 { " (owner nudged)" } else { "" }
                );
                Ok(())
            } else if ignore_not_found {
                Ok(())
            } else {
                Err(Error::NotFound {
                    key: leasehold::keys::manifest(name),
                }
                .into())
            }
        }
    }
}

/// The operator verbs that edit a manifest's spec.
#[derive(Clone, Copy)]
enum Verb {
    Pause,
    Resume,
    Restart,
}

/// `pause`, `resume` and `restart`: one If-Match edit of the manifest
/// (`manifest::edit`), then a nudge of the owner when a token is given.
async fn edit_verb(
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

/// Estimates the store's clock offset from ours: write a scratch object,
/// note our wall clock before sending and after the answer, and read the
/// store's last-modified time from a listing. The store stamped the write in
/// between, so offset = stamp − midpoint, within ± half the round trip plus
/// the store's timestamp resolution. Advisory: leasehold never uses it.
async fn clock_offset(store: &Arc<dyn Store>) -> Result<Option<(i64, u64)>, Error> {
    use futures::StreamExt;
    let clock = SystemClock::new();
    let dir = format!(
        "_probe/{}",
        leasehold::clock::Entropy::hex_id(&OsEntropy::new())
    );
    let key = format!("{dir}/clock");
    let w0 = clock.wall_ms();
    store
        .put(
            &key,
            bytes::Bytes::from_static(b"{}"),
            leasehold::store::Cond::Create,
        )
        .await
        .map_err(|e| Error::from_store("put", &key, e))?;
    let w1 = clock.wall_ms();
    let mut list = store.list(&format!("{dir}/"));
    let mut stamp = None;
    while let Some(e) = list.next().await {
        if let Ok(e) = e
            && e.key == key
        {
            stamp = e.last_modified_ms;
        }
    }
    let _ = store.delete(&key).await;
    Ok(stamp.map(|s| {
        let mid = (w0 + w1) / 2;
        // Object stores stamp to the second; allow that on top of the RTT.
        (s as i64 - mid as i64, (w1 - w0) / 2 + 1000)
    }))
}

async fn doctor(args: &StoreArgs, json: bool) -> Result<(), Failure> {
    let store = open(args).await?;
    // Named before the probe: when the probe fails for want of credentials,
    // where they were looked for is the first thing an operator needs.
    let credentials = leasehold::store::open::credentials_source(&args.store).await;
    let clock = leasehold::clock::SystemClock::new();
    let started = clock.now();
    let (report, result) = leasehold::probe::probe_report(&store, &OsEntropy::new(), &clock).await;
    let total_ms = clock.now().saturating_since(started).as_millis() as u64;
    if result.is_ok() {
        // A passing probe clears an audit's refusal on this host.
        let marker = leasehold::fleet::refusal_marker(
            &leasehold::hostlock::default_lock_dir(),
            &store.identity(),
        );
        if std::fs::remove_file(&marker).is_ok() {
            eprintln!(
                "cleared the audit's refusal of this store ({})",
                marker.display()
            );
        }
    }
    // The rest is shown on failure as on success: it is what an operator
    // needs to find out why.
    let offset = clock_offset(&store).await.ok().flatten();
    let config = config_path();
    let config_found = config.as_ref().is_some_and(|p| p.exists());
    let lock_dir = leasehold::hostlock::default_lock_dir();
    let endpoint = args
        .endpoint
        .clone()
        .or_else(|| std::env::var("AWS_ENDPOINT_URL_S3").ok())
        .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
        .map(|e| leasehold::store::objstore::redact(&e));
    let dialect = report.etag_dialect.map(|d| d.as_str());
    // A local directory's lock files: an older build's scheme keeps one
    // for every key ever written (docs/stores.md, "Its lock files").
    let lock_files = args
        .store
        .split_once("://")
        .filter(|(scheme, p)| scheme.eq_ignore_ascii_case("file") && p.starts_with('/'))
        .and_then(|(_, p)| leasehold::store::local::lock_files(std::path::Path::new(p)).ok());
    if json {
        let mut v = serde_json::json!({
            "store": report.store, "ok": result.is_ok(), "steps": report.steps,
            "probe_ms": total_ms, "etag_dialect": dialect,
            "clock_offset_ms": offset.map(|o| o.0), "clock_offset_uncertainty_ms": offset.map(|o| o.1),
            "config_file": config.as_ref().map(|p| p.display().to_string()), "config_file_found": config_found,
            "lock_dir": lock_dir.display().to_string(),
            "endpoint": endpoint,
            "credentials": credentials,
        });
        if let Some(l) = &lock_files {
            v["lock_files"] = serde_json::json!({
                "dir": l.dir.display().to_string(),
                "removed_with_keys": l.removed_with_keys,
                "count": l.count,
            });
        }
        if let Err(e) = &result {
            v["error"] = leasehold::store::objstore::redact(&error_text(e)).into();
        }
        print_json(&v);
    } else {
        println!("store {}", report.store);
        for s in &report.steps {
            println!(
                "  {:<22} {:<4} {:>6} ms  {}",
                s.name,
                if s.ok { "ok" } else { "FAIL" },
                s.ms,
                s.detail
            );
        }
        match &result {
            Ok(()) => {
                println!("verdict: conditional writes honoured; safe for leasehold ({total_ms} ms)")
            }
            Err(e) if e.kind() == ErrorKind::Unsupported => {
                println!("verdict: REFUSED; nothing leasehold promises holds on this store")
            }
            Err(_) => println!("verdict: the probe could not complete (see the error below)"),
        }
        if let Some(d) = dialect {
            println!("etag dialect {d} (If-Match)");
        }
        match offset {
            Some((o, u)) => println!(
                "clock offset to the store: {:+.1} s (± {:.1} s); advisory, leasehold never relies on it",
                o as f64 / 1000.0,
                u as f64 / 1000.0
            ),
            None => {
                println!("clock offset to the store: unknown (no timestamps, or unreachable)")
            }
        }
        if let Some(e) = &endpoint {
            println!("endpoint {e}");
        }
        println!("credentials {credentials}");
        println!(
            "config file {} ({})",
            config
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "-".into()),
            if config_found { "found" } else { "absent" }
        );
        println!("host locks in {}", lock_dir.display());
        if let Some(l) = &lock_files {
            if l.removed_with_keys {
                println!(
                    "store lock files: {} in {} (removed with their keys)",
                    l.count,
                    l.dir.display()
                );
            } else {
                println!(
                    "store lock files: {} in {}, an older build's scheme: one is kept for every key ever written; to end it, stop every process using the directory and remove that directory",
                    l.count,
                    l.dir.display()
                );
            }
        }
    }
    result.map_err(Failure::Error)
}

/// An error with its `Caused by` chain on one line, for JSON output.
fn error_text(e: &Error) -> String {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

async fn lease(op: LeaseOp, max_skew: Duration) -> Result<(), Failure> {
    match op {
        LeaseOp::Acquire {
            name,
            store,
            ttl,
            node,
            address,
            wait,
            no_probe,
            json,
        } => {
            let name = Name::new(name)?;
            let node = node_name(node)?;
            let mut opts = AcquireOptions::ttl(ttl);
            opts.address = address;
            let store = if no_probe {
                open_for_match(&store).await?
            } else {
                let store = open(&store).await?;
                leasehold::probe::probe(&store, &OsEntropy::new(), &SystemClock::new()).await?;
                store
            };
            let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
            let base = epoch_base_of(&store).await?;
            let client = LeaseClient::builder(store, node)
                .clock(clock.clone())
                .epoch_base(base)
                .build()?;
            let deadline = clock.now() + wait.unwrap_or(Duration::ZERO);
            let mut conflicts = 0;
            loop {
                let answer = match client.acquire(&name, &opts).await {
                    // Lost the final write to another acquirer: look again,
                    // and report whoever won (as Held) rather than the race.
                    Err(e) if e.kind() == ErrorKind::Conflict && conflicts < 3 => {
                        conflicts += 1;
                        continue;
                    }
                    r => r?,
                };
                match answer {
                    Acquire::Acquired(l) => {
                        let token = l.token().encode();
                        if json {
                            print_json(&serde_json::json!({
                                "acquired": true, "key": l.key(), "epoch": l.epoch(),
                                "holder": l.record().holder, "ttl_ms": l.record().ttl_ms,
                                "token": token,
                            }));
                        } else {
                            println!("acquired {} epoch {} (ttl {:?})", l.key(), l.epoch(), ttl);
                            println!("token {token}");
                        }
                        return Ok(());
                    }
                    answer @ (Acquire::Held { .. } | Acquire::Absent { .. }) => {
                        let expires_after = match &answer {
                            Acquire::Held { expires_after, .. }
                            | Acquire::Absent { expires_after, .. } => *expires_after,
                            Acquire::Acquired(_) => Duration::ZERO,
                        };
                        let now = clock.now();
                        if now >= deadline {
                            print_not_acquired(&name, &answer, json);
                            return Err(Failure::Held);
                        }
                        // Poll at most every second, and no later than the
                        // earliest moment it could count as expired.
                        let pause = expires_after
                            .min(Duration::from_secs(1))
                            .min(deadline.saturating_since(now))
                            .max(Duration::from_millis(10));
                        clock.sleep(pause).await;
                    }
                }
            }
        }
        LeaseOp::Create { name, store, json } => {
            let name = Name::new(name)?;
            let store = open(&store).await?;
            let base = epoch_base_of(&store).await?;
            let client = LeaseClient::builder(store, Name::new("cli")?)
                .epoch_base(base)
                .build()?;
            let created = client.create(&name).await?;
            let key = leasehold::keys::lease(&name);
            // Not created: say whether what stands is a lease or the marker
            // of a deleted one (which the next acquire must wait out).
            let vanished = !created
                && client
                    .read(Kind::Lease, &name)
                    .await?
                    .is_some_and(|(rec, _, _)| rec.is_vanished());
            if json {
                print_json(
                    &serde_json::json!({"key": key, "created": created, "vanished": vanished}),
                );
            } else if created {
                println!("created {key}");
            } else if vanished {
                println!(
                    "exists {key} (unchanged): the marker of a deleted record; the next acquire waits its ttl + margin"
                );
            } else {
                println!("exists {key} (unchanged)");
            }
            Ok(())
        }
        LeaseOp::Renew {
            name,
            store,
            token,
            json,
        } => {
            let name = Name::new(name)?;
            let token = LeaseToken::decode(&token)?;
            let client = resumed_client(&store).await?;
            let mut l = client.resume(Kind::Lease, &name, &token).await?;
            l.renew().await?;
            let token = l.token().encode();
            if json {
                print_json(
                    &serde_json::json!({"renewed": true, "key": l.key(), "epoch": l.epoch(), "token": token}),
                );
            } else {
                println!("renewed {} epoch {}", l.key(), l.epoch());
                println!("token {token}");
            }
            Ok(())
        }
        LeaseOp::Release {
            name,
            store,
            token,
            json,
        } => {
            let name = Name::new(name)?;
            let token = LeaseToken::decode(&token)?;
            let client = resumed_client(&store).await?;
            let l = client.resume(Kind::Lease, &name, &token).await?;
            let epoch = l.epoch();
            l.release().await?;
            if json {
                print_json(
                    &serde_json::json!({"released": true, "key": leasehold::keys::lease(name), "epoch": epoch}),
                );
            } else {
                println!("released leases/{name} epoch {epoch}");
            }
            Ok(())
        }
        LeaseOp::Show { name, store, json } => {
            let name = Name::new(name)?;
            let store = open(&store).await?;
            let clock = SystemClock::new();
            // Any identity will do for reading.
            let client = LeaseClient::builder(store, Name::new("reader")?).build()?;
            let Some((rec, version, _)) = client.read(Kind::Lease, &name).await? else {
                return Err(Error::NotFound {
                    key: leasehold::keys::lease(name),
                }
                .into());
            };
            // Wall-clock age is for humans only, and says so.
            let age_ms = clock.wall_ms() as i64 - rec.renewed_at_ms as i64;
            // The one vocabulary (leasehold::liveness), by wall clock within the
            // skew bound: advisory, as the human output says.
            let liveness = leasehold::liveness::judge(
                Some(&rec),
                None,
                leasehold::liveness::Evidence::WallClock {
                    now_ms: clock.wall_ms(),
                    max_skew,
                },
            );
            if json {
                print_json(&serde_json::json!({
                    "key": leasehold::keys::lease(name), "version": version, "record": rec,
                    "wall_clock_age_ms": age_ms, "state": liveness,
                }));
            } else {
                println!("key       leases/{name}");
                println!("version   {version}");
                println!(
                    "state     {}{}",
                    liveness.as_str(),
                    match liveness {
                        leasehold::liveness::Liveness::Live
                        | leasehold::liveness::Liveness::Expired =>
                            " (by wall clock; takeovers are judged by observation)",
                        _ => "",
                    }
                );
                println!("epoch     {}", rec.epoch);
                println!(
                    "holder    {}/{} on {}",
                    rec.holder.node, rec.holder.instance, rec.holder.host
                );
                println!("ttl       {}ms", rec.ttl_ms);
                println!("renewed   {age_ms}ms ago by wall clocks (advisory: clocks may differ)");
                if let Some(a) = &rec.address {
                    println!("address   {a}");
                }
            }
            Ok(())
        }
    }
}

/// Standalone leases in a fleet's bucket take its generation's epochs too
/// (one GET); without a fleet marker, epochs start at 1.
async fn epoch_base_of(store: &Arc<dyn Store>) -> Result<u64, Error> {
    Ok(leasehold::fleet::marker::read(store)
        .await?
        .map_or(0, |(m, _)| {
            leasehold::fleet::marker::epoch_base(m.generation)
        }))
}

/// What `lease acquire` prints when it gives up (exit 1).
fn print_not_acquired(name: &Name, answer: &Acquire, json: bool) {
    let key = leasehold::keys::lease(name);
    match answer {
        Acquire::Held { holder, epoch, .. } => {
            if json {
                print_json(&serde_json::json!({
                    "acquired": false, "key": key, "epoch": epoch, "holder": holder,
                }));
            } else {
                println!(
                    "held: {key} epoch {epoch} by {}/{} on {}",
                    holder.node, holder.instance, holder.host
                );
            }
        }
        Acquire::Absent {
            epoch,
            expires_after,
            observed_for,
        } => {
            // A new process watches from the start: suggest the whole wait.
            let expires_after = &(*expires_after + *observed_for);
            if json {
                print_json(&serde_json::json!({
                    "acquired": false, "key": key, "epoch": epoch, "state": "absent",
                    "expires_after_ms": expires_after.as_millis() as u64,
                }));
            } else {
                println!(
                    "absent: {key} has no record (never declared with `leasehold lease create`, or deleted); \
                     a marker at epoch {epoch} stands in its place. It can be taken after watching it \
                     unchanged {:?} more: acquire with --wait {}s",
                    expires_after,
                    expires_after.as_secs() + 1
                );
            }
        }
        Acquire::Acquired(_) => {}
    }
}

async fn resumed_client(store: &StoreArgs) -> Result<LeaseClient, Error> {
    // `resume` takes the holder identity from the record, checked against the
    // token; this client's own identity is not used.
    LeaseClient::builder(open_for_match(store).await?, Name::new("cli")?).build()
}

/// Opens the store of a one-shot command that writes with If-Match, having
/// learned the store's ETag form (`probe::learn_dialect`, about ten requests
/// on an HTTP store, none on a local one) unless LEASEHOLD_ETAG_DIALECT
/// names it.
async fn open_for_match(args: &StoreArgs) -> Result<Arc<dyn Store>, Error> {
    let store = open(args).await?;
    if std::env::var_os("LEASEHOLD_ETAG_DIALECT").is_none() {
        leasehold::probe::learn_dialect(&store, &OsEntropy::new(), &SystemClock::new()).await?;
    }
    Ok(store)
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    name: String,
    spec: leasehold::fleet::manifest::Spec,
}

async fn apply(
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

/// Node IDs are names; the control object and nudge need the node's record.
async fn node_control(op: NodeOp) -> Result<(), Failure> {
    use leasehold::fleet::control;
    let (id, store, token_file, drain, timeout) = match op {
        NodeOp::Cordon {
            id,
            store,
            token_file,
        } => (id, store, token_file, Some(false), None),
        NodeOp::Drain {
            id,
            store,
            token_file,
            timeout,
        } => (id, store, token_file, Some(true), Some(timeout)),
        NodeOp::Uncordon {
            id,
            store,
            token_file,
        } => (id, store, token_file, None, None),
        NodeOp::Run { .. } => {
            return Err(Error::Internal("node run is not a control command".into()).into());
        }
    };
    let id = Name::new(id)?;
    // The control object is replaced with If-Match: learn the ETag form.
    let store = open_for_match(&store).await?;
    let clock = SystemClock::new();
    // A mistyped id must not "succeed": the node has to be known.
    let node_key = leasehold::keys::node(&id);
    if store
        .get(&node_key)
        .await
        .map_err(|e| Error::from_store("get", &node_key, e))?
        .is_none()
    {
        return Err(Error::NotFound {
            key: format!("{node_key} (no such node; `leasehold nodes` lists them)"),
        }
        .into());
    }
    match drain {
        Some(d) => {
            control::set(&store, &OsEntropy::new(), id.as_str(), d, clock.wall_ms()).await?;
        }
        None => {
            control::clear(&store, id.as_str()).await?;
        }
    }
    let nudged = nudge_nodes(&store, token_file.as_deref(), &[id.to_string()]).await;
    let when = if nudged > 0 {
        "now (nudged)"
    } else if token_file.is_some() {
        "within a few of its passes (it did not answer the nudge)"
    } else {
        "within a few of its passes (pass --token-file to nudge it)"
    };
    match drain {
        Some(false) => println!("node {id} cordoned: it takes no new sessions {when}"),
        None => println!("node {id} uncordoned: it takes sessions again {when}"),
        Some(true) => {
            println!("node {id} draining {when}");
            let deadline = clock.now() + timeout.unwrap_or(Duration::from_secs(120));
            loop {
                let held = sessions_owned_by(&store, id.as_str()).await?;
                if held == 0 {
                    println!("node {id} drained: it holds no sessions");
                    break;
                }
                if clock.now() >= deadline {
                    return Err(Error::Unavailable {
                        op: "drain",
                        key: leasehold::keys::node(id),
                        source: leasehold::store::StoreError::Unavailable {
                            message: format!("still holds {held} sessions at the timeout"),
                        },
                    }
                    .into());
                }
                clock.sleep(Duration::from_millis(500)).await;
            }
        }
    }
    Ok(())
}

/// How many sessions the claims say node `id` holds (not released, not
/// finished).
async fn sessions_owned_by(store: &Arc<dyn Store>, id: &str) -> Result<usize, Error> {
    use leasehold::fleet::claim::{ClaimRecord, ClaimState};
    // The inventory's listing and concurrent reads; an unreadable claim
    // counts as not held, as before.
    let held = inventory::read_all(store, leasehold::keys::SESSIONS)
        .await?
        .into_iter()
        .filter(|(e, b)| {
            matches!(b, Ok(Some(b)) if ClaimRecord::decode(&e.key, b).is_ok_and(|c| {
                c.owner.node == id && c.state != ClaimState::Released && !c.state.is_terminal()
            }))
        })
        .count();
    Ok(held)
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
async fn ranked_for(
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

async fn node(op: NodeOp) -> Result<(), Failure> {
    use leasehold::fleet::{journal::Journal, node as fleet_node, runner::ExecRunner};
    if !matches!(op, NodeOp::Run { .. }) {
        return node_control(op).await;
    }
    let NodeOp::Run {
        store,
        id,
        capacity,
        labels,
        address,
        ttl,
        max_poll,
        full_every,
        full_every_objects,
        nodes_every,
        exec,
        stop_grace,
        listen,
        token_file,
        nudge_peers,
        containment,
        log_dir,
        log_max_bytes,
        pass_env,
        session_user,
        allow_root_sessions,
        max_connections,
    } = op
    else {
        return Err(Error::Internal("control commands are handled above".into()).into());
    };
    let id = Name::new(id)?;
    // HTTP first: a bad address or token fails before anything is written.
    let http = match (&listen, &token_file) {
        (None, None) if nudge_peers => {
            return Err(Error::invalid("--nudge-peers", "needs --listen and --token-file").into());
        }
        (None, None) => None,
        (None, Some(_)) => return Err(Error::invalid("--token-file", "needs --listen").into()),
        (Some(_), None) => {
            return Err(Error::invalid(
                "--listen",
                "needs --token-file (reads require a bearer token)",
            )
            .into());
        }
        (Some(l), Some(f)) => {
            let token = leasehold::http::read_token(f)?;
            let addr = listen_addr(l)?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| Error::invalid("--listen", format!("{addr}: {e}")))?;
            let bound = listener
                .local_addr()
                .map_err(|e| Error::Internal(e.to_string()))?;
            Some((listener, token, bound))
        }
    };
    let address = address.or_else(|| http.as_ref().map(|(_, _, a)| format!("http://{a}")));
    // One message for both ends, before anything is logged or started.
    // (The upper end is a record's, `record::MAX_TTL_MS`.)
    if !(Duration::from_millis(100)..=Duration::from_millis(leasehold::record::MAX_TTL_MS))
        .contains(&ttl)
    {
        return Err(Error::invalid("--ttl", "between 100ms and 24h for a node").into());
    }
    // Up to an hour, or the ttl if that is longer (the default is the ttl).
    let longest = ttl.max(Duration::from_secs(3600));
    if let Some(m) = max_poll
        && !(ttl / 3..=longest).contains(&m)
    {
        return Err(Error::invalid(
            "--max-poll",
            format!(
                "between ttl/3 ({}ms) and {}",
                (ttl / 3).as_millis(),
                humantime::format_duration(longest)
            ),
        )
        .into());
    }
    if let Some(f) = full_every
        && !(ttl..=Duration::from_secs(24 * 3600)).contains(&f)
    {
        return Err(Error::invalid("--full-every", "between the ttl and 24h").into());
    }
    if let Some(n) = nodes_every
        && !(ttl..=Duration::from_secs(24 * 3600)).contains(&n)
    {
        return Err(Error::invalid("--nodes-every", "between the ttl and 24h").into());
    }
    // A stop waits up to one grace per session (and a node's shutdown, one
    // for all): beyond an hour it is a typo, not a plan.
    if stop_grace > Duration::from_secs(3600) {
        return Err(Error::invalid("--stop-grace", "at most 1h").into());
    }
    // A handful of objects per interval would stretch it to the cap for
    // any fleet (a claim deleted by hand then waits two days).
    if full_every_objects != 0 && full_every_objects < 1000 {
        return Err(Error::invalid("--full-every-objects", "0 (fixed) or at least 1000").into());
    }
    // Renewals, and the store's socket work, on a thread no pass occupies
    // (`leasehold::fleet::renew_thread`); it lives until the node has
    // released its lease, at the end of this function.
    let renew_thread = leasehold::fleet::renew_thread::RenewThread::start("leasehold-renew")?;
    let store = open_creating_on(&store, Some(renew_thread.handle())).await?;
    let counting = Arc::new(leasehold::store::CountingStore::new(store));
    // Hints are counted with the rest of the node's requests; their form
    // is the node's to decide (`NodeDeps::hint_forms`).
    let hint_forms = leasehold::fleet::feed::HintForms::auto();
    let store: Arc<dyn Store> = hinting_with(counting.clone(), hint_forms.clone());
    let host = leasehold::hostlock::hostname();
    // A store this host's audit caught breaking its conditions stays refused
    // until `leasehold doctor` passes on it.
    let refusal = leasehold::fleet::refusal_marker(
        &leasehold::hostlock::default_lock_dir(),
        &store.identity(),
    );
    if let Ok(why) = std::fs::read_to_string(&refusal) {
        return Err(Error::Unsupported {
            store: store.to_string(),
            step: "audit".into(),
            detail: format!(
                "refused since an audit on this host found: {}; run `leasehold doctor` on it to clear ({})",
                why.trim(),
                refusal.display()
            ),
        }
        .into());
    }
    let lock = leasehold::hostlock::HostLock::acquire(
        &leasehold::hostlock::default_lock_dir(),
        &store.identity(),
        id.as_str(),
        &host,
    )?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let exe = std::env::current_exe()
        .map_err(|e| Error::Internal(format!("cannot find this executable: {e}")))?;
    let log_dir = log_dir.unwrap_or_else(|| default_log_dir(id.as_str(), &store.identity()));
    let users = session_users(session_user, allow_root_sessions)?;
    let runner = ExecRunner::new(exe, clock.clone(), stop_grace)
        .with_launcher(
            exec.map(|e| e.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
        )
        .with_pass_env(pass_env)
        .with_session_users(users)
        .with_log_dir(log_dir.clone(), log_max_bytes)?
        .with_containment(containment)?;
    tracing::info!(
        containment = runner.containment(),
        limits = %runner.enforced_limits(),
        logs = %log_dir.display(),
        "sessions contained"
    );
    let runner = Arc::new(runner);
    let mut cfg = fleet_node::NodeConfig::new(id, ttl);
    cfg.capacity = capacity;
    cfg.labels = labels;
    cfg.address = address;
    if let Some(m) = max_poll {
        cfg.max_poll = m;
    }
    cfg.full_every = full_every.unwrap_or(ttl.saturating_mul(DEFAULT_FULL_EVERY_TTLS));
    cfg.full_every_objects = full_every_objects;
    if let Some(n) = nodes_every {
        cfg.nodes_every = n;
    }
    tracing::info!(
        ttl = %humantime::format_duration(cfg.ttl),
        max_poll = %humantime::format_duration(cfg.max_poll),
        full_every = %humantime::format_duration(cfg.full_every),
        nodes_every = %humantime::format_duration(cfg.nodes_every),
        "pacing"
    );
    let journal = Arc::new(Journal::new(10_000, 4 << 20));
    let status: Arc<fleet_node::NodeStatus> = Default::default();
    let (claim_handle, claim_inbox) = fleet_node::claim_channel(&cfg.id);
    // With the fleet's token, a node that fences a dead peer nudges the
    // nodes ranked to take its sessions (peers accept the same token).
    let nudge = match (&http, nudge_peers) {
        (Some((_, token, _)), true) => {
            Some(Arc::new(leasehold::fleet::nudge::HttpNudge::new(token)?)
                as Arc<dyn leasehold::fleet::nudge::Nudge>)
        }
        _ => None,
    };
    // The sessions' own channel to this node (`leasehold fence`): an
    // abstract Unix socket, a credential per run.
    let channel_address = leasehold::fleet::channel::server::abstract_name(0);
    let channel_listener = leasehold::fleet::channel::server::bind(&channel_address)
        .map_err(|e| Error::Internal(format!("the session channel {channel_address}: {e}")))?;
    let registry = Arc::new(leasehold::fleet::channel::Registry::new(
        channel_address.clone(),
    ));
    // The wake endpoint's writes are hinted, as every claim write is.
    let wake_store = store.clone();
    let channel_state = leasehold::fleet::channel::server::ChannelState {
        registry: registry.clone(),
        store: store.clone(),
        status: status.clone(),
        runner: runner.clone(),
        clock: clock.clone(),
        journal: journal.clone(),
    };
    let deps = fleet_node::NodeDeps {
        host_lock: Some(Arc::new(lock)),
        journal: journal.clone(),
        status: status.clone(),
        claims: Some(claim_inbox),
        nudge,
        renew_on: Some(renew_thread.handle()),
        hint_forms,
        channel: Some(registry),
        ..fleet_node::NodeDeps::new(store, clock, runner)
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    tracing::info!(address = %channel_address, "serving the session channel");
    let channel_server = tokio::spawn(leasehold::fleet::channel::server::serve(
        channel_listener,
        channel_state,
        shutdown.clone(),
    ));
    let server = match http {
        Some((listener, token, bound)) => {
            let state = leasehold::http::HttpState::new(journal, status, Some(counting), token)?
                .with_claimer(claim_handle)
                .with_store(wake_store)
                .with_logs(log_dir)
                .with_max_connections(max_connections);
            tracing::info!(%bound, "serving the node API");
            Some(tokio::spawn(leasehold::http::serve(
                listener,
                state,
                shutdown.clone(),
            )))
        }
        None => None,
    };
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("signal received; stopping sessions and releasing");
        trigger.cancel();
    });
    // Free pages back to the system now and then (`leasehold::memory`).
    let trimmer = tokio::spawn(leasehold::memory::trim_periodically(
        deps.clock.clone(),
        leasehold::memory::TRIM_EVERY,
        shutdown.clone(),
    ));
    let r = fleet_node::run(cfg, deps, shutdown.clone()).await;
    if let Err(Error::Unsupported { step, detail, .. }) = &r
        && step == "audit"
    {
        let _ = std::fs::write(&refusal, format!("{detail}\n"));
    }
    shutdown.cancel();
    let _ = trimmer.await;
    if let Some(server) = server {
        let _ = server.await;
    }
    let _ = channel_server.await;
    r?;
    Ok(())
}

/// `7400`, `:7400` -> 127.0.0.1:7400 (loopback by default); otherwise an
/// explicit `host:port`.
fn listen_addr(s: &str) -> Result<std::net::SocketAddr, Error> {
    let s = s.trim();
    let full = if s.bytes().all(|b| b.is_ascii_digit()) {
        format!("127.0.0.1:{s}")
    } else if let Some(port) = s.strip_prefix(':') {
        format!("127.0.0.1:{port}")
    } else {
        s.to_string()
    };
    full.parse()
        .map_err(|_| Error::invalid("--listen", format!("{s:?} is not host:port or a port")))
}
