//! Embedding cairn's checkpoints in your own loop.
//!
//! Sums the numbers 1..=N, one iteration per number, and checkpoints after every iteration.
//! Interrupt it (Ctrl-C) and run it again with the same directory: it resumes after the last
//! completed iteration instead of starting over. Run again after it finished, it reports the
//! result of its final checkpoint and writes nothing.
//!
//! ```text
//! cargo run --example checkpoint_loop -- DIR [N]
//! ```
//! DIR is the queue directory that holds the checkpoints (default: a new temp directory);
//! N is the number of iterations (default 20).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use cairn::store::{CheckpointStore, LoopCheckpointer};
use serde::{Deserialize, Serialize};

/// The loop's state: what a checkpoint must hold to continue exactly where it stopped.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Sum {
    total: u64,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("checkpoint_loop: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    // Keeps a default temp directory alive until the end of `run`.
    let mut temp_dir = None;
    let dir: PathBuf = match args.next() {
        Some(dir) => dir.into(),
        None => temp_dir.insert(tempfile::tempdir()?).path().to_path_buf(),
    };
    let iterations: u64 = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|err| format!("N must be a number: {err}"))?,
        None => 20,
    };

    let store = CheckpointStore::open(&dir)?;
    let mut checkpointer = LoopCheckpointer::new(store, "checkpoint-loop-example", "sum");
    let latest = checkpointer.resume_checkpoint()?;
    if let Some(finished) = latest.as_ref().filter(|cp| cp.done) {
        // The final checkpoint is there: the loop is over, and writing it again would only add
        // a generation.
        println!(
            "already finished: sum of 1..={} = {} (final checkpoint, generation {}, in {})",
            finished.iteration_count,
            finished
                .output
                .as_ref()
                .unwrap_or(&finished.partial_results),
            finished.generation,
            dir.join("incremental").display()
        );
        return Ok(());
    }
    let resumed = match latest {
        Some(cp) => Some((
            cp.iteration_count,
            serde_json::from_value::<Sum>(cp.partial_results)?,
        )),
        None => None,
    };
    let (start, mut state) = match resumed {
        Some((done, state)) => {
            println!(
                "resuming at iteration {done} (total so far {})",
                state.total
            );
            (done, state)
        }
        None => {
            println!(
                "no checkpoint in {}, starting at iteration 0",
                dir.display()
            );
            (0, Sum::default())
        }
    };

    for iteration in start..iterations {
        // The "expensive" work of one iteration.
        state.total += iteration + 1;
        std::thread::sleep(Duration::from_millis(50));
        // `iteration + 1` iterations are now complete.
        checkpointer.checkpoint(iteration + 1, &state)?;
    }
    checkpointer.finish(iterations, &state, Some(serde_json::json!(state.total)))?;
    println!(
        "sum of 1..={iterations} = {} (checkpoints in {})",
        state.total,
        dir.join("incremental").display()
    );
    Ok(())
}
