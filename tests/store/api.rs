//! The checkpoint store as embedding programs use it: generations, history, fallback to an
//! older generation, deletion, and the loop helper's resume / every-N / flush / drop.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cairn::store::{
    CheckpointStore, FaultMode, FaultyFileOps, FileOps, FileStorage, IterationCheckpoint,
    LoopCheckpointer, RealFileOps, StoreError, TempFile, FORMAT_VERSION,
};

const TASK: &str = "t1";

/// A checkpoint of task `t1` after `iterations` iterations, with the count as its state.
fn checkpoint(iterations: u64) -> IterationCheckpoint {
    IterationCheckpoint {
        format_version: FORMAT_VERSION,
        task_id: TASK.into(),
        phase: "loop".into(),
        phase_index: 0,
        scope: "loop".into(),
        iteration_count: iterations,
        checkpoint_interval: 1,
        partial_results: serde_json::json!({ "count": iterations }),
        last_checkpoint_at: chrono::Utc::now(),
        attempt: 1,
        generation: 0,
        done: false,
        output: None,
        cost: None,
        files: Default::default(),
    }
}

/// Save generations 1..=n, generation g holding iteration count 10 * g.
fn save_generations(store: &CheckpointStore, n: u64) {
    save_generations_from(store, 1, n);
}

/// The commit log's file in `incremental/` (hidden, listed by no store call).
const COMMIT_LOG: &str = ".commit-log";

/// The task's checkpoint file names on disk, sorted (the commit log left out).
fn files_on_disk(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root.join("incremental"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != COMMIT_LOG)
        .collect();
    names.sort();
    names
}

/// Cut the file at `key` in half, the way a damaged disk or a bad copy might.
fn corrupt(root: &Path, key: &str) {
    let path = root.join(key);
    let bytes = fs::read(&path).unwrap();
    fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
}

#[test]
fn history_lists_the_latest_and_the_kept_generations() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    save_generations(&store, 7);

    let history = store.history(TASK).unwrap();
    let rows: Vec<(u64, &str, Option<u64>)> = history
        .iter()
        .map(|info| (info.generation, info.key.as_str(), info.iteration_count))
        .collect();
    assert_eq!(
        rows,
        vec![
            (7, "incremental/t1.json.gz", Some(70)),
            (6, "incremental/t1.6.json.gz", Some(60)),
            (5, "incremental/t1.5.json.gz", Some(50)),
            (4, "incremental/t1.4.json.gz", Some(40)),
        ]
    );
    for info in &history {
        assert!(info.error.is_none() && info.bytes > 0 && info.last_checkpoint_at.is_some());
    }
    assert_eq!(
        files_on_disk(dir.path()),
        ["t1.4.json.gz", "t1.5.json.gz", "t1.6.json.gz", "t1.json.gz"]
    );

    for generation in 4..=7 {
        let cp = store.generation(TASK, generation).unwrap();
        assert_eq!(
            (cp.generation, cp.iteration_count),
            (generation, 10 * generation)
        );
    }
    let err = store.generation(TASK, 3).unwrap_err();
    assert!(
        matches!(err, StoreError::NoSuchGeneration { generation: 3, .. }),
        "{err}"
    );
}

#[test]
fn keep_generations_bounds_the_files_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path())
        .unwrap()
        .keep_generations(1);
    save_generations(&store, 5);
    assert_eq!(files_on_disk(dir.path()), ["t1.4.json.gz", "t1.json.gz"]);

    let none_kept = CheckpointStore::open(dir.path())
        .unwrap()
        .keep_generations(0);
    none_kept.save(&mut checkpoint(60)).unwrap();
    assert_eq!(files_on_disk(dir.path()), ["t1.4.json.gz", "t1.json.gz"]);
    assert_eq!(
        none_kept
            .latest(TASK)
            .unwrap()
            .unwrap()
            .checkpoint
            .generation,
        6
    );
}

