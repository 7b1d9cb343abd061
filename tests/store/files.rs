//! Checkpoints that name files: committed only once each file is a durable blob, refused
//! (leaving the previous checkpoint in force) for a file that cannot be stored, restored
//! without following links, kept by each generation and by a fork, and collected when no
//! kept checkpoint names them.

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn::store::blobs::BlobStore;
use cairn::store::{CheckpointStore, IterationCheckpoint, LoopCheckpointer, StoreError};
use sha2::{Digest, Sha256};

const TASK: &str = "t1";

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A queue root with a store that keeps blobs, and a scratch directory.
struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    scratch: PathBuf,
    store: CheckpointStore,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("queue");
    let scratch = dir.path().join("scratch");
    fs::create_dir_all(&scratch).unwrap();
    let store = CheckpointStore::open(&root)
        .unwrap()
        .with_blobs(Arc::new(BlobStore::open(&root).unwrap()));
    Setup {
        _dir: dir,
        root,
        scratch,
        store,
    }
}

fn named(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(n, p)| (n.to_string(), p.to_string()))
        .collect()
}

fn checkpoint(iterations: u64) -> IterationCheckpoint {
    IterationCheckpoint {
        format_version: cairn::store::FORMAT_VERSION,
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

fn write(path: &Path, bytes: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
}

#[test]
fn a_checkpoint_records_each_files_name_hash_and_size_and_resume_restores_them() {
    let s = setup();
    write(&s.scratch.join("ckpt/model.bin"), b"weights v1");
    write(&s.scratch.join("opt.bin"), b"optimizer");
    let mut cp = checkpoint(1);
    let files = named(&[("model", "ckpt/model.bin"), ("opt", "opt.bin")]);
    s.store
        .save_with_files(&mut cp, &s.scratch, &files)
        .unwrap();
    let latest = s.store.latest(TASK).unwrap().unwrap().checkpoint;
    assert_eq!(latest.files["model"].path, "ckpt/model.bin");
    assert_eq!(latest.files["model"].sha256, sha(b"weights v1"));
    assert_eq!(latest.files["model"].size, 10);
    assert_eq!(latest.files["opt"].sha256, sha(b"optimizer"));

    // The command overwrites the file and dies before its next checkpoint: resume gets the
    // committed bytes back, in a scratch directory of its own too.
    write(
        &s.scratch.join("ckpt/model.bin"),
        b"weights v2, never committed",
    );
    let blobs = s.store.blobs().unwrap();
    blobs.restore(&latest.files, &s.scratch, None).unwrap();
    assert_eq!(
        fs::read(s.scratch.join("ckpt/model.bin")).unwrap(),
        b"weights v1"
    );
    let elsewhere = s.root.join("other-scratch");
    fs::create_dir_all(&elsewhere).unwrap();
    blobs.restore(&latest.files, &elsewhere, None).unwrap();
    assert_eq!(fs::read(elsewhere.join("opt.bin")).unwrap(), b"optimizer");
}

#[test]
fn a_file_that_cannot_be_stored_refuses_the_checkpoint_and_keeps_the_previous_one() {
    let s = setup();
    write(&s.scratch.join("model.bin"), b"v1");
    s.store
        .save_with_files(
            &mut checkpoint(1),
            &s.scratch,
            &named(&[("m", "model.bin")]),
        )
        .unwrap();
    let outside = s.root.join("secret");
    write(&outside, b"not the task's");
    symlink(&outside, s.scratch.join("link.bin")).unwrap();
    fs::hard_link(&outside, s.scratch.join("hard.bin")).unwrap();
    fs::create_dir_all(s.scratch.join("adir")).unwrap();
    for (path, says) in [
        ("missing.bin", "no such file"),
        ("link.bin", "link out of the scratch directory"),
        ("hard.bin", "hard links"),
        ("adir", "not a regular file"),
        ("../secret", "not a relative path inside"),
    ] {
        let err = s
            .store
            .save_with_files(&mut checkpoint(2), &s.scratch, &named(&[("m", path)]))
            .unwrap_err();
        assert!(matches!(err, StoreError::Files { .. }), "{path}: {err}");
        let message = err.to_string();
        assert!(message.contains(says), "{path}: {message}");
        assert!(message.contains(path), "{path}: {message}");
        assert!(
            message.contains("previous checkpoint stays in force"),
            "{message}"
        );
        let latest = s.store.latest(TASK).unwrap().unwrap().checkpoint;
        assert_eq!(latest.iteration_count, 1, "{path}");
        assert_eq!(latest.files["m"].sha256, sha(b"v1"));
    }
}

#[test]
fn a_checkpoint_written_before_files_existed_still_reads() {
    let s = setup();
    // The JSON of a checkpoint as earlier versions wrote it: no `files` key.
    let json = serde_json::json!({
        "format_version": 1, "task_id": TASK, "phase": "loop", "phase_index": 0,
        "scope": "loop", "iteration_count": 3, "checkpoint_interval": 1,
        "partial_results": {"count": 3}, "last_checkpoint_at": "2025-01-01T00:00:00Z",
        "attempt": 1, "generation": 1
    });
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, json.to_string().as_bytes()).unwrap();
    fs::write(
        s.root.join("incremental").join(format!("{TASK}.json.gz")),
        gz.finish().unwrap(),
    )
    .unwrap();
    let latest = s.store.latest(TASK).unwrap().unwrap().checkpoint;
    assert_eq!(latest.iteration_count, 3);
    assert!(latest.files.is_empty());
    // And a checkpoint without files is written without the key.
    let bytes = cairn::store::encode_checkpoint(&checkpoint(4)).unwrap();
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut text)
        .unwrap();
    assert!(!text.contains("\"files\""), "{text}");
}

