//! A bound on each phase's log (`cairn run --max-log-bytes`, 64 MiB by default).
//!
//! A command writes its stderr straight into its phase's log (`runs/<id>/<n>-<phase>.log`),
//! which is the daemon's file: the submitter's disk quota does not apply to it, and one task
//! wrote 1.5 GB. While a command runs, the daemon looks at the logs of every command in flight
//! every [`CHECK_EVERY`] (one blocking job for all of them), and once more when each ends; a
//! log past its bound keeps its first and its last half of the bound, with a note between them
//! of how many bytes were cut there. The cut is made in place with
//! `fallocate(FALLOC_FL_COLLAPSE_RANGE)` and the note's block with `FALLOC_FL_INSERT_RANGE`
//! (ext4, XFS), which the command's appends cannot interleave with. Where the file system has
//! neither, the middle is cut by copying the tail back over it, and what the command writes
//! during that copy may land out of order (the note says so). Between two looks a fast writer
//! can pass the bound by what it writes in [`CHECK_EVERY`].

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nix::libc;

/// The bound on a phase's log unless the operator sets another.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 64 * 1024 * 1024;

/// How often the logs of the commands in flight are looked at.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How the note that marks a cut begins.
const NOTE_PREFIX: &[u8] = b"\n[cairn: ";

/// Logs of commands in flight: path, its bound, and how many commands write it now.
static WATCHED: OnceLock<Mutex<HashMap<PathBuf, (u64, usize)>>> = OnceLock::new();

fn watched() -> std::sync::MutexGuard<'static, HashMap<PathBuf, (u64, usize)>> {
    WATCHED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The log of a running command, looked at until this is dropped.
#[derive(Debug)]
pub struct Watch {
    path: PathBuf,
    max: u64,
}

impl Watch {
    /// Look at `path` every [`CHECK_EVERY`] while the returned value lives; the first watch
    /// starts the one task that looks (on this runtime).
    pub fn start(path: &Path, max: u64) -> Watch {
        static LOOKER: OnceLock<()> = OnceLock::new();
        LOOKER.get_or_init(|| {
            tokio::spawn(look_forever());
        });
        watched()
            .entry(path.to_path_buf())
            .and_modify(|(bound, users)| {
                *bound = max;
                *users += 1
            })
            .or_insert((max, 1));
        Watch {
            path: path.to_path_buf(),
            max,
        }
    }

    /// Stop watching, and cut the log once more if it is past its bound now that its command
    /// has ended (`log`: the log as the daemon opened it, whose size is read without waiting
    /// for the disk; without it, the blocking pool looks).
    pub async fn finish(self, log: Option<&File>) {
        let (path, max) = (self.path.clone(), self.max);
        drop(self);
        let past = match log {
            Some(log) => log.metadata().is_ok_and(|meta| meta.len() > max),
            None => true,
        };
        if past {
            let _ = super::spawn_limited(move || cap_logged(&path, max)).await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut watched = watched();
        if let Some((_, users)) = watched.get_mut(&self.path) {
            *users -= 1;
            if *users == 0 {
                watched.remove(&self.path);
            }
        }
    }
}

async fn look_forever() {
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let logs: Vec<(PathBuf, u64)> = watched()
            .iter()
            .map(|(path, (max, _))| (path.clone(), *max))
            .collect();
        if logs.is_empty() {
            continue;
        }
        let _ = super::spawn_limited(move || {
            for (path, max) in logs {
                cap_logged(&path, max);
            }
        })
        .await;
    }
}

/// [`cap`], its outcome logged.
fn cap_logged(path: &Path, max: u64) {
    match cap(path, max) {
        Ok(Some(cut)) => tracing::info!(
            log = %path.display(),
            cut,
            "a phase's log passed its bound (--max-log-bytes {max}): its middle was cut"
        ),
        Ok(None) => {}
        Err(e) => tracing::warn!(log = %path.display(), "cannot bound the log: {e}"),
    }
}

