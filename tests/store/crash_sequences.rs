//! Random sequences of checkpoint-store operations with a crash at a random step, in the style
//! of redb's crash fuzzing.
//!
//! Each case runs saves, latest reads, history and generation reads, deletes and work state
//! writes (entries put and removed as one group, the log compacted often) across three tasks (whose ids share a prefix, so one task's generation files look like another's) on a
//! `CheckpointStore` whose file operations go through [`PowerLossFileOps`]. Until the crash
//! every read must match a model of what was acknowledged, generations numbered and kept as
//! documented (the latest plus the newest `keep_generations` older ones). At the crash point the
//! process "dies": that file operation and every later one fail without running. Then the store
//! is recovered the way the daemon starts, twice: on the directory as the dead process left it
//! (a SIGKILL), and on the power-loss model's image of what a power cut at that moment leaves
//! (only what was fsynced). Recovery removes temp files and learns the generations on disk;
//! then, per task, the latest checkpoint must decode, be exactly a checkpoint that was saved,
//! and be the last acknowledged save or the one in flight (never older, never missing), unless
//! a delete was in flight or not yet made durable; a save after recovery must take a
//! generation above every file on disk and keep the recovered latest under its own number; the
//! work state, as the daemon and the CLI read it, must be the last acknowledged write's or the
//! one in flight's, whole.
//!
//! The default case count keeps this at a few seconds; for a soak run, `PROPTEST_CASES`
//! replaces it:
//!
//! ```text
//! PROPTEST_CASES=5000 cargo test --release --test store crash_sequences
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::temp_files::temp_files;
use cairn::store::current_work::ActiveTask;
use cairn::store::work_log::{self, WorkLog};
use cairn::store::{
    CheckpointStore, CommitPath, FileOps, FileStorage, IterationCheckpoint, PowerLossFileOps,
    Storage, StoreError, TempFile, FORMAT_VERSION,
};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

/// Cases run by default; each is a fresh queue with up to [`MAX_OPS`] operations.
const DEFAULT_CASES: u32 = 32;

/// The longest operation sequence.
const MAX_OPS: usize = 30;

/// The tasks: ids sharing a prefix, one with a dot, so file names of one resemble another's.
const TASKS: [&str; 3] = ["t", "t.x", "t-1"];

/// One operation on the store.
#[derive(Debug, Clone)]
enum Op {
    /// Save a checkpoint of the task whose state carries `pad` bytes of padding (varying sizes
    /// make reused files shrink and grow).
    Save { task: usize, pad: usize },
    /// Read the latest checkpoint.
    Latest { task: usize },
    /// List the generations on disk.
    History { task: usize },
    /// Read one generation, counted back from the latest (0: the latest; beyond the kept
    /// window: one that must not be there).
    Generation { task: usize, back: u64 },
    /// Remove every checkpoint file of the task.
    Delete { task: usize },
    /// One write of the work state: the entries of the tasks in `put` (a bit per task) with a
    /// new value, and the removal of those in `remove` (and not in `put`), as one group.
    Work { put: u8, remove: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    let task = 0..TASKS.len();
    prop_oneof![
        6 => (task.clone(), 0..3000usize).prop_map(|(task, pad)| Op::Save { task, pad }),
        2 => task.clone().prop_map(|task| Op::Latest { task }),
        2 => task.clone().prop_map(|task| Op::History { task }),
        1 => (task.clone(), 0..6u64).prop_map(|(task, back)| Op::Generation { task, back }),
        1 => task.prop_map(|task| Op::Delete { task }),
        4 => (0..8u8, 0..8u8).prop_map(|(put, remove)| Op::Work { put, remove: remove & !put }),
    ]
}

/// `DEFAULT_CASES`, or `PROPTEST_CASES` when set (for a soak run).
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_crash_at_any_step_of_any_sequence_keeps_the_acknowledged_checkpoints(
        keep in 0..=3usize,
        ops in prop::collection::vec(op(), 1..MAX_OPS),
        crash_at in any::<Index>(),
    ) {
        let steps: usize = ops.iter().map(Op::estimated_steps).sum();
        run_case(keep, &ops, crash_at.index(steps + 1) as u64, Commit::Replace);
    }

