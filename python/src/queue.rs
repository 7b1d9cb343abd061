//! `cairn.Queue`: submit, follow, wait for and steer the tasks of a queue (a directory, or a
//! queue shared in PostgreSQL), through the same client as the `cairn` commands
//! (`cairn::client::QueueClient`), so the same checks and messages apply.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cairn::client::{ClientError, ErrorKind, ForkRequest, QueueClient};
use cairn::queue::control::ControlAction;
use cairn::store::records::RecordStatus;
use cairn::store::task_state::TaskState;
use cairn::task::Task;
use cairn::task_id::TaskId;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTimeoutError};
use pyo3::prelude::*;
use pyo3::types::PyString;

use super::{to_json, to_python};

create_exception!(
    _native,
    QueueError,
    PyException,
    "A request to a queue failed: the queue or database could not be read or written, the task \
     does not exist, or its daemon refused the request (the message says which and why)."
);
create_exception!(
    _native,
    UsageError,
    QueueError,
    "A request that is wrong in itself: a bad task id, a bad patch, an id already taken."
);
create_exception!(
    _native,
    InvalidTask,
    QueueError,
    "A task definition that does not validate (every problem is listed), or whose id the \
     queue has already."
);
create_exception!(
    _native,
    QueueUnsafe,
    QueueError,
    "A queue that others could write, or that exposes task definitions with `env`."
);
create_exception!(
    _native,
    TaskFailed,
    QueueError,
    "The task ended without finishing (`task_id`, `status` and its `record` are attributes)."
);
create_exception!(
    _native,
    TaskCancelled,
    TaskFailed,
    "The task was cancelled by an operator."
);
create_exception!(
    _native,
    BudgetExceeded,
    TaskFailed,
    "The task was stopped by its budget (`budget.max_cost`)."
);

/// The client's error as the exception of its class.
fn client_error(error: ClientError) -> PyErr {
    match error.kind() {
        ErrorKind::Usage => UsageError::new_err(error.to_string()),
        ErrorKind::InvalidTask => InvalidTask::new_err(error.to_string()),
        ErrorKind::UnsafeQueue => QueueUnsafe::new_err(error.to_string()),
        ErrorKind::Failure => QueueError::new_err(error.to_string()),
    }
}

/// The command line's error (of the documents it builds) as the exception of its exit code.
fn cli_error(error: cairn::cli::error::CliError) -> PyErr {
    let message = error.message();
    use cairn::cli::exit;
    match error.code() {
        exit::USAGE => UsageError::new_err(message),
        exit::INVALID_TASK => InvalidTask::new_err(message),
        exit::UNSAFE_QUEUE => QueueUnsafe::new_err(message),
        _ => QueueError::new_err(message),
    }
}

/// How long `wait` looks for a task it cannot find before it says the queue has none.
const MISSING_FOR: Duration = Duration::from_secs(10);

/// A queue: a directory (`Queue("queue")`) or a queue shared in PostgreSQL
/// (`Queue(db="postgresql://...")`).
#[pyclass(module = "cairn", name = "Queue", frozen)]
pub struct PyQueue {
    client: Mutex<QueueClient>,
    path: PathBuf,
    db: Option<String>,
}

impl PyQueue {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&QueueClient) -> Result<T, ClientError> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let client = self
                .client
                .lock()
                .map_err(|_| QueueError::new_err("the queue's client was poisoned by a panic"))?;
            call(&client).map_err(client_error)
        })
    }

    fn steer(
        &self,
        py: Python<'_>,
        action: ControlAction,
        id: &str,
        wait: bool,
    ) -> PyResult<String> {
        let id = QueueClient::task_id(id).map_err(client_error)?;
        self.with(py, |client| {
            client
                .request(action, &id, wait)
                .map(|outcome| outcome.message(action, &id))
        })
    }
}

/// A task given as a dict (its JSON) or as the path of its file: its definition checked, the
/// name to make an id from, and how messages name it.
fn task_of(task: &Bound<'_, PyAny>) -> PyResult<(Task, String, String)> {
    let (bytes, stem, named) = if task.is_instance_of::<pyo3::types::PyDict>() {
        let value = to_json(task)?;
        let bytes = serde_json::to_vec(&value).map_err(|e| InvalidTask::new_err(e.to_string()))?;
        (bytes, "task".to_string(), "<task>".to_string())
    } else {
        let path: PathBuf = if let Ok(text) = task.cast::<PyString>() {
            PathBuf::from(text.extract::<String>()?)
        } else {
            task.extract()?
        };
        let bytes = std::fs::read(&path)
            .map_err(|e| QueueError::new_err(format!("{}: {e}", path.display())))?;
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("task")
            .to_string();
        (bytes, stem, path.display().to_string())
    };
    let task = Task::parse(&bytes).map_err(|error| {
        let problems: Vec<String> = std::iter::once(error.to_string())
            .chain(error.more.iter().map(ToString::to_string))
            .collect();
        InvalidTask::new_err(format!("{named}: {}", problems.join("; ")))
    })?;
    Ok((task, stem, named))
}

