//! The command line's shape: clap's types, and the parsers of their values.

use super::*;
use clap::{Args, Parser, Subcommand};

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
    pub(crate) log_format: LogFormat,
    /// Wall-clock skew bound for one-shot readers (ls, nodes, resolve): an
    /// owner not renewed for ttl + this, by the clocks, shows as expired.
    /// Advisory only: nodes never take anything over by wall clock.
    #[arg(long, global = true, default_value = "5s", value_parser = parse_duration, allow_hyphen_values = true, env = "LEASEHOLD_MAX_SKEW")]
    pub(crate) max_skew: Duration,
    #[command(subcommand)]
    pub(crate) command: Command,
}

use clap_complete::engine::ArgValueCompleter;
use leasehold::telemetry::LogFormat;

#[derive(Debug, Args, Clone)]
pub(crate) struct StoreArgs {
    /// Store URL: s3://bucket[/prefix], az://container[/prefix], gs://bucket[/prefix],
    /// file:///dir or memory://. Credentials come from the environment, never the URL.
    /// Also read from LEASEHOLD_STORE, or "store" in the config file.
    #[arg(long, env = "LEASEHOLD_STORE")]
    pub(crate) store: Option<String>,
    /// S3 endpoint (MinIO, R2, ...); default from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL.
    #[arg(long)]
    pub(crate) endpoint: Option<String>,
    /// Per-request timeout.
    #[arg(long, default_value = "5s", value_parser = parse_duration, allow_hyphen_values = true)]
    pub(crate) request_timeout: Duration,
}