    /// The same through the commit log (one fdatasync per save), with a log small enough to
    /// be checkpointed and cut mid-sequence, or large enough never to be; after a power cut,
    /// also with the log's unsynced appends torn in half.
    #[test]
    fn a_crash_at_any_step_of_any_sequence_keeps_the_acknowledged_checkpoints_through_the_log(
        keep in 0..=3usize,
        ops in prop::collection::vec(op(), 1..MAX_OPS),
        crash_at in any::<Index>(),
        limit in prop_oneof![Just(2_000u64), Just(20_000), Just(32 << 20)],
    ) {
        let steps: usize = ops.iter().map(Op::estimated_steps).sum::<usize>() + 4;
        run_case(keep, &ops, crash_at.index(steps + 1) as u64, Commit::Log { limit });
    }
}

/// How the store under test commits its saves.
#[derive(Debug, Clone, Copy)]
enum Commit {
    /// The atomic replace alone (temp file fsync, rename, directory fsync).
    Replace,
    /// Through the commit log, checkpointed past `limit` bytes.
    Log { limit: u64 },
}

impl Op {
    /// About how many file operations it makes, so that the crash point falls inside the
    /// sequence mostly, and after its end sometimes (when the estimate is high).
    fn estimated_steps(&self) -> usize {
        match self {
            Op::Save { .. } => 6,
            Op::Delete { .. } => 3,
            // An append (write, fsync); now and then a compaction (two replaces).
            Op::Work { .. } => 4,
            _ => 0,
        }
    }
}

/// One save as the model knows it.
#[derive(Debug, Clone)]
struct SaveRecord {
    task: usize,
    /// The generation the store gives it (numbering restarts after a delete).
    generation: u64,
    /// The state saved.
    state: Value,
}

/// What the store must show of one task.
#[derive(Debug, Default)]
struct TaskModel {
    /// The acknowledged saves since the last acknowledged delete, oldest first.
    live: Vec<u64>,
    /// A save started but not acknowledged when the process died.
    save_in_flight: Option<u64>,
    /// A delete started but not finished when the process died.
    delete_in_flight: bool,
    /// A delete returned, and no save of the task has synced its directory since: a power cut
    /// may bring back what it removed (removals are not made durable on their own).
    delete_not_durable: bool,
}

/// The whole run's model: every save by its sequence number (which is also its iteration
/// count), and each task's view.
#[derive(Debug, Default)]
struct Model {
    saves: HashMap<u64, SaveRecord>,
    tasks: [TaskModel; TASKS.len()],
    next_seq: u64,
    /// The work state as last acknowledged: each task's entry by its value (`iterations`).
    work: BTreeMap<usize, u64>,
    /// The work state the write in flight at the crash would have made.
    work_in_flight: Option<BTreeMap<usize, u64>>,
}

impl Model {
    /// The generation the next save of `task` gets.
    fn next_generation(&self, task: usize) -> u64 {
        self.tasks[task]
            .live
            .last()
            .map_or(1, |seq| self.saves[seq].generation + 1)
    }

    /// The task's files while nothing has crashed, newest first, as `(generation, seq)`: the
    /// latest and the `keep` generations before it.
    fn kept(&self, task: usize, keep: usize) -> Vec<(u64, u64)> {
        let live = &self.tasks[task].live;
        live.iter()
            .rev()
            .take(keep + 1)
            .map(|seq| (self.saves[seq].generation, *seq))
            .collect()
    }

    /// Whether recovery may find `found` (a save's sequence number, or nothing) as the latest
    /// checkpoint of `task`: the last acknowledged save or the one in flight; while a delete
    /// is in flight or not yet durable, also nothing or any earlier save of the task.
    fn latest_allowed(&self, task: usize, found: Option<u64>) -> bool {
        let view = &self.tasks[task];
        let deleting = view.delete_in_flight || view.delete_not_durable;
        found == view.live.last().copied()
            || (found.is_some() && found == view.save_in_flight)
            || (deleting && found.is_none_or(|seq| self.saves[&seq].task == task))
    }
}