#[test]
fn a_corrupt_latest_falls_back_to_the_previous_generation() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    save_generations(&store, 3);
    corrupt(dir.path(), "incremental/t1.json.gz");

    let loaded = store.latest(TASK).unwrap().unwrap();
    assert_eq!(loaded.key, "incremental/t1.2.json.gz");
    assert_eq!(loaded.checkpoint.generation, 2);
    assert_eq!(loaded.checkpoint.iteration_count, 20);
    assert_eq!(loaded.skipped.len(), 1);
    assert_eq!(loaded.skipped[0].0, "incremental/t1.json.gz");
    assert!(
        loaded.skipped[0].1.contains("gzip"),
        "{}",
        loaded.skipped[0].1
    );

    let history = store.history(TASK).unwrap();
    assert!(history[0].error.is_some() && history[0].iteration_count.is_none());

    // Every file damaged: an error naming the latest file, never "no checkpoint".
    corrupt(dir.path(), "incremental/t1.2.json.gz");
    corrupt(dir.path(), "incremental/t1.1.json.gz");
    let err = store.latest(TASK).unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { key, .. } if key == "incremental/t1.json.gz"),
        "{err}"
    );
    assert!(err.to_string().contains("incremental/t1.json.gz"), "{err}");
}

#[test]
fn generation_numbers_are_never_reused_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    save_generations(&CheckpointStore::open(dir.path()).unwrap(), 3);

    // Intact files: a fresh store continues the numbering.
    let fresh = CheckpointStore::open(dir.path()).unwrap();
    assert_eq!(fresh.save(&mut checkpoint(40)).unwrap(), 4);

    // The latest (generation 4) is corrupt: its number cannot be read from it, so the next
    // save must still pick a number above it and keep the damaged file rather than overwrite
    // a good older generation.
    corrupt(dir.path(), "incremental/t1.json.gz");
    let fresh = CheckpointStore::open(dir.path()).unwrap();
    let generation = fresh.save(&mut checkpoint(50)).unwrap();
    assert!(generation > 4, "generation {generation} reused");
    let history = fresh.history(TASK).unwrap();
    let numbers: Vec<u64> = history.iter().map(|info| info.generation).collect();
    assert_eq!(numbers, vec![generation, 4, 3, 2]);
    assert!(
        history[1].error.is_some(),
        "the damaged file is kept as generation 4"
    );
    assert_eq!(fresh.generation(TASK, 3).unwrap().iteration_count, 30);

    // And once more from a fresh store, now that the damaged file is an older generation.
    let fresh = CheckpointStore::open(dir.path()).unwrap();
    assert_eq!(fresh.save(&mut checkpoint(60)).unwrap(), generation + 1);
}

#[test]
fn store_types_can_move_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CheckpointStore>();
    assert_send_sync::<LoopCheckpointer>();
    assert_send_sync::<FaultyFileOps>();
    assert_send_sync::<StoreError>();
}

#[test]
fn clones_share_the_generation_numbering() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let clone = store.clone();
    assert_eq!(store.save(&mut checkpoint(1)).unwrap(), 1);
    assert_eq!(clone.save(&mut checkpoint(2)).unwrap(), 2);
    assert_eq!(store.save(&mut checkpoint(3)).unwrap(), 3);
}

#[test]
fn delete_removes_every_file_of_the_task_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    save_generations(&store, 3);
    let mut other = checkpoint(1);
    other.task_id = "t1.a".into();
    store.save(&mut other).unwrap();

    store.delete(TASK).unwrap();
    assert_eq!(files_on_disk(dir.path()), ["t1.a.json.gz"]);
    assert!(store.latest(TASK).unwrap().is_none());
    assert!(store.history(TASK).unwrap().is_empty());
    // Deleting what is not there is fine, and numbering starts over.
    store.delete(TASK).unwrap();
    assert_eq!(store.save(&mut checkpoint(1)).unwrap(), 1);
}

#[test]
fn errors_name_the_file_and_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let ops = Arc::new(FaultyFileOps::fail_at(0, FaultMode::Error));
    let store = CheckpointStore::with_storage(Arc::new(FileStorage::with_ops(dir.path(), ops)));
    let err = store.save(&mut checkpoint(1)).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("writing incremental/t1.json.gz: No space left on device"),
        "{err}"
    );

    let mut bad = checkpoint(1);
    bad.task_id = "../escape".into();
    let err = store.save(&mut bad).unwrap_err();
    assert!(matches!(err, StoreError::InvalidTaskId { .. }), "{err}");
    // A hand-made file with the largest generation number: an error, not an overflow.
    let real = CheckpointStore::open(dir.path()).unwrap();
    real.save(&mut checkpoint(1)).unwrap();
    fs::copy(
        dir.path().join("incremental/t1.json.gz"),
        dir.path()
            .join(format!("incremental/t1.{}.json.gz", u64::MAX)),
    )
    .unwrap();
    let fresh = CheckpointStore::open(dir.path()).unwrap();
    let err = fresh.save(&mut checkpoint(2)).unwrap_err();
    assert!(err.to_string().contains("exhausted"), "{err}");
    assert_eq!(
        fresh
            .latest(TASK)
            .unwrap()
            .unwrap()
            .checkpoint
            .iteration_count,
        1
    );

    assert!(matches!(
        store.latest("t.12"),
        Err(StoreError::InvalidTaskId { .. })
    ));
}