impl StoreArgs {
    /// The store's URL, or an error that says each place it may come from
    /// (clap's own "required" message named only the flag).
    pub(crate) fn url(&self) -> Result<&str, Error> {
        match self.store.as_deref() {
            Some(u) if !u.is_empty() => Ok(u),
            _ => Err(Error::invalid(
                "store",
                format!(
                    "no store given: pass --store URL, set LEASEHOLD_STORE, or put \"store\" in the config file ({}); \
                     e.g. file:///tmp/fleet on a laptop, s3://bucket/prefix in the cloud",
                    config_path().map_or_else(
                        || "$XDG_CONFIG_HOME/leasehold/config.json".to_string(),
                        |p| p.display().to_string()
                    )
                ),
            )),
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Probe a store: prove it honours conditional writes, or refuse it.
    Doctor {
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of text.
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
        /// Manifest files, as with -f.
        files: Vec<String>,
        /// A manifest file, a directory of them (its *.json, *.yaml and *.yml,
        /// in name order), or - for stdin; may be repeated. A file holds one
        /// manifest ({"name", "spec"}), a JSON array of them, or YAML
        /// documents separated by `---`.
        #[arg(short = 'f', long = "filename")]
        filenames: Vec<String>,
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
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Which node owns a session: exit 0 when a live owner runs it, 1
    /// otherwise (none, or not running), 2 on any error.
    Resolve {
        /// The session to resolve.
        #[arg(add = ArgValueCompleter::new(super::complete::sessions))]
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Also dial the owner; if it does not answer, check its node lease.
        #[arg(long)]
        wake: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Wake a session and wait until it is ready (a live owner runs it and
    /// its health check passes): a sleeping one is released to be placed
    /// (one conditional write; concurrent wakes start one run). Exit 0 when
    /// ready, 1 when not within --wait.
    Wake {
        /// The session to wake.
        #[arg(add = ArgValueCompleter::new(super::complete::sessions))]
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// How long to wait for it to run and be ready.
        #[arg(long, default_value = "30s", value_parser = parse_duration, allow_hyphen_values = true)]
        wait: Duration,
        /// Set an alarm instead of waking now: at TIME (UTC, RFC 3339 with
        /// Z, e.g. 2026-12-24T18:00:00Z; no zone is read as UTC) or
        /// +DURATION from now (e.g. +10m). A node wakes the session then if
        /// it is asleep, at most once.
        #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
        at: Option<String>,
        /// The fleet's token: the wake then reaches the owner of a running
        /// session, restarting its idle time (`sleep.after_idle`).
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Inside a session: ask its node to put it to sleep now (its run is
    /// stopped; a wake runs it again, at a higher epoch).
    Sleep {
        /// Set an alarm first: a node wakes the session this long from now
        /// (e.g. 10m), unless something wakes it before.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        wake_in: Option<Duration>,
    },
    /// List sessions (default), nodes or manifests (`get` is the same, as
    /// in kubectl).
    #[command(visible_alias = "get")]
    Ls {
        /// What to list: sessions (default), nodes or manifests.
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
        /// The session to describe.
        #[arg(add = ArgValueCompleter::new(super::complete::sessions))]
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// File with the fleet's bearer token, to read the owner's journal.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        /// Print JSON instead of text.
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
        /// The object key, e.g. sessions/web, manifests/web, nodes/n1, fleet.
        key: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of text.
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
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a session's output (stdout and stderr), read from its owner
    /// node's API; with --follow, keep printing, following the session to
    /// its next owner.
    Logs {
        /// The session whose output to show.
        #[arg(add = ArgValueCompleter::new(super::complete::sessions))]
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// File with the fleet's bearer token.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: std::path::PathBuf,
        /// Keep printing new output as the session writes it (across owners).
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
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a static shell completion script (bash, zsh, fish, elvish,
    /// powershell). For session and node names too: `source <(COMPLETE=bash leasehold)`.
    Completions {
        /// The shell to write completions for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Pause a session: its owner stops it and keeps its claim (`paused`);
    /// no node starts it until `resume`. Exit 7 if there is no manifest.
    Pause {
        /// The session to pause.
        #[arg(add = ArgValueCompleter::new(super::complete::sessions))]
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
        /// The session to resume.
        #[arg(add = ArgValueCompleter::new(super::complete::sessions))]
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
        /// The session to run again.
        #[arg(add = ArgValueCompleter::new(super::complete::sessions))]
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
        /// The session whose manifest to delete.
        #[arg(add = ArgValueCompleter::new(super::complete::sessions))]
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
    /// table (default), wide (more columns), json, yaml (the same fields
    /// as json), or jsonpath=TEMPLATE (kubectl's, over the json: e.g.
    /// -o jsonpath='{[*].name}{"\n"}').
    #[arg(short = 'o', long, value_parser = parse_output, value_name = "FORMAT")]
    pub output: Option<Output>,
    /// Only rows matching every k=v: nodes by their labels, sessions and
    /// manifests by their manifest's labels.
    #[arg(short = 'l', long = "selector", value_parser = parse_labels, default_value = "")]
    pub selector: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Output {
    Table,
    Wide,
    Json,
    Yaml,
    JsonPath(super::jsonpath::Template),
}

/// `-o`: a format's name, or `jsonpath=TEMPLATE` (checked here, so a bad
/// template is exit 2 before anything is read).
fn parse_output(s: &str) -> Result<Output, String> {
    if let Some(t) = s.strip_prefix("jsonpath=") {
        return super::jsonpath::Template::parse(t).map(Output::JsonPath);
    }
    Ok(match s {
        "table" => Output::Table,
        "wide" => Output::Wide,
        "json" => Output::Json,
        "yaml" => Output::Yaml,
        "jsonpath" => return Err("jsonpath needs a template: -o jsonpath='{[*].name}'".into()),
        _ => {
            return Err(format!(
                "{s:?} is not a format: table, wide, json, yaml or jsonpath=TEMPLATE"
            ));
        }
    })
}

impl ListView {
    /// Rows as data (json, yaml or jsonpath), not a table.
    pub fn json(&self) -> bool {
        self.json
            || matches!(
                self.output,
                Some(Output::Json | Output::Yaml | Output::JsonPath(_))
            )
    }
    /// Prints `rows` as JSON, as YAML with `-o yaml`, or through the
    /// template of `-o jsonpath=`.
    pub fn print(&self, rows: &serde_json::Value) {
        match &self.output {
            _ if self.json => print_json(rows),
            Some(Output::Yaml) => {
                print!("{}", serde_saphyr::to_string(rows).expect("rows serialise"))
            }
            Some(Output::JsonPath(t)) => {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                // A closed pipe (`| head`) is not an error worth a panic.
                let _ = out.write_all(t.render(rows).as_bytes());
                let _ = out.flush();
            }
            _ => print_json(rows),
        }
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
pub(crate) enum LsWhat {
    Sessions,
    Nodes,
    Manifests,
}

// Parsed once per process: the size of `Run` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum NodeOp {
    /// Take no new sessions on node ID (running ones stay), as `kubectl
    /// cordon`. Written to control/ID; the node applies it within a few
    /// passes, at once when nudged (with --token-file).
    Cordon {
        /// The node to cordon.
        #[arg(add = ArgValueCompleter::new(super::complete::nodes))]
        id: String,
        #[command(flatten)]
        store: StoreArgs,
        /// The fleet's bearer token, to nudge the node.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Undo cordon and drain: node ID takes sessions again.
    Uncordon {
        /// The node to uncordon.
        #[arg(add = ArgValueCompleter::new(super::complete::nodes))]
        id: String,
        #[command(flatten)]
        store: StoreArgs,
        /// The fleet's bearer token: nudges the node, so it acts at once.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Cordon node ID and hand its sessions over gracefully (each stopped,
    /// its claim released, so a peer claims it at once); waits until the
    /// node holds none, or --timeout (exit 4).
    Drain {
        /// The node to drain.
        #[arg(add = ArgValueCompleter::new(super::complete::nodes))]
        id: String,
        #[command(flatten)]
        store: StoreArgs,
        /// The fleet's bearer token: nudges the node, so it acts at once.
        #[arg(long, env = "LEASEHOLD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        /// How long to wait for the node's sessions to move before giving up (exit 4); the drain goes on.
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

pub(super) fn parse_env_name(s: &str) -> Result<String, String> {
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

pub(super) fn parse_labels(s: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
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
pub(crate) enum LeaseOp {
    /// Declare NAME, a new lease: writes its placeholder, so that the first
    /// acquire takes it at once. Without it, a name with no record (never
    /// created, or deleted under a holder that may still believe in it) is
    /// acquired only after watching it absent for its ttl + margin. Exit 0
    /// whether or not it existed ("exists" says which).
    Create {
        /// The lease to declare (a name: 1-128 of [a-z0-9._-]).
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Acquire NAME. Prints the epoch (the fencing token) and a lease token
    /// for `renew`/`release`. Exit 1 if someone else holds it.
    Acquire {
        /// The lease to acquire.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// How long the lease holds without a renewal (renew every ttl/3).
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
        /// Declare NAME first if it has no record at all (as `lease create`):
        /// a first acquire of a new name then takes it at once. Without it,
        /// a name with no record is taken only after being watched absent for
        /// its ttl + margin, since it may be a deleted lease whose holder
        /// still believes in it. Never re-creates over a deleted lease's
        /// marker.
        #[arg(long)]
        create: bool,
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
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Renew NAME with the token from `acquire` (or the last `renew`).
    Renew {
        /// The lease to renew.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Lease token; not a secret (it names the holder and version, both
        /// readable in the bucket).
        #[arg(long, env = "LEASEHOLD_LEASE_TOKEN")]
        token: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Release NAME: a tombstone that keeps the epoch.
    Release {
        /// The lease to release.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Lease token from `acquire` or the last `renew`.
        #[arg(long, env = "LEASEHOLD_LEASE_TOKEN")]
        token: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show the record of NAME.
    Show {
        /// The lease to show.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

pub(super) fn parse_duration(s: &str) -> Result<Duration, String> {
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
pub(crate) enum FenceOp {
    /// This run as its node sees it (session, epoch, node, lease validity
    /// left), from memory: no bucket request.
    Check {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The ack gate: the node reads the claim (one GET) and answers yes
    /// only if it still names this run, with the node's lease valid for
    /// --margin after the read.
    Ack {
        /// How long the node lease must stay valid after the claim is read for the answer to be yes.
        #[arg(long, default_value = "1s", value_parser = parse_duration, allow_hyphen_values = true)]
        margin: Duration,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every flag and argument of every command says what it is (issue
    /// #44: `apply --json`, `logs -f`, `<FILE>`, `<NAME>` had none).
    #[test]
    fn every_flag_and_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "leasehold", &mut missing);
        assert!(
            missing.is_empty(),
            "{} without help:\n{}",
            missing.len(),
            missing.join("\n")
        );
    }
}