/// A checkpoint of `task` carrying `state`, numbered `seq` (its iteration count).
fn checkpoint(task: usize, seq: u64, state: Value) -> IterationCheckpoint {
    IterationCheckpoint {
        format_version: FORMAT_VERSION,
        task_id: TASKS[task].into(),
        phase: "loop".into(),
        phase_index: 0,
        scope: "loop".into(),
        iteration_count: seq,
        checkpoint_interval: 1,
        partial_results: state,
        last_checkpoint_at: chrono::Utc::now(),
        attempt: 1,
        generation: 0,
        done: false,
        output: None,
        cost: None,
        files: Default::default(),
    }
}

/// The power-loss model's file operations, with the process dying before call `crash_at`:
/// the power-cut image is taken then, and that call and every later one fail without running.
#[derive(Debug)]
struct CrashingOps {
    model: PowerLossFileOps,
    crash_at: u64,
    steps: AtomicU64,
    crashed: AtomicBool,
    /// Where the power-cut image goes.
    image: PathBuf,
    /// Where the power-cut image with torn log tails goes.
    torn_image: PathBuf,
}

impl CrashingOps {
    fn crashed(&self) -> bool {
        self.crashed.load(Ordering::SeqCst)
    }

    /// Die now (if not dead yet): cut the power, keeping the image of what survives.
    fn crash_now(&self) {
        if !self.crashed.swap(true, Ordering::SeqCst) {
            self.model.crash_image(&self.image).unwrap();
            self.model.torn_image(&self.torn_image).unwrap();
        }
    }

    /// Count the call; fail it if the process is dead, or dies here.
    fn step(&self, name: &str) -> io::Result<()> {
        if self.steps.fetch_add(1, Ordering::SeqCst) == self.crash_at {
            self.crash_now();
        }
        if self.crashed() {
            return Err(io::Error::other(format!(
                "simulated crash: {name} never ran"
            )));
        }
        Ok(())
    }
}

impl FileOps for CrashingOps {
    fn create_temp(&self, dir: &Path, target_name: &str) -> io::Result<TempFile> {
        self.step("create_temp")?;
        self.model.create_temp(dir, target_name)
    }

    fn reuse_as_temp(
        &self,
        old: &Path,
        dir: &Path,
        target_name: &str,
    ) -> io::Result<Option<TempFile>> {
        self.step("reuse_as_temp")?;
        self.model.reuse_as_temp(old, dir, target_name)
    }

    fn write_all(&self, temp: &mut TempFile, bytes: &[u8]) -> io::Result<()> {
        self.step("write_all")?;
        self.model.write_all(temp, bytes)
    }

    fn sync_file(&self, temp: &mut TempFile) -> io::Result<()> {
        self.step("sync_file")?;
        self.model.sync_file(temp)
    }

    fn hard_link(&self, existing: &Path, new: &Path) -> io::Result<()> {
        self.step("hard_link")?;
        self.model.hard_link(existing, new)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.step("rename")?;
        self.model.rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.step("sync_dir")?;
        self.model.sync_dir(dir)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.step("remove_file")?;
        self.model.remove_file(path)
    }

    fn open_log(&self, path: &Path) -> io::Result<fs::File> {
        self.step("open_log")?;
        self.model.open_log(path)
    }

    fn append_log(&self, log: &fs::File, at: u64, bytes: &[u8]) -> io::Result<()> {
        self.step("append_log")?;
        self.model.append_log(log, at, bytes)
    }

    fn sync_log(&self, log: &fs::File) -> io::Result<()> {
        self.step("sync_log")?;
        self.model.sync_log(log)
    }

    fn truncate_log(&self, log: &fs::File, len: u64) -> io::Result<()> {
        self.step("truncate_log")?;
        self.model.truncate_log(log, len)
    }

    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        self.step("sync_fs")?;
        self.model.sync_fs(dir)
    }
}

/// A store on `root` whose file operations are `ops`, committing as `commit` says; `None`
/// when the process died while opening it.
fn open_store(
    root: &Path,
    ops: Arc<dyn FileOps>,
    keep: usize,
    commit: Commit,
) -> Option<CheckpointStore> {
    let storage = FileStorage::with_ops(root, ops);
    let storage = match commit {
        Commit::Replace => storage,
        Commit::Log { limit } => storage
            .with_small_commit_log(CheckpointStore::DIR, limit)
            .ok()?,
    };
    Some(CheckpointStore::with_storage(Arc::new(storage)).keep_generations(keep))
}