#[test]
fn the_loop_helper_writes_every_n_and_flushes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let latest_count = || {
        let fresh = CheckpointStore::open(dir.path()).unwrap();
        fresh
            .latest(TASK)
            .unwrap()
            .map(|loaded| loaded.checkpoint.iteration_count)
    };

    let mut checkpointer = LoopCheckpointer::new(store.clone(), TASK, "sum").every(3);
    assert!(checkpointer.resume::<u64>().unwrap().is_none());
    let mut written = Vec::new();
    for n in 1..=7u64 {
        if checkpointer.checkpoint(n, &(n * 100)).unwrap() {
            written.push(n);
        }
    }
    assert_eq!(written, vec![3, 6]);
    assert_eq!(latest_count(), Some(6));
    assert_eq!(checkpointer.last_committed(), Some(6));

    checkpointer.flush().unwrap();
    assert_eq!(latest_count(), Some(7));
    let generations = store.history(TASK).unwrap().len();
    checkpointer.flush().unwrap();
    assert_eq!(
        store.history(TASK).unwrap().len(),
        generations,
        "flush is idempotent"
    );
    drop(checkpointer);

    // A new run resumes after iteration 7; dropping it mid-way commits iteration 8.
    let mut checkpointer = LoopCheckpointer::new(store.clone(), TASK, "sum").every(3);
    assert_eq!(checkpointer.resume::<u64>().unwrap(), Some((7, 700)));
    assert_eq!(checkpointer.last_committed(), Some(7));
    assert!(!checkpointer.checkpoint(8, &800u64).unwrap());
    assert_eq!(latest_count(), Some(7));
    drop(checkpointer);
    assert_eq!(latest_count(), Some(8));

    let mut checkpointer = LoopCheckpointer::new(store.clone(), TASK, "sum").every(3);
    let cp = checkpointer.resume_checkpoint().unwrap().unwrap();
    assert_eq!((cp.iteration_count, cp.checkpoint_interval), (8, 3));
    assert_eq!(cp.partial_results, serde_json::json!(800));
    checkpointer
        .finish(9, &900u64, Some(serde_json::json!({ "sum": 900 })))
        .unwrap();
    let cp = checkpointer.resume_checkpoint().unwrap().unwrap();
    assert!(cp.done);
    assert_eq!(cp.output, Some(serde_json::json!({ "sum": 900 })));
}

#[test]
fn the_loop_helper_ignores_other_loops_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let mut first = LoopCheckpointer::new(store.clone(), TASK, "loop").phase("gather", 0);
    first.checkpoint(5, &"state").unwrap();

    let mut other_phase = LoopCheckpointer::new(store.clone(), TASK, "loop").phase("gather", 1);
    assert!(other_phase.resume::<String>().unwrap().is_none());
    let mut other_scope = LoopCheckpointer::new(store.clone(), TASK, "inner").phase("gather", 0);
    assert!(other_scope.resume::<String>().unwrap().is_none());

    let mut same = LoopCheckpointer::new(store.clone(), TASK, "loop")
        .phase("gather", 0)
        .attempt(2);
    assert_eq!(
        same.resume::<String>().unwrap(),
        Some((5, "state".to_owned()))
    );
    // A state of the wrong shape is a clear error, not a panic or a silent restart.
    let err = same.resume::<Vec<u64>>().unwrap_err();
    assert!(matches!(err, StoreError::State(_)), "{err}");
}

