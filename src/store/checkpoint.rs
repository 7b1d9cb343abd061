//! The iteration checkpoint's on-disk format: gzip of JSON, with a format version.
//!
//! The field names follow the published incremental-checkpoint pattern (`task_id`, `phase`,
//! `iteration_count`, `checkpoint_interval`, `partial_results`, `last_checkpoint_at`), so its
//! users can read cairn's files with the tools they already have (`zcat`, `jq`).
//!
//! Decoding is strict on purpose: a truncated stream, a bad CRC or length trailer, bytes after
//! the gzip stream, invalid JSON, unknown fields or an unsupported version are all errors, so a
//! damaged file is reported and skipped instead of being read as a wrong checkpoint.

use std::collections::BTreeMap;
use std::io::{self, Read};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::blobs::StoredFile;

/// The format version this cairn writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// One loop's progress: how many iterations are done and the state after them.
///
/// The state is a JSON value when read back; a writer may hold it in any serializable form
/// (the loop checkpointer keeps it as already-serialized JSON, so a large state is serialized
/// once per save instead of being converted to a value tree first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IterationCheckpoint<S = serde_json::Value> {
    /// The on-disk format version ([`FORMAT_VERSION`] when written by this cairn).
    pub format_version: u32,
    /// The task this checkpoint belongs to; also names its file.
    pub task_id: String,
    /// The name of the phase whose loop this is.
    pub phase: String,
    /// The phase's position in the task (names may repeat; positions do not).
    pub phase_index: usize,
    /// Which loop this belongs to: "loop" for the daemon's loop phases; any name for embedding
    /// programs.
    pub scope: String,
    /// Completed iterations; also the 0-based index of the next iteration to run.
    pub iteration_count: u64,
    /// Checkpoints are written every this many completed iterations.
    pub checkpoint_interval: u64,
    /// The loop's state after `iteration_count` iterations.
    pub partial_results: S,
    /// When this checkpoint was written (RFC 3339, UTC).
    pub last_checkpoint_at: DateTime<Utc>,
    /// Which attempt of the task wrote it (1 for the first run).
    pub attempt: u32,
    /// Counts the task's checkpoint writes, so older generations can be told apart.
    pub generation: u64,
    /// True when the loop has finished (a reply said done, or max_iterations was reached).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
    /// The loop's result when `done` (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<serde_json::Value>,
    /// The task's summed cost as of this checkpoint, when its commands report costs.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "finite_cost"
    )]
    pub cost: Option<f64>,
    /// The files this checkpoint names, by the name the command gave each: where each goes in
    /// the task's scratch directory and which blob holds it (see `store::blobs`). Absent in
    /// checkpoints that name none, so older files read as naming none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, StoredFile>,
}

#[cfg(test)]
impl IterationCheckpoint {
    /// A first attempt's loop checkpoint of `task_id` after `iterations`, its state
    /// `{"iteration": iterations}`, not yet numbered (unit tests).
    pub(crate) fn of_loop(task_id: &str, iterations: u64) -> IterationCheckpoint {
        IterationCheckpoint {
            format_version: FORMAT_VERSION,
            task_id: task_id.into(),
            phase: "loop".into(),
            phase_index: 0,
            scope: "loop".into(),
            iteration_count: iterations,
            checkpoint_interval: 1,
            partial_results: serde_json::json!({ "iteration": iterations }),
            last_checkpoint_at: chrono::Utc::now(),
            attempt: 1,
            generation: 0,
            done: false,
            output: None,
            cost: None,
            files: BTreeMap::new(),
        }
    }
}

impl IterationCheckpoint {
    /// Make this checkpoint the start of another task, `new_id`: its state merged with
    /// `patch` (RFC 7386: objects merged key by key, `null` removes a key), not done, with no
    /// output, attempt or cost of the old task's; it keeps the files the checkpoint names, so
    /// the new task resumes with them. `cairn fork` and the Python package's
    /// `CheckpointStore.fork` both start from this.
    pub fn fork_as(&mut self, new_id: &str, patch: Option<&serde_json::Value>) {
        if let Some(patch) = patch {
            json_patch::merge(&mut self.partial_results, patch);
        }
        self.task_id = new_id.to_owned();
        self.done = false;
        self.output = None;
        self.attempt = 0;
        self.cost = None;
    }
}

