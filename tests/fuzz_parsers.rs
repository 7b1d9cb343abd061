//! Fuzz-style property tests of cairn's four input parsers: the task parser (`Task::parse`), the
//! checkpoint decoder (`decode_checkpoint`, and the lenient one behind `cairn checkpoint FILE`),
//! the worker channel's message parser (`runner::channel::parse_message`) and the control
//! request parser (`ControlRequest::parse`).
//!
//! Only a stable toolchain is available, so instead of coverage-guided `cargo fuzz` these are
//! proptest properties over arbitrary bytes, JSON-ish token soup, byte-level mutations
//! (truncate, flip, insert, delete, duplicate) of the seed corpora kept in `tests/corpus/<parser>/`,
//! and edits of the seeds parsed as JSON (a value replaced, removed or added), which reach the
//! type checks and validation. Every parser must return (never panic, never hang, never overflow
//! the stack) and whatever it accepts must satisfy its invariants (a task validates and
//! round-trips through its stored form, a checkpoint has this cairn's format version and
//! round-trips through `encode_checkpoint`, a request's task id is valid, ...).
//!
//! Corpus files are named `ok-*` (must parse) or `err-*` (must be refused); each is also checked
//! on its own.
//! A deeply nested document (100,000 `[`) must be refused by serde_json's recursion limit on a
//! 2 MiB stack, the size of the daemon's threads.
//!
//! The default case counts (2,000 per byte-level property, 1,000 per mutation property, 500 for
//! the checkpoint ones that compress every input) keep this file at about 5 s in a debug build,
//! 10 s with two cores busy. For a soak run, `PROPTEST_CASES` replaces every property's count:
//!
//! ```text
//! PROPTEST_CASES=300000 cargo test --release --test fuzz_parsers
//! ```
//!
//! A failing case is shrunk and saved in `tests/fuzz_parsers.proptest-regressions`, which is
//! replayed first on later runs (keep it in the repository once the cause is fixed).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cairn::queue::control::ControlRequest;
use cairn::runner::channel::{parse_message, Message};
use cairn::store::{decode_checkpoint, encode_checkpoint, IterationCheckpoint, FORMAT_VERSION};
use cairn::task::{Task, MAX_TASK_FILE_BYTES};
use cairn::task_id::TaskId;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::Value;

/// Cases for the cheap byte-level properties (most inputs fail at the first byte).
const BYTE_CASES: u32 = 2000;
/// Cases for the mutation properties (inputs get further, and some succeed and round-trip).
const MUTATION_CASES: u32 = 1000;
/// Cases for the checkpoint properties that compress every input first.
const GZIP_CASES: u32 = 500;
/// Longest any one call may take; a pure parser over a few KiB needs microseconds, so only a
/// blow-up (not a busy machine, even with an unoptimised build) comes near it.
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// `default` cases, or `PROPTEST_CASES` when set (for a soak run).
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(default);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// Run `f`, failing if it takes longer than [`CALL_LIMIT`].
fn timed<T>(what: &str, input: &[u8], f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let result = f();
    let took = start.elapsed();
    assert!(
        took < CALL_LIMIT,
        "{what} took {took:?} on {} bytes: {:?}",
        input.len(),
        String::from_utf8_lossy(&input[..input.len().min(200)])
    );
    result
}

// ---------------------------------------------------------------------------------------------
// The corpora
// ---------------------------------------------------------------------------------------------

fn corpus_dir(parser: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(parser)
}

/// Every file of a corpus: (name, bytes), sorted by name.
fn corpus(parser: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(parser);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| {
            let entry = entry.expect("a corpus entry");
            let name = entry.file_name().to_string_lossy().into_owned();
            let bytes = std::fs::read(entry.path()).expect("reading a corpus file");
            (name, bytes)
        })
        .collect();
    files.sort();
    assert!(
        files.iter().any(|(name, _)| name.starts_with("ok-"))
            && files.iter().any(|(name, _)| name.starts_with("err-")),
        "{} needs ok-* and err-* files",
        dir.display()
    );
    for (name, _) in &files {
        assert!(
            name.starts_with("ok-") || name.starts_with("err-"),
            "{}/{name}: corpus files are named ok-* or err-*",
            dir.display()
        );
    }
    files
}

