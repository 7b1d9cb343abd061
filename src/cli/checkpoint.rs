//! `cairn checkpoint ID [--gen N]` and `cairn checkpoint PATH.json.gz`: print a decoded
//! iteration checkpoint as pretty JSON.
//!
//! A task's checkpoints are read with the store's strict decoding (format version, task id,
//! fallback to an older generation when the latest file is damaged). A file path is read
//! leniently, so that checkpoints written by the Python pattern cairn's format follows — the
//! six fields `task_id`, `phase`, `iteration_count`, `checkpoint_interval`, `partial_results`,
//! `last_checkpoint_at`, gzip, indented or not, no `format_version` — print as well, including
//! the `NaN`, `Infinity` and `-Infinity` that Python's `json` writes for such floats (shown as
//! written, with a note on stderr that the file is not standard JSON).
//!
//! With `--db URL`, a task's checkpoints are the rows of the shared queue's
//! `cairn_checkpoints`: the same gzip bytes, decoded by the same code, printed the same way.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context};
use clap::Args;

use super::error::{print, CliError, CliResult};
use super::format;
use super::python_json::PythonJson;
use super::source::DbArg;
use crate::client::QueueClient;
use crate::queue::QueueReader;

/// The fields every checkpoint of the pattern has.
pub(super) const PATTERN_FIELDS: [&str; 6] = [
    "task_id",
    "phase",
    "iteration_count",
    "checkpoint_interval",
    "partial_results",
    "last_checkpoint_at",
];

/// Larger decompressed checkpoints are refused rather than read into memory.
const MAX_DECOMPRESSED_BYTES: u64 = 1 << 30;

#[derive(Debug, Args)]
#[command(after_help = "\
TARGET is read as a file when it contains a '/', or when no task of the queue has that id and \
a file of that name exists (write ./name.json.gz to be explicit).

Exit codes: 0 printed, 1 no such task, checkpoint or generation, or the file does not decode \
(the reason is printed), 2 bad usage.")]
pub(super) struct CheckpointArgs {
    /// A task id, or the path of a .json.gz checkpoint file.
    #[arg(value_name = "ID|PATH")]
    target: String,

    /// An older generation of the task's checkpoint (see `cairn history ID`).
    #[arg(long = "gen", value_name = "N")]
    generation: Option<u64>,

    /// Write the files the checkpoint names into DIR (at their paths relative to the task's
    /// scratch directory, each checked against its hash) instead of printing the checkpoint.
    #[arg(long = "files-to", value_name = "DIR")]
    files_to: Option<PathBuf>,

    #[command(flatten)]
    pub(super) db: DbArg,
}

pub(super) fn run(queue: &Path, args: CheckpointArgs) -> CliResult {
    let client = QueueClient::open(queue, args.db.url())?;
    // Only a target that can be an id is looked up (as `is_path` does).
    let exists = !args.target.contains('/')
        && format::task_id_arg(&args.target).is_ok()
        && client.task_exists(&args.target)?;
    let is_file = is_path(&args.target, |_| exists);
    if let Some(dir) = &args.files_to {
        if is_file {
            return Err(CliError::usage(
                "--files-to applies to a task id, not to a file",
            ));
        }
        return write_files(&client, &args.target, args.generation, dir);
    }
    let printed = if is_file {
        read_path(&args)?
    } else {
        read_task(&client, &args.target, args.generation)?
    };
    print_checkpoint(printed)
}

/// `--files-to DIR`: the checkpoint's files copied out of the queue's blobs into `dir`, one
/// line each.
fn write_files(client: &QueueClient, id: &str, generation: Option<u64>, dir: &Path) -> CliResult {
    let Some(root) = client.root() else {
        return Err(CliError::usage(
            "--files-to: a shared queue (--db) keeps no checkpoint files",
        ));
    };
    let Some(read) = client.checkpoint(id, generation)? else {
        return Err(CliError::failure(format_args!(
            "task {id:?} has no checkpoint"
        )));
    };
    let checkpoint = read.checkpoint;
    if checkpoint.files.is_empty() {
        return Err(CliError::failure(format_args!(
            "generation {} of task {:?} names no files",
            checkpoint.generation, checkpoint.task_id
        )));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::failure(format_args!("creating {}: {e}", dir.display())))?;
    crate::store::blobs::BlobStore::existing(root)
        .restore(&checkpoint.files, dir, None)
        .map_err(|e| CliError::failure(format_args!("task {:?}: {e}", checkpoint.task_id)))?;
    let mut text = String::new();
    for (name, file) in &checkpoint.files {
        text.push_str(&format!(
            "wrote {} ({name}, {}, sha256 {})\n",
            dir.join(&file.path).display(),
            format::format_bytes(file.size),
            file.sha256
        ));
    }
    print(&text)
}

/// Is `target` a file's path rather than a task id? It is when it contains a '/' or is no
/// task id, or when the queue has no such task (`exists`) and a file of that name exists.
fn is_path(target: &str, exists: impl FnOnce(&str) -> bool) -> bool {
    target.contains('/')
        || format::task_id_arg(target).is_err()
        || (!exists(target) && Path::new(target).is_file())
}

