//! cairn: a checkpointing queue runner.
pub mod store;
