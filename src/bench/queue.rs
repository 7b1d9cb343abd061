//! `cairn bench queue`: queue throughput, pickup latency, loop overhead, resume time, memory.

use clap::Args;

/// Options of `cairn bench queue`.
#[derive(Debug, Args)]
pub struct QueueArgs {}

/// Run the queue benchmarks; returns the process exit code.
pub fn run(_args: QueueArgs) -> u8 {
    eprintln!("error: cairn bench queue is not built yet");
    crate::cli::exit::FAILURE
}
