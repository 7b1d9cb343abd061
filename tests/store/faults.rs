//! Crash safety of checkpoint saves, and strictness of checkpoint decoding.
//!
//! The fault scenarios fail (or "crash") one save at each of its file-system steps in turn,
//! then look at the directory the way a restarted process would: the latest checkpoint must
//! decode to the last committed one (or to the new one, once the rename has happened), temp
//! files must be cleaned up, and the loop must be able to continue with a generation number
//! that was never used before.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use cairn::store::{
    decode_checkpoint, encode_checkpoint, CheckpointError, CheckpointStore, FaultMode,
    FaultyFileOps, FileStorage, IterationCheckpoint, LoopCheckpointer, Storage, StoreError,
    FORMAT_VERSION,
};
use serde::{Deserialize, Serialize};

const TASK: &str = "t1";
const SCOPE: &str = "sum";
const MODES: [FaultMode; 3] = [FaultMode::Error, FaultMode::Crash, FaultMode::TornWrite];

/// The loop state used throughout: a running sum and the numbers added so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SumState {
    total: u64,
    added: Vec<u64>,
}

/// The state after `iterations` iterations of the example loop (adding 1, 2, 3, ...).
fn state_after(iterations: u64) -> SumState {
    let added: Vec<u64> = (1..=iterations).collect();
    SumState {
        total: added.iter().sum(),
        added,
    }
}

/// A checkpoint of the example loop after `iterations` iterations.
fn checkpoint_after(iterations: u64) -> IterationCheckpoint {
    IterationCheckpoint {
        format_version: FORMAT_VERSION,
        task_id: TASK.into(),
        phase: SCOPE.into(),
        phase_index: 0,
        scope: SCOPE.into(),
        iteration_count: iterations,
        checkpoint_interval: 1,
        partial_results: serde_json::to_value(state_after(iterations)).unwrap(),
        last_checkpoint_at: chrono::Utc::now(),
        attempt: 1,
        generation: 0,
        done: false,
        output: None,
        cost: None,
        files: Default::default(),
    }
}

/// Commit `generations` checkpoints (iterations 1..=generations) with real file operations and
/// return the last one as read back.
fn commit_generations(root: &Path, generations: u64) -> IterationCheckpoint {
    let store = CheckpointStore::open(root).unwrap();
    for iterations in 1..=generations {
        let written = store.save(&mut checkpoint_after(iterations)).unwrap();
        assert_eq!(written, iterations);
    }
    let latest = store.latest(TASK).unwrap().unwrap();
    assert!(latest.skipped.is_empty());
    latest.checkpoint
}

/// A checkpoint store whose file operations go through `ops`.
fn faulty_store(root: &Path, ops: &Arc<FaultyFileOps>) -> CheckpointStore {
    let storage = FileStorage::with_ops(root, Arc::clone(ops) as _);
    CheckpointStore::with_storage(Arc::new(storage))
}

/// Every temp file under `root`, recursively.
fn temp_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            } else if entry.file_name().to_string_lossy().ends_with(".cairn.tmp") {
                found.push(entry.path());
            }
        }
    }
    found
}

/// The highest generation number of any checkpoint file of the task on disk.
fn highest_generation_on_disk(store: &CheckpointStore) -> u64 {
    store
        .history(TASK)
        .unwrap()
        .iter()
        .map(|info| info.generation)
        .max()
        .unwrap_or(0)
}

