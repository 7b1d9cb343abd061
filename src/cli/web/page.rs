//! One page of the task table, cut from a status document: the first screen of a queue of
//! 10,000 tasks need not carry 10,000 rows, but its counts by state must be exact. A request
//! names a filter (state, submitter) and a window (offset, limit); the answer is the status
//! document with `tasks` cut to the window, and beside it the counts by state of the whole
//! queue, the submitters to filter by, how many tasks match, and the recent rejections.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{json, Map, Value};

/// The most rows one answer carries.
pub(super) const MAX_LIMIT: usize = 1000;

/// `/api/status?state=…&submitter=…&offset=…&limit=…`; without `limit`, the whole document.
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct PageQuery {
    pub state: Option<String>,
    pub submitter: Option<String>,
    pub offset: Option<usize>,
    pub limit: Option<usize>,
}

impl PageQuery {
    /// Whether the query asks for a page rather than the whole document.
    pub(super) fn is_page(&self) -> bool {
        self.limit.is_some()
    }
}

/// How the page names a submitter: the user name, else the uid.
pub(super) fn submitter_name(task: &Value) -> Option<String> {
    let by = &task["submitted_by"];
    by["user"]
        .as_str()
        .map(str::to_string)
        .or_else(|| by["uid"].as_u64().map(|uid| uid.to_string()))
}

/// Whether `who` (a user name or a uid) submitted the task.
pub(super) fn submitted_by(task: &Value, who: &str) -> bool {
    let by = &task["submitted_by"];
    by["user"].as_str() == Some(who)
        || by["uid"].as_u64().map(|u| u.to_string()).as_deref() == Some(who)
}

/// The page `query` asks for, of the status `document`.
pub(super) fn page(document: &Value, query: &PageQuery) -> Value {
    let tasks: &[Value] = document["tasks"].as_array().map_or(&[], Vec::as_slice);
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut submitters = BTreeSet::new();
    let mut rejections = Vec::new();
    let mut matching = Vec::new();
    for task in tasks {
        let state = task["state"].as_str().unwrap_or("");
        if state == "rejected" {
            rejections.push(task);
            continue;
        }
        *counts.entry(state.to_string()).or_default() += 1;
        let submitter = submitter_name(task);
        if let Some(name) = &submitter {
            submitters.insert(name.clone());
        }
        let state_matches = query
            .state
            .as_deref()
            .is_none_or(|s| s.is_empty() || s == state);
        let submitter_matches = query
            .submitter
            .as_deref()
            .is_none_or(|s| s.is_empty() || submitted_by(task, s));
        if state_matches && submitter_matches {
            matching.push(task);
        }
    }
    // Every rejection counts, not only the recent ones listed.
    let rejected = document["rejected"]
        .as_u64()
        .unwrap_or(rejections.len() as u64);
    if rejected > 0 {
        counts.insert("rejected".to_string(), rejected);
    }
    let offset = query.offset.unwrap_or(0).min(matching.len());
    let limit = query.limit.unwrap_or(MAX_LIMIT).min(MAX_LIMIT);
    let rows: Vec<Value> = matching
        .iter()
        .skip(offset)
        .take(limit)
        .map(|task| (*task).clone())
        .collect();
    let mut answer = Map::new();
    if let Value::Object(fields) = document {
        for (key, value) in fields.iter().filter(|(key, _)| *key != "tasks") {
            answer.insert(key.clone(), value.clone());
        }
    }
    answer.insert("tasks".into(), Value::Array(rows));
    answer.insert("counts".into(), json!(counts));
    answer.insert("total".into(), json!(tasks.len() - rejections.len()));
    answer.insert("matching".into(), json!(matching.len()));
    answer.insert("offset".into(), json!(offset));
    answer.insert("limit".into(), json!(limit));
    answer.insert("submitter_names".into(), json!(submitters));
    answer.insert("recent_rejections".into(), json!(rejections));
    Value::Object(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document() -> Value {
        let mut tasks: Vec<Value> = (0..250)
            .map(|n| {
                let state = if n % 5 == 0 { "running" } else { "pending" };
                let user = if n % 2 == 0 { "alice" } else { "bob" };
                json!({"id": format!("t{n:03}"), "state": state,
                       "submitted_by": {"uid": 1000 + n % 2, "user": user}})
            })
            .collect();
        tasks.push(json!({"id": "rejected-x", "state": "rejected"}));
        json!({"version": 1, "queue": "q", "rejected": 7, "tasks": tasks})
    }

    #[test]
    fn a_page_carries_a_window_and_exact_counts_of_the_whole_queue() {
        let query = PageQuery {
            limit: Some(20),
            offset: Some(10),
            ..PageQuery::default()
        };
        let page = page(&document(), &query);
        let ids: Vec<&str> = page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.len(), 20);
        assert_eq!((ids[0], ids[19]), ("t010", "t029"));
        assert_eq!(
            page["counts"],
            json!({"pending": 200, "running": 50, "rejected": 7})
        );
        assert_eq!(
            (page["total"].as_u64(), page["matching"].as_u64()),
            (Some(250), Some(250))
        );
        assert_eq!(page["submitter_names"], json!(["alice", "bob"]));
        assert_eq!(page["recent_rejections"][0]["id"], "rejected-x");
        assert_eq!(page["queue"], "q", "the document's other fields stay");
    }

    #[test]
    fn filters_cut_the_rows_and_never_the_counts() {
        let query = PageQuery {
            state: Some("running".into()),
            submitter: Some("alice".into()),
            limit: Some(MAX_LIMIT * 10),
            ..PageQuery::default()
        };
        let page = page(&document(), &query);
        // Running (every fifth) and alice's (even): every tenth.
        assert_eq!(page["matching"], 25);
        assert_eq!(page["tasks"].as_array().unwrap().len(), 25);
        assert_eq!(page["limit"], MAX_LIMIT);
        assert_eq!(page["counts"]["pending"], 200);
        let by_uid = PageQuery {
            submitter: Some("1001".into()),
            limit: Some(1),
            ..PageQuery::default()
        };
        assert_eq!(super::page(&document(), &by_uid)["matching"], 125);
    }
}
