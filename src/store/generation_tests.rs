//! How a save numbers its generation when it must work the number out from the files on disk:
//! whatever files are there (gaps in the numbers, a latest that does not decode, a latest older
//! than a kept generation), no save may overwrite one of them, whether the store lists the
//! directory at the save or learned it from one listing beforehand.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;

use super::checkpoint::{encode_checkpoint, IterationCheckpoint};
use super::checkpoint_store::CheckpointStore;
use super::file::FileStorage;
use super::Storage;

const TASK: &str = "t";

/// What the task's latest file holds before the first save.
#[derive(Debug, Clone)]
enum Latest {
    Missing,
    /// A checkpoint of this generation.
    Decodes(u64),
    /// Bytes that are no checkpoint.
    Garbage,
}

/// A checkpoint of `task` that says it is `generation`.
fn checkpoint(task: &str, generation: u64) -> IterationCheckpoint {
    IterationCheckpoint {
        partial_results: serde_json::json!({ "generation": generation }),
        generation,
        ..IterationCheckpoint::of_loop(task, generation)
    }
}

/// The files in `incremental/`, name → bytes.
fn files_on_disk(root: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(root.join("incremental"))
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            (name, std::fs::read(entry.path()).unwrap())
        })
        .collect()
}

/// The generation numbers of the task's older files on disk.
fn older_numbers(root: &Path) -> Vec<u64> {
    files_on_disk(root)
        .keys()
        .filter_map(|name| {
            name.strip_prefix("t.")?
                .strip_suffix(".json.gz")?
                .parse()
                .ok()
        })
        .collect()
}

/// Lay out the task's files: older generations under `older` (each holding a checkpoint of
/// its number), and the latest file as `latest` says. An older file with the latest's number
/// holds the same bytes, as an earlier save that linked the latest and failed before its
/// rename leaves it.
fn lay_out(root: &Path, older: &[u64], latest: &Latest) {
    let incremental = root.join("incremental");
    std::fs::create_dir_all(&incremental).unwrap();
    let mut encoded = BTreeMap::new();
    let mut bytes_of = |generation: u64| -> Vec<u8> {
        encoded
            .entry(generation)
            .or_insert_with(|| encode_checkpoint(&checkpoint(TASK, generation)).unwrap())
            .clone()
    };
    for &generation in older {
        let path = incremental.join(format!("t.{generation}.json.gz"));
        std::fs::write(path, bytes_of(generation)).unwrap();
    }
    let latest_bytes = match latest {
        Latest::Missing => return,
        Latest::Decodes(generation) => bytes_of(*generation),
        Latest::Garbage => b"not a checkpoint".to_vec(),
    };
    std::fs::write(incremental.join("t.json.gz"), latest_bytes).unwrap();
}

/// Save `saves` times, checking after each save that every file that was on disk before it,
/// other than the latest, is gone (a generation pruned) or holds the same bytes, and that the
/// new generation is above every older file's number.
fn save_and_check(root: &Path, store: &CheckpointStore, saves: usize) -> Result<(), TestCaseError> {
    for _ in 0..saves {
        let before = files_on_disk(root);
        let generation = store.save(&mut checkpoint(TASK, 0)).unwrap();
        let after = files_on_disk(root);
        for (name, bytes) in &before {
            if name == "t.json.gz" {
                continue;
            }
            if let Some(now) = after.get(name) {
                prop_assert!(
                    now == bytes,
                    "the save of generation {generation} overwrote {name}"
                );
            }
        }
        let older = older_numbers(root);
        prop_assert!(
            older.iter().all(|&n| n < generation),
            "generation {generation} is not above the older files {older:?}"
        );
        let latest = store.latest(TASK).unwrap().unwrap();
        prop_assert_eq!(latest.checkpoint.generation, generation);
    }
    Ok(())
}

fn latest_strategy() -> impl Strategy<Value = Latest> {
    prop_oneof![
        Just(Latest::Missing),
        Just(Latest::Garbage),
        (1u64..=14).prop_map(Latest::Decodes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn no_save_overwrites_a_file_on_disk(
        older in proptest::collection::btree_set(1u64..=12, 0..6),
        latest in latest_strategy(),
        keep in 0usize..=3,
        learned in any::<bool>(),
        resumed in any::<bool>(),
        saves in 1usize..=6,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let older: Vec<u64> = older.into_iter().collect();
        lay_out(dir.path(), &older, &latest);
        let store = CheckpointStore::with_storage(Arc::new(FileStorage::new(dir.path())))
            .keep_generations(keep);
        if learned {
            store.learn_generations_on_disk([TASK]).unwrap();
        }
        if resumed {
            // As the daemon does before a resumed task's first save; whatever it finds.
            let _ = store.latest(TASK);
        }
        save_and_check(dir.path(), &store, saves)?;
    }
}

/// The edge cases by name, each with and without the listing learned beforehand.
#[test]
fn the_edge_cases_keep_every_file() {
    let cases = [
        ("gaps in the numbers", vec![2, 5, 9], Latest::Decodes(10)),
        (
            "a latest that does not decode",
            vec![3, 4, 5],
            Latest::Garbage,
        ),
        (
            "a latest older than a kept one",
            vec![5, 6, 7],
            Latest::Decodes(2),
        ),
        (
            "a restored latest beside gaps",
            vec![4, 9],
            Latest::Decodes(4),
        ),
        ("no latest, only older files", vec![1, 7], Latest::Missing),
    ];
    for (what, older, latest) in cases {
        for learned in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            lay_out(dir.path(), &older, &latest);
            let store = CheckpointStore::with_storage(Arc::new(FileStorage::new(dir.path())));
            if learned {
                store.learn_generations_on_disk([TASK]).unwrap();
            }
            let _ = store.latest(TASK);
            if let Err(err) = save_and_check(dir.path(), &store, 8) {
                panic!("{what} (learned beforehand: {learned}, resumed): {err}");
            }
        }
    }
}

/// A [`FileStorage`] that counts how often `incremental/` is listed and a file is read.
#[derive(Debug)]
struct CountingStorage {
    files: FileStorage,
    listings: AtomicUsize,
    reads: AtomicUsize,
}

impl Storage for CountingStorage {
    fn put(&self, key: &str, bytes: &[u8], keep_previous_as: Option<&str>) -> io::Result<()> {
        self.files.put(key, bytes, keep_previous_as)
    }

    fn put_retiring(
        &self,
        key: &str,
        bytes: &[u8],
        keep_previous_as: Option<&str>,
        retire: &str,
    ) -> io::Result<()> {
        self.files
            .put_retiring(key, bytes, keep_previous_as, retire)
    }

    fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.files.get(key)
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.listings.fetch_add(1, Ordering::SeqCst);
        self.files.list(dir)
    }

    fn remove(&self, key: &str) -> io::Result<()> {
        self.files.remove(key)
    }

    fn remove_temp_files(&self) -> io::Result<Vec<String>> {
        self.files.remove_temp_files()
    }
}

