//! Listing: a walk of the directory tree from a cursor, in key order, opening each directory relative to its parent.

use super::*;

/// How the listing opens a directory: never through a symlink, and a
/// directory only (one replaced by a symlink fails instead of being
/// followed).
pub(super) const DIR_OPEN: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

pub(super) fn errno(what: &str, e: Errno) -> StoreError {
    io_err(what, std::io::Error::from(e))
}

/// How many object headers a listing reads per blocking task.
pub(super) const LIST_CHUNK: usize = 1000;

/// How many directories a listing keeps open from its name pass to its
/// reads (besides the one per level the walk holds while it descends, as
/// it always did). Every prefix leasehold lists is one directory, which
/// the walk holds first; in a tree of more (an operator's stray folders),
/// the files of directories past this many are read in the name pass, as
/// every file was before, so a listing holds no more descriptors than
/// this however many directories there are.
pub(super) const MAX_HELD_DIRS: usize = 16;

/// A listing between its two steps: every matching name, sorted, with the
/// directories they are in still open, and their headers read on demand
/// (`read`).
///
/// Why two steps: an object's version is in its header, so each listed
/// object is opened and read, and the listing must be sorted, which needs
/// every name first. Reading every header before sorting held the whole
/// listing as entries (key, ETag, size, time: about 180 bytes each) until
/// the caller had taken the last one; a name is about 70. At 100,000
/// sessions that was 20-30 MB of a node's peak during each full listing
/// (issue #14). Each header of a held directory is now read when its
/// chunk is reached, so an object rewritten meanwhile lists at its newer
/// version and one deleted meanwhile is left out, as a deletion during the
/// walk always was (a file of a directory past `MAX_HELD_DIRS` lists as
/// the name pass found it). Listings are not snapshots on any store.
#[derive(Default)]
pub(super) struct Names {
    pub(super) dirs: Vec<OwnedFd>,
    pub(super) pending: std::vec::IntoIter<Pending>,
}

pub(super) enum Pending {
    /// `key[at..]` is a file name in `dirs[dir]`.
    Named { dir: u32, at: u32, key: String },
    /// Read in the name pass (a directory past `MAX_HELD_DIRS`).
    Read(Box<Entry>),
}

impl Pending {
    pub(super) fn key(&self) -> &str {
        match self {
            Pending::Named { key, .. } => key,
            Pending::Read(e) => &e.key,
        }
    }
}

impl Names {
    pub(super) fn is_done(&self) -> bool {
        self.pending.len() == 0
    }

    /// The next entries, up to `n` of them read (fewer where a file went
    /// away since its name was read).
    pub(super) fn read(&mut self, n: usize) -> Vec<Entry> {
        let mut out = Vec::with_capacity(n.min(self.pending.len()));
        for p in self.pending.by_ref().take(n) {
            match p {
                Pending::Named { dir, at, key } => {
                    if let Some(e) = read_entry(&self.dirs[dir as usize], key, at as usize) {
                        out.push(e);
                    }
                }
                Pending::Read(e) => out.push(*e),
            }
        }
        if self.is_done() {
            // The descriptors are not kept for the stream's lifetime.
            self.dirs.clear();
        }
        out
    }
}

