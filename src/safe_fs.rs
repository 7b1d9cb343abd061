//! Reading files and directories that another user may be able to write: a queue directory
//! is shared with its submitters, so a name in it may turn into a link, a FIFO or a device
//! between two looks. Every layer that reads such a path opens it through these helpers, so
//! the rule is written once: never follow a link in the last component, never block on a FIFO,
//! never take the terminal, and cap what is read.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Open for reading without following a link in the last component (a link is refused:
/// `ELOOP`), blocking on a FIFO, or taking a terminal as the controlling one.
pub fn open_no_follow(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
}

/// A small file's bytes, or `None` unless it is a regular file (not a link, FIFO or device) of
/// at most `cap` bytes: reading never blocks and never runs away.
pub fn read_regular(path: &Path, cap: u64) -> Option<Vec<u8>> {
    let file = open_no_follow(path).ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > cap {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(cap).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Every name in a directory, as the OS gives it (a missing directory is empty); an error
/// names the directory.
pub fn read_names(dir: &Path) -> io::Result<Vec<OsString>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("reading {}: {e}", dir.display()),
            ))
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        names.push(entry?.file_name());
    }
    Ok(names)
}

/// The UTF-8 names in a directory, sorted; empty when it does not exist or cannot be read
/// (for the read model, which shows what it can).
pub fn list_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = read_names(dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|name| name.into_string().ok())
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_a_fifo_and_a_large_file_are_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"ok").unwrap();
        std::os::unix::fs::symlink(&file, dir.path().join("link")).unwrap();
        nix::unistd::mkfifo(&dir.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(read_regular(&file, 2).as_deref(), Some(&b"ok"[..]));
        assert_eq!(read_regular(&file, 1), None);
        assert_eq!(read_regular(&dir.path().join("link"), 10), None);
        assert_eq!(read_regular(&dir.path().join("fifo"), 10), None);
        let loop_error = open_no_follow(&dir.path().join("link")).unwrap_err();
        assert_eq!(loop_error.raw_os_error(), Some(nix::libc::ELOOP));
        assert_eq!(list_names(dir.path()), ["fifo", "file", "link"]);
        assert!(read_names(&dir.path().join("missing")).unwrap().is_empty());
    }
}