/// What a restarted process must be able to do after the fault: clean up, find `expected` as
/// the latest checkpoint, resume the loop from it and commit the next iteration under a fresh
/// generation number.
fn assert_restart_recovers(root: &Path, expected: Option<&IterationCheckpoint>, context: &str) {
    let storage = FileStorage::new(root);
    storage.remove_temp_files().unwrap();
    assert!(temp_files(root).is_empty(), "{context}: temp files remain");

    let store = CheckpointStore::open(root).unwrap();
    let latest = store.latest(TASK).unwrap();
    match expected {
        Some(expected) => {
            let latest = latest.unwrap_or_else(|| panic!("{context}: no checkpoint found"));
            assert_eq!(&latest.checkpoint, expected, "{context}");
            assert!(latest.skipped.is_empty(), "{context}: {:?}", latest.skipped);
        }
        None => assert!(latest.is_none(), "{context}: {latest:?}"),
    }

    let highest_before = highest_generation_on_disk(&store);
    let mut checkpointer = LoopCheckpointer::new(store.clone(), TASK, SCOPE);
    let resumed = checkpointer.resume::<SumState>().unwrap();
    let next = match expected {
        Some(expected) => {
            let (iterations, state) = resumed.unwrap();
            assert_eq!(iterations, expected.iteration_count, "{context}");
            assert_eq!(state, state_after(iterations), "{context}");
            iterations + 1
        }
        None => {
            assert!(resumed.is_none(), "{context}");
            1
        }
    };
    assert!(checkpointer.checkpoint(next, &state_after(next)).unwrap());
    let after = store.latest(TASK).unwrap().unwrap().checkpoint;
    assert_eq!(after.iteration_count, next, "{context}");
    assert!(
        after.generation > highest_before,
        "{context}: generation {} reused (highest on disk was {highest_before})",
        after.generation
    );
    assert_eq!(
        highest_generation_on_disk(&store),
        after.generation,
        "{context}"
    );
}

/// The file-system steps of a save that replaces an existing latest checkpoint and retires the
/// oldest kept generation, whose file it reuses as its temp file, in the order FileStorage
/// performs them.
const SAVE_STEPS: [&str; 6] = [
    "reuse_as_temp (the retired generation)",
    "write_all",
    "sync_file",
    "hard_link (keep previous)",
    "rename",
    "sync_dir",
];
const REUSE_STEP: u64 = 0;
const RENAME_STEP: u64 = 4;

#[test]
fn a_save_counts_the_expected_steps() {
    let dir = tempfile::tempdir().unwrap();
    commit_generations(dir.path(), 4);
    let ops = Arc::new(FaultyFileOps::new());
    let store = faulty_store(dir.path(), &ops);
    assert_eq!(store.save(&mut checkpoint_after(5)).unwrap(), 5);
    assert_eq!(ops.steps(), SAVE_STEPS.len() as u64);
    assert!(!ops.crashed());
    // Generation 1 was retired (its file became the new latest); generations 2..=4 are kept
    // besides the latest (5).
    let generations: Vec<u64> = store
        .history(TASK)
        .unwrap()
        .iter()
        .map(|i| i.generation)
        .collect();
    assert_eq!(generations, vec![5, 4, 3, 2]);
}

#[test]
fn a_fault_at_any_step_of_a_save_keeps_the_last_committed_checkpoint() {
    for mode in MODES {
        for step in 0..SAVE_STEPS.len() as u64 {
            let context = format!("{mode:?} at step {step} ({})", SAVE_STEPS[step as usize]);
            let dir = tempfile::tempdir().unwrap();
            let committed = commit_generations(dir.path(), 4);

            let ops = Arc::new(FaultyFileOps::fail_at(step, mode));
            let store = faulty_store(dir.path(), &ops);
            let mut new = checkpoint_after(5);
            let result = store.save(&mut new);

            // Until the directory sync has succeeded the save is not durable, so it must be
            // reported as failed, even though the rename may already have happened. Reusing
            // the retired file is only a saving: when it fails, a new temp file is made.
            if !(mode == FaultMode::Error && step == REUSE_STEP) {
                let err = result.expect_err(&context);
                assert!(
                    matches!(&err, StoreError::Io { key, .. } if key == "incremental/t1.json.gz"),
                    "{context}: {err}"
                );
            } else {
                assert_eq!(result.unwrap(), 5, "{context}");
            }
            assert_eq!(ops.crashed(), mode != FaultMode::Error, "{context}");

            // A crash between creating the temp file and the rename leaves the temp file
            // behind (the cleanup never ran); an Error is cleaned up by the save itself.
            let leftovers = temp_files(dir.path());
            let temp_expected = mode != FaultMode::Error && (1..=RENAME_STEP).contains(&step);
            assert_eq!(leftovers.len(), usize::from(temp_expected), "{context}");
            if mode == FaultMode::TornWrite && step == 1 {
                let full = encode_checkpoint(&new).unwrap().len() as u64;
                let torn = fs::metadata(&leftovers[0]).unwrap().len();
                assert_eq!(torn, full / 2, "{context}: the write was not torn");
            }

            let saved = step > RENAME_STEP || (mode == FaultMode::Error && step == REUSE_STEP);
            let expected = if saved { &new } else { &committed };
            assert_restart_recovers(dir.path(), Some(expected), &context);
        }
    }
}

