//! The stop signals a spec may name (`stop_signal`), by name.

/// The number of a stop signal a spec may name (`SIGTERM` or `TERM`, ...).
/// SIGKILL and SIGSTOP are not stop requests, and anything else is refused.
pub fn number(name: &str) -> Option<i32> {
    Some(match name.strip_prefix("SIG").unwrap_or(name) {
        "TERM" => libc::SIGTERM,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "HUP" => libc::SIGHUP,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        _ => return None,
    })
}
