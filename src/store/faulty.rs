//! Fault injection for tests: [`FileOps`] that fail, or "crash", at a chosen step.
//!
//! A test double, compiled only with the `test-doubles` feature (on for cairn's own tests
//! through its dev-dependency on itself; a program embedding cairn can turn it on in its
//! dev-dependencies to prove its own recovery): count the steps of an operation with
//! [`FaultyFileOps::new`], then repeat it with [`FaultyFileOps::fail_at`] for every step in
//! turn and check what a fresh store finds on disk afterwards.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::file_ops::{FileOps, RealFileOps, TempFile};

/// `ENOSPC`: the transient error [`FaultMode::Error`] reports, since a full disk is the
/// everyday failure a checkpoint write must survive.
const NO_SPACE_LEFT: i32 = 28;

/// `EIO`: what [`FaultMode::IoError`] reports.
const IO_ERROR: i32 = 5;

/// What happens at the faulting step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// That one call fails with "no space left on device" without doing anything; later calls
    /// work normally (a transient I/O error, or a disk that was full for a moment).
    Error,
    /// Like [`FaultMode::Error`], but the call fails with an I/O error (`EIO`): a failure that
    /// is not about space, so no write can get round it by needing less room.
    IoError,
    /// That call and every later one fail without doing anything: the process died there.
    /// Open a fresh store with real ops on the same directory to see what a restart finds.
    Crash,
    /// Like [`FaultMode::Crash`], but a faulting `write_all` or `append_log` first writes the
    /// first half of its bytes (the process died mid-write).
    TornWrite,
}

/// [`FileOps`] that delegate to [`RealFileOps`], count every call, and fault at one of them.
#[derive(Debug, Default)]
pub struct FaultyFileOps {
    /// The syscalls that run when no fault applies.
    real: RealFileOps,
    /// The 0-based call index that faults, and how; `None` only counts calls.
    fault: Option<(u64, FaultMode)>,
    /// Calls made so far (faulted ones included).
    steps: AtomicU64,
    /// Set once a `Crash` or `TornWrite` fault fired: every later call fails.
    crashed: AtomicBool,
}

/// Which operation is running, so a torn write knows it is a write.
enum Call<'a> {
    Write(&'a mut TempFile, &'a [u8]),
    Append(&'a File, u64, &'a [u8]),
    Other,
}

impl FaultyFileOps {
    /// No fault: every call goes through, and [`steps`](Self::steps) counts them.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `step`-th call (0-based, counting every [`FileOps`] call) faults in `mode`.
    pub fn fail_at(step: u64, mode: FaultMode) -> Self {
        Self {
            fault: Some((step, mode)),
            ..Self::default()
        }
    }

    /// How many calls were made so far.
    pub fn steps(&self) -> u64 {
        self.steps.load(Ordering::SeqCst)
    }

    /// Whether a `Crash` or `TornWrite` fault fired (every call since has failed).
    pub fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Count the call, and return the error to report instead of running it, if any.
    fn check(&self, name: &str, call: Call<'_>) -> io::Result<()> {
        let step = self.steps.fetch_add(1, Ordering::SeqCst);
        if self.crashed() {
            return Err(crashed_error(name, step));
        }
        match self.fault {
            Some((fault_step, mode)) if fault_step == step => match mode {
                FaultMode::Error => Err(io::Error::from_raw_os_error(NO_SPACE_LEFT)),
                FaultMode::IoError => Err(io::Error::from_raw_os_error(IO_ERROR)),
                FaultMode::Crash => {
                    self.crashed.store(true, Ordering::SeqCst);
                    Err(crashed_error(name, step))
                }
                FaultMode::TornWrite => {
                    self.crashed.store(true, Ordering::SeqCst);
                    // The torn half is part of the simulation; its own error is moot.
                    match call {
                        Call::Write(temp, bytes) => {
                            let _ = self.real.write_all(temp, &bytes[..bytes.len() / 2]);
                        }
                        Call::Append(log, at, bytes) => {
                            let _ = self.real.append_log(log, at, &bytes[..bytes.len() / 2]);
                        }
                        Call::Other => {}
                    }
                    Err(crashed_error(name, step))
                }
            },
            _ => Ok(()),
        }
    }
}

/// The error every call gets once the simulated process is dead.
fn crashed_error(name: &str, step: u64) -> io::Error {
    io::Error::other(format!("simulated crash: {name} (step {step}) never ran"))
}

impl FileOps for FaultyFileOps {
    fn create_temp(&self, dir: &Path, target_name: &str) -> io::Result<TempFile> {
        self.check("create_temp", Call::Other)?;
        self.real.create_temp(dir, target_name)
    }

    fn reuse_as_temp(
        &self,
        old: &Path,
        dir: &Path,
        target_name: &str,
    ) -> io::Result<Option<TempFile>> {
        self.check("reuse_as_temp", Call::Other)?;
        self.real.reuse_as_temp(old, dir, target_name)
    }

    fn write_all(&self, temp: &mut TempFile, bytes: &[u8]) -> io::Result<()> {
        self.check("write_all", Call::Write(temp, bytes))?;
        self.real.write_all(temp, bytes)
    }

    fn sync_file(&self, temp: &mut TempFile) -> io::Result<()> {
        self.check("sync_file", Call::Other)?;
        self.real.sync_file(temp)
    }

    fn hard_link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        self.check("hard_link", Call::Other)?;
        self.real.hard_link(existing, new)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check("rename", Call::Other)?;
        self.real.rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.check("sync_dir", Call::Other)?;
        self.real.sync_dir(dir)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.check("remove_file", Call::Other)?;
        self.real.remove_file(path)
    }

    fn open_log(&self, path: &Path) -> io::Result<File> {
        self.check("open_log", Call::Other)?;
        self.real.open_log(path)
    }

    fn append_log(&self, log: &File, at: u64, bytes: &[u8]) -> io::Result<()> {
        self.check("append_log", Call::Append(log, at, bytes))?;
        self.real.append_log(log, at, bytes)
    }

    fn sync_log(&self, log: &File) -> io::Result<()> {
        self.check("sync_log", Call::Other)?;
        self.real.sync_log(log)
    }

    fn truncate_log(&self, log: &File, len: u64) -> io::Result<()> {
        self.check("truncate_log", Call::Other)?;
        self.real.truncate_log(log, len)
    }

    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        self.check("sync_fs", Call::Other)?;
        self.real.sync_fs(dir)
    }
}
