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

mod apply;
mod args;
mod complete;
mod demo;
mod doctor;
mod edit;
mod fence;
mod inventory;
mod jsonpath;
mod lease;
mod logs;
mod node;
mod wake;
mod watch;

use apply::*;
pub use args::Cli;
use args::*;
use doctor::*;
use edit::*;
use lease::*;
use node::*;

use clap::Parser;
use leasehold::Name;
use leasehold::clock::{Clock, OsEntropy, SystemClock};
use leasehold::error::{Error, ErrorKind};
use leasehold::lease::{Acquire, AcquireOptions, LeaseClient, LeaseToken};
use leasehold::record::Kind;
use leasehold::store::{OpenOptions, Store, open_store};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

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
    // `COMPLETE=bash leasehold` (and the shell calling back with the words
    // typed so far): dynamic completion, session and node names included.
    // Exits here when it is such a call; a no-op otherwise.
    {
        use clap::CommandFactory;
        clap_complete::CompleteEnv::with_factory(Cli::command).complete();
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
    let url = args.url()?;
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
    open_creating_on(args, None, true).await
}

/// As [`open_creating`], with the HTTP stores' socket work on `io` (see
/// `OpenOptions::io_runtime`).
async fn open_creating_on(
    args: &StoreArgs,
    io: Option<tokio::runtime::Handle>,
    create: bool,
) -> Result<Arc<dyn Store>, Error> {
    let url = args.url()?;
    if let Some(dir) = url
        .to_ascii_lowercase()
        .strip_prefix("file://")
        .map(|_| &url["file://".len()..])
        && dir.starts_with('/')
        && !std::path::Path::new(dir).exists()
    {
        if !create {
            return Err(Error::invalid(
                "--store",
                format!(
                    "{dir} does not exist: `leasehold init --store {url}` creates a fleet there (a typo?)"
                ),
            ));
        }
        eprintln!("creating {dir} (a new local store)");
    }
    let opts = OpenOptions {
        endpoint: args.endpoint.clone(),
        request_timeout: args.request_timeout,
        io_runtime: io,
    };
    open_store(url, &opts).await
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

/// A duration as people write it: humantime's units, with a space after
/// each number ("1 day", "2h 30m"; humantime prints "1day").
pub(crate) fn for_humans(d: Duration) -> String {
    let text = humantime::format_duration(d).to_string();
    let mut out = String::with_capacity(text.len() + 4);
    let mut prev_digit = false;
    for (i, c) in text.char_indices() {
        // Words get a space ("1 day", "2 months"); h, m, s, ms, us, ns
        // stay as units do.
        let word = c.is_ascii_alphabetic()
            && (!matches!(c, 'h' | 'm' | 's' | 'u' | 'n') || text[i..].starts_with("month"));
        if prev_digit && word {
            out.push(' ');
        }
        prev_digit = c.is_ascii_digit();
        out.push(c);
    }
    out
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
            files,
            filenames,
            store,
            replace,
            token_file,
            json,
        } => {
            let paths: Vec<String> = files.into_iter().chain(filenames).collect();
            apply(
                &paths,
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
            at: Some(at),
            json,
            ..
        } => wake::alarm(name, &store, &at, json).await,
        Command::Wake {
            name,
            store,
            wait,
            token_file,
            json,
            at: None,
        } => wake::wake(name, &store, wait, token_file.as_deref(), json, max_skew).await,
        Command::Sleep { wake_in } => wake::sleep(wake_in).await,
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
            // Probed first, as a node probes before it serves: on a store
            // that ignores conditions, the marker's create-if-absent would
            // be no guard, and each `init` would write a fleet of its own.
            leasehold::probe::probe(&store, &OsEntropy::new(), &SystemClock::new()).await?;
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
                    for_humans(older_than)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(for_humans(Duration::from_secs(86_400)), "1 day");
        assert_eq!(
            for_humans(Duration::from_secs(2 * 86_400 + 3_600)),
            "2 days 1h"
        );
        assert_eq!(for_humans(Duration::from_secs(90)), "1m 30s");
        assert_eq!(for_humans(Duration::from_millis(250)), "250ms");
        assert!(for_humans(Duration::from_secs(40 * 86_400)).starts_with("1 month"));
    }
}
