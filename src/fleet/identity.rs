//! Who a session runs as: its spec's `user` and `group`, the node's
//! default session user, and whether the node allows root sessions.
//!
//! # Why a node running as root does not run sessions as root
//!
//! A session running as root on its node's host can read the node's
//! environment (`/proc/<pid>/environ`: the bucket's credentials), move
//! itself out of its cgroup, stop its watchdog and kill its node: every
//! containment rule becomes advice. So, as Nomad's exec driver runs tasks
//! as `nobody`, a node that runs as root runs sessions as an unprivileged
//! user (`leasehold node run --session-user`, `nobody` by default) unless
//! the spec says `user: root` *and* the node was started with
//! `--allow-root-sessions`: the operator asks for it in so many words, twice.
//!
//! A node that is not root cannot change users: its sessions run as its own
//! user, and a spec that names another is refused with that reason.
//!
//! Names are looked up on the node (`getpwnam_r`, `getgrnam_r`), when the
//! session starts: a user that does not exist there is the session's
//! reason for failing on that node, never a crash loop.

use std::ffi::{CStr, CString};

/// The node's rule for session users.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionUsers {
    /// The user a session runs as when its spec names none (`None`: the
    /// node's own user).
    pub default_user: Option<String>,
    /// Sessions may run as root (uid 0) when their spec says so.
    pub allow_root: bool,
}

/// The credentials a session's process takes before it runs its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    /// From the user's passwd entry, when it has one: the session's `HOME`,
    /// `USER` and `LOGNAME`.
    pub home: Option<String>,
    pub name: Option<String>,
}

/// A user's passwd entry: (uid, primary gid, home, name).
type Passwd = (u32, u32, String, String);

fn buf_len() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_GETPW_R_SIZE_MAX) };
    if n > 0 { n as usize } else { 16 * 1024 }
}

fn passwd_by(name: Option<&CStr>, uid: u32) -> Option<Passwd> {
    let mut buf = vec![0 as libc::c_char; buf_len()];
    loop {
        // SAFETY: zeroed passwd is a valid out-parameter for getpw*_r.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; the buffer's length
        // is passed with it.
        let rc = unsafe {
            match name {
                Some(n) => {
                    libc::getpwnam_r(n.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out)
                }
                None => libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out),
            }
        };
        if rc == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || out.is_null() {
            return None;
        }
        // SAFETY: on success the strings point into `buf`, NUL-terminated.
        let s =
            |p: *const libc::c_char| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        return Some((pw.pw_uid, pw.pw_gid, s(pw.pw_dir), s(pw.pw_name)));
    }
}

