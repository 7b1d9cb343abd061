//! Power-loss simulation of checkpoint saves.
//!
//! A loop saves its checkpoints through [`PowerLossFileOps`], which runs every file operation
//! for real and models what a power cut would leave: file data not fsynced is lost, directory
//! entries created, linked or renamed since the directory's last fsync are lost, removed ones
//! may come back. After every single file operation the test writes that crash image into a
//! fresh directory and opens a fresh store on it, the way the daemon restarts after a power
//! cut: the latest checkpoint must decode and be no older than the last save that had returned
//! `Ok`, and the store must clean up and save again there.
//!
//! The same check is run with a writer that skips the directory fsync, and one that skips the
//! temp file's fsync, to show that it notices when either barrier is missing.
//!
//! Two tests at the end cover what the simulation found beyond a single run: windows where a
//! process killed at the wrong moment leaves state that a restart would trust but a later power
//! cut could still take away. `FileStorage` closes them by syncing, once per process, a
//! directory it did not create before writing into it, and the queue's directories at start
//! (`remove_temp_files`).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::temp_files::temp_files;
use cairn::store::blobs::BlobStore;
use cairn::store::{
    CheckpointStore, FaultMode, FaultyFileOps, FileOps, FileStorage, LoopCheckpointer,
    PowerLossFileOps, Storage, TempFile,
};
use serde::{Deserialize, Serialize};

const TASK: &str = "t1";
const SCOPE: &str = "sum";
/// The directory the checkpoint writer puts checkpoints in (and syncs after its rename).
const CHECKPOINT_DIR: &str = "incremental";
/// Saves made under the simulation in each run.
const SAVES: u64 = 6;

/// The loop state: a running sum and the numbers added so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SumState {
    total: u64,
    added: Vec<u64>,
}

/// The state after `iterations` iterations (adding 1, 2, 3, ...).
fn state_after(iterations: u64) -> SumState {
    let added: Vec<u64> = (1..=iterations).collect();
    SumState {
        total: added.iter().sum(),
        added,
    }
}

/// Which barrier a deliberately broken writer leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    /// Nothing: the writer as it is.
    Nothing,
    /// The fsync of the checkpoint directory (reported as done, never run).
    CheckpointDirSync,
    /// The fsync of the temp file (reported as done, never run).
    TempFileSync,
    /// The fdatasync of the commit log (reported as done, never run).
    LogSync,
    /// The fsync of a blob's temp file, before its rename (reported as done, never run).
    BlobSync,
}

/// How the writer commits its saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    /// The atomic replace alone.
    Replace,
    /// Through the checkpoint directory's commit log.
    Log,
}

/// What is known about the run when a crash image is taken.
#[derive(Debug)]
struct Checker {
    /// Where the crash images are written (each removed once checked).
    images: tempfile::TempDir,
    /// The iteration count of the last save that returned `Ok` (0: none).
    committed: AtomicU64,
    /// The iteration count of the newest save started: no image may hold a newer one.
    attempted: AtomicU64,
    /// Crash images checked so far.
    checked: AtomicU64,
    /// Every violation found: which step, and what was wrong.
    findings: Mutex<Vec<String>>,
    /// Before the restart, open each crash image with a replay that fails at each of its
    /// steps in turn (see [`Checker::failed_replays`]).
    failing_replay: bool,
    /// The saves name a file (see [`model_after`]): every checkpoint in a crash image must
    /// find its blobs, each holding what the checkpoint's iteration wrote.
    files: bool,
}

impl Checker {
    fn new(committed: u64) -> Self {
        Self {
            images: tempfile::tempdir().unwrap(),
            committed: AtomicU64::new(committed),
            attempted: AtomicU64::new(committed),
            checked: AtomicU64::new(0),
            findings: Mutex::default(),
            failing_replay: false,
            files: false,
        }
    }