impl<S> IterationCheckpoint<S> {
    /// The same checkpoint holding `state` instead (a sink takes the state serialized once).
    pub fn with_state<T>(&self, state: T) -> IterationCheckpoint<T> {
        IterationCheckpoint {
            format_version: self.format_version,
            task_id: self.task_id.clone(),
            phase: self.phase.clone(),
            phase_index: self.phase_index,
            scope: self.scope.clone(),
            iteration_count: self.iteration_count,
            checkpoint_interval: self.checkpoint_interval,
            partial_results: state,
            last_checkpoint_at: self.last_checkpoint_at,
            attempt: self.attempt,
            generation: self.generation,
            done: self.done,
            output: self.output.clone(),
            cost: self.cost,
            files: self.files.clone(),
        }
    }
}

/// A cost read back must be one a checkpoint can hold: JSON has no infinity, so a number too
/// large for an `f64` (`1e999`) would parse as infinite and be written back as `null`, a
/// different checkpoint. Such a file is refused instead.
fn finite_cost<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    let cost = Option::<f64>::deserialize(deserializer)?;
    match cost {
        Some(value) if !value.is_finite() => Err(serde::de::Error::custom(
            "cost is out of range (larger than a 64-bit float holds)",
        )),
        _ => Ok(cost),
    }
}

/// Why a checkpoint could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The gzip layer is damaged: bad header, corrupt data, or a CRC/length trailer mismatch.
    #[error("gzip stream is corrupt or truncated (CRC/length check failed): {0}")]
    Gzip(#[source] std::io::Error),
    /// Bytes follow the end of the gzip stream: the file is not one whole checkpoint.
    #[error("{0} unexpected bytes after the end of the gzip stream (file damaged or appended to)")]
    TrailingBytes(usize),
    /// The decompressed content is not a valid checkpoint JSON document.
    #[error("checkpoint JSON is invalid: {0}")]
    Json(#[source] serde_json::Error),
    /// The file was written in a format this cairn does not read.
    #[error(
        "checkpoint format version {found} is not supported (this cairn reads version \
         {supported}); use the cairn version that wrote it"
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u32,
        /// The version this cairn reads.
        supported: u32,
    },
    /// The file decodes, but belongs to another task (a misplaced or copied file).
    #[error("checkpoint belongs to task {found:?}, but task {expected:?} was expected")]
    WrongTask {
        /// The task whose checkpoint was asked for.
        expected: String,
        /// The task named inside the file.
        found: String,
    },
    /// An older generation's file holds a later checkpoint than its name gives: the file was
    /// being reused for a later save when the machine went down. It is not that generation.
    #[error(
        "the file is named generation {named} but holds generation {found} (left by a save \
         that was interrupted); it is not generation {named}"
    )]
    NotItsGeneration {
        /// The generation the file's name gives.
        named: u64,
        /// The generation recorded inside.
        found: u64,
    },
    /// Serializing or compressing failed (nothing was written).
    #[error("encoding the checkpoint failed: {0}")]
    Encode(#[source] std::io::Error),
}

/// Encode `cp` as the bytes of a checkpoint file: JSON, gzip-compressed, stream finished.
pub fn encode_checkpoint<S: Serialize>(
    cp: &IterationCheckpoint<S>,
) -> Result<Vec<u8>, CheckpointError> {
    // Serialized straight into the compressor, which works on full blocks while the rest is
    // serialized. The stream is finished, CRC and length trailer included; without them the
    // file would not decode.
    super::gzip::gzip_with(|w| serde_json::to_writer(w, cp).map_err(io::Error::from))
        .map_err(CheckpointError::Encode)
}

