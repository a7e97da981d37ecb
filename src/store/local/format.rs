//! The object file's format (a header, then the body) and its version stamps (ETags kept in the file's mtime).

use super::*;

pub(super) const MAGIC: &str = "leasehold-object/1";

/// A stamped regular file's version, body length and time from its
/// metadata alone; None for any other file (a symlink, a directory, an
/// unstamped file, or one too short to hold a header with this stamp).
pub(super) fn stamped_version(st: &rustix::fs::Stat) -> Option<(Version, u64, Option<u64>)> {
    // The field's types differ between targets.
    #[allow(clippy::unnecessary_cast)]
    let (mode, sec, nsec) = (
        st.st_mode as u32,
        st.st_mtime as i64,
        st.st_mtime_nsec as i64,
    );
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || mode & 0o7777 != STAMPED_MODE
    {
        return None;
    }
    let etag = stamp_etag(sec, nsec);
    let size = body_len(&etag, u64::try_from(st.st_size).ok()?)?;
    // The stamp's nanoseconds are random: the second is the time.
    let last_modified_ms = u64::try_from(sec).ok()?.checked_mul(1000);
    Some((
        Version {
            etag: Some(etag),
            version: None,
        },
        size,
        last_modified_ms,
    ))
}

/// A stamped file's ETag.
pub(super) fn stamp_etag(sec: i64, nsec: i64) -> String {
    format!("{sec}.{nsec:09}")
}

/// A stamp's (seconds, nanoseconds), if `etag` is one.
pub(super) fn parse_stamp(etag: &str) -> Option<(i64, i64)> {
    let (sec, nsec) = etag.split_once('.')?;
    let nsec: i64 = nsec.parse().ok()?;
    ((0..1_000_000_000).contains(&nsec)).then_some((sec.parse().ok()?, nsec))
}

/// The stamp of a key's next version: the kernel's second `now` and
/// random nanoseconds, moved past the current version's stamp `prev` when
/// not later (a clock stepped back, or two writes in one second). So while
/// a key exists its stamps only increase, and no version comes back, as
/// with the generations of plain files: a conditional write on an old
/// version can never match a newer one. A key deleted and created again
/// starts afresh: its versions differ by the second and 30 random bits.
pub(super) fn next_stamp(now: i64, random: u64, prev: Option<(i64, i64)>) -> (i64, i64) {
    let fresh = (now, (random % 1_000_000_000) as i64);
    match prev {
        Some((sec, nsec)) if fresh <= (sec, nsec) => {
            // Still random within a millisecond past it.
            let n = nsec + 1 + ((random >> 32) % 1_000_000) as i64;
            if n >= 1_000_000_000 {
                (sec.saturating_add(1), n - 1_000_000_000)
            } else {
                (sec, n)
            }
        }
        _ => fresh,
    }
}

/// The body length of a file of `total` bytes whose header carries `etag`:
/// the header is `MAGIC etag len checksum\n`, whose own length grows with
/// the digits of `len` (so one length fits). None if none does.
pub(super) fn body_len(etag: &str, total: u64) -> Option<u64> {
    // MAGIC, etag, the length's digits, 16 hex digits, 3 spaces, newline.
    let fixed = (MAGIC.len() + etag.len() + 16 + 4) as u64;
    (1..=20u32).find_map(|digits| {
        let len = total.checked_sub(fixed + u64::from(digits))?;
        (len.checked_ilog10().unwrap_or(0) + 1 == digits).then_some(len)
    })
}

pub(super) fn header(etag: &str, body: &[u8]) -> String {
    format!("{MAGIC} {etag} {} {:016x}\n", body.len(), fnv1a64(body))
}

/// Parses the header line: (etag, body length, checksum, header length).
pub(super) fn parse_header(buf: &[u8]) -> Option<(String, usize, u64, usize)> {
    let nl = buf.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&buf[..nl]).ok()?;
    let mut parts = line.split(' ');
    if parts.next()? != MAGIC {
        return None;
    }
    let etag = parts.next()?.to_string();
    let len: usize = parts.next()?.parse().ok()?;
    let sum = u64::from_str_radix(parts.next()?, 16).ok()?;
    if parts.next().is_some() || etag.is_empty() {
        return None;
    }
    Some((etag, len, sum, nl + 1))
}

pub(super) fn parse_file(buf: &[u8]) -> Result<(String, &[u8]), StoreError> {
    let Some((etag, len, sum, hlen)) = parse_header(buf) else {
        return Err(StoreError::Corrupt {
            reason: "not a leasehold object file (missing or malformed header)".into(),
        });
    };
    let body = &buf[hlen..];
    if body.len() != len {
        return Err(StoreError::Corrupt {
            reason: format!(
                "truncated or extended: header says {len} bytes, file has {}",
                body.len()
            ),
        });
    }
    if fnv1a64(body) != sum {
        return Err(StoreError::Corrupt {
            reason: "checksum mismatch".into(),
        });
    }
    Ok((etag, body))
}

/// Does the filesystem under `root` keep a modification time to the
/// nanosecond (see the module docs)? Checked once at open on a file of our
/// own under `.leasehold/`: set, then read back through a fresh lookup.
/// Any failure answers no, and the store then writes plain files (its
/// listings read every header, as before stamps).
pub(super) fn stamps_kept(root: &Path, entropy: &dyn Entropy) -> bool {
    let meta = root.join(META_DIR);
    if fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&meta)
        .is_err()
    {
        return false;
    }
    let path = meta.join(format!(".stamp-probe-{}", entropy.hex_id()));
    let want = rustix::fs::Timespec {
        tv_sec: 1_000_000_007,
        tv_nsec: 987_654_321,
    };
    let kept = (|| -> Option<bool> {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(PLAIN_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .ok()?;
        set_mtime(&f, want).ok()?;
        f.sync_all().ok()?;
        drop(f);
        let st = rustix::fs::stat(&path).ok()?;
        #[allow(clippy::unnecessary_cast)]
        Some(
            st.st_mtime as i64 == want.tv_sec as i64
                && st.st_mtime_nsec as i64 == want.tv_nsec as i64,
        )
    })();
    let _ = fs::remove_file(&path);
    kept.unwrap_or(false)
}

/// Sets the modification time of the open file `f` (its access time left
/// as it is): a stamp (see the module docs).
pub(super) fn set_mtime(f: &File, t: rustix::fs::Timespec) -> rustix::io::Result<()> {
    let keep = rustix::fs::Timespec {
        tv_sec: 0,
        tv_nsec: rustix::fs::UTIME_OMIT,
    };
    rustix::fs::futimens(
        f,
        &rustix::fs::Timestamps {
            last_access: keep,
            last_modification: t,
        },
    )
}

pub(super) fn generation_of(etag: &str) -> u64 {
    etag.split('-')
        .next()
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

/// FNV-1a, 64 bit: a checksum against truncation and accidental edits, and
/// a stable short hash for file names. Not cryptographic.
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