/// The valid seeds of a corpus, the starting points of the mutation properties (read once).
fn seeds(parser: &'static str) -> &'static [Vec<u8>] {
    type Cache = Mutex<HashMap<&'static str, &'static [Vec<u8>]>>;
    static SEEDS: OnceLock<Cache> = OnceLock::new();
    let mut seeds = SEEDS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    seeds.entry(parser).or_insert_with(|| {
        let ok: Vec<Vec<u8>> = corpus(parser)
            .into_iter()
            .filter(|(name, _)| name.starts_with("ok-"))
            .map(|(_, bytes)| bytes)
            .collect();
        Vec::leak(ok)
    })
}

/// Corpus files that put a JSON array where an object belongs: serde would read a struct from
/// it by position, so every parser checks for objects first.
const ARRAYS_FOR_OBJECTS: &[(&str, &str)] = &[
    ("checkpoint", "err-array-for-object.json.gz"),
    // The version check looks for the `format_version` key, which an array has not.
    ("checkpoint", "err-array-version-2.json.gz"),
    ("control", "err-array-for-object.json"),
    ("channel", "err-top-level-array.jsonl"),
    ("channel", "err-checkpoint-as-array.jsonl"),
];

/// Check each corpus file's expected outcome; `parse` returns the error text on refusal.
fn check_corpus(parser: &str, parse: impl Fn(&[u8]) -> Result<(), String>) {
    let mut wrong = Vec::new();
    for (name, bytes) in corpus(parser) {
        let result = timed(&name, &bytes, || parse(&bytes));
        match (name.starts_with("ok-"), result) {
            (true, Err(e)) => wrong.push(format!("{name}: refused: {e}")),
            (false, Ok(())) => wrong.push(format!("{name}: accepted")),
            (false, Err(e)) => assert!(!e.is_empty(), "{name}: an empty error"),
            (true, Ok(())) => {}
        }
    }
    assert!(wrong.is_empty(), "corpus {parser}:\n{}", wrong.join("\n"));
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("compressing in memory");
    encoder.finish().expect("compressing in memory")
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("a corpus ok-* checkpoint is gzip");
    out
}

// ---------------------------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------------------------

/// Arbitrary bytes, up to 4 KiB.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..4096)
}

/// Pieces that make random input look like JSON, so that it gets past the first byte.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1.5e308",
    "1e999",
    "18446744073709551616",
    "-0",
    "\"a\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"é✓🦀\"",
    " ",
    "\n",
    "\u{0}",
    "\u{feff}",
    "\"phases\"",
    "\"name\"",
    "\"run\"",
    "\"kind\"",
    "\"loop\"",
    "\"items\"",
    "\"items_from\"",
    "\"worker\"",
    "\"id\"",
    "\"retry\"",
    "\"budget\"",
    "\"max_cost\"",
    "\"meta\"",
    "\"checkpoint\"",
    "\"iteration\"",
    "\"state\"",
    "\"progress\"",
    "\"done\"",
    "\"total\"",
    "\"cost\"",
    "\"output\"",
    "\"heartbeat\"",
    "\"action\"",
    "\"pause\"",
    "\"task_id\"",
    "\"requested_at\"",
    "\"2026-01-01T00:00:00Z\"",
    "\"30s\"",
    "\"format_version\"",
    "\"partial_results\"",
    "\"last_checkpoint_at\"",
    "\"t-1\"",
];

/// JSON-ish token soup.
fn token_soup() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..120)
        .prop_map(|tokens| tokens.concat().into_bytes())
}

/// One edit of an input.
#[derive(Debug, Clone)]
enum Mutation {
    /// Keep only the bytes before a point.
    Truncate(Index),
    /// XOR one byte with a non-zero mask.
    Flip(Index, u8),
    /// Insert random bytes at a point.
    Insert(Index, Vec<u8>),
    /// Insert a JSON-ish token at a point.
    InsertToken(Index, &'static str),
    /// Remove a run of bytes.
    Delete(Index, usize),
    /// Copy a run of bytes to just after itself (a duplicated field, element or key).
    Duplicate(Index, usize),
    /// Overwrite one byte with a byte that matters to JSON.
    Replace(Index, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), 1..=255u8).prop_map(|(at, mask)| Mutation::Flip(at, mask)),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        (any::<Index>(), prop::sample::select(TOKENS))
            .prop_map(|(at, token)| Mutation::InsertToken(at, token)),
        (any::<Index>(), 1..64usize).prop_map(|(at, len)| Mutation::Delete(at, len)),
        (any::<Index>(), 1..200usize).prop_map(|(at, len)| Mutation::Duplicate(at, len)),
        (
            any::<Index>(),
            prop::sample::select(&b"{}[],:\"\\0-e.9 \x00\xff"[..])
        )
            .prop_map(|(at, byte)| Mutation::Replace(at, byte)),
    ]
}

