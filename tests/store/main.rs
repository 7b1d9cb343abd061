//! The checkpoint store as a library: its API, and what a failed, crashed or torn write or a
//! power cut at any file operation leaves for a restart. The file operations are the test
//! doubles of the `test-doubles` feature (`FaultyFileOps`, `PowerLossFileOps`).
//!
//! Run one area with `cargo test --test store power_loss::`.

#[path = "../common/temp_files.rs"]
mod temp_files;

mod api;
mod crash_sequences;
mod faults;
mod files;
mod power_loss;