/// The file-system steps of the same save through the commit log, after the store's opening.
const LOGGED_SAVE_STEPS: [&str; 6] = [
    "reuse_as_temp (the retired generation)",
    "write_all",
    "append_log",
    "sync_log",
    "hard_link (keep previous)",
    "rename",
];
const APPEND_STEP: u64 = 2;

/// A checkpoint store committing through its commit log, with file operations `ops`.
fn logged_store(root: &Path, ops: &Arc<FaultyFileOps>) -> CheckpointStore {
    let storage = FileStorage::with_ops(root, Arc::clone(ops) as _)
        .with_commit_log(CheckpointStore::DIR)
        .unwrap();
    CheckpointStore::with_storage(Arc::new(storage))
}

#[test]
fn a_fault_at_any_step_of_a_logged_save_keeps_the_last_committed_checkpoint() {
    let counted = {
        let counting = Arc::new(FaultyFileOps::new());
        let probe = tempfile::tempdir().unwrap();
        commit_generations(probe.path(), 4);
        let store = logged_store(probe.path(), &counting);
        let before = counting.steps();
        store.save(&mut checkpoint_after(5)).unwrap();
        counting.steps() - before
    };
    assert_eq!(counted, LOGGED_SAVE_STEPS.len() as u64);
    for mode in [FaultMode::IoError].into_iter().chain(MODES) {
        for step in 0..LOGGED_SAVE_STEPS.len() as u64 {
            let context = format!(
                "{mode:?} at step {step} ({}) through the log",
                LOGGED_SAVE_STEPS[step as usize]
            );
            let dir = tempfile::tempdir().unwrap();
            let committed = commit_generations(dir.path(), 4);
            // Counted before the probe closes (closing removes the log, as it was before).
            let open_steps = {
                let counting = Arc::new(FaultyFileOps::new());
                let probe = logged_store(dir.path(), &counting);
                let steps = counting.steps();
                drop(probe);
                steps
            };

            let ops = Arc::new(FaultyFileOps::fail_at(open_steps + step, mode));
            let store = logged_store(dir.path(), &ops);
            let mut new = checkpoint_after(5);
            let result = store.save(&mut new);
            // No room (ENOSPC) at any step: the save checkpoints the log and commits by the
            // atomic replace. A failed reuse of the retired file is only a saving lost.
            let succeeds =
                mode == FaultMode::Error || (mode == FaultMode::IoError && step == REUSE_STEP);
            if succeeds {
                assert_eq!(result.unwrap(), 5, "{context}");
            } else {
                let err = result.expect_err(&context);
                assert!(
                    matches!(&err, StoreError::Io { key, .. } if key == "incremental/t1.json.gz"),
                    "{context}: {err}"
                );
            }
            let dies = matches!(mode, FaultMode::Crash | FaultMode::TornWrite);
            assert_eq!(ops.crashed(), dies, "{context}");
            // Closed: after an error the log is checkpointed, so the failed save's record is
            // never replayed; a dead process closes nothing.
            drop(store);

            // A process that died after its record was wholly in the log comes back with the
            // save (the replay writes it); one that failed with an error does not.
            let saved = match mode {
                FaultMode::Error | FaultMode::IoError => succeeds,
                FaultMode::Crash | FaultMode::TornWrite => step > APPEND_STEP,
            };
            let expected = if saved { &new } else { &committed };
            assert_restart_recovers(dir.path(), Some(expected), &context);
        }
    }
}