    /// Cut the power now: write the crash image and check what a restart finds there.
    fn power_cut(&self, model: &PowerLossFileOps, step: &str) {
        let n = self.checked.fetch_add(1, Ordering::SeqCst);
        let image = self.images.path().join(n.to_string());
        model.crash_image(&image).unwrap();
        let committed = self.committed.load(Ordering::SeqCst);
        let attempted = self.attempted.load(Ordering::SeqCst);
        let files_checked = if self.files {
            check_files(&image)
        } else {
            Ok(())
        };
        if let Err(why) = files_checked.and_then(|()| restart_on(&image, committed, attempted)) {
            self.findings.lock().unwrap().push(format!(
                "power cut after step {n} ({step}), last committed iteration {committed}: {why}"
            ));
        }
        fs::remove_dir_all(&image).unwrap();
        if self.failing_replay {
            self.failed_replays(model, &format!("step {n} ({step})"), committed, attempted);
        }
    }

    /// For each step of opening the crash image of `model` in turn: a start whose replay of
    /// the commit log fails at that step (an error such as a full disk or an EIO from
    /// `syncfs`, after which the process goes on running), then a start on a healthy disk,
    /// which must find every acknowledged checkpoint.
    fn failed_replays(&self, model: &PowerLossFileOps, cut: &str, committed: u64, attempted: u64) {
        for fault in 0.. {
            let image = self.images.path().join(format!(
                "{}-replay-{fault}",
                self.checked.load(Ordering::SeqCst)
            ));
            model.crash_image(&image).unwrap();
            let ops = Arc::new(FaultyFileOps::fail_at(fault, FaultMode::Error));
            let opened = FileStorage::with_ops(&image, Arc::clone(&ops) as _)
                .with_commit_log(CHECKPOINT_DIR);
            let failed = opened.is_err();
            // Closed as a start that gives up closes it.
            drop(opened);
            if let Err(why) = restart_on(&image, committed, attempted) {
                self.findings.lock().unwrap().push(format!(
                    "power cut after {cut}, the replay failing at its step {fault}, last \
                     committed iteration {committed}: {why}"
                ));
            }
            fs::remove_dir_all(&image).unwrap();
            if !failed || ops.steps() <= fault {
                // The open did not reach the fault: every step of it has been failed once.
                break;
            }
        }
    }
}

/// What the daemon does when it starts on the crash image `root`, checked: clean up temp
/// files, find a latest checkpoint that decodes and is at least `committed` (and at most
/// `attempted`) iterations, resume from it and commit the next iteration under a new
/// generation.
fn restart_on(root: &Path, committed: u64, attempted: u64) -> Result<(), String> {
    FileStorage::new(root)
        .remove_temp_files()
        .map_err(|err| format!("removing temp files: {err}"))?;
    if !temp_files(root).is_empty() {
        return Err("temp files remain after cleanup".into());
    }
    let store = CheckpointStore::open(root).map_err(|err| format!("opening the store: {err}"))?;
    let found = match store.latest(TASK) {
        Err(err) => return Err(format!("the latest checkpoint is undecodable: {err}")),
        Ok(None) if committed > 0 => {
            return Err("the committed checkpoint is lost: no checkpoint at all".into())
        }
        Ok(None) => 0,
        Ok(Some(loaded)) => {
            let cp = loaded.checkpoint;
            if cp.iteration_count < committed {
                return Err(format!(
                    "the committed checkpoint is lost: the latest that decodes ({}) holds \
                     iteration {}",
                    loaded.key, cp.iteration_count
                ));
            }
            if cp.iteration_count > attempted {
                return Err(format!("iteration {} was never saved", cp.iteration_count));
            }
            let state: SumState = serde_json::from_value(cp.partial_results)
                .map_err(|err| format!("the latest state does not parse: {err}"))?;
            if state != state_after(cp.iteration_count) {
                return Err(format!(
                    "the state of iteration {} is wrong: {state:?}",
                    cp.iteration_count
                ));
            }
            cp.iteration_count
        }
    };

    let highest_before = highest_generation(&store)?;
    let mut checkpointer = LoopCheckpointer::new(store.clone(), TASK, SCOPE);
    let resumed = checkpointer
        .resume::<SumState>()
        .map_err(|err| format!("resuming: {err}"))?
        .map_or(0, |(iterations, _)| iterations);
    if resumed != found {
        return Err(format!("resumed at {resumed}, the latest holds {found}"));
    }
    let next = resumed + 1;
    checkpointer
        .checkpoint(next, &state_after(next))
        .map_err(|err| format!("saving iteration {next} after the restart: {err}"))?;
    drop(checkpointer);
    let after = CheckpointStore::open(root)
        .and_then(|fresh| fresh.latest(TASK))
        .map_err(|err| format!("reading back the save after the restart: {err}"))?
        .ok_or("the save after the restart is not there")?
        .checkpoint;
    if after.iteration_count != next || after.generation <= highest_before {
        return Err(format!(
            "the save after the restart reads back as iteration {} generation {} \
             (expected iteration {next}, a generation above {highest_before})",
            after.iteration_count, after.generation
        ));
    }
    Ok(())
}