fn mutate(input: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut bytes = input.to_vec();
    for mutation in mutations {
        // Points range over 0..=len, bytes over 0..len.
        let point = |at: &Index, len: usize| at.index(len + 1);
        match mutation {
            Mutation::Truncate(at) => bytes.truncate(point(at, bytes.len())),
            Mutation::Flip(at, mask) if !bytes.is_empty() => {
                let i = at.index(bytes.len());
                bytes[i] ^= mask;
            }
            Mutation::Replace(at, byte) if !bytes.is_empty() => {
                let i = at.index(bytes.len());
                bytes[i] = *byte;
            }
            Mutation::Flip(..) | Mutation::Replace(..) => {}
            Mutation::Insert(at, new) => {
                let i = point(at, bytes.len());
                bytes.splice(i..i, new.iter().copied());
            }
            Mutation::InsertToken(at, token) => {
                let i = point(at, bytes.len());
                bytes.splice(i..i, token.bytes());
            }
            Mutation::Delete(at, len) => {
                let i = point(at, bytes.len());
                let end = (i + len).min(bytes.len());
                bytes.drain(i..end);
            }
            Mutation::Duplicate(at, len) => {
                let i = point(at, bytes.len());
                let end = (i + len).min(bytes.len());
                let copy = bytes[i..end].to_vec();
                bytes.splice(end..end, copy);
            }
        }
    }
    bytes
}

/// A seed (by index) and up to four edits of it.
fn mutations() -> impl Strategy<Value = (Index, Vec<Mutation>)> {
    (any::<Index>(), prop::collection::vec(mutation(), 1..5))
}

/// A JSON value to put somewhere in a seed: scalars of every kind, including the ones the parsers
/// give meaning to (kinds, durations, ids, times), and small containers.
fn json_value() -> impl Strategy<Value = Value> {
    let scalar = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0..5u64).prop_map(Value::from),
        any::<f64>().prop_map(Value::from), // NaN and infinities become null
        ".{0,12}".prop_map(Value::String),
        prop::sample::select(INTERESTING_STRINGS).prop_map(|s| Value::String(s.into())),
    ];
    scalar.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..4).prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

/// Strings the parsers interpret.
const INTERESTING_STRINGS: &[&str] = &[
    "",
    "a",
    "b",
    "once",
    "loop",
    "items",
    "worker",
    "pause",
    "resume",
    "cancel",
    "retry",
    "30s",
    "0s",
    "1y 2months",
    "18446744073709551615s",
    "t-1",
    "x.3",
    "../a",
    ".hidden",
    "é",
    "2026-01-01T00:00:00Z",
    "2016-12-31T23:59:60Z",
    "+262143-12-31T23:59:59Z",
    "true",
    "\0",
    "a=b",
];

/// Field names of all four formats, so that added keys are sometimes known ones.
const KEYS: &[&str] = &[
    "id",
    "priority",
    "cwd",
    "env",
    "retry",
    "max_attempts",
    "backoff",
    "max_backoff",
    "budget",
    "max_cost",
    "phases",
    "name",
    "kind",
    "run",
    "timeout",
    "max_iterations",
    "initial_state",
    "checkpoint_every",
    "items",
    "items_from",
    "concurrency",
    "heartbeat_timeout",
    "meta",
    "checkpoint",
    "iteration",
    "state",
    "progress",
    "done",
    "total",
    "cost",
    "output",
    "heartbeat",
    "ack",
    "action",
    "task_id",
    "requested_at",
    "format_version",
    "phase",
    "phase_index",
    "scope",
    "iteration_count",
    "checkpoint_interval",
    "partial_results",
    "last_checkpoint_at",
    "attempt",
    "generation",
    "surprise",
];

