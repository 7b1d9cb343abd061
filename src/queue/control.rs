//! Control requests: `control/<time>-<random>.json` files that the CLI writes (atomically) and
//! the daemon takes, applies and removes — pause, resume, cancel and retry of one task. A
//! request written while no daemon runs is applied when the next one starts.

use std::io;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::store::Storage;

/// What an operator asks of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ControlAction {
    Pause,
    Resume,
    Cancel,
    Retry,
}

impl ControlAction {
    pub fn as_str(self) -> &'static str {
        match self {
            ControlAction::Pause => "pause",
            ControlAction::Resume => "resume",
            ControlAction::Cancel => "cancel",
            ControlAction::Retry => "retry",
        }
    }
}

/// One request file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlRequest {
    pub action: ControlAction,
    pub task_id: String,
    pub requested_at: DateTime<Utc>,
}

impl ControlRequest {
    pub fn new(action: ControlAction, task_id: &str) -> Self {
        ControlRequest {
            action,
            task_id: task_id.to_string(),
            requested_at: Utc::now(),
        }
    }

    /// Parse a request file's bytes; the error says what is wrong.
    pub fn parse(bytes: &[u8]) -> Result<ControlRequest, String> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not a control request: {e}"))?;
        // serde would read the struct from an array by position.
        if !value.is_object() {
            return Err("not a control request: it must be a JSON object".into());
        }
        // Parsed again from the bytes, so that a field given twice is refused.
        let request: ControlRequest =
            serde_json::from_slice(bytes).map_err(|e| format!("not a control request: {e}"))?;
        crate::task::validate_id(&request.task_id).map_err(|e| format!("task_id: {e}"))?;
        Ok(request)
    }
}

/// Write a request durably into `control/`; returns its storage key. Names sort by time, so
/// requests are applied in the order they were made.
pub fn submit(storage: &dyn Storage, request: &ControlRequest) -> io::Result<String> {
    let nanos = request
        .requested_at
        .timestamp_nanos_opt()
        .unwrap_or_default();
    let key = format!(
        "control/{nanos:020}-{}-{}.json",
        crate::task::random_suffix(),
        request.action.as_str()
    );
    let bytes = serde_json::to_vec(request).map_err(io::Error::other)?;
    storage.put(&key, &bytes, None)?;
    Ok(key)
}

/// The requests waiting in `control/`, oldest first, each parsed or with why it is not valid.
pub fn pending(storage: &dyn Storage) -> io::Result<Vec<(String, Result<ControlRequest, String>)>> {
    let mut requests = Vec::new();
    for name in storage.list("control")? {
        if !name.ends_with(".json") {
            continue;
        }
        let key = format!("control/{name}");
        let parsed = match storage.get(&key)? {
            Some(bytes) => ControlRequest::parse(&bytes),
            None => continue,
        };
        requests.push((key, parsed));
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let request = ControlRequest::new(ControlAction::Pause, "t-1");
        let bytes = serde_json::to_vec(&request).unwrap();
        assert_eq!(ControlRequest::parse(&bytes).unwrap(), request);
        assert!(ControlRequest::parse(b"{}").is_err());
        assert!(ControlRequest::parse(
            br#"{"action":"explode","task_id":"a","requested_at":"2026-01-01T00:00:00Z"}"#
        )
        .is_err());
        assert!(ControlRequest::parse(
            br#"{"action":"pause","task_id":"../a","requested_at":"2026-01-01T00:00:00Z"}"#
        )
        .is_err());
    }
}