/// The file iteration `i` leaves in the scratch directory: it changes every other iteration,
/// so some saves name the blob of the one before.
fn model_after(iteration: u64) -> Vec<u8> {
    format!("model weights after iteration {}", iteration / 2 * 2).into_bytes()
}

/// Every checkpoint file in the crash image `root` that decodes finds the blob of each file
/// it names, holding the bytes its iteration wrote.
fn check_files(root: &Path) -> Result<(), String> {
    use sha2::Digest;
    let store = CheckpointStore::with_storage(Arc::new(FileStorage::new(root)));
    for info in store.history(TASK).map_err(|e| format!("history: {e}"))? {
        let Ok(cp) = store.generation(TASK, info.generation) else {
            continue;
        };
        if cp.files.is_empty() {
            continue;
        }
        let model = &cp.files["model"];
        let want = model_after(cp.iteration_count);
        let blob = root.join("blobs").join(&model.sha256);
        let found = fs::read(&blob).map_err(|e| {
            format!(
                "generation {} (iteration {}) names blob {} which is lost: {e}",
                info.generation, cp.iteration_count, model.sha256
            )
        })?;
        let hash: String = sha2::Sha256::digest(&found)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if found != want || hash != model.sha256 {
            return Err(format!(
                "generation {} (iteration {}) finds other bytes in blob {} ({} bytes)",
                info.generation,
                cp.iteration_count,
                model.sha256,
                found.len()
            ));
        }
    }
    Ok(())
}

/// The highest generation number among the task's checkpoint files.
fn highest_generation(store: &CheckpointStore) -> Result<u64, String> {
    let history = store
        .history(TASK)
        .map_err(|err| format!("listing the generations: {err}"))?;
    Ok(history
        .iter()
        .map(|info| info.generation)
        .max()
        .unwrap_or(0))
}

/// The writer's file operations: the power-loss model, minus the barrier `skip` leaves out,
/// with a power cut checked after every call.
#[derive(Debug)]
struct CutAfterEveryStep {
    model: Arc<PowerLossFileOps>,
    skip: Skip,
    checker: Arc<Checker>,
}

impl CutAfterEveryStep {
    /// Check a power cut right after the call `step`, then hand its result on.
    fn then_cut<T>(&self, step: &str, result: io::Result<T>) -> io::Result<T> {
        self.checker.power_cut(&self.model, step);
        result
    }
}

impl FileOps for CutAfterEveryStep {
    fn create_temp(&self, dir: &Path, target_name: &str) -> io::Result<TempFile> {
        self.then_cut("create_temp", self.model.create_temp(dir, target_name))
    }

    fn reuse_as_temp(
        &self,
        old: &Path,
        dir: &Path,
        target_name: &str,
    ) -> io::Result<Option<TempFile>> {
        self.then_cut(
            "reuse_as_temp",
            self.model.reuse_as_temp(old, dir, target_name),
        )
    }

    fn write_all(&self, temp: &mut TempFile, bytes: &[u8]) -> io::Result<()> {
        self.then_cut("write_all", self.model.write_all(temp, bytes))
    }

    fn sync_file(&self, temp: &mut TempFile) -> io::Result<()> {
        let blob = temp.path.parent().is_some_and(|dir| dir.ends_with("blobs"));
        if self.skip == Skip::BlobSync && blob {
            return self.then_cut("sync_file of a blob (skipped)", Ok(()));
        }
        if self.skip == Skip::TempFileSync {
            return self.then_cut("sync_file (skipped)", Ok(()));
        }
        self.then_cut("sync_file", self.model.sync_file(temp))
    }