#[test]
fn a_retired_generation_file_is_reused_but_never_one_with_another_name() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    save_generations(&store, 4);
    let incremental = dir.path().join("incremental");
    // Saving generation 5 retires generation 1: its inode becomes the new latest file.
    let retired_inode = fs::metadata(incremental.join("t1.1.json.gz"))
        .unwrap()
        .ino();
    save_generations_from(&store, 5, 5);
    assert_eq!(
        fs::metadata(incremental.join("t1.json.gz")).unwrap().ino(),
        retired_inode
    );
    assert_eq!(
        files_on_disk(dir.path()),
        vec!["t1.2.json.gz", "t1.3.json.gz", "t1.4.json.gz", "t1.json.gz"]
    );

    // A retired file that has a second name (someone's backup link) is removed, not
    // overwritten: the backup keeps its bytes.
    let backup = dir.path().join("backup.json.gz");
    fs::hard_link(incremental.join("t1.2.json.gz"), &backup).unwrap();
    let backed_up = fs::read(&backup).unwrap();
    save_generations_from(&store, 6, 6);
    assert_eq!(fs::read(&backup).unwrap(), backed_up);
    assert_eq!(
        files_on_disk(dir.path()),
        vec!["t1.3.json.gz", "t1.4.json.gz", "t1.5.json.gz", "t1.json.gz"]
    );
    assert_eq!(
        store.latest(TASK).unwrap().unwrap().checkpoint.generation,
        6
    );
}

#[test]
fn an_older_file_holding_a_later_generation_is_not_that_generation() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    save_generations(&store, 3);
    // What a power cut during a reuse can leave: the old name still there, holding the new
    // checkpoint (here generation 3's bytes under generation 1's name).
    let incremental = dir.path().join("incremental");
    fs::copy(
        incremental.join("t1.json.gz"),
        incremental.join("t1.1.json.gz"),
    )
    .unwrap();
    let err = store.generation(TASK, 1).unwrap_err();
    assert!(
        err.to_string()
            .contains("named generation 1 but holds generation 3"),
        "{err}"
    );
    let history = store.history(TASK).unwrap();
    let oldest = history.iter().find(|info| info.generation == 1).unwrap();
    assert!(
        oldest.error.as_deref().unwrap().contains("interrupted"),
        "{oldest:?}"
    );
    // As a fallback it is skipped too: with the newer files damaged, nothing decodes.
    corrupt(dir.path(), "incremental/t1.json.gz");
    corrupt(dir.path(), "incremental/t1.2.json.gz");
    assert!(store.latest(TASK).is_err());
}

/// Save generations `from..=to` (iteration count 10 * generation).
fn save_generations_from(store: &CheckpointStore, from: u64, to: u64) {
    for generation in from..=to {
        assert_eq!(
            store.save(&mut checkpoint(10 * generation)).unwrap(),
            generation
        );
    }
}

#[test]
fn a_reused_file_longer_than_the_new_checkpoint_is_cut_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    // Generations 1..=4 carry a large state (random text does not compress).
    let mut rng = fastrand::Rng::with_seed(1);
    for generation in 1..=4u64 {
        let mut big = checkpoint(generation);
        let noise: String = std::iter::repeat_with(|| rng.alphanumeric())
            .take(50_000)
            .collect();
        big.partial_results = serde_json::json!({ "noise": noise });
        assert_eq!(store.save(&mut big).unwrap(), generation);
    }
    let big_len = fs::metadata(dir.path().join("incremental/t1.1.json.gz"))
        .unwrap()
        .len();
    // Generation 5 is small and is written into generation 1's file.
    let mut small = checkpoint(5);
    assert_eq!(store.save(&mut small).unwrap(), 5);
    let latest = dir.path().join("incremental/t1.json.gz");
    assert!(fs::metadata(&latest).unwrap().len() < big_len / 10);
    let loaded = CheckpointStore::open(dir.path())
        .unwrap()
        .latest(TASK)
        .unwrap()
        .unwrap();
    assert!(loaded.skipped.is_empty(), "{:?}", loaded.skipped);
    assert_eq!(loaded.checkpoint.partial_results, small.partial_results);
}

/// Real file operations until [`Killable::kill`]; from then on every call fails without
/// running, as if the process had died.
#[derive(Debug, Default)]
struct Killable {
    dead: AtomicBool,
}

impl Killable {
    fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    fn alive(&self) -> io::Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(io::Error::other("the process was killed"));
        }
        Ok(())
    }
}

impl FileOps for Killable {
    fn create_temp(&self, dir: &Path, target_name: &str) -> io::Result<TempFile> {
        self.alive()?;
        RealFileOps.create_temp(dir, target_name)
    }

    fn reuse_as_temp(&self, old: &Path, dir: &Path, name: &str) -> io::Result<Option<TempFile>> {
        self.alive()?;
        RealFileOps.reuse_as_temp(old, dir, name)
    }

    fn write_all(&self, temp: &mut TempFile, bytes: &[u8]) -> io::Result<()> {
        self.alive()?;
        RealFileOps.write_all(temp, bytes)
    }

