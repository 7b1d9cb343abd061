//! The dashboard's reads of the queue, on one thread of their own: the status document is
//! read at most once a second whatever the number of requests (every request within a second
//! of the last read shares it), and a slow disk or database holds up only this thread, never
//! the daemon's. The documents are those of `cairn status --json` and `cairn show --json`,
//! with every task's `env` values hidden.

use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::client::QueueClient as Source;
use crate::queue::{LoadOptions, QueueReader};
use crate::task_id::TaskId;

/// Where the dashboard reads: a queue directory, or a shared queue's database.
#[derive(Debug, Clone)]
pub struct ReadSource {
    pub queue: PathBuf,
    pub db: Option<String>,
}

/// How long a status document is served again before the queue is read anew.
const STATUS_FRESH_FOR: Duration = Duration::from_secs(1);

/// The bytes of each phase log's tail the task page shows.
const LOG_TAIL_BYTES: u64 = 16 * 1024;

/// The rejected files the first screen lists.
const RECENT_REJECTED: usize = 10;

enum Job {
    Status(oneshot::Sender<Result<String, String>>),
    Task(String, oneshot::Sender<Result<Option<String>, String>>),
    QueueMetrics(oneshot::Sender<Result<String, String>>),
}

/// The handle requests send their reads through.
#[derive(Clone)]
pub struct Reader {
    jobs: mpsc::Sender<Job>,
}

impl Reader {
    /// Start the reading thread; it opens the source itself (a database reader runs a
    /// runtime of its own, which must not start inside the listener's).
    pub fn start(source: ReadSource) -> Reader {
        let (jobs, receive) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("cairn-web-reader".into())
            .spawn(move || serve_reads(source, receive));
        if let Err(e) = spawned {
            tracing::error!("cannot start the dashboard's reader thread: {e}");
        }
        Reader { jobs }
    }

    async fn ask<T>(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<T, String>>) -> Job,
    ) -> Result<T, String> {
        let (answer, answered) = oneshot::channel();
        self.jobs
            .send(job(answer))
            .map_err(|_| "the dashboard's reader is gone".to_string())?;
        answered
            .await
            .map_err(|_| "the dashboard's reader is gone".to_string())?
    }

    /// The `cairn status --json` document (the 10 most recent rejections included).
    pub async fn status(&self) -> Result<String, String> {
        self.ask(Job::Status).await
    }

    /// The `cairn show --json` document of a task, with its checkpoint generations, its latest
    /// checkpoint decoded and the tail of each phase log (a queue directory's).
    pub async fn task(&self, id: String) -> Result<Option<String>, String> {
        self.ask(|answer| Job::Task(id, answer)).await
    }

    /// `cairn serve`'s metrics: the queue's tasks by state.
    pub async fn queue_metrics(&self) -> Result<String, String> {
        self.ask(Job::QueueMetrics).await
    }
}

fn serve_reads(source: ReadSource, jobs: mpsc::Receiver<Job>) {
    let opened = open(&source);
    let mut cached: Option<(Instant, Result<String, String>, Value)> = None;
    for job in jobs {
        let opened = match &opened {
            Ok(opened) => opened,
            Err(e) => {
                let e = e.clone();
                match job {
                    Job::Status(answer) | Job::QueueMetrics(answer) => {
                        let _ = answer.send(Err(e));
                    }
                    Job::Task(_, answer) => {
                        let _ = answer.send(Err(e));
                    }
                }
                continue;
            }
        };
        match job {
            Job::Status(answer) => {
                let (_, text, _) = fresh_status(opened, &mut cached);
                let _ = answer.send(text.clone());
            }
            Job::QueueMetrics(answer) => {
                let (_, _, document) = fresh_status(opened, &mut cached);
                let _ = answer.send(Ok(super::queue_metrics::render(document)));
            }
            Job::Task(id, answer) => {
                let _ = answer.send(task_document(opened, &id));
            }
        }
    }
}

fn open(source: &ReadSource) -> Result<Source, String> {
    Source::open(&source.queue, source.db.as_deref()).map_err(|e| e.to_string())
}