#[test]
fn restore_never_follows_a_link_planted_in_the_scratch_directory() {
    let s = setup();
    write(&s.scratch.join("ckpt/model.bin"), b"weights");
    s.store
        .save_with_files(
            &mut checkpoint(1),
            &s.scratch,
            &named(&[("m", "ckpt/model.bin")]),
        )
        .unwrap();
    let files = s.store.latest(TASK).unwrap().unwrap().checkpoint.files;
    // The command replaces its directory by a link to somewhere the daemon may write.
    let target = s.root.join("elsewhere");
    fs::create_dir_all(&target).unwrap();
    fs::remove_dir_all(s.scratch.join("ckpt")).unwrap();
    symlink(&target, s.scratch.join("ckpt")).unwrap();
    let err = s
        .store
        .blobs()
        .unwrap()
        .restore(&files, &s.scratch, None)
        .unwrap_err();
    assert!(err.to_string().contains("ckpt/model.bin"), "{err}");
    assert_eq!(fs::read_dir(&target).unwrap().count(), 0);
    // A link in the file's own place is replaced, not written through.
    fs::remove_file(s.scratch.join("ckpt")).unwrap();
    fs::create_dir_all(s.scratch.join("ckpt")).unwrap();
    let victim = s.root.join("victim");
    write(&victim, b"keep me");
    symlink(&victim, s.scratch.join("ckpt/model.bin")).unwrap();
    s.store
        .blobs()
        .unwrap()
        .restore(&files, &s.scratch, None)
        .unwrap();
    assert_eq!(fs::read(&victim).unwrap(), b"keep me");
    assert_eq!(
        fs::read(s.scratch.join("ckpt/model.bin")).unwrap(),
        b"weights"
    );
}

#[test]
fn each_kept_generation_keeps_its_files_and_the_others_are_collected() {
    let s = setup();
    // Generation g names model v<g/2> (every other save leaves it unchanged) and a fixed file.
    write(&s.scratch.join("fixed.bin"), b"fixed");
    for g in 1..=9u64 {
        write(
            &s.scratch.join("model.bin"),
            format!("model v{}", g / 2).as_bytes(),
        );
        let files = named(&[("model", "model.bin"), ("fixed", "fixed.bin")]);
        s.store
            .save_with_files(&mut checkpoint(g), &s.scratch, &files)
            .unwrap();
    }
    // Kept: generations 9 (latest) and 8, 7, 6: models v4, v4, v3, v3, and the fixed file.
    let history = s.store.history(TASK).unwrap();
    assert_eq!(history.len(), 4);
    let mut kept: Vec<String> = [b"model v4".as_slice(), b"model v3", b"fixed"]
        .iter()
        .map(|b| sha(b))
        .collect();
    kept.sort();
    assert_eq!(s.store.blobs().unwrap().blobs().unwrap(), kept);
    for info in &history {
        let cp = s.store.generation(TASK, info.generation).unwrap();
        for file in cp.files.values() {
            assert!(s.store.blobs().unwrap().blob_path(&file.sha256).exists());
        }
    }
    // Deleting the task's checkpoints collects all of its blobs.
    s.store.delete(TASK).unwrap();
    assert!(s.store.blobs().unwrap().blobs().unwrap().is_empty());
}