    fn sync_file(&self, temp: &mut TempFile) -> io::Result<()> {
        self.alive()?;
        RealFileOps.sync_file(temp)
    }

    fn hard_link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        self.alive()?;
        RealFileOps.hard_link(existing, new)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.alive()?;
        RealFileOps.rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.alive()?;
        RealFileOps.sync_dir(dir)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.alive()?;
        RealFileOps.remove_file(path)
    }

    fn open_log(&self, path: &Path) -> io::Result<fs::File> {
        self.alive()?;
        RealFileOps.open_log(path)
    }

    fn append_log(&self, log: &fs::File, at: u64, bytes: &[u8]) -> io::Result<()> {
        self.alive()?;
        RealFileOps.append_log(log, at, bytes)
    }

    fn sync_log(&self, log: &fs::File) -> io::Result<()> {
        self.alive()?;
        RealFileOps.sync_log(log)
    }

    fn truncate_log(&self, log: &fs::File, len: u64) -> io::Result<()> {
        self.alive()?;
        RealFileOps.truncate_log(log, len)
    }

    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        self.alive()?;
        RealFileOps.sync_fs(dir)
    }
}

/// Open a store on `root` through its commit log, run `work`, and die right after: the store
/// cannot close cleanly, so the log keeps what `work` saved.
fn killed_after(root: &Path, work: impl Fn(&CheckpointStore)) {
    let ops = Arc::new(Killable::default());
    let storage = FileStorage::with_ops(root, Arc::clone(&ops) as _)
        .with_commit_log("incremental")
        .unwrap();
    let store = CheckpointStore::with_storage(Arc::new(storage));
    work(&store);
    ops.kill();
}

#[test]
fn a_store_that_was_not_closed_is_restored_from_its_commit_log_when_opened_again() {
    let dir = tempfile::tempdir().unwrap();
    let incremental = dir.path().join("incremental");
    killed_after(dir.path(), |store| save_generations(store, 3));
    let log = incremental.join(COMMIT_LOG);
    assert!(
        fs::metadata(&log).unwrap().len() > 0,
        "the saves are logged"
    );
    let latest = fs::read(incremental.join("t1.json.gz")).unwrap();
    let kept = fs::read(incremental.join("t1.2.json.gz")).unwrap();
    // What a power cut could leave of files that were never fsynced.
    corrupt(dir.path(), "incremental/t1.json.gz");
    fs::remove_file(incremental.join("t1.2.json.gz")).unwrap();

    let store = CheckpointStore::open(dir.path()).unwrap();
    assert_eq!(fs::read(incremental.join("t1.json.gz")).unwrap(), latest);
    assert_eq!(fs::read(incremental.join("t1.2.json.gz")).unwrap(), kept);
    assert_eq!(
        fs::metadata(&log).unwrap().len(),
        0,
        "the replay cut the log"
    );
    let cp = store.latest(TASK).unwrap().unwrap().checkpoint;
    assert_eq!((cp.generation, cp.iteration_count), (3, 30));
    drop(store);

    // Written later without the log, then opened with it: the log left behind was replayed
    // before that write, not over it.
    killed_after(dir.path(), |store| save_generations_from(store, 4, 4));
    assert!(fs::metadata(&log).unwrap().len() > 0, "the save is logged");
    let plain = CheckpointStore::with_storage(Arc::new(FileStorage::new(dir.path())));
    save_generations_from(&plain, 5, 5);
    drop(plain);
    let store = CheckpointStore::open(dir.path()).unwrap();
    let cp = store.latest(TASK).unwrap().unwrap().checkpoint;
    assert_eq!((cp.generation, cp.iteration_count), (5, 50));
}

#[test]
fn a_second_process_writes_without_the_log_while_another_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let first = CheckpointStore::open(dir.path()).unwrap();
    save_generations(&first, 2);
    // The log's lock is per open file description: a second open in this process stands in
    // for a second process.
    let second = CheckpointStore::open(dir.path()).unwrap();
    let mut other = checkpoint(5);
    other.task_id = "t2".into();
    second.save(&mut other).unwrap();
    assert_eq!(
        second
            .latest("t2")
            .unwrap()
            .unwrap()
            .checkpoint
            .iteration_count,
        5
    );
    assert_eq!(
        first.latest(TASK).unwrap().unwrap().checkpoint.generation,
        2
    );
}