#[test]
fn after_a_transient_error_the_same_store_saves_again() {
    // The store saves once successfully before the fault, so it has the generation cached:
    // the retry must not trust that cache after a failed save (the rename may have happened).
    let warm_up_steps = {
        let dir = tempfile::tempdir().unwrap();
        commit_generations(dir.path(), 3);
        let counting = Arc::new(FaultyFileOps::new());
        faulty_store(dir.path(), &counting)
            .save(&mut checkpoint_after(4))
            .unwrap();
        counting.steps()
    };
    for step in 0..SAVE_STEPS.len() as u64 {
        let context = format!("Error at step {step} ({})", SAVE_STEPS[step as usize]);
        let dir = tempfile::tempdir().unwrap();
        commit_generations(dir.path(), 3);
        let ops = Arc::new(FaultyFileOps::fail_at(
            warm_up_steps + step,
            FaultMode::Error,
        ));
        let store = faulty_store(dir.path(), &ops);
        assert_eq!(
            store.save(&mut checkpoint_after(4)).unwrap(),
            4,
            "{context}"
        );
        let first = store.save(&mut checkpoint_after(5));
        assert_eq!(first.is_ok(), step == REUSE_STEP, "{context}");
        let highest_before = highest_generation_on_disk(&store);

        let mut retry = checkpoint_after(5);
        let generation = store.save(&mut retry).expect(&context);
        assert!(
            generation > highest_before,
            "{context}: generation {generation} reused"
        );
        let generations: Vec<u64> = store
            .history(TASK)
            .unwrap()
            .iter()
            .map(|i| i.generation)
            .collect();
        let mut unique = generations.clone();
        unique.dedup();
        assert_eq!(
            generations, unique,
            "{context}: a generation number appears twice"
        );

        let fresh = CheckpointStore::open(dir.path()).unwrap();
        assert_eq!(
            fresh.latest(TASK).unwrap().unwrap().checkpoint,
            retry,
            "{context}"
        );
        assert!(temp_files(dir.path()).is_empty(), "{context}");
    }
}

#[test]
fn a_crashed_process_stays_dead() {
    let dir = tempfile::tempdir().unwrap();
    commit_generations(dir.path(), 2);
    let ops = Arc::new(FaultyFileOps::fail_at(2, FaultMode::Crash));
    let store = faulty_store(dir.path(), &ops);
    assert!(store.save(&mut checkpoint_after(3)).is_err());
    assert!(store.save(&mut checkpoint_after(3)).is_err());
    assert!(ops.crashed());
}

/// The steps of the very first save into an empty queue directory: the `incremental/`
/// directory is created (and its parent synced), and there is no previous latest to keep.
const FIRST_SAVE_STEPS: [&str; 7] = [
    "sync_dir (new incremental/)",
    "create_temp",
    "write_all",
    "sync_file",
    "hard_link (finds nothing to keep)",
    "rename",
    "sync_dir",
];
const FIRST_SAVE_RENAME_STEP: u64 = 5;

#[test]
fn a_fault_during_the_first_save_leaves_no_checkpoint_or_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let counting = Arc::new(FaultyFileOps::new());
    faulty_store(dir.path(), &counting)
        .save(&mut checkpoint_after(1))
        .unwrap();
    assert_eq!(counting.steps(), FIRST_SAVE_STEPS.len() as u64);

    for mode in MODES {
        for step in 0..FIRST_SAVE_STEPS.len() as u64 {
            let context = format!(
                "{mode:?} at step {step} ({})",
                FIRST_SAVE_STEPS[step as usize]
            );
            let dir = tempfile::tempdir().unwrap();
            let ops = Arc::new(FaultyFileOps::fail_at(step, mode));
            let mut new = checkpoint_after(1);
            let result = faulty_store(dir.path(), &ops).save(&mut new);
            assert!(result.is_err(), "{context}");
            let expected = (step > FIRST_SAVE_RENAME_STEP).then_some(&new);
            assert_restart_recovers(dir.path(), expected, &context);
        }
    }
}

// ---- decoding is strict: damage is an error, never a different checkpoint ----

/// A checkpoint with enough state that its compressed form has a real deflate body.
fn encoded_sample() -> (IterationCheckpoint, Vec<u8>) {
    let mut cp = checkpoint_after(40);
    cp.generation = 9;
    let bytes = encode_checkpoint(&cp).unwrap();
    (cp, bytes)
}

#[test]
fn every_truncation_is_an_error() {
    let (_, bytes) = encoded_sample();
    for len in 0..bytes.len() {
        let result = decode_checkpoint(&bytes[..len]);
        assert!(
            result.is_err(),
            "truncated to {len} of {} bytes decoded",
            bytes.len()
        );
    }
}

