//! `cairn history ID [--json]`: the checkpoint generations kept for a task, newest first —
//! generation, iteration, phase, when it was written, size, and why a file does not decode.
//!
//! With `--db URL`, the generations are the rows of `cairn_checkpoints`, the same gzip bytes as
//! the files, decoded by the same code; each row's "file" is its key in the database
//! (`cairn_checkpoints/<id>/<gen>`).
//!
//! A file that is not cairn's but a checkpoint of the Python pattern cairn's format follows (no
//! `format_version`, no `generation`; copied into the queue by hand) has no generation: its
//! row says `none` (`null` in `--json`), with its iteration and phase as the file gives them.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::Utc;
use clap::Args;
use serde_json::{json, Value};

use super::checkpoint::decode_lenient;
use super::error::{print, CliError, CliResult, ExitCodeExt};
use super::exit;
use super::format;
use super::source::DbArg;
use crate::client::{QueueClient, StoredGeneration};
use crate::queue::QueueReader;
use crate::store::blobs::StoredFile;
use crate::store::{GenerationInfo, IterationCheckpoint};

#[derive(Debug, Args)]
#[command(after_help = "\
The first row is the task's latest file (incremental/<id>.json.gz); the others are the older \
generations kept beside it (incremental/<id>.<gen>.json.gz). `cairn checkpoint ID --gen N` \
prints one. The --json document is described in docs/cli.md (\"version\": 1).
With --db URL the generations are the shared queue's rows; \"file\" is then the row's key \
(cairn_checkpoints/<id>/<gen>).")]
pub(super) struct HistoryArgs {
    /// The task id.
    id: String,

    /// Print a JSON document instead.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    pub(super) db: DbArg,
}

/// One generation, with what the file says about its phase.
struct Row {
    info: GenerationInfo,
    /// Where the generation is: the file's path, or its key in the database.
    file: String,
    /// `None` for a file of the Python pattern, which has no generation.
    generation: Option<u64>,
    phase: Option<String>,
    phase_index: Option<usize>,
    /// The files the generation names.
    files: BTreeMap<String, StoredFile>,
}

impl Row {
    /// The row of one generation: cairn's checkpoint, else possibly a file of the Python
    /// pattern.
    fn of(stored: StoredGeneration) -> Row {
        let StoredGeneration {
            info,
            location,
            checkpoint,
            undecoded,
        } = stored;
        if let Some(cp) = checkpoint {
            return Row::decoded(info, location, &cp);
        }
        let foreign = undecoded
            .as_deref()
            .and_then(|bytes| decode_lenient(bytes).ok())
            .filter(|parsed| parsed.value.get("generation").is_none());
        match foreign {
            Some(parsed) => Row::foreign(info, location, &parsed.value),
            None => Row::undecodable(info, location),
        }
    }

    /// A generation that decodes.
    fn decoded(info: GenerationInfo, file: String, cp: &IterationCheckpoint) -> Row {
        Row {
            generation: Some(info.generation),
            phase: Some(cp.phase.clone()),
            phase_index: Some(cp.phase_index),
            files: cp.files.clone(),
            info,
            file,
        }
    }

    /// A generation that does not decode (`info.error` says why).
    fn undecodable(info: GenerationInfo, file: String) -> Row {
        Row {
            generation: Some(info.generation),
            phase: None,
            phase_index: None,
            files: BTreeMap::new(),
            info,
            file,
        }
    }

    /// A Python pattern's file: what it says, and why it is not one of cairn's generations.
    fn foreign(mut info: GenerationInfo, file: String, value: &Value) -> Row {
        info.iteration_count = value["iteration_count"].as_u64();
        info.error = Some(
            "not a cairn checkpoint (no format_version or generation): written by the Python \
             pattern; `cairn checkpoint FILE` prints it"
                .into(),
        );
        Row {
            generation: None,
            phase: value["phase"].as_str().map(str::to_string),
            phase_index: None,
            files: BTreeMap::new(),
            info,
            file,
        }
    }
}

pub(super) fn run(queue: &Path, args: HistoryArgs) -> CliResult {
    let id = format::task_id_arg(&args.id).exit_code(exit::USAGE)?;
    let client = QueueClient::open(queue, args.db.url())?;
    let generations = client.generations(&id)?;
    if generations.is_empty() && !client.task_exists(&id)? {
        let where_looked = match client.root() {
            Some(root) => format!(
                "queue {} has no task {:?} and no checkpoint of it in {}",
                root.display(),
                args.id,
                QueueReader::open(root).dir().checkpoint_dir().display()
            ),
            None => format!(
                "the shared queue ({}) has no task {:?}",
                client.location(),
                args.id
            ),
        };
        return Err(CliError::failure(where_looked));
    }
    let rows: Vec<Row> = generations.into_iter().map(Row::of).collect();
    print_rows(&args, &client.location(), &rows)
}

/// The table, or with `--json` the document, of `rows` of the queue at `location`.
fn print_rows(args: &HistoryArgs, location: &str, rows: &[Row]) -> CliResult {
    if rows.is_empty() && !args.json {
        eprintln!(
            "note: task {:?} has no checkpoint (only loop, items and worker phases write them)",
            args.id
        );
    }
    let text = if args.json {
        let document = json!({
            "version": format::JSON_VERSION,
            "queue": location,
            "task_id": args.id,
            "generations": rows.iter().enumerate().map(|(i, row)| row_json(i == 0, row)).collect::<Vec<_>>(),
        });
        let mut text = serde_json::to_string_pretty(&document).unwrap_or_default();
        text.push('\n');
        text
    } else {
        table(rows)
    };
    print(&text)
}

fn row_json(latest: bool, row: &Row) -> Value {
    let info = &row.info;
    json!({
        "generation": row.generation,
        "latest": latest,
        "file": row.file,
        "bytes": info.bytes,
        "iteration": info.iteration_count,
        "phase": row.phase,
        "phase_index": row.phase_index,
        "written_at": info.last_checkpoint_at.map(format::rfc3339),
        "error": info.error,
        "files": row.files,
    })
}

/// `name size` of each file a generation names, `-` for none.
fn files_cell(files: &BTreeMap<String, StoredFile>) -> String {
    if files.is_empty() {
        return "-".into();
    }
    files
        .iter()
        .map(|(name, f)| format!("{name} {}", format::format_bytes(f.size).replace(' ', "")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn table(rows: &[Row]) -> String {
    let now = Utc::now();
    let dash = || "-".to_string();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let info = &row.info;
            vec![
                row.generation
                    .map(|g| g.to_string())
                    .unwrap_or_else(|| "none".into()),
                info.iteration_count
                    .map(|i| i.to_string())
                    .unwrap_or_else(dash),
                row.phase.clone().unwrap_or_else(dash),
                info.last_checkpoint_at
                    .map(format::rfc3339)
                    .unwrap_or_else(dash),
                info.last_checkpoint_at
                    .map(|at| format::short_duration((now - at).num_seconds().max(0) as u64))
                    .unwrap_or_else(dash),
                format::format_bytes(info.bytes).replace(' ', ""),
                files_cell(&row.files),
                info.error.clone().unwrap_or_else(dash),
            ]
        })
        .collect();
    format::render_table(
        &[
            "GEN", "ITER", "PHASE", "WRITTEN", "AGE", "SIZE", "FILES", "ERROR",
        ],
        &cells,
    )
}
