//! The modes of the directories and files cairn creates in a queue, whatever the umask.
//!
//! A daemon started without the unit's `UMask=0027` (a shell with umask `000`, a container)
//! would otherwise leave task definitions, and the tokens in their `env`, readable or writable
//! by every user; a umask of `077` would hide the queue from the group that reads it
//! (`cairn status`) and the daemon from the files `cairn submit` drops. So what cairn creates is
//! [`DIR_MODE`] and [`FILE_MODE`] exactly; what exists already keeps the mode its owner gave it
//! (an administrator's group-writable `inbox/`). Worker FIFOs are created `0600` elsewhere.

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::OnceLock;

/// Directories cairn creates: the owner writes, the group (readers of the queue) enters.
pub const DIR_MODE: u32 = 0o750;
/// Files cairn writes: the owner writes, the group reads.
pub const FILE_MODE: u32 = 0o640;

/// The process's umask, read once from `/proc/self/status` (`umask(2)` can only be read by
/// setting it, which would race with other threads creating files). `None` if unknown.
fn umask() -> Option<u32> {
    static UMASK: OnceLock<Option<u32>> = OnceLock::new();
    *UMASK.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
        u32::from_str_radix(line.trim(), 8).ok()
    })
}

/// Would creating with `mode` leave fewer bits than `mode` (so a `chmod` is needed)?
fn umask_strips(mode: u32) -> bool {
    umask().is_none_or(|mask| mask & mode != 0)
}

/// Give a file cairn has just created (with mode [`FILE_MODE`]) that exact mode, if the
/// umask took bits from it. A `chmod` only when needed: this is on the checkpoint path.
pub fn fix_new_file(file: &File) -> io::Result<()> {
    if umask_strips(FILE_MODE) {
        file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    }
    Ok(())
}

fn fix_new_dir(path: &Path) -> io::Result<()> {
    if umask_strips(DIR_MODE) {
        std::fs::set_permissions(path, Permissions::from_mode(DIR_MODE))?;
    }
    Ok(())
}

/// `create_dir_all` whose new directories are [`DIR_MODE`]; existing ones are left as they are.
/// An existing directory is looked up first: a `mkdir` that fails with `EEXIST` still takes its
/// parent's lock for writing, which every resumed task's run directory would contend for.
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => fix_new_dir(path),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
            let Some(parent) = parent else {
                return Err(e);
            };
            create_dir_all(parent)?;
            match DirBuilder::new().mode(DIR_MODE).create(path) {
                Ok(()) => fix_new_dir(path),
                // Created by someone else meanwhile.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Open `path` for appending, creating it [`FILE_MODE`] if it does not exist (a log, a journal).
/// A link in its place is refused (`ELOOP`): whoever can write the queue must not make cairn,
/// perhaps run by root, append to a file elsewhere.
pub fn open_append(path: &Path) -> io::Result<File> {
    match OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
    {
        Ok(file) => {
            fix_new_file(&file)?;
            Ok(file)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => open_append_existing(path),
        Err(e) => Err(e),
    }
}

/// Open the existing file `path` for appending; a link in its place is refused (`ELOOP`), as
/// by [`open_append`].
pub fn open_append_existing(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// Write `bytes` as the whole content of `path`, created [`FILE_MODE`] if it does not exist.
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)?;
    fix_new_file(&file)?;
    file.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_umask_is_read() {
        // The test harness does not change its umask; whatever it is, it is known on Linux.
        assert!(super::umask().is_some());
    }

    #[test]
    fn created_directories_and_files_have_the_queue_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b");
        super::create_dir_all(&deep).unwrap();
        let mode =
            |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&tmp.path().join("a")), 0o750);
        assert_eq!(mode(&deep), 0o750);
        super::write_file(&deep.join("f"), b"x").unwrap();
        assert_eq!(mode(&deep.join("f")), 0o640);
        super::open_append(&deep.join("log")).unwrap();
        assert_eq!(mode(&deep.join("log")), 0o640);
        // An existing directory keeps its mode.
        std::fs::set_permissions(&deep, std::fs::Permissions::from_mode(0o3770)).unwrap();
        super::create_dir_all(&deep).unwrap();
        assert_eq!(mode(&deep), 0o3770);
    }
}