/// One edit of a parsed seed, at a node chosen by index (in pre-order).
#[derive(Debug, Clone)]
enum ValueEdit {
    /// Replace the node.
    Replace(Value),
    /// Remove the node from its parent.
    Remove,
    /// Set a key of the node (when it is an object) or push onto it (when an array).
    Add(&'static str, Value),
}

fn value_edits() -> impl Strategy<Value = (Index, Vec<(Index, ValueEdit)>)> {
    let edit = prop_oneof![
        json_value().prop_map(ValueEdit::Replace),
        Just(ValueEdit::Remove),
        (prop::sample::select(KEYS), json_value()).prop_map(|(k, v)| ValueEdit::Add(k, v)),
    ];
    (
        any::<Index>(),
        prop::collection::vec((any::<Index>(), edit), 1..4),
    )
}

fn count_nodes(value: &Value) -> usize {
    1 + match value {
        Value::Array(items) => items.iter().map(count_nodes).sum(),
        Value::Object(map) => map.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// Apply `edit` to the `n`th node below `value` (0 is `value` itself, which is only replaced or
/// added to). Returns true once applied.
fn edit_nth(value: &mut Value, n: &mut usize, edit: &ValueEdit) -> bool {
    if *n == 0 {
        match edit {
            ValueEdit::Replace(new) => *value = new.clone(),
            ValueEdit::Remove => {}
            ValueEdit::Add(key, new) => match value {
                Value::Object(map) => {
                    map.insert(key.to_string(), new.clone());
                }
                Value::Array(items) => items.push(new.clone()),
                _ => {}
            },
        }
        return true;
    }
    *n -= 1;
    match value {
        Value::Array(items) => {
            for i in 0..items.len() {
                if *n == 0 && matches!(edit, ValueEdit::Remove) {
                    items.remove(i);
                    return true;
                }
                if edit_nth(&mut items[i], n, edit) {
                    return true;
                }
            }
        }
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if *n == 0 && matches!(edit, ValueEdit::Remove) {
                    map.remove(&key);
                    return true;
                }
                if edit_nth(map.get_mut(&key).expect("a key just listed"), n, edit) {
                    return true;
                }
            }
        }
        _ => {}
    }
    false
}

/// A seed parsed as JSON, edited, and written back compactly or pretty.
fn edit_json(seed: &[u8], edits: &[(Index, ValueEdit)], pretty: bool) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(seed).ok()?;
    for (at, edit) in edits {
        let mut n = at.index(count_nodes(&value));
        edit_nth(&mut value, &mut n, edit);
    }
    let text = if pretty {
        serde_json::to_vec_pretty(&value)
    } else {
        serde_json::to_vec(&value)
    };
    text.ok()
}

/// Repeat one top-level field of a JSON object seed, so that the text has the key twice.
fn duplicate_field(seed: &[u8], which: &Index, changed: bool) -> Option<(String, Vec<u8>)> {
    let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(seed) else {
        return None;
    };
    let keys: Vec<&String> = object.keys().collect();
    if keys.is_empty() {
        return None;
    }
    let key = keys[which.index(keys.len())].clone();
    let value = if changed {
        Value::String("another value".into())
    } else {
        object[&key].clone()
    };
    let text = String::from_utf8(seed.to_vec()).ok()?;
    let end = text.rfind('}')?;
    let pair = format!(", {}: {}", Value::String(key.clone()), value);
    let mut doubled = text;
    doubled.insert_str(end, &pair);
    Some((key, doubled.into_bytes()))
}

// ---------------------------------------------------------------------------------------------
// The parsers, each with the invariants of what it accepts
// ---------------------------------------------------------------------------------------------

/// The task parser; an accepted task validates, has a valid id and round-trips through the form
/// intake stores in `tasks/<id>.json`.
fn task_checked(bytes: &[u8]) -> Result<(), String> {
    let task = match timed("Task::parse", bytes, || Task::parse(bytes)) {
        Ok(task) => task,
        Err(e) => return Err(e.to_string()),
    };
    let input = String::from_utf8_lossy(bytes);
    if let Err(e) = task.validate() {
        panic!("accepted a task that does not validate ({e}): {input:?}");
    }
    if let Some(id) = &task.id {
        if let Err(e) = TaskId::parse(id.as_str()) {
            panic!("accepted the id {id:?} ({e}): {input:?}");
        }
    }
    let stored = task.to_json_bytes();
    match Task::parse(&stored) {
        Ok(again) => assert_eq!(again, task, "stored form differs: {input:?}"),
        Err(e) => panic!("the stored form of an accepted task is refused ({e}): {input:?}"),
    }
    Ok(())
}

