//! Fencing a system that is not the bucket with a session's token: a file
//! that records the highest epoch that ever wrote it, and refuses any
//! writer below it, as a database row with a `fence_epoch` column refuses
//! `UPDATE ... WHERE fence_epoch <= $epoch` (docs/fencing.md).
//!
//! ```sh
//! cargo run --example fenced_file -- /tmp/ledger.txt
//! ```
//!
//! It plays three writers: epoch 1, then a takeover at epoch 2, then the
//! epoch-1 run again, as a paused process that wakes after the takeover
//! would. The last write is refused, and the file keeps epoch 2's lines.
//! In a session, the epoch is `LEASEHOLD_EPOCH`, and the ack gate
//! (`leasehold fence ack`, or `leasehold::fleet::channel::client`) comes
//! before anything the session acknowledges to others.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;

/// Appends `line` to the ledger at `path` as a writer holding `epoch`:
/// under an exclusive lock, refused if the ledger's fence (its first line,
/// `fence_epoch N`) is above `epoch`; else the fence is raised to `epoch`
/// and the line appended. The check and the write are one step under the
/// lock: that is what makes it a fence, not advice.
fn append(path: &str, epoch: u64, line: &str) -> Result<(), String> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("{path}: {e}"))?;
    // SAFETY: flock on a descriptor we own; released when `f` closes.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!("lock: {}", std::io::Error::last_os_error()));
    }
    let mut lines: Vec<String> = BufReader::new(&f).lines().map_while(Result::ok).collect();
    let fence = match lines.first() {
        Some(h) => h
            .strip_prefix("fence_epoch ")
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| format!("{path} is not a fenced ledger"))?,
        None => 0,
    };
    if epoch < fence {
        return Err(format!(
            "refused: the ledger is fenced at epoch {fence}, this writer holds {epoch}"
        ));
    }
    if lines.is_empty() {
        lines.push(String::new());
    }
    lines[0] = format!("fence_epoch {epoch}");
    lines.push(format!("{epoch} {line}"));
    f.set_len(0).map_err(|e| e.to_string())?;
    f.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    f.write_all((lines.join("\n") + "\n").as_bytes())
        .map_err(|e| e.to_string())?;
    f.sync_all().map_err(|e| e.to_string())
}

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        std::env::temp_dir()
            .join("leasehold-fenced-ledger.txt")
            .display()
            .to_string()
    });
    let _ = std::fs::remove_file(&path);
    let steps: [(u64, &str); 4] = [
        (1, "debit 10 (the first run)"),
        (2, "debit 5 (the run that took over)"),
        (
            1,
            "debit 10 again (the first run, woken after the takeover)",
        ),
        (2, "credit 1 (the holder goes on)"),
    ];
    let mut refused = 0;
    for (epoch, what) in steps {
        match append(&path, epoch, what) {
            Ok(()) => println!("epoch {epoch}: written: {what}"),
            Err(e) => {
                refused += 1;
                println!("epoch {epoch}: {e}");
            }
        }
    }
    let ledger = std::fs::read_to_string(&path).unwrap_or_default();
    print!("{path}:\n{ledger}");
    // The stale write, and only it, was refused.
    assert_eq!(refused, 1);
    assert!(!ledger.contains("again"));
}