#[test]
fn a_fork_names_the_blobs_of_its_generation_and_keeps_them_when_the_source_goes() {
    let s = setup();
    write(&s.scratch.join("model.bin"), b"gen one");
    s.store
        .save_with_files(
            &mut checkpoint(1),
            &s.scratch,
            &named(&[("m", "model.bin")]),
        )
        .unwrap();
    write(&s.scratch.join("model.bin"), b"gen two");
    s.store
        .save_with_files(
            &mut checkpoint(2),
            &s.scratch,
            &named(&[("m", "model.bin")]),
        )
        .unwrap();
    // As `cairn fork --gen 1` does, through a store of its own.
    let forker =
        CheckpointStore::with_storage(Arc::clone(s.store.storage())).with_blobs_of_queue(&s.root);
    let mut forked = forker.generation(TASK, 1).unwrap();
    forked.fork_as("t2", None);
    forker.save(&mut forked).unwrap();
    s.store.delete(TASK).unwrap();
    let fork = s.store.latest("t2").unwrap().unwrap().checkpoint;
    assert_eq!(fork.files["m"].sha256, sha(b"gen one"));
    assert_eq!(s.store.blobs().unwrap().blobs().unwrap(), [sha(b"gen one")]);
    let fresh = s.root.join("fork-scratch");
    fs::create_dir_all(&fresh).unwrap();
    s.store
        .blobs()
        .unwrap()
        .restore(&fork.files, &fresh, None)
        .unwrap();
    assert_eq!(fs::read(fresh.join("model.bin")).unwrap(), b"gen one");
}

#[test]
fn the_loop_checkpointer_saves_and_restores_files_with_its_state() {
    let s = setup();
    let new = || {
        LoopCheckpointer::new(s.store.clone(), TASK, "train")
            .every(5)
            .scratch(&s.scratch, None)
    };
    let mut loop_ = new();
    for i in 1..=3u64 {
        write(&s.scratch.join("w.bin"), format!("w{i}").as_bytes());
        // Written at once, though `every` is 5: a checkpoint naming files is never pending.
        let files = named(&[("w", "w.bin")]);
        assert!(loop_.checkpoint_with_files(i, &i, &files).unwrap());
    }
    write(
        &s.scratch.join("w.bin"),
        b"w4, crashed before its checkpoint",
    );
    drop(loop_);
    let mut resumed = new();
    let cp = resumed.resume_checkpoint().unwrap().unwrap();
    assert_eq!(cp.iteration_count, 3);
    resumed.restore_files(&cp).unwrap();
    assert_eq!(fs::read(s.scratch.join("w.bin")).unwrap(), b"w3");
    // The final checkpoint names the last one's files unless given its own.
    resumed.finish(3, &3u64, None).unwrap();
    let done = s.store.latest(TASK).unwrap().unwrap().checkpoint;
    assert!(done.done);
    assert_eq!(done.files["w"].sha256, sha(b"w3"));
    let kept: HashSet<String> = s
        .store
        .blobs()
        .unwrap()
        .blobs()
        .unwrap()
        .into_iter()
        .collect();
    assert!(kept.contains(&sha(b"w3")));
}

/// A queue in a database, as far as a checkpointer sees it: no checkpoint yet, and no save
/// may reach it.
#[derive(Debug)]
struct SharedQueue;

impl cairn::store::CheckpointSink for SharedQueue {
    fn latest(&self, _: &str) -> Result<Option<cairn::store::LoadedCheckpoint>, StoreError> {
        Ok(None)
    }

    fn save(
        &self,
        _: &mut IterationCheckpoint<&serde_json::value::RawValue>,
    ) -> Result<cairn::store::SavedCheckpoint, StoreError> {
        panic!("a checkpoint naming files reached the shared queue")
    }
}

#[test]
fn a_shared_queue_refuses_a_checkpoint_with_files_saying_why() {
    let s = setup();
    write(&s.scratch.join("model.bin"), b"weights");
    let mut checkpointer = LoopCheckpointer::with_sink(Arc::new(SharedQueue), TASK, "worker")
        .scratch(&s.scratch, None);
    let err = checkpointer
        .checkpoint_with_files(1, &1u64, &named(&[("m", "model.bin")]))
        .unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("shared queue (--db)") && message.contains("queue directory"),
        "{message}"
    );
}
