//! The worker helpers (`clients/` of the source tree), built into the binary.
//!
//! A worker script needs `cairn_worker.py` or `cairn.sh`, wherever cairn runs: from a clone in
//! a terminal, from `/usr/local/bin` under systemd, with the queue anywhere. So the binary
//! carries the helpers, writes them into `<queue>/clients/` when the daemon starts, and gives
//! every command `CAIRN_CLIENTS` (that directory) and a `PYTHONPATH` that ends with its
//! `python/` subdirectory. `cairn clients-path` writes and prints the same directory for a
//! shell that wants to try a worker by hand.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The helpers, as `(path under clients/, contents)`.
pub const HELPERS: [(&str, &str); 2] = [
    (
        "python/cairn_worker.py",
        include_str!("../clients/python/cairn_worker.py"),
    ),
    ("sh/cairn.sh", include_str!("../clients/sh/cairn.sh")),
];

/// The directory inside a queue that holds the helpers.
pub const CLIENTS_DIR: &str = "clients";

/// The environment variable naming the helpers' directory.
pub const CLIENTS_ENV: &str = "CAIRN_CLIENTS";

/// The helpers' directory of the queue at `queue_root`.
pub fn clients_dir(queue_root: &Path) -> PathBuf {
    queue_root.join(CLIENTS_DIR)
}

/// Write the helpers into `<queue_root>/clients/` unless they are there already with the same
/// contents (an upgraded binary replaces them). Each file is replaced by a rename, so a worker
/// starting meanwhile reads the old or the new file whole. Returns the directory.
pub fn install(queue_root: &Path) -> io::Result<PathBuf> {
    let dir = clients_dir(queue_root);
    for (name, contents) in HELPERS {
        let path = dir.join(name);
        if std::fs::read(&path).is_ok_and(|on_disk| on_disk == contents.as_bytes()) {
            continue;
        }
        let parent = path.parent().unwrap_or(&dir);
        // Modes like the rest of the queue (0750, 0640), whatever the umask.
        crate::store::modes::create_dir_all(parent).map_err(|e| named(e, "creating", parent))?;
        // Named like the store's temp files, so a start after a crash removes a leftover one.
        let mut temp = tempfile::Builder::new()
            .prefix(".")
            .suffix(crate::store::TEMP_SUFFIX)
            .tempfile_in(parent)
            .map_err(|e| named(e, "writing in", parent))?;
        temp.write_all(contents.as_bytes())
            .and_then(|()| {
                temp.as_file()
                    .set_permissions(std::fs::Permissions::from_mode(
                        crate::store::modes::FILE_MODE,
                    ))
            })
            .map_err(|e| named(e, "writing", &path))?;
        temp.persist(&path)
            .map_err(|e| named(e.error, "replacing", &path))?;
    }
    Ok(dir)
}

fn named(error: io::Error, doing: &str, path: &Path) -> io::Error {
    io::Error::new(error.kind(), format!("{doing} {}: {error}", path.display()))
}

/// `CAIRN_CLIENTS` and `PYTHONPATH` for a command: the task's own `PYTHONPATH` (else the one
/// the daemon passes to commands, `passed`, when its operator listed it) keeps its entries
/// first, so a task's copy of a helper wins over the built-in one.
pub fn command_env(
    clients: &Path,
    task_env: &BTreeMap<String, String>,
    passed: Option<&str>,
) -> [(String, String); 2] {
    let python = clients.join("python").display().to_string();
    let inherited = task_env
        .get("PYTHONPATH")
        .cloned()
        .or_else(|| passed.map(str::to_string))
        .filter(|path| !path.is_empty());
    let python_path = match inherited {
        Some(path) => format!("{path}:{python}"),
        None => python,
    };
    [
        (CLIENTS_ENV.to_string(), clients.display().to_string()),
        ("PYTHONPATH".to_string(), python_path),
    ]
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::{command_env, install, HELPERS};

    #[test]
    fn install_writes_the_built_in_helpers_and_replaces_stale_ones() {
        let queue = tempfile::tempdir().unwrap();
        let dir = install(queue.path()).unwrap();
        assert_eq!(dir, queue.path().join("clients"));
        for (name, contents) in HELPERS {
            assert_eq!(std::fs::read_to_string(dir.join(name)).unwrap(), contents);
        }
        let sh = dir.join("sh/cairn.sh");
        std::fs::write(&sh, "stale").unwrap();
        install(queue.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&sh).unwrap(), HELPERS[1].1);
        let names: Vec<_> = std::fs::read_dir(dir.join("sh"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["cairn.sh"], "no temp file is left");
    }

    #[test]
    fn the_task_pythonpath_comes_first() {
        let clients = Path::new("/q/clients");
        let mut env = BTreeMap::new();
        env.insert("PYTHONPATH".to_string(), "/mine".to_string());
        let [(name, dir), (_, python_path)] = command_env(clients, &env, Some("/daemon's"));
        assert_eq!(
            (name.as_str(), dir.as_str()),
            ("CAIRN_CLIENTS", "/q/clients")
        );
        assert_eq!(python_path, "/mine:/q/clients/python");
        let [_, (_, python_path)] = command_env(clients, &BTreeMap::new(), Some("/passed"));
        assert_eq!(python_path, "/passed:/q/clients/python");
        let [_, (_, python_path)] = command_env(clients, &BTreeMap::new(), None);
        assert_eq!(python_path, "/q/clients/python");
    }
}