/// The exception a finished task's `record` raises from `wait`, or `None` when it is done.
fn finished_error(
    py: Python<'_>,
    id: &str,
    status: &RecordStatus,
    record: &serde_json::Value,
) -> PyResult<Option<PyErr>> {
    let error = record["error"].as_str().unwrap_or("");
    let message = format!(
        "task {id} ended {}{}{error}",
        status.as_str(),
        if error.is_empty() { "" } else { ": " }
    );
    let err = match status {
        RecordStatus::Done => return Ok(None),
        RecordStatus::Cancelled => TaskCancelled::new_err(message),
        RecordStatus::BudgetExceeded => BudgetExceeded::new_err(message),
        _ => TaskFailed::new_err(message),
    };
    let value = err.value(py);
    value.setattr("task_id", id)?;
    value.setattr("status", status.as_str())?;
    value.setattr("record", to_python(py, record)?)?;
    Ok(Some(err))
}

#[pymethods]
impl PyQueue {
    /// The queue directory `path` (default `./queue`), or with `db` the queue shared in that
    /// PostgreSQL database (connects and checks its schema).
    #[new]
    #[pyo3(signature = (path = None, *, db = None))]
    fn new(py: Python<'_>, path: Option<PathBuf>, db: Option<String>) -> PyResult<Self> {
        let path = path.unwrap_or_else(|| PathBuf::from("./queue"));
        let client = py
            .detach(|| QueueClient::open(&path, db.as_deref()))
            .map_err(client_error)?;
        Ok(PyQueue {
            client: Mutex::new(client),
            path,
            db,
        })
    }

    /// Submit a task (a dict, or the path of a task file); its id. A directory that is not a
    /// queue yet is created only with `create=True`.
    #[pyo3(signature = (task, *, create = false))]
    fn submit(&self, py: Python<'_>, task: &Bound<'_, PyAny>, create: bool) -> PyResult<String> {
        let (task, stem, named) = task_of(task)?;
        let submitted = self.with(py, |client| client.submit(task, &stem, &named, create))?;
        Ok(submitted.id.to_string())
    }