/// Keep the log at `path` to its first and last `max / 2` bytes (at block boundaries), with a
/// note between them; returns the bytes cut this time, if any. Blocking.
pub fn cap(path: &Path, max: u64) -> io::Result<Option<u64>> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || meta.len() <= max.max(1) {
        return Ok(None);
    }
    let block = meta.blksize().clamp(512, 1 << 20);
    let size = meta.len();
    let start = (max / 2).div_ceil(block) * block;
    let end = (size - max / 2) / block * block;
    if end <= start + block {
        return Ok(None);
    }
    // A note from an earlier cut starts the range: its count goes on, its block is not log.
    let earlier = earlier_cut(&file, start, block);
    let cut_now = end - start - if earlier.is_some() { block } else { 0 };
    let total = earlier.unwrap_or(0) + cut_now;
    if collapse(&file, start, end - start).is_ok() {
        let note = note(total, block, false);
        if insert(&file, start, block).is_ok() {
            file.write_all_at(&note, start)?;
        }
        return Ok(Some(cut_now));
    }
    // No collapsing here: copy the tail back over the middle, then shorten the file.
    let mut tail = vec![0; usize::try_from(size - end).map_err(io::Error::other)?];
    file.read_exact_at(&mut tail, end)?;
    let note = note(total, block, true);
    file.write_all_at(&note, start)?;
    file.write_all_at(&tail, start + block)?;
    file.set_len(start + block + tail.len() as u64)?;
    Ok(Some(cut_now))
}

/// The count of a note that starts at `at`, if one does.
fn earlier_cut(file: &File, at: u64, block: u64) -> Option<u64> {
    let mut buf = vec![0; usize::try_from(block).ok()?];
    file.read_exact_at(&mut buf, at).ok()?;
    let rest = buf.strip_prefix(NOTE_PREFIX)?;
    let digits: Vec<u8> = rest
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// One block that says how many bytes were cut, padded with spaces to the block's end.
fn note(total: u64, block: u64, copied: bool) -> Vec<u8> {
    let mut text = NOTE_PREFIX.to_vec();
    text.extend_from_slice(
        format!(
            "{total} bytes of this log were cut here: a phase's log keeps its first and last \
             halves of the bound (cairn run --max-log-bytes){}]",
            if copied {
                "; lines written while it was cut may be out of order"
            } else {
                ""
            }
        )
        .as_bytes(),
    );
    let len = usize::try_from(block).unwrap_or(4096);
    text.truncate(len - 1);
    text.resize(len - 1, b' ');
    text.push(b'\n');
    text
}

fn collapse(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate(file, libc::FALLOC_FL_COLLAPSE_RANGE, offset, len)
}

fn insert(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fallocate(file, libc::FALLOC_FL_INSERT_RANGE, offset, len)
}

#[allow(unsafe_code)] // fallocate with FALLOC_FL_COLLAPSE_RANGE/INSERT_RANGE has no safe wrapper
fn fallocate(file: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (offset, len) = (
        libc::off_t::try_from(offset).map_err(io::Error::other)?,
        libc::off_t::try_from(len).map_err(io::Error::other)?,
    );
    // SAFETY: fallocate on a descriptor we own, with integers.
    if unsafe { libc::fallocate(file.as_raw_fd(), mode, offset, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_log_past_its_bound_keeps_its_head_and_tail_with_a_note_and_cuts_again_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0-p.log");
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let line = |i: u32| format!("line {i:08}\n");
        for i in 0..100_000 {
            log.write_all(line(i).as_bytes()).unwrap();
        }
        let max = 256 * 1024;
        let cut = cap(&path, max).unwrap().expect("a cut");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() as u64 <= max + 8192, "{}", text.len());
        assert!(text.starts_with(&line(0)));
        assert!(text.ends_with(&line(99_999)));
        assert!(text.contains(&format!("[cairn: {cut} bytes of this log were cut here")));
        // The command goes on appending; a second cut counts both.
        for i in 100_000..200_000 {
            log.write_all(line(i).as_bytes()).unwrap();
        }
        let again = cap(&path, max).unwrap().expect("a second cut");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(&line(0)) && text.ends_with(&line(199_999)));
        assert!(
            text.contains(&format!(
                "[cairn: {} bytes of this log were cut here",
                cut + again
            )),
            "{}",
            &text[..300.min(text.len())]
        );
        assert_eq!(text.matches("[cairn: ").count(), 1);
        // Every line left is whole and in order, apart from the note.
        // (The lines at the cut's edges are partial: the cut is at block boundaries.)
        let numbers: Vec<u32> = text
            .lines()
            .filter(|l| l.len() == 13)
            .filter_map(|l| l.strip_prefix("line ")?.parse().ok())
            .collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(cap(&path, max).unwrap(), None);
    }
}