/// Run `ops` until the crash (or to their end, then cut the power), then recover twice: on
/// the directory the dead process left, and on the power-cut image.
fn run_case(keep: usize, ops: &[Op], crash_at: u64, commit: Commit) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("queue");
    fs::create_dir(&root).unwrap();
    let crashing = Arc::new(CrashingOps {
        model: PowerLossFileOps::new(&root).unwrap(),
        crash_at,
        steps: AtomicU64::new(0),
        crashed: AtomicBool::new(false),
        image: dir.path().join("power-cut"),
        torn_image: dir.path().join("power-cut-torn"),
    });
    let mut model = Model {
        next_seq: 1,
        ..Model::default()
    };
    let ops_of_store = Arc::clone(&crashing) as Arc<dyn FileOps>;
    let store = open_store(&root, ops_of_store, keep, commit);
    // The work state beside it, on the same file operations; compacted often (once the log is
    // larger than the snapshot), so crashes cut compactions.
    let work = WorkLog::new(Arc::new(FileStorage::with_ops(
        &root,
        Arc::clone(&crashing) as Arc<dyn FileOps>,
    )))
    .compact_at(0);
    work.load().unwrap();
    if let Some(store) = &store {
        for op in ops {
            match *op {
                Op::Work { put, remove } => write_work(&work, put, remove, &mut model, &crashing),
                _ => apply(op, store, &mut model, keep, &crashing),
            }
            if crashing.crashed() {
                break;
            }
        }
    }
    // Dead before the store is dropped: a store closed cleanly cuts its log.
    crashing.crash_now();
    drop((store, work));
    recover(&crashing.image, &model, keep, commit, "after a power cut");
    if let Commit::Log { .. } = commit {
        recover(
            &crashing.torn_image,
            &model,
            keep,
            commit,
            "after a power cut that tore the log's tail",
        );
    }
    recover(&root, &model, keep, commit, "after the process died");
}

/// Run one operation and check it against the model (or, if the process died during it,
/// record it as in flight).
fn apply(op: &Op, store: &CheckpointStore, model: &mut Model, keep: usize, ops: &CrashingOps) {
    match *op {
        Op::Save { task, pad } => {
            let seq = model.next_seq;
            model.next_seq += 1;
            let state = json!({ "seq": seq, "pad": "x".repeat(pad) });
            let generation = model.next_generation(task);
            let record = SaveRecord {
                task,
                generation,
                state: state.clone(),
            };
            model.saves.insert(seq, record);
            match store.save(&mut checkpoint(task, seq, state)) {
                Ok(saved) => {
                    assert_eq!(saved, generation, "generation of save {seq} of {op:?}");
                    let view = &mut model.tasks[task];
                    view.live.push(seq);
                    view.delete_not_durable = false;
                }
                Err(err) => {
                    assert!(ops.crashed(), "{op:?} failed without a crash: {err}");
                    model.tasks[task].save_in_flight = Some(seq);
                }
            }
        }
        Op::Delete { task } => match store.delete(TASKS[task]) {
            Ok(()) => {
                let view = &mut model.tasks[task];
                view.live.clear();
                view.delete_not_durable = true;
            }
            Err(err) => {
                assert!(ops.crashed(), "{op:?} failed without a crash: {err}");
                model.tasks[task].delete_in_flight = true;
            }
        },
        Op::Latest { task } => check_latest(store, model, task),
        Op::History { task } => check_history(store, model, task, keep),
        Op::Generation { task, back } => check_generation(store, model, task, keep, back),
        Op::Work { .. } => unreachable!("work state writes go through write_work"),
    }
}

/// The work state entry of `task` carrying `value` (as its iteration count).
fn work_entry(task: usize, value: u64) -> ActiveTask {
    let mut entry = ActiveTask::new(&TASKS[task].parse().unwrap(), "loop");
    entry.iterations = value;
    entry
}

