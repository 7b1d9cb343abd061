use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::{BlobError, BlobStore};

fn sha(bytes: &[u8]) -> String {
    super::hex(&Sha256::digest(bytes))
}

fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(name, path)| (name.to_string(), path.to_string()))
        .collect()
}

fn scratch_with(root: &Path, contents: &[(&str, &[u8])]) -> std::path::PathBuf {
    let scratch = root.join("scratch");
    for (path, bytes) in contents {
        let full = scratch.join(path);
        fs::create_dir_all(full.parent().unwrap()).unwrap();
        fs::write(full, bytes).unwrap();
    }
    scratch
}

#[test]
fn files_are_stored_once_by_content_and_restored_byte_for_byte() {
    let root = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let scratch = scratch_with(
        root.path(),
        &[
            ("ckpt/model.bin", &big),
            ("ckpt/same.bin", &big),
            ("notes.txt", b"hello"),
        ],
    );
    let store = BlobStore::open(root.path()).unwrap();
    let stored = store
        .store_files(
            &scratch,
            &files(&[
                ("model", "ckpt/model.bin"),
                ("copy", "ckpt/same.bin"),
                ("notes", "notes.txt"),
            ]),
        )
        .unwrap();
    assert_eq!(stored["model"].sha256, sha(&big));
    assert_eq!(stored["model"].size, big.len() as u64);
    assert_eq!(stored["copy"].sha256, stored["model"].sha256);
    assert_eq!(stored["notes"].sha256, sha(b"hello"));
    assert_eq!(store.blobs().unwrap(), {
        let mut both = vec![sha(&big), sha(b"hello")];
        both.sort();
        both
    });

    // Restored into a fresh scratch directory, and over a file the command changed since.
    let fresh = root.path().join("fresh");
    fs::create_dir_all(fresh.join("ckpt")).unwrap();
    fs::write(fresh.join("ckpt/model.bin"), b"a newer, uncommitted file").unwrap();
    store.restore(&stored, &fresh, None).unwrap();
    assert_eq!(fs::read(fresh.join("ckpt/model.bin")).unwrap(), big);
    assert_eq!(fs::read(fresh.join("ckpt/same.bin")).unwrap(), big);
    assert_eq!(fs::read(fresh.join("notes.txt")).unwrap(), b"hello");
    // A copy, not a link: writing the restored file leaves the blob as it was.
    fs::write(fresh.join("notes.txt"), b"changed").unwrap();
    assert_eq!(fs::read(store.blob_path(&sha(b"hello"))).unwrap(), b"hello");
}

#[test]
fn an_unchanged_file_is_not_read_again_and_a_rewritten_one_is() {
    use std::sync::atomic::Ordering;
    let root = tempfile::tempdir().unwrap();
    let scratch = scratch_with(root.path(), &[("w.bin", b"first version")]);
    let store = BlobStore::open(root.path()).unwrap();
    let names = files(&[("w", "w.bin")]);
    // A file changed within the racy window is read at every checkpoint.
    store.store_files(&scratch, &names).unwrap();
    store.store_files(&scratch, &names).unwrap();
    assert_eq!(store.reads.load(Ordering::Relaxed), 2);
    // Once it has settled, an unchanged file costs no read.
    std::thread::sleep(super::RACY_WINDOW + std::time::Duration::from_millis(200));
    let first = store.store_files(&scratch, &names).unwrap();
    assert_eq!(store.store_files(&scratch, &names).unwrap(), first);
    assert_eq!(store.reads.load(Ordering::Relaxed), 3);
    // Rewritten with the same size and its old mtime: its change time moved, so it is read.
    let path = scratch.join("w.bin");
    let mtime = fs::metadata(&path).unwrap().modified().unwrap();
    fs::write(&path, b"other version").unwrap();
    fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let second = store.store_files(&scratch, &names).unwrap();
    assert_eq!(first["w"].sha256, sha(b"first version"));
    assert_eq!(second["w"].sha256, sha(b"other version"));
    assert_eq!(store.reads.load(Ordering::Relaxed), 4);
}

