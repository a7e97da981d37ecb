//! Exec health checks: a probe run as the session, under a watchdog of its own.

use super::*;

impl ExecRunner {
    #[allow(clippy::disallowed_methods)] // an I/O bound on a probe, not protocol time
    pub(super) async fn run_exec_check(
        &self,
        name: &str,
        argv: &[String],
        timeout: Duration,
    ) -> std::result::Result<(), String> {
        let ctx = self
            .shared
            .children
            .lock()
            .unwrap()
            .get(name)
            .map(|p| p.check_ctx.clone())
            .ok_or("the session is not running here")?;
        let program = argv.first().ok_or("no command")?;
        // Under a watchdog of its own, as the session runs: its launcher,
        // user, working directory, environment and cgroups (joined, never
        // owned: the check's end kills only its own tree), in a session of
        // its own that the watchdog kills whole at the deadline, with every
        // descriptor closed and every signal reset.
        let args = crate::fleet::watchdog::Args {
            grace_ms: 0,
            deadline_ns: crate::fleet::watchdog::monotonic_ns()
                .saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)),
            cgroup: None,
            joins: Vec::new(),
            members: ctx.cgroups.clone(),
            log: None,
            log_max: 0,
            uid: ctx.ids.map(|i| i.0),
            gid: ctx.ids.map(|i| i.1),
            workdir: ctx.workdir.clone(),
            stop_signal: None,
            program: self.launcher.first().unwrap_or(program).clone(),
            args: self
                .launcher
                .iter()
                .skip(1)
                .chain(if self.launcher.is_empty() {
                    None
                } else {
                    Some(program)
                })
                .chain(&argv[1..])
                .cloned()
                .collect(),
        };
        let mut std_cmd = Command::new(&self.watchdog);
        std_cmd
            .arg("__watchdog")
            .args(args.to_argv())
            .env_clear()
            .envs(ctx.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut cmd = tokio::process::Command::from(std_cmd);
        cmd.kill_on_drop(true);
        // Registered as a watchdog while it runs: the node's orphan sweep
        // kills children of ours it does not know.
        let mut child = {
            let mut registry = watchdogs().lock().unwrap();
            let child = cmd
                .spawn()
                .map_err(|e| format!("cannot start its watchdog: {}", e.kind()))?;
            if let Some(pid) = child.id() {
                registry.insert(pid as i32);
            }
            child
        };
        let wd = child.id().map(|p| p as i32);
        // Its stdin stays open until it ends: a closed one means the node
        // is gone, and it kills the check.
        let _stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let report = async {
            use tokio::io::AsyncBufReadExt;
            let mut end = None;
            if let Some(out) = stdout {
                let mut lines = tokio::io::BufReader::new(out).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    if let Some(rest) = l.strip_prefix("end ") {
                        let mut p = rest.split_whitespace();
                        let reason = p.next().unwrap_or("").to_string();
                        let code: i32 = p.next().and_then(|c| c.parse().ok()).unwrap_or(137);
                        end = Some((reason, code));
                    }
                }
            }
            end
        };
        // The watchdog ends the check at its deadline; a second more for
        // it to report, then it is killed.
        let limit = timeout + Duration::from_secs(1);
        let end = tokio::time::timeout(limit, report).await.ok().flatten();
        if end.is_none() {
            let _ = child.start_kill();
        }
        let _ = child.wait().await;
        if let Some(pid) = wd {
            watchdogs().lock().unwrap().remove(&pid);
        }
        match end {
            Some((r, 0)) if r == "exited" => Ok(()),
            Some((r, 127)) if r == "spawn-failed" => Err(format!("cannot start {program:?}")),
            Some((r, _)) if r == "deadline" => Err(format!(
                "no exit within {}",
                humantime::format_duration(timeout)
            )),
            Some((_, c)) => Err(format!("exit {c}")),
            None => Err("its watchdog did not report".into()),
        }
    }
}