/// The checkpoint file `args.target`, read leniently (`--gen` is refused for a file).
fn read_path(args: &CheckpointArgs) -> CliResult<String> {
    if args.generation.is_some() {
        return Err(CliError::usage(format_args!(
            "--gen applies to a task id, not to a file ({})",
            args.target
        )));
    }
    let path = PathBuf::from(&args.target);
    let parsed = read_file(&path)?;
    note_non_standard(&path, &parsed);
    Ok(parsed.to_string_pretty(&parsed.value))
}

fn print_checkpoint(mut text: String) -> CliResult {
    text.push('\n');
    print(&text)
}

/// A task's latest usable checkpoint, or one generation, printed in the struct's field order.
fn read_task(client: &QueueClient, id: &str, generation: Option<u64>) -> CliResult<String> {
    let Some(read) = client.checkpoint(id, generation)? else {
        let found = client.task_exists(id)?;
        return Err(CliError::failure(match (found, client.root()) {
            (true, Some(root)) => format!(
                "task {id:?} has no checkpoint in {} (only loop, items and worker phases write them)",
                QueueReader::open(root).dir().checkpoint_dir().display()
            ),
            (true, None) => format!(
                "task {id:?} has no checkpoint in the shared queue ({}) (only loop, items and \
                 worker phases write them)",
                client.location()
            ),
            (false, Some(root)) => format!(
                "queue {} has no task {id:?} and no checkpoint of it; for a file, give its path (./{id})",
                root.display()
            ),
            (false, None) => format!(
                "the shared queue ({}) has no task {id:?} and no checkpoint of it; for a file, \
                 give its path (./{id})",
                client.location()
            ),
        }));
    };
    for (location, why) in &read.skipped {
        eprintln!(
            "warning: {location} does not decode ({why}); printing {} instead",
            read.location
        );
    }
    serde_json::to_string_pretty(&read.checkpoint)
        .with_context(|| format!("task {id:?}"))
        .map_err(CliError::from)
}

/// Say on stderr that a file holds Python's non-standard tokens, which are printed as written.
fn note_non_standard(path: &Path, parsed: &PythonJson) {
    let tokens = parsed.non_standard_tokens();
    if !tokens.is_empty() {
        eprintln!(
            "note: {} is not standard JSON: it holds {} (as Python's json module writes them), \
             printed as written",
            path.display(),
            tokens.join(", ")
        );
    }
}

/// Any gzip JSON checkpoint file: cairn's own, or the Python pattern's six fields.
pub(super) fn read_file(path: &Path) -> anyhow::Result<PythonJson> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    decode_lenient(&bytes).with_context(|| path.display().to_string())
}

/// gzip (one or more members, CRC and length checked) → JSON object with the pattern's fields;
/// Python's `NaN`, `Infinity` and `-Infinity` are accepted.
pub(super) fn decode_lenient(bytes: &[u8]) -> anyhow::Result<PythonJson> {
    let mut json = Vec::new();
    flate2::read::MultiGzDecoder::new(bytes)
        .take(MAX_DECOMPRESSED_BYTES + 1)
        .read_to_end(&mut json)
        .context("not a whole gzip file (corrupt or truncated)")?;
    if json.len() as u64 > MAX_DECOMPRESSED_BYTES {
        bail!("decompresses to more than {MAX_DECOMPRESSED_BYTES} bytes; refused");
    }
    let parsed =
        PythonJson::parse(&json).map_err(|e| anyhow!("the gzip content is not JSON: {e}"))?;
    let Some(object) = parsed.value.as_object() else {
        bail!("the JSON is not an object, so not a checkpoint");
    };
    let missing: Vec<&str> = PATTERN_FIELDS
        .iter()
        .copied()
        .filter(|field| !object.contains_key(*field))
        .collect();
    if !missing.is_empty() {
        bail!(
            "not a checkpoint: missing {} (a checkpoint has {})",
            missing.join(", "),
            PATTERN_FIELDS.join(", ")
        );
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::decode_lenient;

    fn gzip(text: &str) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(text.as_bytes()).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn lenient_decoding_wants_the_six_fields_and_a_whole_stream() {
        let six = r#"{"task_id": "t", "phase": "p", "iteration_count": 3,
            "checkpoint_interval": 1, "partial_results": [1], "last_checkpoint_at": "2025-01-01T00:00:00"}"#;
        let parsed = decode_lenient(&gzip(six)).unwrap();
        assert_eq!(parsed.value["iteration_count"], 3);
        assert!(parsed.non_standard_tokens().is_empty());

        let err = decode_lenient(&gzip(r#"{"task_id": "t"}"#))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing phase, iteration_count"), "{err}");
        let err = decode_lenient(&gzip("[1, 2]")).unwrap_err().to_string();
        assert!(err.contains("not an object"), "{err}");
        let whole = gzip(six);
        let err = decode_lenient(&whole[..whole.len() - 4])
            .unwrap_err()
            .to_string();
        assert!(err.contains("gzip"), "{err}");
        let mut flipped = whole.clone();
        let at = flipped.len() - 6;
        flipped[at] ^= 0xff;
        assert!(decode_lenient(&flipped).is_err());
    }
}