/// The strict checkpoint decoder; an accepted checkpoint has this cairn's format version and
/// re-encodes to bytes that decode to an equal value.
fn checkpoint_checked(bytes: &[u8]) -> Result<(), String> {
    let checkpoint = match timed("decode_checkpoint", bytes, || decode_checkpoint(bytes)) {
        Ok(checkpoint) => checkpoint,
        Err(e) => return Err(e.to_string()),
    };
    assert_checkpoint_round_trips(&checkpoint);
    Ok(())
}

fn assert_checkpoint_round_trips(checkpoint: &IterationCheckpoint) {
    assert_eq!(checkpoint.format_version, FORMAT_VERSION, "{checkpoint:?}");
    let encoded =
        encode_checkpoint(checkpoint).unwrap_or_else(|e| panic!("re-encoding {checkpoint:?}: {e}"));
    let again = decode_checkpoint(&encoded)
        .unwrap_or_else(|e| panic!("decoding the re-encoded {checkpoint:?}: {e}"));
    assert_eq!(&again, checkpoint);
}

/// The channel's message parser, given a line as the channel reads it (valid UTF-8, no
/// newline); an accepted message is a JSON object of known keys and holds what they say.
fn channel_checked(line: &str) -> Result<(), String> {
    let message: Message = timed("parse_message", line.as_bytes(), || parse_message(line))
        .map_err(|e| e.to_string())?;
    let value: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("accepted a line that is not JSON ({e}): {line:?}"));
    let Value::Object(object) = value else {
        // A positional array (see ARRAYS_FOR_OBJECTS); there are no keys to compare.
        assert!(
            value.is_array(),
            "accepted a line that is not an object: {line:?}"
        );
        return Ok(());
    };
    for key in object.keys() {
        assert!(
            [
                "checkpoint",
                "progress",
                "cost",
                "output",
                "heartbeat",
                "ack"
            ]
            .contains(&key.as_str()),
            "accepted an unknown key {key:?}: {line:?}"
        );
    }
    let present = |key: &str| object.get(key).is_some_and(|v| !v.is_null());
    assert_eq!(
        message.checkpoint.is_some(),
        present("checkpoint"),
        "{line:?}"
    );
    assert_eq!(message.progress.is_some(), present("progress"), "{line:?}");
    assert_eq!(message.cost.is_some(), present("cost"), "{line:?}");
    assert_eq!(message.output.is_some(), present("output"), "{line:?}");
    assert_eq!(
        message.heartbeat.is_some(),
        present("heartbeat"),
        "{line:?}"
    );
    assert_eq!(message.ack.is_some(), present("ack"), "{line:?}");
    if let Some(cost) = message.cost {
        assert!(cost.is_finite(), "{line:?}");
    }
    let checkpoint_is_object = object.get("checkpoint").is_some_and(Value::is_object);
    if let (Some(checkpoint), true) = (&message.checkpoint, checkpoint_is_object) {
        assert_eq!(
            object["checkpoint"]["iteration"].as_u64(),
            Some(checkpoint.iteration),
            "{line:?}"
        );
    }
    Ok(())
}

/// The channel parser on raw bytes: lines that are not UTF-8 never reach it (the channel's line
/// codec refuses them), so they are read lossily here.
fn channel_bytes_checked(bytes: &[u8]) -> Result<(), String> {
    channel_checked(&String::from_utf8_lossy(bytes))
}