    fn hard_link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        self.then_cut("hard_link", self.model.hard_link(existing, new))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.then_cut("rename", self.model.rename(from, to))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        if self.skip == Skip::CheckpointDirSync && dir.ends_with(CHECKPOINT_DIR) {
            return self.then_cut("sync_dir (skipped)", Ok(()));
        }
        self.then_cut("sync_dir", self.model.sync_dir(dir))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.then_cut("remove_file", self.model.remove_file(path))
    }

    fn open_log(&self, path: &Path) -> io::Result<fs::File> {
        self.then_cut("open_log", self.model.open_log(path))
    }

    fn append_log(&self, log: &fs::File, at: u64, bytes: &[u8]) -> io::Result<()> {
        self.then_cut("append_log", self.model.append_log(log, at, bytes))
    }

    fn sync_log(&self, log: &fs::File) -> io::Result<()> {
        if self.skip == Skip::LogSync {
            return self.then_cut("sync_log (skipped)", Ok(()));
        }
        self.then_cut("sync_log", self.model.sync_log(log))
    }

    fn truncate_log(&self, log: &fs::File, len: u64) -> io::Result<()> {
        self.then_cut("truncate_log", self.model.truncate_log(log, len))
    }

    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        self.then_cut("sync_fs", self.model.sync_fs(dir))
    }
}

/// What one simulated run found.
struct Run {
    /// Crash images checked.
    checked: u64,
    /// Violations, one line each.
    findings: Vec<String>,
}

/// Commit `before` iterations with real file operations, then `SAVES` more through the
/// power-loss model, cutting the power after every file operation.
fn simulate(skip: Skip, before: u64) -> Run {
    simulate_commit(skip, before, Commit::Replace)
}

/// [`simulate`], the writer committing as `commit` says.
fn simulate_commit(skip: Skip, before: u64, commit: Commit) -> Run {
    simulate_with(skip, before, commit, false)
}

/// [`simulate_commit`]; with `failing_replay`, each crash image is first opened by a start
/// whose replay fails (see [`Checker::failed_replays`]).
fn simulate_with(skip: Skip, before: u64, commit: Commit, failing_replay: bool) -> Run {
    simulate_run(skip, before, commit, failing_replay, false)
}

/// [`simulate_with`]; with `files`, each save also names a file (see [`model_after`]), stored
/// through the same model, and the saves retire generations whose blobs are collected.
fn simulate_run(skip: Skip, before: u64, commit: Commit, failing_replay: bool, files: bool) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("queue");
    fs::create_dir(&root).unwrap();
    if before > 0 {
        let mut checkpointer =
            LoopCheckpointer::new(CheckpointStore::open(&root).unwrap(), TASK, SCOPE);
        for i in 1..=before {
            checkpointer.checkpoint(i, &state_after(i)).unwrap();
        }
    }

    // The blob directory and its lock exist before the simulation (a daemon makes them when
    // it opens the queue); the scratch directory is outside the modelled tree.
    let scratch = dir.path().join("scratch");
    fs::create_dir(&scratch).unwrap();
    drop(BlobStore::open(&root).unwrap());
    let model = Arc::new(PowerLossFileOps::new(&root).unwrap());
    let checker = Arc::new(Checker {
        failing_replay,
        files,
        ..Checker::new(before)
    });
    checker.power_cut(&model, "before the first save");
    let ops = Arc::new(CutAfterEveryStep {
        model: Arc::clone(&model),
        skip,
        checker: Arc::clone(&checker),
    });
    let blobs = BlobStore::open_with(&root, Arc::clone(&ops) as _).unwrap();
    let storage = FileStorage::with_ops(&root, ops);
    let storage = match commit {
        Commit::Replace => storage,
        Commit::Log => storage.with_commit_log(CHECKPOINT_DIR).unwrap(),
    };
    let store = CheckpointStore::with_storage(Arc::new(storage)).with_blobs(Arc::new(blobs));
    let mut checkpointer = LoopCheckpointer::new(store, TASK, SCOPE).scratch(&scratch, None);
    let named: BTreeMap<String, String> = [("model".to_string(), "model.bin".to_string())].into();
    let start = checkpointer
        .resume::<SumState>()
        .unwrap()
        .map_or(0, |(iterations, _)| iterations);
    assert_eq!(start, before);
    for i in start + 1..=start + SAVES {
        checker.attempted.store(i, Ordering::SeqCst);
        if files {
            fs::write(scratch.join("model.bin"), model_after(i)).unwrap();
            let saved = checkpointer.checkpoint_with_files(i, &state_after(i), &named);
            assert!(saved.unwrap());
        } else {
            assert!(checkpointer.checkpoint(i, &state_after(i)).unwrap());
        }
        checker.committed.store(i, Ordering::SeqCst);
    }
    checker.power_cut(&model, "after the last save");
    drop(checkpointer);
    checker.power_cut(&model, "after the store was closed");

    let findings = std::mem::take(&mut *checker.findings.lock().unwrap());
    let checked = checker.checked.load(Ordering::SeqCst);
    eprintln!(
        "{skip:?}, {commit:?}, {before} checkpoints before: {checked} power cuts, {} lose work{}",
        findings.len(),
        findings
            .iter()
            .map(|finding| format!("\n  {finding}"))
            .collect::<String>()
    );
    Run { checked, findings }
}