/// One work state write of the tasks whose bits are in `put` (a new value each) and `remove`.
fn write_work(work: &WorkLog, put: u8, remove: u8, model: &mut Model, ops: &CrashingOps) {
    let mut after = model.work.clone();
    let mut changed = Vec::new();
    let mut removed = Vec::new();
    for (task, id) in TASKS.iter().enumerate() {
        if put & (1 << task) != 0 {
            let value = model.next_seq;
            model.next_seq += 1;
            after.insert(task, value);
            changed.push(work_entry(task, value));
        } else if remove & (1 << task) != 0 {
            after.remove(&task);
            removed.push(id.parse().unwrap());
        }
    }
    match work.write(&changed, &removed) {
        Ok(()) => model.work = after,
        Err(err) => {
            assert!(ops.crashed(), "a work write failed without a crash: {err}");
            model.work_in_flight = Some(after);
        }
    }
}

/// The work state at `root` as the daemon (`WorkLog::load`) and the CLI (`work_log::read`)
/// read it, by task index and value; they agree.
fn read_work(root: &Path, when: &str) -> BTreeMap<usize, u64> {
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::new(root));
    let loaded = WorkLog::new(storage)
        .load()
        .unwrap_or_else(|err| panic!("{when}: the work state is unusable: {err}"));
    let by_cli = work_log::read(|key| match fs::read(root.join(key)) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    })
    .unwrap_or_else(|err| panic!("{when}: the CLI cannot read the work state: {err}"));
    assert_eq!(
        loaded.active_tasks, by_cli.work.active_tasks,
        "{when}: the daemon and the CLI disagree"
    );
    loaded
        .active_tasks
        .iter()
        .map(|entry| {
            let task = TASKS.iter().position(|id| entry.task_id == *id).unwrap();
            (task, entry.iterations)
        })
        .collect()
}

/// The recovered work state is the last acknowledged one or the one the write in flight
/// made, whole (never a part of a write); a write after the restart is read back.
fn check_recovered_work(root: &Path, model: &Model, when: &str) {
    let found = read_work(root, when);
    assert!(
        found == model.work || Some(&found) == model.work_in_flight.as_ref(),
        "{when}: the work state {found:?} is neither the acknowledged {:?} nor the one in \
         flight {:?}",
        model.work,
        model.work_in_flight
    );
    let storage: Arc<dyn Storage> = Arc::new(FileStorage::new(root));
    let work = WorkLog::new(storage);
    work.load().unwrap();
    work.write(&[work_entry(0, u64::MAX)], &[]).unwrap();
    assert_eq!(read_work(root, when).get(&0), Some(&u64::MAX), "{when}");
}

/// The latest checkpoint is the last acknowledged save, read from the latest file.
fn check_latest(store: &CheckpointStore, model: &Model, task: usize) {
    let loaded = store.latest(TASKS[task]).unwrap();
    let expected = model.tasks[task].live.last();
    match (loaded, expected) {
        (None, None) => {}
        (Some(loaded), Some(seq)) => {
            assert!(loaded.skipped.is_empty(), "skipped {:?}", loaded.skipped);
            assert_is_save(&loaded.checkpoint, model, task);
            assert_eq!(loaded.checkpoint.iteration_count, *seq);
        }
        (loaded, expected) => panic!(
            "task {}: latest {:?}, expected save {expected:?}",
            TASKS[task],
            loaded.map(|loaded| loaded.checkpoint.iteration_count)
        ),
    }
}

/// The history lists the latest and the `keep` generations before it, each decoding to its
/// save.
fn check_history(store: &CheckpointStore, model: &Model, task: usize, keep: usize) {
    let history: Vec<(u64, Option<u64>, Option<String>)> = store
        .history(TASKS[task])
        .unwrap()
        .into_iter()
        .map(|info| (info.generation, info.iteration_count, info.error))
        .collect();
    let expected: Vec<(u64, Option<u64>, Option<String>)> = model
        .kept(task, keep)
        .into_iter()
        .map(|(generation, seq)| (generation, Some(seq), None))
        .collect();
    assert_eq!(history, expected, "history of task {}", TASKS[task]);
}