/// Bits no check covers, where damage cannot change the content, so decoding to the same
/// checkpoint is correct: the gzip header's FTEXT flag (byte 3), MTIME (4..8), XFL (8) and
/// OS (9), and the padding bits after the end-of-block code in the last deflate byte (the one
/// before the 8-byte CRC/length trailer).
fn unchecked_byte(index: usize, len: usize) -> bool {
    (3..=9).contains(&index) || index == len - 9
}

#[test]
fn every_bit_flip_is_an_error_or_harmless() {
    let (cp, bytes) = encoded_sample();
    let mut harmless = 0;
    for index in 0..bytes.len() {
        for bit in 0..8 {
            let mut damaged = bytes.clone();
            damaged[index] ^= 1 << bit;
            if let Ok(decoded) = decode_checkpoint(&damaged) {
                assert_eq!(
                    decoded, cp,
                    "flip of bit {bit} of byte {index} changed the content"
                );
                assert!(
                    unchecked_byte(index, bytes.len()),
                    "flip of bit {bit} of byte {index} of {} went unnoticed",
                    bytes.len()
                );
                harmless += 1;
            }
        }
    }
    // At most: 1 FTEXT bit, 6 unchecked header bytes, 7 padding bits of the last deflate byte.
    assert!(harmless <= 1 + 6 * 8 + 7, "{harmless} harmless flips");
}

#[test]
fn trailing_bytes_are_an_error() {
    let (_, bytes) = encoded_sample();
    let mut appended_member = bytes.clone();
    appended_member.extend_from_slice(&bytes);
    for tail in [&b"\0"[..], b"garbage", &[0u8; 512], &bytes] {
        let mut damaged = bytes.clone();
        damaged.extend_from_slice(tail);
        let err = decode_checkpoint(&damaged).unwrap_err();
        assert!(
            matches!(err, CheckpointError::TrailingBytes(n) if n == tail.len()),
            "{err}"
        );
    }
}

/// Gzip `json` the way cairn does, for hand-made documents.
fn gzip(json: &serde_json::Value) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(json.to_string().as_bytes()).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn another_format_version_is_reported_as_such() {
    let (cp, _) = encoded_sample();
    let mut newer = cp.clone();
    newer.format_version = FORMAT_VERSION + 1;
    let err = decode_checkpoint(&encode_checkpoint(&newer).unwrap()).unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnsupportedVersion { found, supported }
            if found == FORMAT_VERSION + 1 && supported == FORMAT_VERSION),
        "{err}"
    );

    // A newer format may add fields; the version is still what gets reported.
    let mut value = serde_json::to_value(&newer).unwrap();
    value["field_from_the_future"] = serde_json::json!(true);
    let err = decode_checkpoint(&gzip(&value)).unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnsupportedVersion { .. }),
        "{err}"
    );

    let mut missing = serde_json::to_value(&cp).unwrap();
    missing.as_object_mut().unwrap().remove("format_version");
    let err = decode_checkpoint(&gzip(&missing)).unwrap_err();
    assert!(matches!(err, CheckpointError::Json(_)), "{err}");
}

#[test]
fn a_checkpoint_of_another_task_at_the_latest_name_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    commit_generations(dir.path(), 3);
    let store = CheckpointStore::open(dir.path()).unwrap();
    let previous = store.generation(TASK, 2).unwrap();
    let mut foreign = checkpoint_after(99);
    foreign.task_id = "other".into();
    let foreign_bytes = encode_checkpoint(&foreign).unwrap();
    fs::write(dir.path().join("incremental/t1.json.gz"), foreign_bytes).unwrap();

    let loaded = store.latest(TASK).unwrap().unwrap();
    // The previous latest (generation 2) was kept as incremental/t1.2.json.gz.
    assert_eq!(loaded.key, "incremental/t1.2.json.gz");
    assert_eq!(loaded.checkpoint, previous);
    assert_eq!(loaded.checkpoint.generation, 2);
    assert_eq!(loaded.skipped.len(), 1);
    assert_eq!(loaded.skipped[0].0, "incremental/t1.json.gz");
    assert!(
        loaded.skipped[0].1.contains("\"other\""),
        "{}",
        loaded.skipped[0].1
    );
}