fn group_by_name(name: &CStr) -> Option<u32> {
    let mut buf = vec![0 as libc::c_char; buf_len()];
    loop {
        // SAFETY: as in `passwd_by`.
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::group = std::ptr::null_mut();
        // SAFETY: as in `passwd_by`.
        let rc = unsafe {
            libc::getgrnam_r(
                name.as_ptr(),
                &mut gr,
                buf.as_mut_ptr(),
                buf.len(),
                &mut out,
            )
        };
        if rc == libc::ERANGE && buf.len() < (1 << 20) {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        return (rc == 0 && !out.is_null()).then_some(gr.gr_gid);
    }
}

/// A user or group as a spec names it: a name, or a numeric id.
fn numeric(s: &str) -> Option<u32> {
    s.parse::<u32>().ok().filter(|n| *n < u32::MAX)
}

/// Whether `s` is a user or group a spec may name: a numeric id below
/// 2^31, or a name of 1-32 of `[a-z_][a-z0-9_-]*` with an optional trailing
/// `$` (as `useradd` accepts).
pub fn valid_name(s: &str) -> bool {
    if let Ok(n) = s.parse::<u64>() {
        return n < (1 << 31);
    }
    let body = s.strip_suffix('$').unwrap_or(s);
    !body.is_empty()
        && s.len() <= 32
        && body
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && body
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

fn lookup_user(user: &str) -> Result<(u32, Option<Passwd>), String> {
    if let Some(uid) = numeric(user) {
        return Ok((uid, passwd_by(None, uid)));
    }
    let c = CString::new(user).map_err(|_| format!("user {user:?} is not a valid name"))?;
    match passwd_by(Some(&c), 0) {
        Some(p) => Ok((p.0, Some(p))),
        None => Err(format!("user {user} does not exist")),
    }
}

fn lookup_group(group: &str) -> Result<u32, String> {
    if let Some(gid) = numeric(group) {
        return Ok(gid);
    }
    let c = CString::new(group).map_err(|_| format!("group {group:?} is not a valid name"))?;
    group_by_name(&c).ok_or_else(|| format!("group {group} does not exist"))
}

/// Group root is as good as root on most hosts (root-group-writable files,
/// devices): the same rule as the user.
const ROOT_GROUP: &str =
    "sessions run in group root only on a node started with --allow-root-sessions";

/// The nogroup id, for a numeric user with no passwd entry and no group.
const NOGROUP: u32 = 65534;

/// Who a session whose spec names `user` and `group` runs as on a node
/// with `policy` whose process runs as `node_uid`/`node_gid`: `None` to run
/// as the node's own user (nothing to change), or the reason it may not run
/// here at all. Pure but for the name lookups.
pub fn resolve(
    policy: &SessionUsers,
    user: Option<&str>,
    group: Option<&str>,
    node_uid: u32,
    node_gid: u32,
) -> Result<Option<RunAs>, String> {
    let requested = user.or(policy.default_user.as_deref());
    let Some(requested) = requested else {
        if let Some(g) = group {
            let gid = lookup_group(g)?;
            if gid == 0 && gid != node_gid && !policy.allow_root {
                return Err(ROOT_GROUP.into());
            }
            if node_uid != 0 && gid != node_gid {
                return Err(format!(
                    "this node runs as uid {node_uid} and cannot run sessions in group {g}"
                ));
            }
            return Ok((gid != node_gid).then_some(RunAs {
                uid: node_uid,
                gid,
                home: None,
                name: None,
            }));
        }
        return Ok(None);
    };
    let (uid, entry) = lookup_user(requested)?;
    let gid = match group {
        Some(g) => lookup_group(g)?,
        None => entry.as_ref().map_or(NOGROUP, |p| p.1),
    };
    if uid == 0 && !policy.allow_root {
        return Err(
            "sessions run as root only on a node started with --allow-root-sessions".into(),
        );
    }
    if gid == 0 && !policy.allow_root {
        return Err(ROOT_GROUP.into());
    }
    if node_uid != 0 {
        if uid == node_uid && gid == node_gid {
            return Ok(None);
        }
        return Err(format!(
            "this node runs as uid {node_uid} and cannot run sessions as {requested}"
        ));
    }
    Ok(Some(RunAs {
        uid,
        gid,
        home: entry.as_ref().map(|p| p.2.clone()),
        name: entry.map(|p| p.3),
    }))
}

/// The user and group this process runs as (effective ids).
pub fn own_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(default_user: Option<&str>, allow_root: bool) -> SessionUsers {
        SessionUsers {
            default_user: default_user.map(str::to_string),
            allow_root,
        }
    }

    #[test]
    fn names_a_spec_may_use() {
        for ok in ["nobody", "_svc", "web-1", "a$", "0", "65534", "2147483647"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Root",
            "1abc",
            "a b",
            "a/b",
            "../x",
            "2147483648",
            &"a".repeat(33),
            "a$b",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    /// Every rule, as a root node and as an unprivileged one sees it (uid
    /// 0 and 65534 exist on every Debian and on every CI machine here).
    #[test]
    fn the_rules_in_a_table() {
        let root = |p: &SessionUsers, u: Option<&str>, g: Option<&str>| resolve(p, u, g, 0, 0);
        // A root node with the daemon's default runs sessions as nobody.
        let nobody = root(&policy(Some("nobody"), false), None, None)
            .unwrap()
            .unwrap();
        assert_eq!(
            (nobody.uid, nobody.name.as_deref()),
            (65534, Some("nobody"))
        );
        // Root only when the spec and the node both say so.
        let e = root(&policy(Some("nobody"), false), Some("root"), None).unwrap_err();
        assert!(e.contains("--allow-root-sessions"), "{e}");
        let e = root(&policy(Some("nobody"), false), Some("0"), None).unwrap_err();
        assert!(e.contains("--allow-root-sessions"), "{e}");
        let r = root(&policy(Some("nobody"), true), Some("root"), None)
            .unwrap()
            .unwrap();
        assert_eq!((r.uid, r.gid), (0, 0));
        // The node's default of root needs the flag too.
        assert!(root(&policy(Some("root"), false), None, None).is_err());
        // A user or group that does not exist is the reason.
        // Group root, named or by id, is root's rule too.
        for g in ["root", "0"] {
            let e = root(&policy(Some("nobody"), false), None, Some(g)).unwrap_err();
            assert!(e.contains("group root"), "{e}");
            assert!(root(&policy(Some("nobody"), true), None, Some(g)).is_ok());
        }
        let e = root(&policy(None, false), Some("no-such-user-here"), None).unwrap_err();
        assert_eq!(e, "user no-such-user-here does not exist");
        let e = root(&policy(None, false), Some("nobody"), Some("no-such-group")).unwrap_err();
        assert_eq!(e, "group no-such-group does not exist");
        // A numeric user with no entry: its group is nogroup unless named.
        let n = root(&policy(None, false), Some("4242"), None)
            .unwrap()
            .unwrap();
        assert_eq!((n.uid, n.gid, n.home), (4242, NOGROUP, None));
        let n = root(&policy(None, false), Some("4242"), Some("7"))
            .unwrap()
            .unwrap();
        assert_eq!(n.gid, 7);
        // No default and no user: the node's own.
        assert_eq!(root(&policy(None, false), None, None).unwrap(), None);
        // An unprivileged node cannot change users, and says so.
        let un = |u: Option<&str>| resolve(&policy(None, false), u, None, 65534, 65534);
        assert_eq!(un(None).unwrap(), None);
        assert_eq!(un(Some("nobody")).unwrap(), None);
        let e = un(Some("root")).unwrap_err();
        assert!(e.contains("--allow-root-sessions"), "{e}");
        let e = resolve(&policy(None, true), Some("root"), None, 65534, 65534).unwrap_err();
        assert!(e.contains("cannot run sessions as root"), "{e}");
    }
}