#[test]
fn what_is_not_a_regular_file_inside_the_scratch_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let scratch = scratch_with(root.path(), &[("ok.bin", b"x")]);
    fs::create_dir_all(scratch.join("dir")).unwrap();
    let outside = root.path().join("outside.txt");
    fs::write(&outside, b"secret").unwrap();
    std::os::unix::fs::symlink(&outside, scratch.join("link-out")).unwrap();
    std::os::unix::fs::symlink("ok.bin", scratch.join("link-in")).unwrap();
    nix::unistd::mkfifo(&scratch.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let store = BlobStore::open(root.path()).unwrap();

    let refused = |path: &str| {
        store
            .store_files(&scratch, &files(&[("f", path)]))
            .unwrap_err()
    };
    let reason = |err: BlobError| match err {
        BlobError::Refused { reason, .. } => reason,
        other => panic!("not a refusal: {other}"),
    };
    assert_eq!(reason(refused("missing.bin")), "no such file");
    assert_eq!(reason(refused("dir")), "not a regular file");
    assert_eq!(reason(refused("fifo")), "not a regular file");
    assert!(reason(refused("link-out")).contains("link out of the scratch directory"));
    for bad in ["../outside.txt", "/etc/hostname", "", "a/../../b"] {
        assert!(
            matches!(refused(bad), BlobError::BadPath { .. }),
            "{bad:?} was not refused as a path"
        );
    }
    // A link that stays inside is followed.
    let inside = store
        .store_files(&scratch, &files(&[("f", "link-in")]))
        .unwrap();
    assert_eq!(inside["f"].sha256, sha(b"x"));
    // Nothing of the refused files was stored.
    assert_eq!(store.blobs().unwrap(), [sha(b"x")]);
}

#[test]
fn a_blob_whose_bytes_changed_on_disk_is_not_restored() {
    let root = tempfile::tempdir().unwrap();
    let scratch = scratch_with(root.path(), &[("m.bin", b"weights")]);
    let store = BlobStore::open(root.path()).unwrap();
    let stored = store
        .store_files(&scratch, &files(&[("m", "m.bin")]))
        .unwrap();
    fs::write(store.blob_path(&sha(b"weights")), b"weightz").unwrap();
    let fresh = root.path().join("fresh");
    fs::create_dir_all(&fresh).unwrap();
    let err = store.restore(&stored, &fresh, None).unwrap_err();
    assert!(matches!(err, BlobError::Corrupt { .. }), "{err}");
    assert!(!fresh.join("m.bin").exists());
}

#[test]
fn a_sweep_removes_only_blobs_no_kept_checkpoint_names() {
    let root = tempfile::tempdir().unwrap();
    let scratch = scratch_with(root.path(), &[("a", b"aaa"), ("b", b"bbb"), ("c", b"ccc")]);
    let store = BlobStore::open(root.path()).unwrap();
    store
        .store_files(&scratch, &files(&[("a", "a"), ("b", "b"), ("c", "c")]))
        .unwrap();
    fs::write(
        store.dir.join(".incoming.abc.cairn.tmp"),
        b"left by a crash",
    )
    .unwrap();
    let kept: HashSet<String> = [sha(b"aaa"), sha(b"ccc")].into_iter().collect();
    assert_eq!(store.sweep(&kept).unwrap(), 1);
    let mut left = store.blobs().unwrap();
    left.sort();
    let mut want: Vec<String> = kept.into_iter().collect();
    want.sort();
    assert_eq!(left, want);
    assert!(!store.dir.join(".incoming.abc.cairn.tmp").exists());
    // A kept blob is found again by content: storing "b" again makes it anew.
    store.store_files(&scratch, &files(&[("b", "b")])).unwrap();
    assert!(store.blob_path(&sha(b"bbb")).exists());
}