    /// The queue as `cairn status --json` gives it, or with `id` that task's entry of it.
    #[pyo3(signature = (id = None))]
    fn status<'py>(&self, py: Python<'py>, id: Option<&str>) -> PyResult<Bound<'py, PyAny>> {
        let document = py
            .detach(|| cairn::cli::documents::status(&self.path, self.db.as_deref()))
            .map_err(cli_error)?;
        let Some(id) = id else {
            return to_python(py, &document);
        };
        let task = document["tasks"]
            .as_array()
            .and_then(|tasks| tasks.iter().find(|t| t["id"] == id))
            .ok_or_else(|| QueueError::new_err(format!("the queue has no task {id:?}")))?;
        to_python(py, task)
    }

    /// One task as `cairn show --json` gives it: definition, phases, attempts, timeline.
    fn show<'py>(&self, py: Python<'py>, id: &str) -> PyResult<Bound<'py, PyAny>> {
        let id = QueueClient::task_id(id).map_err(client_error)?;
        let document = py
            .detach(|| cairn::cli::documents::show(&self.path, self.db.as_deref(), &id))
            .map_err(cli_error)?;
        to_python(py, &document)
    }

    /// Wait until task `id` finishes; its final record. Raises `TaskFailed` (or
    /// `TaskCancelled`, `BudgetExceeded`) naming the task when it did not finish done, and
    /// `TimeoutError` after `timeout` seconds.
    #[pyo3(signature = (id, timeout = None, *, poll = 0.2))]
    fn wait<'py>(
        &self,
        py: Python<'py>,
        id: &str,
        timeout: Option<f64>,
        poll: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let task_id = QueueClient::task_id(id).map_err(client_error)?;
        let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.max(0.0)));
        let poll = Duration::from_secs_f64(poll.clamp(0.01, 60.0));
        let mut missing_since: Option<Instant> = None;
        loop {
            let view = self.with(py, |client| client.task(&task_id))?;
            let Some(view) = view else {
                // Intake moves a task from the inbox into the queue: for a moment it is in
                // neither. Only a task missing for a while is no task.
                let since = *missing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= MISSING_FOR {
                    return Err(QueueError::new_err(format!("the queue has no task {id:?}")));
                }
                py.check_signals()?;
                py.detach(|| std::thread::sleep(poll));
                continue;
            };
            missing_since = None;
            if let (TaskState::Finished(status), Some(record)) = (&view.state, &view.record) {
                if let Some(err) = finished_error(py, id, status, &record.value)? {
                    return Err(err);
                }
                return to_python(py, &record.value);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(PyTimeoutError::new_err(format!(
                    "task {id} is still {} after {}s",
                    view.state.as_str(),
                    timeout.unwrap_or_default()
                )));
            }
            py.check_signals()?;
            py.detach(|| std::thread::sleep(poll));
        }
    }

    /// Ask the daemon to pause task `id` at its next iteration boundary; what it says.
    #[pyo3(signature = (id, *, wait = true))]
    fn pause(&self, py: Python<'_>, id: &str, wait: bool) -> PyResult<String> {
        self.steer(py, ControlAction::Pause, id, wait)
    }

    /// Let a paused task continue.
    #[pyo3(signature = (id, *, wait = true))]
    fn resume(&self, py: Python<'_>, id: &str, wait: bool) -> PyResult<String> {
        self.steer(py, ControlAction::Resume, id, wait)
    }

    /// Stop a task for good and record it cancelled.
    #[pyo3(signature = (id, *, wait = true))]
    fn cancel(&self, py: Python<'_>, id: &str, wait: bool) -> PyResult<String> {
        self.steer(py, ControlAction::Cancel, id, wait)
    }

    /// Put a failed or cancelled task back, resuming from its last checkpoint.
    #[pyo3(signature = (id, *, wait = true))]
    fn retry(&self, py: Python<'_>, id: &str, wait: bool) -> PyResult<String> {
        self.steer(py, ControlAction::Retry, id, wait)
    }

    /// Set task `id`'s spending limit to `max_cost` (`cairn budget`): a task its budget paused
    /// stays paused until `resume`.
    #[pyo3(signature = (id, max_cost, *, wait = true))]
    fn set_budget(&self, py: Python<'_>, id: &str, max_cost: f64, wait: bool) -> PyResult<String> {
        let id = QueueClient::task_id(id).map_err(client_error)?;
        self.with(py, |client| {
            client
                .set_budget(&id, max_cost, wait)
                .map(|outcome| outcome.message(ControlAction::Budget, &id))
        })
    }

    /// A new task from a checkpoint of task `id` (generation `gen`, default the latest) with
    /// the merge `patch` applied to its state, or from the start of phase `from_phase` with
    /// the earlier phases' outputs; its id (`as_id`, or a new one).
    #[pyo3(signature = (id, gen = None, patch = None, as_id = None, from_phase = None))]
    fn fork(
        &self,
        py: Python<'_>,
        id: &str,
        gen: Option<u64>,
        patch: Option<&Bound<'_, PyAny>>,
        as_id: Option<&str>,
        from_phase: Option<String>,
    ) -> PyResult<String> {
        let request = ForkRequest {
            id: QueueClient::task_id(id).map_err(client_error)?,
            generation: gen,
            patch: patch.map(to_json).transpose()?,
            new_id: as_id
                .map(QueueClient::task_id)
                .transpose()
                .map_err(client_error)?,
            from_phase,
        };
        let new_id: TaskId = self.with(py, |client| client.fork(&request))?;
        Ok(new_id.to_string())
    }

    /// Where the queue is: its directory, or the database without its password.
    #[getter]
    fn location(&self) -> PyResult<String> {
        let client = self
            .client
            .lock()
            .map_err(|_| QueueError::new_err("the queue's client was poisoned by a panic"))?;
        Ok(client.location())
    }

    fn __repr__(&self) -> PyResult<String> {
        Ok(format!("Queue({:?})", self.location()?))
    }
}

/// Add the class and its exceptions to the module.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add_class::<PyQueue>()?;
    module.add("QueueError", py.get_type::<QueueError>())?;
    module.add("UsageError", py.get_type::<UsageError>())?;
    module.add("InvalidTask", py.get_type::<InvalidTask>())?;
    module.add("QueueUnsafe", py.get_type::<QueueUnsafe>())?;
    module.add("TaskFailed", py.get_type::<TaskFailed>())?;
    module.add("TaskCancelled", py.get_type::<TaskCancelled>())?;
    module.add("BudgetExceeded", py.get_type::<BudgetExceeded>())?;
    Ok(())
}