/// Decode a checkpoint file's bytes, verifying the gzip trailer, the JSON and the version.
pub fn decode_checkpoint(bytes: &[u8]) -> Result<IterationCheckpoint, CheckpointError> {
    // The bufread decoder consumes exactly one gzip member from the slice, so what is left
    // afterwards is trailing garbage. `read_to_end` checks the CRC32 and ISIZE trailer and
    // fails with UnexpectedEof on a truncated stream.
    let mut decoder = flate2::bufread::GzDecoder::new(bytes);
    let mut json = Vec::new();
    decoder
        .read_to_end(&mut json)
        .map_err(CheckpointError::Gzip)?;
    let rest = decoder.into_inner();
    if !rest.is_empty() {
        return Err(CheckpointError::TrailingBytes(rest.len()));
    }
    // Look at the version before the strict parse, so a newer file (which may have new fields)
    // reports its version rather than an "unknown field" error.
    let value: serde_json::Value = serde_json::from_slice(&json).map_err(CheckpointError::Json)?;
    // serde would read the struct from an array by position, skipping every check by name.
    if !value.is_object() {
        return Err(CheckpointError::Json(serde::de::Error::custom(
            "a checkpoint must be a JSON object",
        )));
    }
    if let Some(found) = value.get("format_version").and_then(|v| v.as_u64()) {
        if found != u64::from(FORMAT_VERSION) {
            return Err(CheckpointError::UnsupportedVersion {
                found: u32::try_from(found).unwrap_or(u32::MAX),
                supported: FORMAT_VERSION,
            });
        }
    }
    serde_json::from_value(value).map_err(CheckpointError::Json)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use flate2::write::GzEncoder;
    use flate2::Compression;

    use chrono::DateTime;

    use super::{
        decode_checkpoint, encode_checkpoint, CheckpointError, IterationCheckpoint, FORMAT_VERSION,
    };

    #[test]
    fn a_cost_too_large_for_a_float_is_refused_not_turned_into_null() {
        let mut checkpoint = sample();
        checkpoint.cost = Some(1.5);
        let encoded = encode_checkpoint(&checkpoint).unwrap();
        let mut json = String::new();
        flate2::read::GzDecoder::new(&encoded[..])
            .read_to_string(&mut json)
            .unwrap();
        let json = json.replace("1.5", "1e999");
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(json.as_bytes()).unwrap();
        let err = decode_checkpoint(&gz.finish().unwrap()).unwrap_err();
        assert!(err.to_string().contains("cost is out of range"), "{err}");
        // A cost in range still round-trips.
        assert_eq!(decode_checkpoint(&encoded).unwrap().cost, Some(1.5));
    }

    fn sample() -> IterationCheckpoint {
        IterationCheckpoint {
            format_version: FORMAT_VERSION,
            task_id: "t1".into(),
            phase: "supervise".into(),
            phase_index: 2,
            scope: "loop".into(),
            iteration_count: 4,
            checkpoint_interval: 1,
            partial_results: serde_json::json!({"sum": 10}),
            last_checkpoint_at: DateTime::from_timestamp(1_700_000_000, 5).unwrap(),
            attempt: 1,
            generation: 7,
            done: false,
            output: None,
            cost: None,
            files: Default::default(),
        }
    }

    #[test]
    fn round_trips_and_omits_done_fields_while_running() {
        let cp = sample();
        let bytes = encode_checkpoint(&cp).unwrap();
        assert_eq!(decode_checkpoint(&bytes).unwrap(), cp);
        let mut json = String::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_string(&mut json)
            .unwrap();
        assert!(!json.contains("\"done\""), "{json}");
        assert!(!json.contains("\"output\""), "{json}");
        assert!(json.contains("\"last_checkpoint_at\":\"2023-11-14T22:13:20.000000005Z\""));

        let finished = IterationCheckpoint {
            done: true,
            output: Some(serde_json::json!([1, 2])),
            ..cp
        };
        let bytes = encode_checkpoint(&finished).unwrap();
        assert_eq!(decode_checkpoint(&bytes).unwrap(), finished);
    }

    #[test]
    fn unknown_fields_are_an_error() {
        let mut value = serde_json::to_value(sample()).unwrap();
        value["surprise"] = serde_json::json!(1);
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(value.to_string().as_bytes()).unwrap();
        let err = decode_checkpoint(&encoder.finish().unwrap()).unwrap_err();
        assert!(matches!(err, CheckpointError::Json(_)), "{err}");
        assert!(err.to_string().contains("surprise"), "{err}");
    }
}
