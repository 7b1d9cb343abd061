//! The README's embedding example, whole: a loop of your own program checkpointed with cairn's
//! library. Run it, interrupt it (Ctrl-C), run it again in the same directory: it continues
//! after the last completed iteration. `cargo run --release -p embed`

use cairn::{CheckpointStore, LoopCheckpointer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A directory of its own, not a daemon's queue: there, `cairn prune` would remove these
    // checkpoints, which belong to no task of the queue, as orphans.
    let store = CheckpointStore::open("my-job-checkpoints")?;
    let mut loop_cp = LoopCheckpointer::new(store, "my-job", "epochs").every(1);
    let (start, mut total): (u64, u64) = loop_cp.resume()?.unwrap_or((0, 0));
    for i in start..100 {
        total += i; // the expensive step
        loop_cp.checkpoint(i + 1, &total)?; // i + 1 iterations are complete
    }
    loop_cp.flush()?;
    println!("total {total} (started at iteration {start})");
    Ok(())
}
