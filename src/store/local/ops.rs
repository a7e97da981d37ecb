//! The conditional operations on files (get, put with its condition, delete), each under the key's lock, and the paths they take.

use super::*;

/// Segments of a local key: the shared key rules plus a charset that cannot
/// name our hidden files or escape the directory.
pub(super) fn local_segments(key: &str) -> Result<Vec<&str>, StoreError> {
    check_key(key)?;
    let segs: Vec<&str> = key.split('/').collect();
    for s in &segs {
        if !segment_ok(s) {
            return Err(StoreError::Invalid {
                reason: format!(
                    "key {key:?}: the local store accepts segments of [A-Za-z0-9._-] not starting with '.'"
                ),
            });
        }
    }
    Ok(segs)
}

/// A segment the local store can address: [A-Za-z0-9._-], not starting
/// with '.' (which names our own hidden files), so never `.` or `..`.
pub(super) fn segment_ok(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Opens for reading without following a symlink, and without waiting: a
/// FIFO planted in the directory would otherwise block `open` (and with it
/// every listing, read and write of the store) until some writer appeared.
/// Regular files ignore `O_NONBLOCK`; anything else is then refused as not a
/// regular file.
pub(super) fn nofollow_read() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    o
}

impl Inner {
    /// Fails if the root was replaced since open.
    pub(super) fn check_root(&self) -> Result<(), StoreError> {
        let md = fs::metadata(&self.root).map_err(|e| io_err("stat root", e))?;
        if md.dev() != self.dev || md.ino() != self.ino {
            return Err(StoreError::Invalid {
                reason: format!(
                    "root directory {} changed identity since it was opened; refusing to continue",
                    self.root.display()
                ),
            });
        }
        Ok(())
    }