/// A generation `back` before the latest reads as its save when it is kept, and is refused as
/// missing otherwise (also one never written).
fn check_generation(store: &CheckpointStore, model: &Model, task: usize, keep: usize, back: u64) {
    let newest = model.next_generation(task) - 1;
    let generation = match newest.checked_sub(back) {
        Some(generation) if generation > 0 => generation,
        _ => newest + 1 + back,
    };
    let kept = model.kept(task, keep);
    let result = store.generation(TASKS[task], generation);
    match kept.iter().find(|(kept, _)| *kept == generation) {
        Some((_, seq)) => {
            let cp = result.unwrap();
            assert_is_save(&cp, model, task);
            assert_eq!(cp.iteration_count, *seq);
        }
        None => assert!(
            matches!(result, Err(StoreError::NoSuchGeneration { .. })),
            "task {} generation {generation} should be gone: {result:?}",
            TASKS[task]
        ),
    }
}

/// `cp` is exactly a save the model made for `task`, under that save's generation.
fn assert_is_save(cp: &IterationCheckpoint, model: &Model, task: usize) {
    let record = model
        .saves
        .get(&cp.iteration_count)
        .unwrap_or_else(|| panic!("checkpoint {} was never saved", cp.iteration_count));
    assert_eq!(record.task, task, "a checkpoint of another task");
    assert_eq!(cp.task_id, TASKS[task]);
    assert_eq!(
        cp.partial_results, record.state,
        "save {}",
        cp.iteration_count
    );
    assert_eq!(
        cp.generation, record.generation,
        "save {}",
        cp.iteration_count
    );
}

/// Start on `root` as the daemon does (replay the commit log, remove temp files, learn the
/// generations on disk), then check every task's latest checkpoint and a save after the
/// restart.
fn recover(root: &Path, model: &Model, keep: usize, commit: Commit, when: &str) {
    let path = match commit {
        Commit::Replace => CommitPath::Replace,
        Commit::Log { .. } => CommitPath::Log,
    };
    let storage = FileStorage::new(root)
        .with_commit_path(CheckpointStore::DIR, path)
        .unwrap_or_else(|err| panic!("{when}: replaying the commit log: {err}"));
    storage.remove_temp_files().unwrap();
    let left = temp_files(root);
    assert!(left.is_empty(), "{when}: temp files left: {left:?}");
    let store = CheckpointStore::with_storage(Arc::new(storage)).keep_generations(keep);
    store.learn_generations_on_disk(TASKS).unwrap();
    for task in 0..TASKS.len() {
        check_recovered(&store, model, task, keep, when);
    }
    check_recovered_work(root, model, when);
}

/// The recovered latest checkpoint of `task` is allowed by the model and is exactly a save;
/// a save now takes a generation above every file of the task and keeps that latest.
fn check_recovered(store: &CheckpointStore, model: &Model, task: usize, keep: usize, when: &str) {
    let id = TASKS[task];
    let found = match store.latest(id) {
        Ok(found) => found.map(|loaded| {
            assert!(
                loaded.skipped.is_empty(),
                "{when}: {id} skipped {:?}",
                loaded.skipped
            );
            loaded.checkpoint
        }),
        Err(err) => panic!("{when}: the latest checkpoint of {id} is unusable: {err}"),
    };
    if let Some(cp) = &found {
        assert_is_save(cp, model, task);
    }
    let found_seq = found.as_ref().map(|cp| cp.iteration_count);
    assert!(
        model.latest_allowed(task, found_seq),
        "{when}: task {id} recovered save {found_seq:?}; the model: {:?}",
        model.tasks[task]
    );

    let highest = store
        .history(id)
        .unwrap()
        .iter()
        .map(|info| info.generation)
        .max()
        .unwrap_or(0);
    let seq = u64::MAX - task as u64;
    let generation = store
        .save(&mut checkpoint(task, seq, json!({ "after": when })))
        .unwrap_or_else(|err| panic!("{when}: saving {id} after the restart: {err}"));
    assert!(
        generation > highest,
        "{when}: {id} saved as generation {generation}, not above {highest}"
    );
    let latest = store.latest(id).unwrap().unwrap().checkpoint;
    assert_eq!(
        (latest.iteration_count, latest.generation),
        (seq, generation)
    );
    if let (Some(cp), true) = (found, keep > 0) {
        let kept = store.generation(id, cp.generation).unwrap();
        assert_eq!(kept.iteration_count, cp.iteration_count, "{when}: {id}");
    }
}
