//! Starting a session: its user, environment, logs, cgroups and limits, and the watchdog it runs under.

use super::*;

impl ExecRunner {
    pub(super) async fn start_session(&self, s: SessionStart) -> Result<()> {
        if self.clock.now() >= s.deadline {
            return Err(deadline_passed(&s.name, s.epoch));
        }
        // Never two process trees of one session on one node: the node stops
        // a run before it starts another, and this refuses if it did not.
        if let Some(p) = self.shared.children.lock().unwrap().get(&s.name) {
            return Err(Error::Internal(format!(
                "session {} (epoch {}) is still running here at epoch {}",
                s.name, s.epoch, p.epoch
            )));
        }
        // What only this node can know, before anything is made: who the
        // session runs as, and its working directory. Each refusal is the
        // session's reason (it fails here, with that reason, rather than
        // crash-looping on an error nobody sees).
        let (uid, gid) = crate::fleet::identity::own_ids();
        let run_as = crate::fleet::identity::resolve(
            &self.users,
            s.spec.user.as_deref(),
            s.spec.group.as_deref(),
            uid,
            gid,
        )
        .map_err(|reason| Error::invalid(format!("spec.user of session {}", s.name), reason))?;
        if let Some(w) = &s.spec.workdir {
            match std::fs::metadata(w) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(Error::invalid(
                        format!("spec.workdir of session {}", s.name),
                        format!("workdir {w} is not a directory"),
                    ));
                }
                Err(e) => {
                    return Err(Error::invalid(
                        format!("spec.workdir of session {}", s.name),
                        if e.kind() == std::io::ErrorKind::NotFound {
                            format!("workdir {w} does not exist")
                        } else {
                            format!("workdir {w}: {e}")
                        },
                    ));
                }
            }
        }
        // Limits this node cannot enforce, or its host cannot hold: not
        // started here (never run without them).
        self.limits.admit(&s.spec.limits).map_err(|reason| {
            Error::invalid(format!("spec.limits of session {}", s.name), reason)
        })?;
        // A session running as the node's own user owns the cgroup files
        // that hold its limits, and could raise them: that is no limit.
        let session_uid = run_as.as_ref().map_or(uid, |r| r.uid);
        if !s.spec.limits.is_empty() && session_uid == uid {
            return Err(Error::invalid(
                format!("spec.limits of session {}", s.name),
                format!(
                    "cannot enforce its limits: it would run as uid {uid}, the node's own user, \
                     who may rewrite its cgroup's limits (a node running as root runs sessions \
                     as another user)"
                ),
            ));
        }
        // The spec's own stop grace, else the node's.
        let grace = s.spec.stop_grace.unwrap_or(self.grace);
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}-e{}-{n}", s.name, s.epoch);
        let cgroup = match &self.cgroups {
            Some(root) => Some(
                crate::fleet::contain::Cgroup::create(root.dir().join(&tag))
                    .map_err(|e| Error::Internal(format!("session cgroup: {e}")))?,
            ),
            None => None,
        };
        let limit_cgroups = if s.spec.limits.is_empty() {
            Default::default()
        } else {
            match self
                .limits
                .apply(&s.spec.limits, cgroup.as_ref().map(|c| c.path()), &tag)
            {
                Ok(r) => r,
                Err(e) => {
                    if let Some(cg) = &cgroup {
                        cg.kill_and_remove(Duration::from_secs(1));
                    }
                    return Err(Error::invalid(
                        format!("spec.limits of session {}", s.name),
                        format!("its limits could not be set: {e}"),
                    ));
                }
            }
        };
        let args = crate::fleet::watchdog::Args {
            grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            deadline_ns: self.absolute(s.deadline),
            cgroup: cgroup.as_ref().map(|c| c.path().to_path_buf()),
            joins: limit_cgroups.v1.clone(),
            members: Vec::new(),
            log: self.log_path(&s.name),
            log_max: self.log_max,
            uid: run_as.as_ref().map(|r| r.uid),
            gid: run_as.as_ref().map(|r| r.gid),
            workdir: s.spec.workdir.as_ref().map(PathBuf::from),
            stop_signal: s
                .spec
                .stop_signal
                .as_deref()
                .and_then(crate::fleet::manifest::stop_signal_number),
            program: self.launcher.first().unwrap_or(&s.spec.command).clone(),
            args: self
                .launcher
                .iter()
                .skip(1)
                .chain(if self.launcher.is_empty() {
                    None
                } else {
                    Some(&s.spec.command)
                })
                .chain(&s.spec.args)
                .cloned()
                .collect(),
        };
        let mut cmd = self.command(&s, &args, run_as.as_ref());
        let check_ctx = Arc::new(CheckCtx {
            ids: run_as.as_ref().map(|r| (r.uid, r.gid)),
            workdir: args.workdir.clone(),
            env: cmd
                .get_envs()
                .filter_map(|(k, v)| Some((k.to_os_string(), v?.to_os_string())))
                .collect(),
            cgroups: args.cgroup.iter().chain(&args.joins).cloned().collect(),
        });
        // Current from before it can run (its channel may be called at
        // once) until it is in `children`, or its start failed.
        let _starting = Starting::new(&self.shared, &s.name, s.epoch);
        let mut child = {
            let mut registry = watchdogs().lock().unwrap();
            let child = cmd.spawn().map_err(|e| {
                Error::Internal(format!(
                    "cannot start the watchdog {}: {e}",
                    self.watchdog.display()
                ))
            })?;
            registry.insert(child.id() as i32);
            child
        };
        let stdin = child.stdin.take();
        if let Some(w) = &stdin {
            use std::os::fd::AsRawFd;
            // Never block on a watchdog that stopped reading (a session
            // can SIGSTOP its watchdog): a full pipe is a lost watchdog.
            // SAFETY: fcntl on a descriptor we own.
            unsafe {
                let fd = w.as_raw_fd();
                let fl = libc::fcntl(fd, libc::F_GETFL);
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
        }
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let end = Arc::new(Mutex::new(None));
        let events = Arc::new(Mutex::new(Default::default()));
        let (first_tx, first) = tokio::sync::oneshot::channel::<String>();
        let (done_tx, reader_done) = std::sync::mpsc::channel();
        let end2 = end.clone();
        let events2 = events.clone();
        let wake = self.wake.lock().unwrap().clone();
        std::thread::spawn(move || {
            let mut first_tx = Some(first_tx);
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("end ") {
                    let mut parts = rest.split_whitespace();
                    let reason = parts.next().unwrap_or("unknown").to_string();
                    let code = parts.next().and_then(|c| c.parse().ok()).unwrap_or(137);
                    *end2.lock().unwrap() = Some((reason, code));
                }
                if let Some(rest) = line.strip_prefix("limit ") {
                    let mut n = rest.split_whitespace().map(|x| x.parse().unwrap_or(0));
                    *events2.lock().unwrap() = crate::fleet::limits::enforce::LimitEvents {
                        oom_kills: n.next().unwrap_or(0),
                        forks_refused: n.next().unwrap_or(0),
                    };
                    continue; // not the first line: that is `pid` or `end`
                }
                if let Some(tx) = first_tx.take() {
                    let _ = tx.send(line);
                }
            }
            let _ = done_tx.send(());
            let _ = wake.send(());
        });
        // The first line is `pid <pid>` (or `end ...` if it could not start).
        // The session runs before that line is written, and may already
        // have stopped its watchdog: a stopped watchdog is a failed start,
        // not a 10 s wait.
        let wd = child.id() as i32;
        let mut first = first;
        let mut waited = Duration::ZERO;
        let line = loop {
            tokio::select! {
                l = &mut first => break l.unwrap_or_default(),
                _ = self.clock.sleep(Duration::from_millis(50)) => {}
            }
            waited += Duration::from_millis(50);
            if waited >= Duration::from_secs(10) || process_stopped(wd) {
                break String::new();
            }
        };
        let pgid = match line.strip_prefix("pid ") {
            Some(p) => p.trim().parse().unwrap_or(0),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                watchdogs().lock().unwrap().remove(&(child.id() as i32));
                if let Some(cg) = &cgroup {
                    cg.kill_and_remove(Duration::from_secs(1));
                }
                limit_cgroups.remove();
                return Err(Error::invalid(
                    format!("spec.command of session {}", s.name),
                    if line.is_empty() {
                        "its watchdog never reported (stopped, or stuck for 10 s): killed, \
                         with every process of the session"
                            .to_string()
                    } else {
                        format!("could not start {:?} ({})", s.spec.command, line.trim())
                    },
                ));
            }
        };
        self.shared.children.lock().unwrap().insert(
            s.name,
            Proc {
                epoch: s.epoch,
                grace,
                child,
                stdin,
                pgid,
                cgroup,
                limit_cgroups,
                limits: s.spec.limits,
                events,
                check_ctx,
                end,
                reader_done,
                deadline_ns: args.deadline_ns,
            },
        );
        Ok(())
    }
}