#[test]
fn a_power_cut_after_any_step_keeps_the_last_committed_checkpoint() {
    // An empty queue (the first save creates `incremental/`), and one with 4 generations
    // already on disk (the saves keep and prune generations).
    for before in [0, 4] {
        let run = simulate(Skip::Nothing, before);
        assert!(
            run.findings.is_empty(),
            "{} of {} power cuts lose work:\n{}",
            run.findings.len(),
            run.checked,
            run.findings.join("\n")
        );
        // Each save is at least create_temp, write_all, sync_file, rename, sync_dir.
        assert!(run.checked > SAVES * 5, "only {} power cuts", run.checked);
    }
}

#[test]
fn a_power_cut_at_any_step_of_saves_with_files_and_their_collection_loses_no_named_file() {
    for commit in [Commit::Replace, Commit::Log] {
        for before in [0, 4] {
            let run = simulate_run(Skip::Nothing, before, commit, false, true);
            assert!(
                run.findings.is_empty(),
                "{commit:?}, {before} before: {} of {} power cuts lose a file:\n{}",
                run.findings.len(),
                run.checked,
                run.findings.join("\n")
            );
            assert!(run.checked > SAVES * 8, "only {} power cuts", run.checked);
        }
    }
}

#[test]
fn the_check_finds_a_missing_blob_fsync() {
    let run = simulate_run(Skip::BlobSync, 0, Commit::Replace, false, true);
    assert!(
        run.findings
            .iter()
            .any(|finding| finding.contains("finds other bytes in blob")),
        "without the blob's fsync no power cut lost a file: {:?}",
        run.findings
    );
}

#[test]
fn the_check_finds_a_missing_directory_fsync() {
    for before in [0, 4] {
        let run = simulate(Skip::CheckpointDirSync, before);
        assert!(
            run.findings
                .iter()
                .any(|finding| finding.contains("the committed checkpoint is lost")),
            "before {before}: without the directory fsync no power cut lost work: {:?}",
            run.findings
        );
    }
}

#[test]
fn the_check_finds_a_missing_temp_file_fsync() {
    for before in [0, 4] {
        let run = simulate(Skip::TempFileSync, before);
        assert!(
            run.findings.iter().any(|finding| {
                finding.contains("undecodable")
                    || finding.contains("the committed checkpoint is lost")
            }),
            "before {before}: without the temp file fsync no power cut lost work: {:?}",
            run.findings
        );
    }
}

#[test]
fn a_power_cut_after_any_step_keeps_the_last_committed_checkpoint_through_the_log() {
    for before in [0, 4] {
        let run = simulate_commit(Skip::Nothing, before, Commit::Log);
        assert!(
            run.findings.is_empty(),
            "{} of {} power cuts lose work:\n{}",
            run.findings.len(),
            run.checked,
            run.findings.join("\n")
        );
        // Each save is at least create_temp, write_all, append_log, sync_log, rename.
        assert!(run.checked > SAVES * 5, "only {} power cuts", run.checked);
    }
}

/// A start whose replay of the commit log fails (a full disk, an EIO from `syncfs`) keeps the
/// log and fails; the next start, on a healthy disk, restores every acknowledged checkpoint
/// from it. (The log used to be removed when the half-opened log was dropped.)
#[test]
fn a_failed_replay_keeps_the_log_for_the_next_start() {
    for before in [0, 4] {
        let run = simulate_with(Skip::Nothing, before, Commit::Log, true);
        assert!(
            run.findings.is_empty(),
            "{} of {} power cuts lose work:\n{}",
            run.findings.len(),
            run.checked,
            run.findings.join("\n")
        );
    }
}

