//! What holds one task's commands: the user they run as (with `--run-as-submitter`), the
//! cgroup they join (where the daemon may create one), and what is left of them at the end of
//! each attempt (see [`super::task_processes`]).
//!
//! With `--run-as-submitter` a task's run directory `runs/<id>/` stays the daemon's (`0750`):
//! its logs (which the command writes through the descriptors it is given), large outputs and
//! the FIFOs' names cannot be renamed, replaced or linked by the task. What the command uses is
//! handed to its submitter with `chown`: the worker's FIFOs (`0600`), its resume file (`0600`)
//! and the scratch directory `runs/<id>/scratch/` (`0700`, `$CAIRN_SCRATCH`), each given its
//! mode before it is handed over. So only `CAP_CHOWN` is needed for this, not `CAP_FOWNER` or
//! `CAP_DAC_OVERRIDE`, and the daemon never writes into a directory a task could fill with
//! links.

use std::io;
use std::path::{Path, PathBuf};

use super::child::Confinement;
use super::identity::RunAs;
use super::task_processes::{self, CgroupRoot, TaskCgroup};

/// The daemon's choices, shared by every task.
#[derive(Debug, Clone, Default)]
pub struct ConfineConfig {
    /// Run each task's commands as its submitter (`cairn run --run-as-submitter`).
    pub run_as_submitter: bool,
    /// Where task cgroups are created; `None`: the `/proc` scan is used instead.
    pub cgroups: Option<CgroupRoot>,
}

/// One task's confinement, for one attempt.
#[derive(Debug)]
pub(crate) struct TaskConfinement {
    /// What each command is started with.
    pub spawn: Confinement,
    /// The submitter, when commands run as their submitter.
    pub run_as: Option<RunAs>,
    cgroup: Option<TaskCgroup>,
    run_dir: PathBuf,
}

/// Why a task's commands cannot be confined as asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfineError {
    #[error(
        "the daemon runs tasks as their submitters (--run-as-submitter) and this task has no \
         submitter it can trust: it was accepted before submitters were recorded, or, on a \
         shared queue, inserted by a database role that cairn_roles maps to no user of this \
         host (`cairn db grant submitter ROLE --user LOCAL_USER`); nothing was run"
    )]
    NoSubmitter,
    #[error("cannot run as the task's submitter: {0}")]
    Identity(#[from] super::identity::IdentityError),
    #[error("preparing {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// The run directory could not be created (the error names it).
    #[error("{0}")]
    RunDir(#[source] io::Error),
}

/// The scratch directory of a task's run directory (`$CAIRN_SCRATCH`).
pub(super) fn scratch_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("scratch")
}

impl TaskConfinement {
    /// Prepare task `id`'s attempt (blocking): find its submitter's identity, create its
    /// scratch directory in `run_dir` (which exists), owned by the submitter, then its cgroup
    /// (last, so that no failure leaves a cgroup that nothing ends).
    pub(crate) fn prepare(
        config: &ConfineConfig,
        id: &str,
        submitter_uid: Option<u32>,
        run_dir: &Path,
    ) -> Result<TaskConfinement, ConfineError> {
        let run_as = match (config.run_as_submitter, submitter_uid) {
            (false, _) => None,
            (true, None) => return Err(ConfineError::NoSubmitter),
            (true, Some(uid)) => Some(RunAs::of_uid(uid)?),
        };
        let scratch = scratch_dir(run_dir);
        crate::store::modes::create_dir_all(&scratch)
            .and_then(|()| FileOwner::of(run_as.as_ref()).hand_over(&scratch, 0o700))
            .map_err(|source| ConfineError::Io {
                path: scratch,
                source,
            })?;
        let cgroup = match &config.cgroups {
            Some(root) => match root.task(id) {
                Ok(cgroup) => Some(cgroup),
                Err(e) => {
                    tracing::warn!(task_id = %id, error = %e, "cannot create the task's cgroup: its helpers are found by the scan of /proc instead");
                    None
                }
            },
            None => None,
        };
        Ok(TaskConfinement {
            spawn: Confinement {
                run_as: run_as.as_ref().map(|r| r.switch.clone()),
                cgroup_procs: cgroup.as_ref().map(TaskCgroup::procs_file),
            },
            run_as,
            cgroup,
            run_dir: run_dir.to_path_buf(),
        })
    }

    /// Who the files a task's commands use are handed to, as a value a blocking job can take.
    pub(crate) fn file_owner(&self) -> FileOwner {
        FileOwner::of(self.run_as.as_ref())
    }