/// The control request parser; an accepted request names a valid task id and round-trips
/// through the form `cairn pause` and the others write.
fn control_checked(bytes: &[u8]) -> Result<(), String> {
    let request = timed("ControlRequest::parse", bytes, || {
        ControlRequest::parse(bytes)
    })
    .map_err(|e| e.to_string())?;
    let input = String::from_utf8_lossy(bytes);
    if let Err(e) = TaskId::parse(request.task_id.as_str()) {
        panic!(
            "accepted the task id {:?} ({e}): {input:?}",
            request.task_id
        );
    }
    let written = serde_json::to_vec(&request).expect("serializing a request");
    match ControlRequest::parse(&written) {
        Ok(again) => assert_eq!(again, request, "{input:?}"),
        Err(e) => panic!("the written form of an accepted request is refused ({e}): {input:?}"),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// (c) Every corpus file gives its expected outcome
// ---------------------------------------------------------------------------------------------

#[test]
fn task_corpus() {
    check_corpus("task", task_checked);
}

#[test]
fn checkpoint_corpus() {
    check_corpus("checkpoint", checkpoint_checked);
}

#[test]
fn channel_corpus() {
    check_corpus("channel", |bytes| {
        let line = std::str::from_utf8(bytes).expect("channel corpus files are UTF-8 lines");
        channel_checked(line)
    });
}

#[test]
fn control_corpus() {
    check_corpus("control", control_checked);
}

#[test]
fn arrays_in_place_of_objects_are_refused() {
    let mut accepted = Vec::new();
    for (parser, name) in ARRAYS_FOR_OBJECTS {
        let bytes = std::fs::read(corpus_dir(parser).join(name)).expect("a corpus file");
        let result = match *parser {
            "checkpoint" => decode_checkpoint(&bytes)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            "control" => ControlRequest::parse(&bytes)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            "channel" => parse_message(&String::from_utf8_lossy(&bytes))
                .map(|_| ())
                .map_err(|e| e.to_string()),
            other => panic!("no parser {other}"),
        };
        if result.is_ok() {
            accepted.push(format!("{parser}/{name}"));
        }
    }
    assert!(accepted.is_empty(), "accepted: {accepted:?}");
}

/// The lenient decoder behind `cairn checkpoint FILE` is private; run the binary on every
/// checkpoint corpus file. It reads more than the strict decoder (several gzip members, the
/// Python pattern's six fields, other versions), so only a crash is a failure there, and every
/// file the strict decoder accepts must print.
#[test]
fn lenient_checkpoint_decoder_on_the_corpus() {
    let queue = tempfile::tempdir().expect("a temporary queue directory");
    let mut wrong = Vec::new();
    for (name, _) in corpus("checkpoint") {
        let path = corpus_dir("checkpoint").join(&name);
        let output = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .arg("--queue")
            .arg(queue.path())
            .arg("checkpoint")
            .arg(&path)
            .env_remove("CAIRN_QUEUE")
            .env_remove("RUST_LOG")
            .output()
            .expect("running cairn checkpoint");
        let stderr = String::from_utf8_lossy(&output.stderr);
        match output.status.code() {
            Some(0) => {}
            Some(1) if !name.starts_with("ok-") => {}
            other => wrong.push(format!("{name}: exit {other:?}: {stderr}")),
        }
        if stderr.contains("panicked") {
            wrong.push(format!("{name}: {stderr}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Deep nesting, huge inputs
// ---------------------------------------------------------------------------------------------

/// Run `f` on a thread with the 2 MiB stack of the daemon's threads, so that unbounded recursion
/// shows as a crash of this test binary.
fn on_daemon_sized_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(f)
        .expect("starting a thread")
        .join()
        .expect("the parser panicked");
}

/// 100,000 levels of arrays and of objects, bare (refused early by the typed parsers) and in a
/// field that takes any JSON (where only serde_json's recursion limit stops the descent); the
/// flag says which.
fn deep_documents(field_prefix: &str, field_suffix: &str) -> Vec<(Vec<u8>, bool)> {
    const DEPTH: usize = 100_000;
    let arrays = "[".repeat(DEPTH);
    let closed_arrays = format!("{arrays}1{}", "]".repeat(DEPTH));
    let objects = format!("{}1{}", "{\"a\":".repeat(DEPTH), "}".repeat(DEPTH));
    vec![
        (arrays.clone().into_bytes(), false),
        (closed_arrays.clone().into_bytes(), false),
        (objects.clone().into_bytes(), false),
        (
            format!("{field_prefix}{closed_arrays}{field_suffix}").into_bytes(),
            true,
        ),
        (
            format!("{field_prefix}{objects}{field_suffix}").into_bytes(),
            true,
        ),
        (format!("{field_prefix}{arrays}").into_bytes(), true),
    ]
}

fn assert_deep_refused(what: &str, in_field: bool, result: Result<(), String>) {
    let err = result.expect_err(what);
    assert!(!err.is_empty(), "{what}: an empty error");
    if in_field {
        assert!(err.contains("recursion limit"), "{what}: {err}");
    }
}

#[test]
fn deep_nesting_is_an_error_not_a_stack_overflow() {
    on_daemon_sized_stack(|| {
        let task = r#"{"phases":[{"name":"a","run":["x"]}],"meta":"#;
        for (doc, in_field) in deep_documents(task, "}") {
            let result = Task::parse(&doc).map(|_| ()).map_err(|e| e.to_string());
            assert_deep_refused("a 100,000-deep task", in_field, result);
        }
        for (doc, in_field) in deep_documents(r#"{"output":"#, "}") {
            let line = String::from_utf8(doc).expect("ASCII");
            let result = parse_message(&line).map(|_| ()).map_err(|e| e.to_string());
            if let Err(err) = &result {
                assert!(err.len() < 1024, "the error quotes the whole line");
            }
            assert_deep_refused("a 100,000-deep channel line", in_field, result);
        }
        // A request has no field that takes any JSON: all are refused at the first level.
        for (doc, _) in deep_documents(r#"{"action":"#, "}") {
            let result = ControlRequest::parse(&doc)
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_deep_refused("a 100,000-deep request", false, result);
        }
        let template = serde_json::json!({
            "format_version": 1, "task_id": "t", "phase": "p", "phase_index": 0, "scope": "loop",
            "iteration_count": 1, "checkpoint_interval": 1, "partial_results": "STATE",
            "last_checkpoint_at": "2026-01-01T00:00:00Z", "attempt": 1, "generation": 1,
        })
        .to_string();
        let (prefix, suffix) = template.split_once("\"STATE\"").expect("the placeholder");
        for (doc, _) in deep_documents(prefix, suffix) {
            // The decoder reads a `Value` first, so every one of them meets the limit.
            let result = decode_checkpoint(&gzip(&doc))
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_deep_refused("a 100,000-deep checkpoint", true, result);
        }
    });
}

#[test]
fn nesting_within_the_limit_is_accepted() {
    on_daemon_sized_stack(|| {
        let nested = format!("{}null{}", "[".repeat(100), "]".repeat(100));
        let task = format!(r#"{{"phases":[{{"name":"a","run":["x"]}}],"meta":{nested}}}"#);
        task_checked(task.as_bytes()).expect("a task with 100-deep meta");
        channel_checked(&format!(r#"{{"output":{nested}}}"#)).expect("a 100-deep output");
    });
}

#[test]
fn huge_channel_lines_are_parsed_or_refused_with_a_short_error() {
    // The channel reads lines of up to 64 MiB; these are 8 MiB.
    let big = "x".repeat(8 << 20);
    let line = format!(r#"{{"output":"{big}"}}"#);
    let message = parse_message(&line).expect("an 8 MiB output");
    assert_eq!(
        message.output.and_then(|v| v.as_str().map(str::len)),
        Some(big.len())
    );
    let err = parse_message(&big)
        .expect_err("8 MiB of garbage")
        .to_string();
    assert!(
        err.len() < 1024,
        "the error quotes the whole line: {} bytes",
        err.len()
    );
    let err = parse_message(&line[..line.len() - 2])
        .expect_err("a truncated 8 MiB line")
        .to_string();
    assert!(
        err.len() < 1024,
        "the error quotes the whole line: {} bytes",
        err.len()
    );
}

#[test]
fn oversized_task_files_are_refused_unread() {
    let mut bytes = br#"{"phases":[{"name":"a","run":["x"]}],"meta":""#.to_vec();
    bytes.resize(MAX_TASK_FILE_BYTES as usize + 1, b'x');
    let err = Task::parse(&bytes).expect_err("a file over the limit");
    assert!(err.problem.contains("larger than the limit"), "{err}");
}

/// Intake accepts a task file up to [`MAX_TASK_FILE_BYTES`] and stores it pretty-printed in
/// `tasks/<id>.json`, which the daemon parses again (with the same limit) whenever the task
/// runs. A compact file under the limit can grow past it when pretty-printed.
#[test]
fn a_task_accepted_near_the_size_limit_can_be_read_back_from_its_stored_form() {
    let mut text = String::from(r#"{"phases":[{"name":"a","run":["x"]}],"meta":[0"#);
    while text.len() < (MAX_TASK_FILE_BYTES as usize) * 3 / 4 {
        text.push_str(",0");
    }
    text.push_str("]}");
    let task = Task::parse(text.as_bytes()).expect("a compact task under the limit");
    let stored = task.to_json_bytes();
    assert!(
        Task::parse_stored(&stored).is_ok(),
        "the stored form is {} bytes (the input was {})",
        stored.len(),
        text.len()
    );
}

// ---------------------------------------------------------------------------------------------
// (a) Arbitrary bytes and (b) mutations of the seeds
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(config(BYTE_CASES))]

    #[test]
    fn task_parser_survives_arbitrary_bytes(input in bytes()) {
        let _ = task_checked(&input);
    }

    #[test]
    fn task_parser_survives_token_soup(input in token_soup()) {
        let _ = task_checked(&input);
    }

    #[test]
    fn checkpoint_decoder_survives_arbitrary_bytes(input in bytes()) {
        let _ = checkpoint_checked(&input);
    }

    #[test]
    fn channel_parser_survives_arbitrary_bytes(input in bytes()) {
        let _ = channel_bytes_checked(&input);
    }

    #[test]
    fn channel_parser_survives_arbitrary_strings(line in ".{0,2000}") {
        let _ = channel_checked(&line);
    }

    #[test]
    fn channel_parser_survives_token_soup(input in token_soup()) {
        let _ = channel_bytes_checked(&input);
    }

    #[test]
    fn control_parser_survives_arbitrary_bytes(input in bytes()) {
        let _ = control_checked(&input);
    }

    #[test]
    fn control_parser_survives_token_soup(input in token_soup()) {
        let _ = control_checked(&input);
    }
}

proptest! {
    #![proptest_config(config(MUTATION_CASES))]

    #[test]
    fn task_parser_survives_mutated_seeds((seed, edits) in mutations()) {
        let seeds = seeds("task");
        let _ = task_checked(&mutate(&seeds[seed.index(seeds.len())], &edits));
    }

    #[test]
    fn channel_parser_survives_mutated_seeds((seed, edits) in mutations()) {
        let seeds = seeds("channel");
        let _ = channel_bytes_checked(&mutate(&seeds[seed.index(seeds.len())], &edits));
    }

    #[test]
    fn control_parser_survives_mutated_seeds((seed, edits) in mutations()) {
        let seeds = seeds("control");
        let _ = control_checked(&mutate(&seeds[seed.index(seeds.len())], &edits));
    }

    /// Edits of the parsed seeds (a value replaced, removed or added): inputs that are valid
    /// JSON, so that they reach the type checks and validation, and often pass them.
    #[test]
    fn parsers_survive_edited_json(
        parser in prop::sample::select(&["task", "channel", "control", "checkpoint"][..]),
        (seed, edits) in value_edits(),
        pretty in any::<bool>(),
    ) {
        let seeds = seeds(parser);
        let seed = &seeds[seed.index(seeds.len())];
        if parser == "checkpoint" {
            if let Some(json) = edit_json(&gunzip(seed), &edits, pretty) {
                let _ = checkpoint_checked(&gzip(&json));
            }
        } else if let Some(input) = edit_json(seed, &edits, pretty) {
            let _ = match parser {
                "task" => task_checked(&input),
                "channel" => channel_bytes_checked(&input),
                _ => control_checked(&input),
            };
        }
    }

    /// serde's derived structs refuse a field given twice, whatever its value.
    #[test]
    fn a_duplicated_field_is_refused(seed in any::<Index>(), which in any::<Index>(), changed in any::<bool>()) {
        for (parser, check) in [
            ("task", task_checked as fn(&[u8]) -> Result<(), String>),
            ("channel", channel_bytes_checked),
            ("control", control_checked),
        ] {
            let seeds = seeds(parser);
            let seed = &seeds[seed.index(seeds.len())];
            if let Some((key, doubled)) = duplicate_field(seed, &which, changed) {
                let result = check(&doubled);
                prop_assert!(
                    result.is_err(),
                    "{} accepted {:?} twice: {}", parser, key, String::from_utf8_lossy(&doubled)
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(config(GZIP_CASES))]

    /// Mutations of the compressed bytes: the gzip layer (CRC, length, trailing bytes) must catch
    /// them, or what decodes must still be a whole, valid checkpoint.
    #[test]
    fn checkpoint_decoder_survives_mutated_files((seed, edits) in mutations()) {
        let seeds = seeds("checkpoint");
        let _ = checkpoint_checked(&mutate(&seeds[seed.index(seeds.len())], &edits));
    }

    /// Mutations of the JSON inside an intact gzip stream, which reach the JSON and version checks.
    #[test]
    fn checkpoint_decoder_survives_mutated_json((seed, edits) in mutations()) {
        let seeds = seeds("checkpoint");
        let json = gunzip(&seeds[seed.index(seeds.len())]);
        let _ = checkpoint_checked(&gzip(&mutate(&json, &edits)));
    }

    #[test]
    fn checkpoint_decoder_survives_compressed_garbage(input in prop_oneof![bytes(), token_soup()]) {
        let _ = checkpoint_checked(&gzip(&input));
    }
}