/// The status document, read again when older than [`STATUS_FRESH_FOR`].
fn fresh_status<'a>(
    source: &Source,
    cached: &'a mut Option<(Instant, Result<String, String>, Value)>,
) -> &'a (Instant, Result<String, String>, Value) {
    let stale = cached
        .as_ref()
        .is_none_or(|(at, _, _)| at.elapsed() >= STATUS_FRESH_FOR);
    if stale {
        let options = LoadOptions {
            rejected: RECENT_REJECTED,
        };
        let read = source.status(options).map(|view| {
            let mut document = crate::cli::status::to_json(&view);
            // The page shows cost against budget: the limit in force (`cairn budget` may have
            // set one other than the definition's).
            if let Some(tasks) = document["tasks"].as_array_mut() {
                for (json, task) in tasks.iter_mut().zip(&view.tasks) {
                    json["budget"] = json!(task.max_cost);
                }
            }
            hide_env_values(&mut document);
            document
        });
        *cached = Some(match read {
            Ok(document) => (Instant::now(), Ok(document.to_string()), document),
            Err(e) => (Instant::now(), Err(e.to_string()), Value::Null),
        });
    }
    cached.as_ref().expect("filled above")
}

fn task_document(source: &Source, id: &str) -> Result<Option<String>, String> {
    let Ok(id) = TaskId::parse(id) else {
        return Ok(None);
    };
    let files = source.root().map(QueueReader::open);
    let exists = match &files {
        Some(reader) => reader.task(&id).is_some(),
        None => source.task(&id).map_err(|e| e.to_string())?.is_some(),
    };
    if !exists {
        return Ok(None);
    }
    let mut document = crate::cli::show::json_document(source, &id).map_err(|e| e.message())?;
    if let Some(reader) = &files {
        document["checkpoints"] = checkpoints(reader, &id);
        document["log_tails"] = log_tails(reader, &id);
    }
    hide_env_values(&mut document);
    Ok(Some(document.to_string()))
}

/// The task's checkpoint generations and its newest checkpoint that decodes, state included.
fn checkpoints(reader: &QueueReader, id: &TaskId) -> Value {
    let generations = match reader.history(id.as_str()) {
        Ok(generations) => json!(generations),
        Err(e) => json!({ "unreadable": e.to_string() }),
    };
    let latest = match reader.latest_checkpoint(id.as_str()) {
        Ok(Some(loaded)) => json!({
            "key": loaded.key,
            "phase": loaded.checkpoint.phase,
            "iteration_count": loaded.checkpoint.iteration_count,
            "last_checkpoint_at": loaded.checkpoint.last_checkpoint_at,
            "state": loaded.checkpoint.partial_results,
        }),
        Ok(None) => Value::Null,
        Err(e) => json!({ "unreadable": e.to_string() }),
    };
    json!({ "generations": generations, "latest": latest })
}

/// The last [`LOG_TAIL_BYTES`] of each phase log of the task, by file name.
fn log_tails(reader: &QueueReader, id: &TaskId) -> Value {
    let tails: Vec<Value> = reader
        .log_files(id.as_str())
        .into_iter()
        .map(|(path, bytes)| {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            match tail(&path, LOG_TAIL_BYTES) {
                Ok(text) => json!({ "name": name, "bytes": bytes, "tail": text }),
                Err(e) => json!({ "name": name, "bytes": bytes, "unreadable": e.to_string() }),
            }
        })
        .collect();
    json!(tails)
}

fn tail(path: &std::path::Path, bytes: u64) -> std::io::Result<String> {
    let mut file = crate::queue::read::files::open_no_follow(path)?;
    let length = file.metadata()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(bytes)))?;
    let mut buffer = Vec::new();
    file.take(bytes).read_to_end(&mut buffer)?;
    Ok(String::from_utf8_lossy(&buffer).into_owned())
}

/// Replace the value of every variable under an `env` object: task definitions carry secrets
/// there, and no response of the listener shows them (their names stay, for people).
pub fn hide_env_values(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                match item {
                    Value::Object(env) if key == "env" => {
                        for variable in env.values_mut() {
                            *variable = json!("(hidden)");
                        }
                    }
                    other => hide_env_values(other),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(hide_env_values),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_are_hidden_at_any_depth_and_their_names_kept() {
        let mut document = json!({
            "tasks": [{"definition": {"env": {"TOKEN": "s3cret"}, "phases": []}}],
            "env": {"A": "b"},
        });
        hide_env_values(&mut document);
        let text = document.to_string();
        assert!(
            !text.contains("s3cret") && !text.contains("\"b\""),
            "{text}"
        );
        assert!(text.contains("TOKEN"), "{text}");
    }
}
