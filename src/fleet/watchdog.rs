//! The dead-man switch that every exec session runs under.
//!
//! A node whose main process is frozen (SIGSTOP, a debugger, a long pause)
//! cannot stop its children, yet its lease lapses and a peer takes over. So
//! each session's process group is owned by a separate small process, this
//! watchdog (`leasehold __watchdog`), which:
//!
//! - starts the session command in a new process group;
//! - reads deadlines from its stdin, as absolute `CLOCK_MONOTONIC`
//!   nanoseconds (one clock for every process on the machine, so no transit
//!   delay stretches the deadline), sent by the node after every successful
//!   renew;
//! - SIGKILLs the group the moment the last announced deadline passes;
//! - SIGKILLs it at once when its stdin closes (the node is gone);
//! - on `stop`, sends SIGTERM, then SIGKILL after the grace period;
//! - reports on stdout `pid <pid>` at start and `end <reason> <code>` at the
//!   end, and exits.
//!
//! The watchdog runs in its own session (`setsid`), so a terminal's Ctrl-C
//! aimed at the node does not reach it; it acts only on what the node tells
//! it or on the node's disappearance.

use std::io::{BufRead, Write};
use std::process::{Command, ExitCode};
use std::sync::mpsc;
use std::time::Duration;

/// `CLOCK_MONOTONIC` now, in nanoseconds: shared by every process on the host.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reports a line to the node. The node may be gone (that is often why we
/// are finishing), so a closed pipe is ignored, never a panic.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
}

enum Msg {
    Deadline(u64),
    Stop,
    Gone,
}

fn kill_group(pgid: i32, sig: i32) {
    // SAFETY: plain syscall; a negative pid addresses the process group.
    unsafe { libc::kill(-pgid, sig) };
}

/// The watchdog's main: `__watchdog <grace_ms> <initial_deadline_ns> <program> [args...]`.
pub fn main(args: &[String]) -> ExitCode {
    let (Some(grace), Some(deadline), Some(program)) = (args.first(), args.get(1), args.get(2))
    else {
        let _ = writeln!(
            std::io::stderr(),
            "error: usage: leasehold __watchdog <grace_ms> <deadline_ns> <program> [args...]"
        );
        return ExitCode::from(2);
    };
    let (Ok(grace_ms), Ok(mut deadline)) = (grace.parse::<u64>(), deadline.parse::<u64>()) else {
        let _ = writeln!(
            std::io::stderr(),
            "error: __watchdog: grace and deadline must be integers"
        );
        return ExitCode::from(2);
    };
    // SAFETY: setsid has no memory-safety preconditions; failure (already a
    // group leader) is harmless.
    unsafe { libc::setsid() };
    if monotonic_ns() >= deadline {
        say("end deadline -1");
        return ExitCode::from(137);
    }
    use std::os::unix::process::CommandExt;
    let mut child = match Command::new(program)
        .args(&args[3..])
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            say("end spawn-failed 127");
            let _ = writeln!(std::io::stderr(), "error: cannot start {program:?}: {e}");
            return ExitCode::from(127);
        }
    };
    let pgid = child.id() as i32;
    say(&format!("pid {pgid}"));

    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let msg = match line.split_once(' ') {
                Some(("deadline", n)) => n.trim().parse().ok().map(Msg::Deadline),
                _ if line.trim() == "stop" => Some(Msg::Stop),
                _ => None,
            };
            if let Some(m) = msg
                && tx.send(m).is_err()
            {
                return;
            }
        }
        let _ = tx.send(Msg::Gone);
    });

    let finish = |reason: &str, code: i32| {
        say(&format!("end {reason} {code}"));
        ExitCode::from(code.clamp(0, 255) as u8)
    };
    let code_of = |s: std::process::ExitStatus| {
        use std::os::unix::process::ExitStatusExt;
        s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
    };
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            // The leader exited; take the rest of its group with it.
            kill_group(pgid, libc::SIGKILL);
            return finish("exited", code_of(status));
        }
        let now = monotonic_ns();
        if now >= deadline {
            kill_group(pgid, libc::SIGKILL);
            let _ = child.wait();
            return finish("deadline", 137);
        }
        let wait = Duration::from_nanos((deadline - now).min(20_000_000));
        match rx.recv_timeout(wait) {
            Ok(Msg::Deadline(d)) => deadline = d,
            Ok(Msg::Stop) => {
                kill_group(pgid, libc::SIGTERM);
                let until = monotonic_ns() + grace_ms * 1_000_000;
                loop {
                    if let Ok(Some(status)) = child.try_wait() {
                        kill_group(pgid, libc::SIGKILL);
                        return finish("stopped", code_of(status));
                    }
                    // The lease deadline still binds during a graceful stop.
                    let now = monotonic_ns();
                    if now >= until || now >= deadline {
                        kill_group(pgid, libc::SIGKILL);
                        let status = child.wait().ok().map_or(137, code_of);
                        return finish("stopped", status);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Ok(Msg::Gone) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                kill_group(pgid, libc::SIGKILL);
                let _ = child.wait();
                return finish("node-gone", 137);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}