#[test]
fn first_saves_of_learned_tasks_list_nothing_and_others_list_once() {
    let dir = tempfile::tempdir().unwrap();
    let incremental = dir.path().join("incremental");
    std::fs::create_dir_all(&incremental).unwrap();
    for task in ["a", "b"] {
        for generation in [3, 4] {
            let bytes = encode_checkpoint(&checkpoint(task, generation)).unwrap();
            std::fs::write(
                incremental.join(format!("{task}.{generation}.json.gz")),
                bytes,
            )
            .unwrap();
        }
        let bytes = encode_checkpoint(&checkpoint(task, 5)).unwrap();
        std::fs::write(incremental.join(format!("{task}.json.gz")), bytes).unwrap();
    }
    let storage = Arc::new(CountingStorage {
        files: FileStorage::new(dir.path()),
        listings: AtomicUsize::new(0),
        reads: AtomicUsize::new(0),
    });
    let store = CheckpointStore::with_storage(Arc::clone(&storage) as Arc<dyn Storage>);
    store.learn_generations_on_disk(["a", "b", "new"]).unwrap();
    assert_eq!(storage.listings.load(Ordering::SeqCst), 1);
    // A learned task without files has no checkpoint to resume from, known without a listing.
    assert!(store.latest("new").unwrap().is_none());
    assert_eq!(
        storage.listings.load(Ordering::SeqCst),
        1,
        "looking for a learned new task's checkpoint listed incremental/"
    );
    assert_eq!(store.save(&mut checkpoint("a", 0)).unwrap(), 6);
    assert_eq!(store.save(&mut checkpoint("b", 0)).unwrap(), 6);
    assert_eq!(store.save(&mut checkpoint("new", 0)).unwrap(), 1);
    assert_eq!(
        storage.listings.load(Ordering::SeqCst),
        1,
        "a learned task's first save listed incremental/"
    );
    // A task the store did not learn lists the directory at its first save, as before, and
    // when its checkpoint is looked for before one exists.
    store.save(&mut checkpoint("other", 0)).unwrap();
    assert_eq!(storage.listings.load(Ordering::SeqCst), 2);
    assert!(store.latest("unseen").unwrap().is_none());
    assert_eq!(storage.listings.load(Ordering::SeqCst), 3);
}

#[test]
fn a_resumed_tasks_first_save_reads_its_latest_file_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let incremental = dir.path().join("incremental");
    std::fs::create_dir_all(&incremental).unwrap();
    for generation in [2, 3] {
        let bytes = encode_checkpoint(&checkpoint(TASK, generation)).unwrap();
        std::fs::write(
            incremental.join(format!("{TASK}.{generation}.json.gz")),
            bytes,
        )
        .unwrap();
    }
    let bytes = encode_checkpoint(&checkpoint(TASK, 4)).unwrap();
    std::fs::write(incremental.join(format!("{TASK}.json.gz")), bytes).unwrap();
    let storage = Arc::new(CountingStorage {
        files: FileStorage::new(dir.path()),
        listings: AtomicUsize::new(0),
        reads: AtomicUsize::new(0),
    });
    let store = CheckpointStore::with_storage(Arc::clone(&storage) as Arc<dyn Storage>);
    store.learn_generations_on_disk([TASK]).unwrap();
    let resumed = store.latest(TASK).unwrap().expect("the latest checkpoint");
    assert_eq!(resumed.checkpoint.generation, 4);
    assert_eq!(storage.reads.load(Ordering::SeqCst), 1);
    assert_eq!(store.save(&mut checkpoint(TASK, 0)).unwrap(), 5);
    assert_eq!(
        storage.reads.load(Ordering::SeqCst),
        1,
        "the first save after the resume read the latest file again"
    );
    assert_eq!(storage.listings.load(Ordering::SeqCst), 1);
    assert_eq!(older_numbers(dir.path()), vec![2, 3, 4]);
}