    /// Walks the parent directories of `segs`, refusing symlinks; creates the
    /// missing ones (owner-only) when `create` is set. Returns the parent
    /// directory, or None when it does not exist and `create` is false.
    pub(super) fn parent_dir(
        &self,
        segs: &[&str],
        create: bool,
    ) -> Result<Option<PathBuf>, StoreError> {
        self.check_root()?;
        // A delete removes the directories it empties (`remove`), so one
        // found or made here may be gone by the next step: then the walk
        // starts again from the root.
        'walk: for _ in 0..DIR_TRIES {
            let mut dir = self.root.clone();
            for s in &segs[..segs.len() - 1] {
                dir.push(s);
                match fs::symlink_metadata(&dir) {
                    Ok(md) if md.file_type().is_symlink() => {
                        return Err(StoreError::Invalid {
                            reason: format!("{} is a symlink; refusing it", dir.display()),
                        });
                    }
                    Ok(md) if md.is_dir() => {}
                    Ok(_) => {
                        return Err(StoreError::Corrupt {
                            reason: format!("{} is not a directory", dir.display()),
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        if !create {
                            return Ok(None);
                        }
                        match fs::DirBuilder::new().mode(0o700).create(&dir) {
                            // Durable before anything is written in it:
                            // directories now come and go (the feed's
                            // buckets), and an object acknowledged in one
                            // must not be lost with it in a crash.
                            Ok(()) => {
                                if let Some(parent) = dir.parent() {
                                    match File::open(parent).and_then(|d| d.sync_all()) {
                                        Ok(()) => {}
                                        // Emptied and removed since the
                                        // mkdir: ours went with it.
                                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                                            continue 'walk;
                                        }
                                        Err(e) => {
                                            return Err(io_err(
                                                &format!("fsync {}", parent.display()),
                                                e,
                                            ));
                                        }
                                    }
                                }
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue 'walk,
                            Err(e) => return Err(io_err(&format!("mkdir {}", dir.display()), e)),
                        }
                        match fs::symlink_metadata(&dir) {
                            Ok(md) if md.is_dir() && !md.file_type().is_symlink() => {}
                            Ok(_) => {
                                return Err(StoreError::Invalid {
                                    reason: format!("{} is not a directory", dir.display()),
                                });
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue 'walk,
                            Err(e) => return Err(io_err("stat", e)),
                        }
                    }
                    Err(e) => return Err(io_err(&format!("stat {}", dir.display()), e)),
                }
            }
            return Ok(Some(dir));
        }
        Err(StoreError::Unavailable {
            message: format!(
                "the directories of {:?} were removed under each of {DIR_TRIES} tries",
                segs.join("/")
            ),
        })
    }

    /// Makes a removal in the directory of the key `segs` durable: fsyncs
    /// that directory, or, where a delete of another key emptied and
    /// removed it meanwhile (`remove_empty_dirs`), the nearest directory
    /// above it that is still there: the removal that took the directory
    /// came after ours, and a journaling filesystem keeps the two in
    /// order. (One made again since under the same name is fsynced into
    /// its parent by its maker, `parent_dir`, but perhaps only after this
    /// delete is acknowledged: there too the order rests on a journaling
    /// filesystem, ext4 or XFS, committing metadata in order.)
    pub(super) fn sync_dir_of(&self, segs: &[&str]) -> Result<(), StoreError> {
        for depth in (0..segs.len()).rev() {
            let mut dir = self.root.clone();
            dir.extend(&segs[..depth]);
            match File::open(&dir).and_then(|d| d.sync_all()) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && depth > 0 => {}
                Err(e) => return Err(io_err("fsync directory", e)),
            }
        }
        Ok(())
    }

    /// Removes the directories above the key `segs` that are empty, deepest
    /// first, down to the second level: an object store has no
    /// directories, and a key scheme that spreads keys over directories
    /// (the change feed's time buckets, `keys::HintForm::Bucketed`) would
    /// otherwise leave one behind for every ten seconds of hints, each read
    /// by every listing of the feed and every expiry.
    ///
    /// Why this is safe beside writers: `rmdir` removes only an empty
    /// directory, atomically. A writer holds a temporary file in the key's
    /// directory from before its rename until after it, so a directory
    /// with a write in flight is not empty; a writer that made or found
    /// the directory and had not yet created its temporary file finds it
    /// gone and makes it again (`parent_dir`, `write`).
    ///
    /// Why never a top-level directory (`sessions/`, `changes/`): builds
    /// before this one write only keys one level deep (besides the probe's
    /// own `_probe/<run>/`, which only that probe empties) and do not make
    /// a directory again, so removing one of theirs under them would fail
    /// their write or their delete's fsync. A second-level directory is
    /// never theirs, so this holds in either lock scheme, and a directory
    /// an older build wrote is kept free of empty buckets too.
    pub(super) fn remove_empty_dirs(&self, segs: &[&str]) {
        for depth in (2..segs.len()).rev() {
            let mut dir = self.root.clone();
            dir.extend(&segs[..depth]);
            if fs::remove_dir(&dir).is_err() {
                // Not empty (the usual case), or gone, or not ours to remove.
                break;
            }
        }
    }

    /// Where this directory's lock files are, and whether a deleted key's
    /// is unlinked (see `lock`).
    ///
    /// Why two schemes: older builds lock `.leasehold/locks/<key>.lock`,
    /// never unlink it, and do not check the inode after `flock`. Beside
    /// one of them, a writer that unlinks a lock file breaks exclusion
    /// (that build, waiting on the unlinked file, holds it beside a writer
    /// that created a new one). So:
    /// - `.leasehold/locks` a directory (an older build wrote here): its
    ///   scheme, lock files kept, exactly as that build does;
    /// - missing: a regular file is put there (create-only), which makes an
    ///   older build's writes fail ("create lock directory": it is not a
    ///   directory) rather than run beside ours unexcluded (they would
    ///   lock other files);
    /// - a regular file: lock files under `.leasehold/keylocks/`, unlinked
    ///   with their key.
    ///
    /// Decided on every write (one `lstat`): a directory that turns up
    /// later (an older build racing the first write) is taken as found.
    pub(super) fn lock_scheme(&self) -> Result<(PathBuf, bool), StoreError> {
        let meta = self.root.join(META_DIR);
        let legacy = meta.join("locks");
        loop {
            match rustix::fs::lstat(&legacy) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    return Ok((legacy, false));
                }
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                    let keylocks = meta.join("keylocks");
                    fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(&keylocks)
                        .map_err(|e| io_err("create lock directory", e))?;
                    return Ok((keylocks, true));
                }
                Ok(_) => {
                    return Err(StoreError::Invalid {
                        reason: format!(
                            "{} is neither a directory nor a file; refusing it",
                            legacy.display()
                        ),
                    });
                }
                Err(Errno::NOENT) => {
                    fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(&meta)
                        .map_err(|e| io_err("create metadata directory", e))?;
                    match OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o400)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&legacy)
                    {
                        Ok(mut f) => {
                            let _ = f.write_all(LOCKS_NOTE.as_bytes());
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(io_err("create lock marker", e)),
                    }
                }
                Err(e) => return Err(errno("stat lock marker", e)),
            }
        }
    }

    /// Takes `key`'s write lock: an exclusive `flock` on its lock file,
    /// held until the returned guard is dropped.
    ///
    /// Why the check after the `flock` (where lock files are unlinked, see
    /// `lock_scheme`): the holder that deletes a key unlinks its lock file
    /// (`KeyLock::unlink`), or every key ever written (each change hint is
    /// a key of its own) would leave a file behind for ever. A writer that
    /// opened the file before that unlink then gets the lock on an inode no
    /// path names any more, while a later writer creates a new file and
    /// locks that: two holders. So a writer holds the lock only once the
    /// path still names the very inode it locked; else it drops it and
    /// tries again. The path changes only while its inode's lock is held
    /// (the unlink) or while it names nothing (a create), so a check that
    /// passed stays true until its holder unlinks.
    pub(super) fn lock(&self, key: &str) -> Result<KeyLock, StoreError> {
        // Before creating anything: never write into a replaced root.
        self.check_root()?;
        let (locks, unlinks) = self.lock_scheme()?;
        // '%' cannot appear in a local key segment, so this mapping is 1:1.
        let path = locks.join(format!("{}.lock", key.replace('/', "%")));
        for _ in 0..LOCK_TRIES {
            let f = open_lock_file(&path)
                .map_err(|e| io_err(&format!("open lock {}", path.display()), e))?;
            f.lock().map_err(|e| io_err("flock", e))?;
            if !unlinks {
                return Ok(KeyLock {
                    file: f,
                    path: None,
                });
            }
            let held = rustix::fs::fstat(&f).map_err(|e| errno("stat lock", e))?;
            match rustix::fs::lstat(&path) {
                Ok(now) if now.st_dev == held.st_dev && now.st_ino == held.st_ino => {
                    return Ok(KeyLock {
                        file: f,
                        path: Some(path),
                    });
                }
                // Unlinked (and perhaps created again) while we waited.
                Ok(_) | Err(Errno::NOENT) => continue,
                Err(e) => return Err(errno("stat lock", e)),
            }
        }
        // Each retry follows an unlink of this key's lock file after we
        // opened it: so many means a filesystem whose `fstat` and `lstat`
        // disagree on one file, or a key deleted without pause while we
        // wait. An error (retryable) rather than a spin.
        Err(StoreError::Unavailable {
            message: format!(
                "lock {}: the file changed under every one of {LOCK_TRIES} tries",
                path.display()
            ),
        })
    }

    pub(super) fn read(&self, key: &str) -> Result<Option<Object>, StoreError> {
        let segs = local_segments(key)?;
        let Some(dir) = self.parent_dir(&segs, false)? else {
            return Ok(None);
        };
        let path = dir.join(segs[segs.len() - 1]);
        let mut f = match nofollow_read().open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(StoreError::Invalid {
                    reason: format!("{} is a symlink; refusing it", path.display()),
                });
            }
            Err(e) => return Err(io_err(&format!("open {}", path.display()), e)),
        };
        let md = f.metadata().map_err(|e| io_err("stat", e))?;
        if !md.is_file() {
            return Err(StoreError::Corrupt {
                reason: format!("{} is not a regular file", path.display()),
            });
        }
        let mut buf = Vec::new();
        (&mut f)
            .take(MAX_BODY as u64 + 512)
            .read_to_end(&mut buf)
            .map_err(|e| io_err("read", e))?;
        let (etag, body) = parse_file(&buf)?;
        Ok(Some(Object {
            bytes: Bytes::copy_from_slice(body),
            version: Version {
                etag: Some(etag),
                version: None,
            },
        }))
    }

    pub(super) fn write(
        &self,
        key: &str,
        bytes: &[u8],
        cond: &Cond,
    ) -> Result<Version, StoreError> {
        if bytes.len() > MAX_BODY {
            return Err(StoreError::Invalid {
                reason: format!("object of {} bytes exceeds {MAX_BODY}", bytes.len()),
            });
        }
        let segs = local_segments(key)?;
        let lock = self.lock(key)?;
        // Under the lock, the current version cannot change (every writer
        // locks), so this check-then-rename is a compare-and-swap.
        let current = match self.read(key) {
            Ok(current) => current,
            Err(e) => {
                // Nothing written: no lock file left for the key (an
                // unlink under a held lock is safe whatever it holds).
                lock.unlink();
                return Err(e);
            }
        };
        let generation = match (cond, &current) {
            (Cond::Create, None) => 1,
            (Cond::Create, Some(_)) => return Err(StoreError::AlreadyExists),
            (Cond::Match(_) | Cond::MatchAs(..), None) => {
                // Nothing there, nothing written: no lock file left for it.
                lock.unlink();
                return Err(StoreError::Precondition);
            }
            (Cond::Match(want) | Cond::MatchAs(want, _), Some(cur)) => {
                if want.etag.is_none() || want.etag != cur.version.etag {
                    return Err(StoreError::Precondition);
                }
                generation_of(cur.version.etag.as_deref().unwrap_or("")) + 1
            }
        };
        // Made only for a write that will be tried: a refused condition
        // leaves no directory behind, and a create that fails here leaves
        // neither its lock file nor the directories it made.
        let mut dir = match self.parent_dir(&segs, true) {
            Ok(dir) => dir.expect("created parent directories"),
            Err(e) => {
                if current.is_none() {
                    lock.unlink();
                    self.remove_empty_dirs(&segs);
                }
                return Err(e);
            }
        };
        let mut tmp = dir.join(format!(".tmp-{}", self.entropy.hex_id()));
        let mut etag = String::new();
        let result = (|| {
            // The temporary file keeps the directory from being removed
            // (`remove_empty_dirs`) until after the rename; before it is
            // made, a delete that emptied the directory may remove it: then
            // it is made again.
            let mut tries = 0;
            let mut f = loop {
                match OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if self.stamps {
                        STAMPED_MODE
                    } else {
                        PLAIN_MODE
                    })
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&tmp)
                {
                    Ok(f) => break f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < DIR_TRIES => {
                        tries += 1;
                        dir = self
                            .parent_dir(&segs, true)?
                            .expect("created parent directories");
                        tmp = dir.join(format!(".tmp-{}", self.entropy.hex_id()));
                    }
                    Err(e) => return Err(io_err("create temporary file", e)),
                }
            };
            let target = dir.join(segs[segs.len() - 1]);
            let stamp = if self.stamps {
                // The kernel's clock, as the file's creation stamped it (the
                // store reads no clock of its own), and random nanoseconds.
                // Past the current version's stamp, if it is one.
                let st = rustix::fs::fstat(&f).map_err(|e| errno("stat temporary file", e))?;
                let prev = current
                    .as_ref()
                    .and_then(|c| c.version.etag.as_deref())
                    .and_then(parse_stamp);
                let (sec, nsec) = next_stamp(st.st_mtime, self.entropy.next_u64(), prev);
                Some(rustix::fs::Timespec {
                    tv_sec: sec,
                    tv_nsec: nsec as _,
                })
            } else {
                None
            };
            etag = match &stamp {
                Some(t) => stamp_etag(t.tv_sec, t.tv_nsec),
                None => format!("{generation}-{}", self.entropy.hex_id()),
            };
            f.write_all(header(&etag, bytes).as_bytes())
                .and_then(|_| f.write_all(bytes))
                .map_err(|e| io_err("write temporary file", e))?;
            // After the last write (a write sets the time), before the
            // rename (which keeps it).
            if let Some(t) = stamp {
                set_mtime(&f, t).map_err(|e| errno("stamp temporary file", e))?;
            }
            f.sync_all()
                .map_err(|e| io_err("write temporary file", e))?;
            // Refuse to replace a symlink planted at the key.
            if let Ok(md) = fs::symlink_metadata(&target)
                && md.file_type().is_symlink()
            {
                return Err(StoreError::Invalid {
                    reason: format!("{} is a symlink; refusing it", target.display()),
                });
            }
            fs::rename(&tmp, &target).map_err(|e| io_err("rename", e))?;
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_err("fsync directory", e))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
            // A create that failed leaves no lock file for its key (an
            // unlink under a held lock is safe whatever the key holds),
            // nor a directory it made.
            if current.is_none() {
                lock.unlink();
                self.remove_empty_dirs(&segs);
            }
        }
        result?;
        Ok(Version {
            etag: Some(etag),
            version: None,
        })
    }

    pub(super) fn remove(&self, key: &str) -> Result<(), StoreError> {
        let segs = local_segments(key)?;
        let lock = self.lock(key)?;
        let Some(dir) = self.parent_dir(&segs, false)? else {
            lock.unlink();
            return Ok(());
        };
        match fs::remove_file(dir.join(segs[segs.len() - 1])) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                lock.unlink();
                self.remove_empty_dirs(&segs);
                return Ok(());
            }
            Err(e) => return Err(io_err("remove", e)),
        }
        let synced = self.sync_dir_of(&segs);
        // The key is gone: so is its lock file (see `lock`), and any
        // directory it leaves empty.
        lock.unlink();
        self.remove_empty_dirs(&segs);
        synced
    }

    /// Every key under `prefix` above `after` (all of them for `None`), as
    /// names still to be read (see [`Names`]). `after` is applied to names
    /// before any file is opened: a directory holding many old hints is then
    /// read (one `getdents` pass) but none of their files, where the trait's
    /// default read every header to drop it.
    pub(super) fn names(&self, prefix: &str, after: Option<&str>) -> Result<Names, StoreError> {
        check_prefix(prefix)?;
        self.check_root()?;
        let dir_part = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let mut start = self.root.clone();
        if !dir_part.is_empty() {
            for s in local_segments(dir_part)? {
                start.push(s);
                match fs::symlink_metadata(&start) {
                    Ok(md) if md.is_dir() && !md.file_type().is_symlink() => {}
                    Ok(_) => return Ok(Names::default()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Ok(Names::default());
                    }
                    Err(e) => return Err(io_err("stat", e)),
                }
            }
        }
        let base = if dir_part.is_empty() {
            String::new()
        } else {
            format!("{dir_part}/")
        };
        // Not through a symlink (the walk never follows one), and a
        // directory only: every directory on the way was checked, and the
        // last one replaced by a symlink since fails here instead of being
        // followed. Below it the walk opens each directory relative to its
        // parent's descriptor, never by path.
        let dfd = match rustix::fs::open(&start, DIR_OPEN, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(Names::default()),
            Err(e) => return Err(errno(&format!("list {}", start.display()), e)),
        };
        let mut names = Names::default();
        let mut pending = Vec::new();
        let mut walked = 0;
        let r = walk(
            dfd,
            &base,
            prefix,
            after,
            &mut pending,
            &mut names.dirs,
            &mut walked,
        );
        self.walked
            .fetch_add(walked, std::sync::atomic::Ordering::Relaxed);
        r?;
        pending.sort_unstable_by(|a, b| a.key().cmp(b.key()));
        names.pending = pending.into_iter();
        Ok(names)
    }
}
