//! `cairn history ID [--json]`: the checkpoint generations kept for a task, newest first —
//! generation, iteration, phase, when it was written, size, and why a file does not decode.

use std::path::Path;
use std::sync::Arc;

use chrono::Utc;
use clap::Args;
use serde_json::{json, Value};

use super::exit;
use super::view;
use crate::store::{decode_checkpoint, CheckpointStore, FileStorage, GenerationInfo};

#[derive(Debug, Args)]
#[command(after_help = "\
The first row is the task's latest file (incremental/<id>.json.gz); the others are the older \
generations kept beside it (incremental/<id>.<gen>.json.gz). `cairn checkpoint ID --gen N` \
prints one. The --json document is described in docs/cli.md (\"version\": 1).")]
pub struct HistoryArgs {
    /// The task id.
    id: String,

    /// Print a JSON document instead.
    #[arg(long)]
    json: bool,
}

/// One generation, with what the file says about its phase.
struct Row {
    info: GenerationInfo,
    phase: Option<String>,
    phase_index: Option<usize>,
}

pub fn run(queue: &Path, args: HistoryArgs) -> u8 {
    if let Err(e) = view::check_id(&args.id) {
        eprintln!("error: {e}");
        return exit::USAGE;
    }
    let root = std::path::absolute(queue).unwrap_or_else(|_| queue.to_path_buf());
    let store = CheckpointStore::with_storage(Arc::new(FileStorage::new(&root)));
    let history = match view::quietly(|| store.history(&args.id)) {
        Ok(history) => history,
        Err(e) => {
            eprintln!("error: task {:?} in queue {}: {e}", args.id, root.display());
            return exit::FAILURE;
        }
    };
    if history.is_empty() && !view::task_exists(&root, &args.id) {
        eprintln!(
            "error: queue {} has no task {:?} and no checkpoint of it in {}",
            root.display(),
            args.id,
            root.join("incremental").display()
        );
        return exit::FAILURE;
    }
    let rows: Vec<Row> = history
        .into_iter()
        .map(|info| {
            let decoded = std::fs::read(root.join(&info.key))
                .ok()
                .and_then(|bytes| decode_checkpoint(&bytes).ok())
                .filter(|_| info.error.is_none());
            Row {
                phase: decoded.as_ref().map(|cp| cp.phase.clone()),
                phase_index: decoded.map(|cp| cp.phase_index),
                info,
            }
        })
        .collect();
    if rows.is_empty() && !args.json {
        eprintln!(
            "note: task {:?} has no checkpoint (only loop, items and worker phases write them)",
            args.id
        );
    }
    let text = if args.json {
        let document = json!({
            "version": view::JSON_VERSION,
            "queue": root.display().to_string(),
            "task_id": args.id,
            "generations": rows.iter().enumerate().map(|(i, row)| row_json(&root, i == 0, row)).collect::<Vec<_>>(),
        });
        let mut text = serde_json::to_string_pretty(&document).unwrap_or_default();
        text.push('\n');
        text
    } else {
        table(&rows)
    };
    view::print_or_fail(&text)
}

fn row_json(root: &Path, latest: bool, row: &Row) -> Value {
    let info = &row.info;
    json!({
        "generation": info.generation,
        "latest": latest,
        "file": root.join(&info.key).display().to_string(),
        "bytes": info.bytes,
        "iteration": info.iteration_count,
        "phase": row.phase,
        "phase_index": row.phase_index,
        "written_at": info.last_checkpoint_at.map(view::rfc3339),
        "error": info.error,
    })
}

fn table(rows: &[Row]) -> String {
    let now = Utc::now();
    let dash = || "-".to_string();
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            let info = &row.info;
            vec![
                info.generation.to_string(),
                info.iteration_count
                    .map(|i| i.to_string())
                    .unwrap_or_else(dash),
                row.phase.clone().unwrap_or_else(dash),
                info.last_checkpoint_at
                    .map(view::rfc3339)
                    .unwrap_or_else(dash),
                info.last_checkpoint_at
                    .map(|at| view::short_duration((now - at).num_seconds().max(0) as u64))
                    .unwrap_or_else(dash),
                view::format_bytes(info.bytes).replace(' ', ""),
                info.error.clone().unwrap_or_else(dash),
            ]
        })
        .collect();
    view::render_table(
        &["GEN", "ITER", "PHASE", "WRITTEN", "AGE", "SIZE", "ERROR"],
        &cells,
    )
}