#[test]
fn the_check_finds_a_missing_log_sync() {
    for before in [0, 4] {
        let run = simulate_commit(Skip::LogSync, before, Commit::Log);
        assert!(
            run.findings.iter().any(|finding| {
                finding.contains("undecodable")
                    || finding.contains("the committed checkpoint is lost")
            }),
            "before {before}: without the log's fdatasync no power cut lost work: {:?}",
            run.findings
        );
    }
}

// ---- the model's own rules ----

/// The crash image of `model` now, as `path → content` for every file in it.
fn image_files(model: &PowerLossFileOps) -> Vec<(String, String)> {
    let image = tempfile::tempdir().unwrap();
    let into = image.path().join("image");
    model.crash_image(&into).unwrap();
    let mut files = Vec::new();
    let mut dirs = vec![into.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = path.strip_prefix(&into).unwrap().display().to_string();
            if entry.file_type().unwrap().is_dir() {
                files.push((format!("{name}/"), String::new()));
                dirs.push(path);
            } else {
                files.push((name, fs::read_to_string(&path).unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// `(path, content)` pairs, for comparing with [`image_files`].
fn expect(files: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut files: Vec<_> = files
        .iter()
        .map(|(path, content)| (path.to_string(), content.to_string()))
        .collect();
    files.sort();
    files
}

/// Write `content` to a new temp file in `dir` through `ops`, synced or not; its path.
fn temp_with(ops: &PowerLossFileOps, dir: &Path, content: &str, sync: bool) -> PathBuf {
    let mut temp = ops.create_temp(dir, "x").unwrap();
    ops.write_all(&mut temp, content.as_bytes()).unwrap();
    if sync {
        ops.sync_file(&mut temp).unwrap();
    }
    temp.path
}

#[test]
fn the_model_keeps_only_what_was_synced() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::write(root.join("old"), "seed").unwrap();
    fs::create_dir(root.join("sub")).unwrap();
    fs::write(root.join("sub/kept"), "sub seed").unwrap();
    let ops = PowerLossFileOps::new(root).unwrap();
    let seeded = [("old", "seed"), ("sub/", ""), ("sub/kept", "sub seed")];
    // What was there at the start counts as synced; unsynced changes to it are not seen.
    assert_eq!(image_files(&ops), expect(&seeded));
    fs::write(root.join("old"), "changed without a sync").unwrap();
    assert_eq!(image_files(&ops), expect(&seeded));

    // A synced file renamed into place: only there once the directory is synced.
    let temp = temp_with(&ops, root, "one", true);
    assert_eq!(image_files(&ops), expect(&seeded));
    ops.rename(&temp, &root.join("a")).unwrap();
    assert_eq!(image_files(&ops), expect(&seeded));
    ops.sync_dir(root).unwrap();
    let mut with_a = seeded.to_vec();
    with_a.push(("a", "one"));
    assert_eq!(image_files(&ops), expect(&with_a));

    // A file never synced, renamed over `a`: until the directory sync the old `a` stays;
    // after it, `a` is the new file, empty because its data never reached the disk.
    let temp = temp_with(&ops, root, "two", false);
    ops.rename(&temp, &root.join("a")).unwrap();
    assert_eq!(image_files(&ops), expect(&with_a));
    ops.sync_dir(root).unwrap();
    with_a.pop();
    with_a.push(("a", ""));
    assert_eq!(image_files(&ops), expect(&with_a));

    // A removed entry comes back until the directory is synced; a hard link appears only then.
    ops.remove_file(&root.join("old")).unwrap();
    ops.hard_link(&root.join("sub/kept"), &root.join("link"))
        .unwrap();
    assert_eq!(image_files(&ops), expect(&with_a));
    ops.sync_dir(root).unwrap();
    assert_eq!(
        image_files(&ops),
        expect(&[
            ("a", ""),
            ("link", "sub seed"),
            ("sub/", ""),
            ("sub/kept", "sub seed")
        ])
    );

    // A new directory needs its parent synced to exist, and its own sync for its entries.
    fs::create_dir(root.join("new")).unwrap();
    let temp = temp_with(&ops, &root.join("new"), "three", true);
    ops.rename(&temp, &root.join("new/f")).unwrap();
    ops.sync_dir(&root.join("new")).unwrap();
    assert!(!image_files(&ops)
        .iter()
        .any(|(path, _)| path.starts_with("new")));
    ops.sync_dir(root).unwrap();
    let image = image_files(&ops);
    assert!(
        image.contains(&("new/f".to_string(), "three".to_string())),
        "{image:?}"
    );
    assert!(ops.steps() > 0);
}

// ---- what the simulation found (and the store now prevents) ----

/// Finding: `FileStorage::ensure_dir` trusts any directory that exists. If a process is killed
/// after `create_dir_all` made `incremental/` but before the fsync of the queue root (the undo
/// in `ensure_dir` runs only when that fsync returns an error, not when the process dies), no
/// later process ever syncs the root: every save into the directory returns `Ok`, yet a power
/// cut loses the directory entry and with it every checkpoint in it.
#[test]
fn a_directory_left_unsynced_by_a_killed_process_is_synced_before_it_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("queue");
    fs::create_dir(&root).unwrap();
    let model = Arc::new(PowerLossFileOps::new(&root).unwrap());
    // The killed process: its mkdir ran, the fsync of the root never did.
    fs::create_dir(root.join(CHECKPOINT_DIR)).unwrap();

    let storage = FileStorage::with_ops(&root, Arc::clone(&model) as _);
    let store = CheckpointStore::with_storage(Arc::new(storage));
    let mut checkpointer = LoopCheckpointer::new(store, TASK, SCOPE);
    assert!(checkpointer.checkpoint(1, &state_after(1)).unwrap());

    let image = tempfile::tempdir().unwrap();
    let into = image.path().join("image");
    model.crash_image(&into).unwrap();
    restart_on(&into, 1, 1).unwrap();
}

/// The writer of a process that is killed right before the fsync of the checkpoint directory
/// (after its rename): that fsync fails without running, and so does every later call. With
/// `once`, the process lives on: that one fsync fails (EIO), and later calls run.
#[derive(Debug)]
struct KilledBeforeDirSync {
    model: Arc<PowerLossFileOps>,
    killed: std::sync::atomic::AtomicBool,
    once: bool,
}

impl KilledBeforeDirSync {
    fn new(model: &Arc<PowerLossFileOps>, once: bool) -> Self {
        Self {
            model: Arc::clone(model),
            killed: std::sync::atomic::AtomicBool::new(false),
            once,
        }
    }

    fn alive(&self) -> io::Result<()> {
        if self.killed.load(Ordering::SeqCst) && !self.once {
            Err(io::Error::other("the process was killed"))
        } else {
            Ok(())
        }
    }
}

impl FileOps for KilledBeforeDirSync {
    fn create_temp(&self, dir: &Path, target_name: &str) -> io::Result<TempFile> {
        self.alive()?;
        self.model.create_temp(dir, target_name)
    }

    fn reuse_as_temp(
        &self,
        old: &Path,
        dir: &Path,
        target_name: &str,
    ) -> io::Result<Option<TempFile>> {
        self.alive()?;
        self.model.reuse_as_temp(old, dir, target_name)
    }

    fn write_all(&self, temp: &mut TempFile, bytes: &[u8]) -> io::Result<()> {
        self.alive()?;
        self.model.write_all(temp, bytes)
    }

    fn sync_file(&self, temp: &mut TempFile) -> io::Result<()> {
        self.alive()?;
        self.model.sync_file(temp)
    }

    fn hard_link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        self.alive()?;
        self.model.hard_link(existing, new)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.alive()?;
        self.model.rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.alive()?;
        if dir.ends_with(CHECKPOINT_DIR) && !self.killed.swap(true, Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(5));
        }
        if dir.ends_with(CHECKPOINT_DIR) && !self.once {
            return self.alive();
        }
        self.model.sync_dir(dir)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.alive()?;
        self.model.remove_file(path)
    }

    fn open_log(&self, path: &Path) -> io::Result<fs::File> {
        self.alive()?;
        self.model.open_log(path)
    }

    fn append_log(&self, log: &fs::File, at: u64, bytes: &[u8]) -> io::Result<()> {
        self.alive()?;
        self.model.append_log(log, at, bytes)
    }

    fn sync_log(&self, log: &fs::File) -> io::Result<()> {
        self.alive()?;
        self.model.sync_log(log)
    }

    fn truncate_log(&self, log: &fs::File, len: u64) -> io::Result<()> {
        self.alive()?;
        self.model.truncate_log(log, len)
    }

    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        self.alive()?;
        self.model.sync_fs(dir)
    }
}

