//! What cairn's interrupted writes leave behind. Shared by the `e2e` and `store` binaries.

use std::fs;
use std::path::{Path, PathBuf};

/// Every temp file cairn made under `root` (names ending in `.cairn.tmp`), recursively; a
/// missing directory has none.
pub(crate) fn temp_files(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            } else if entry.file_name().to_string_lossy().ends_with(".cairn.tmp") {
                found.push(entry.path());
            }
        }
    }
    found.sort();
    found
}