/// One directory of a listing (`base` is its key prefix, `dir` it open):
/// the names of its matching objects go to `out`, then its subdirectories
/// are walked in turn. This directory takes its slot among the held ones
/// before any subdirectory does, so the directory a prefix names (the
/// one that holds a fleet's sessions) is held however many stray folders
/// sit in it. Every object and subdirectory is opened relative to `dir`
/// (`openat`), so each costs a lookup of one name, not of the whole path,
/// and nothing is ever reached through a symlink; a name at or below
/// `after`, or outside `prefix`, is dropped before anything is allocated
/// for it. A full listing of 200,000 objects does this for every one
/// (issue #14).
///
/// What changes under the walk is taken as it is found: a name gone by the
/// time it is opened was deleted during the listing and is left out; one
/// replaced by a symlink is skipped as symlinks are.
pub(super) fn walk(
    dir: OwnedFd,
    base: &str,
    prefix: &str,
    after: Option<&str>,
    out: &mut Vec<Pending>,
    dirs: &mut Vec<OwnedFd>,
    walked: &mut u64,
) -> Result<(), StoreError> {
    let mut key = String::new();
    let mut here: Vec<String> = Vec::new();
    let mut subdirs: Vec<String> = Vec::new();
    // The directory's reader is dropped before any subdirectory is opened:
    // two descriptors per level at most, besides the held ones.
    for ent in rustix::fs::Dir::read_from(&dir).map_err(|e| errno("list", e))? {
        let ent = ent.map_err(|e| errno("list", e))?;
        *walked += 1;
        let cname = ent.file_name();
        let Ok(name) = cname.to_str() else { continue };
        if name.starts_with('.') {
            continue; // our metadata and temporary files, `.` and `..`
        }
        let key = crate::keys::key_in(&mut key, base, name);
        // A name `get` would refuse (another tool's file, a key too long):
        // listed, it would stop every caller that reads what it lists.
        // (Our hidden names are skipped above, silently.)
        if !segment_ok(name) || key.len() > 1024 {
            tracing::warn!(
                key,
                "local store: skipping a name it cannot address in listing"
            );
            continue;
        }
        let ft = match ent.file_type() {
            FileType::Unknown => match rustix::fs::statat(&dir, cname, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => FileType::from_raw_mode(st.st_mode),
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(errno("stat", e)),
            },
            ft => ft,
        };
        if ft == FileType::Symlink {
            tracing::warn!(key, "local store: skipping symlink in listing");
            continue;
        }
        if ft == FileType::Directory {
            // Descend only where keys under it can match the prefix, and
            // can sort after the cursor: every key under `sub` sorts
            // before a cursor that `sub` sorts before without being its
            // prefix (they differ at a byte of `sub`). So a listing of the
            // change feed from a cursor reads the time buckets from the
            // cursor's on, not every hint within the retention
            // (`keys::HintForm::Bucketed`, issue #14).
            let sub = format!("{key}/");
            if (sub.starts_with(prefix) || prefix.starts_with(&sub))
                && !after.is_some_and(|a| sub.as_str() < a && !a.starts_with(&sub))
            {
                subdirs.push(name.to_string());
            }
            continue;
        }
        if !key.starts_with(prefix) || after.is_some_and(|a| key <= a) {
            continue;
        }
        here.push(key.to_string());
    }
    let at = u32::try_from(base.len()).map_err(|_| StoreError::Invalid {
        reason: format!("key prefix {base:?} is too long"),
    })?;
    // This directory: held (its names read in chunks later) while there
    // are slots, else its files read now. Either way it stays open while
    // its subdirectories are walked, one level's descriptor as before.
    // Held: its index in `dirs`; else the descriptor itself.
    let slot: std::result::Result<usize, OwnedFd> =
        if !here.is_empty() && dirs.len() < MAX_HELD_DIRS {
            let idx = dirs.len();
            dirs.push(dir);
            out.extend(here.into_iter().map(|key| Pending::Named {
                dir: idx as u32,
                at,
                key,
            }));
            Ok(idx)
        } else {
            for key in here {
                if let Some(e) = read_entry(&dir, key, base.len()) {
                    out.push(Pending::Read(Box::new(e)));
                }
            }
            Err(dir)
        };
    for name in subdirs {
        let parent = match &slot {
            Ok(i) => &dirs[*i],
            Err(d) => d,
        };
        let sub = format!("{base}{name}/");
        match rustix::fs::openat(parent, name.as_str(), DIR_OPEN, Mode::empty()) {
            Ok(sub_fd) => walk(sub_fd, &sub, prefix, after, out, dirs, walked)?,
            Err(Errno::NOENT) => {}
            Err(Errno::LOOP | Errno::NOTDIR) => {
                tracing::warn!(key = %sub, "local store: skipping symlink in listing");
            }
            Err(e) => return Err(errno(&format!("list {sub}"), e)),
        }
    }
    Ok(())
}

/// The listing's entry for the object `key[at..]` in `dir` (its key `key`),
/// or None if it is gone or a symlink now. A stamped file's version is its
/// modification time (one `fstatat`; see the module docs); any other file's
/// is read from its header (the listing carries ETags without reading
/// whole objects). A foreign file lists with no version, or (stamped) with
/// its stamp; reading it reports the corruption. Opened as `nofollow_read`
/// does (no symlink, no waiting on a FIFO); the metadata from the open
/// file (fstat), not by name again.
pub(super) fn read_entry(dir: &OwnedFd, key: String, at: usize) -> Option<Entry> {
    let name = &key[at..];
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => {
            if let Some((version, size, last_modified_ms)) = stamped_version(&st) {
                return Some(Entry {
                    key,
                    version,
                    size,
                    last_modified_ms,
                });
            }
        }
        Err(Errno::NOENT) => return None,
        Err(_) => {}
    }
    header_entry(dir, key, at)
}

/// The listing's entry for a file whose version is in its header.
pub(super) fn header_entry(dir: &OwnedFd, key: String, at: usize) -> Option<Entry> {
    let name = &key[at..];
    let mut head = [0u8; 256];
    let (n, st) = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(f) => (
            rustix::io::read(&f, &mut head).unwrap_or(0),
            rustix::fs::fstat(&f).ok(),
        ),
        Err(Errno::NOENT) => return None,
        Err(Errno::LOOP) => {
            tracing::warn!(key, "local store: skipping symlink in listing");
            return None;
        }
        // Unreadable (permissions): listed without a version.
        Err(_) => (
            0,
            rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok(),
        ),
    };
    let (etag, size) = match parse_header(&head[..n]) {
        Some((etag, len, _, _)) => (Some(etag), len as u64),
        None => (None, st.as_ref().map_or(0, |m| m.st_size.max(0) as u64)),
    };
    let last_modified_ms = st.and_then(|m| {
        // The field's type differs between targets.
        #[allow(clippy::unnecessary_cast)]
        let nsec = m.st_mtime_nsec as u64;
        u64::try_from(m.st_mtime)
            .ok()?
            .checked_mul(1000)?
            .checked_add(nsec / 1_000_000)
    });
    Some(Entry {
        key,
        version: Version {
            etag,
            version: None,
        },
        size,
        last_modified_ms,
    })
}