/// Finding: a process killed between the rename and the directory fsync leaves a checkpoint
/// that is visible but not durable. The restarted process (on the same, still powered disk)
/// resumes from it and `LoopCheckpointer::last_committed` reports it as committed, but nothing
/// makes the directory durable until that process's next save: a power cut before then brings
/// back the older checkpoint. Syncing the checkpoint directory at startup (for example where
/// `remove_temp_files` runs) would close this.
#[test]
fn a_restart_resumes_only_from_durable_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("queue");
    fs::create_dir(&root).unwrap();
    let mut first = LoopCheckpointer::new(CheckpointStore::open(&root).unwrap(), TASK, SCOPE);
    assert!(first.checkpoint(1, &state_after(1)).unwrap());
    drop(first);
    let model = Arc::new(PowerLossFileOps::new(&root).unwrap());

    // The process saving iteration 2 is killed before the directory fsync.
    let dying = Arc::new(KilledBeforeDirSync::new(&model, false));
    let store = CheckpointStore::with_storage(Arc::new(FileStorage::with_ops(&root, dying)));
    let mut checkpointer = LoopCheckpointer::new(store, TASK, SCOPE);
    assert!(checkpointer.checkpoint(2, &state_after(2)).is_err());
    std::mem::forget(checkpointer); // killed: no flush on drop

    // The restart, on the same disk.
    let storage = FileStorage::with_ops(&root, Arc::clone(&model) as _);
    storage.remove_temp_files().unwrap();
    let store = CheckpointStore::with_storage(Arc::new(storage));
    let mut restarted = LoopCheckpointer::new(store, TASK, SCOPE);
    let (resumed, _) = restarted.resume::<SumState>().unwrap().unwrap();
    assert_eq!((resumed, restarted.last_committed()), (2, Some(2)));

    // Power cut before the restarted process saves again.
    let image = tempfile::tempdir().unwrap();
    let into = image.path().join("image");
    model.crash_image(&into).unwrap();
    restart_on(&into, resumed, resumed).unwrap();
}

