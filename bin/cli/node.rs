//! `leasehold node`: run a node, and cordon, drain or uncordon one.

use super::*;

/// Node IDs are names; the control object and nudge need the node's record.
pub(super) async fn node_control(op: NodeOp) -> Result<(), Failure> {
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
pub(super) async fn sessions_owned_by(store: &Arc<dyn Store>, id: &str) -> Result<usize, Error> {
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

pub(super) async fn node(op: NodeOp) -> Result<(), Failure> {
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
    // A missing local root is refused, not created: `init` makes a fleet.
    let store = open_creating_on(&store, Some(renew_thread.handle()), false).await?;
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
        running: leasehold::fleet::runner::running_of(runner.clone()),
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
pub(super) fn listen_addr(s: &str) -> Result<std::net::SocketAddr, Error> {
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

/// The node's rule for session users (see `leasehold::fleet::identity`),
/// checked at start: a --session-user that does not exist here, or root
/// without --allow-root-sessions, stops the node with exit 2 rather than
/// failing every session.
pub(super) fn session_users(
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

/// The default directory for session logs (see `node run --log-dir`).
pub(super) fn default_log_dir(node: &str, store_identity: &str) -> std::path::PathBuf {
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