    /// The submitter's login variables (`USER`, `HOME`, ...), and `XDG_CACHE_HOME` in its
    /// scratch directory (the service's cache directory is the daemon's user's), which a task's
    /// `env` may override; none when commands run as the daemon's user.
    pub(crate) fn login_env(&self) -> Vec<(String, String)> {
        let Some(run_as) = &self.run_as else {
            return Vec::new();
        };
        let mut env = run_as.login_env().to_vec();
        let cache = scratch_dir(&self.run_dir).join(".cache");
        env.push(("XDG_CACHE_HOME".into(), cache.display().to_string()));
        env
    }

    /// The scratch directory, where the files checkpoints name are read and restored.
    pub(crate) fn scratch(&self) -> PathBuf {
        scratch_dir(&self.run_dir)
    }

    /// `CAIRN_SCRATCH`: the directory the task's commands may write.
    pub(crate) fn scratch_env(&self) -> (String, String) {
        (
            "CAIRN_SCRATCH".into(),
            scratch_dir(&self.run_dir).display().to_string(),
        )
    }

    /// End every process of the task still alive after its attempt (blocking): everything in
    /// its cgroup, else everything carrying its `CAIRN_RUN_DIR`. Returns how many were found.
    pub(crate) fn end_leftovers(self) -> usize {
        match self.cgroup {
            Some(cgroup) => cgroup.end_all(),
            None => task_processes::kill_by_marker(&self.run_dir),
        }
    }
}

/// The submitter's uid and gid when commands run as their submitter, else nobody: the owner
/// the files a task's commands use are handed to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileOwner(Option<(u32, u32)>);

impl FileOwner {
    fn of(run_as: Option<&RunAs>) -> FileOwner {
        FileOwner(run_as.map(|run_as| (run_as.switch.uid.as_raw(), run_as.switch.gid.as_raw())))
    }

    /// The owner's uid and gid, when there is one.
    pub(crate) fn ids(self) -> Option<(u32, u32)> {
        self.0
    }

    /// Give `path` to the owner with `mode`; nothing when there is none.
    ///
    /// The mode is set while the daemon owns the file, then the file is handed over: changing
    /// the mode of another user's file needs `CAP_FOWNER`, which would let the daemon change
    /// the mode of any file on the host, while `CAP_CHOWN` (which it has) is all a hand-over
    /// needs. A file handed over before (the scratch directory of an earlier attempt) is
    /// taken back first, unless it is as asked already.
    pub(crate) fn hand_over(self, path: &Path, mode: u32) -> io::Result<()> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let Some((uid, gid)) = self.0 else {
            return Ok(());
        };
        let found = std::fs::symlink_metadata(path)?;
        if (found.uid(), found.gid(), found.mode() & 0o7777) == (uid, gid, mode) {
            return Ok(());
        }
        let daemon = nix::unistd::geteuid().as_raw();
        if found.uid() != daemon {
            std::os::unix::fs::lchown(path, Some(daemon), None)?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))
    }
}

/// Create `task`'s run directory and prepare its attempt's confinement, in one job off the
/// async thread (each hand-off to the blocking pool costs the async thread a wake-up, and a
/// resume of thousands makes them by the thousand); an attempt that cannot be confined as asked
/// fails (and counts: it would fail the same way again).
pub(super) async fn prepare(
    ctx: &super::RunContext,
    task: &crate::task::Task,
) -> Result<TaskConfinement, super::AttemptEnd> {
    let (config, queue) = (ctx.confine.clone(), ctx.queue.clone());
    let id = task.id().to_string();
    let submitter = submitter_uid(task);
    let prepared = super::blocking(move || {
        let run_dir = queue.create_run_dir(&id).map_err(ConfineError::RunDir)?;
        TaskConfinement::prepare(&config, &id, submitter, &run_dir)
    })
    .await;
    match prepared {
        Ok(Ok(confinement)) => Ok(confinement),
        Ok(Err(e)) => Err(super::AttemptEnd::Failed {
            error: e.to_string(),
            counts: !matches!(e, ConfineError::Io { .. } | ConfineError::RunDir(_)),
        }),
        Err(e) => Err(super::AttemptEnd::Failed {
            error: e.to_string(),
            counts: false,
        }),
    }
}

/// End what is left of the attempt's processes, off the async thread.
pub(super) async fn end(id: &str, confinement: TaskConfinement) {
    let ended = super::blocking(move || confinement.end_leftovers()).await;
    if let Some(count) = ended.ok().filter(|count| *count > 0) {
        tracing::info!(task_id = %id, count, "killed processes the task left running");
    }
}

/// The user who submitted `task` (the owner of the file taken from `inbox/`, recorded at
/// intake).
fn submitter_uid(task: &crate::task::Task) -> Option<u32> {
    task.submitted_by().map(|submitter| submitter.uid)
}