/// Finding: with the atomic replace, a directory fsync that fails after the rename (EIO) fails
/// the save, but the checkpoint is in place, and the retry in the same process resumed from it
/// although nothing had made it durable: a power cut then took it back. A directory whose
/// fsync failed is now synced before it is read again, and reading it fails while that fails.
#[test]
fn a_retry_resumes_only_from_a_checkpoint_made_durable() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("queue");
    fs::create_dir(&root).unwrap();
    let mut first = LoopCheckpointer::new(CheckpointStore::open(&root).unwrap(), TASK, SCOPE);
    assert!(first.checkpoint(1, &state_after(1)).unwrap());
    drop(first);
    let model = Arc::new(PowerLossFileOps::new(&root).unwrap());

    // The save of iteration 2 fails at its directory fsync; the attempt ends there.
    let failing = Arc::new(KilledBeforeDirSync::new(&model, true));
    let store = CheckpointStore::with_storage(Arc::new(FileStorage::with_ops(&root, failing)));
    let mut checkpointer = LoopCheckpointer::new(store.clone(), TASK, SCOPE);
    let err = checkpointer.checkpoint(2, &state_after(2)).unwrap_err();
    assert!(err.to_string().contains("Input/output error"), "{err}");
    std::mem::forget(checkpointer); // the attempt's end is not what is tested here

    // The retry, in the same process and through the same store.
    let mut retry = LoopCheckpointer::new(store, TASK, SCOPE);
    let (resumed, _) = retry.resume::<SumState>().unwrap().unwrap();

    // Power cut before the retry saves again: what it resumed from must still be there.
    let image = tempfile::tempdir().unwrap();
    let into = image.path().join("image");
    model.crash_image(&into).unwrap();
    restart_on(&into, resumed, 2).unwrap();
}
