//! `cairn._native`: cairn's checkpoint store, loop checkpointer and command line for Python.
//!
//! Everything here calls the `cairn` crate the binary is built from, so a checkpoint written
//! from Python is the daemon's file format, commit log and generations, byte for byte. State
//! crosses as JSON values, numbers as their text: Python integers of any size and `Decimal`s
//! are kept exactly. The interpreter is released while the store waits on the disk.

mod queue;

use std::path::PathBuf;
use std::sync::Mutex;

use cairn::store::{
    CheckpointStore, GenerationInfo, IterationCheckpoint, LoopCheckpointer, StoreError,
    FORMAT_VERSION,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

create_exception!(
    _native,
    CheckpointError,
    PyException,
    "A checkpoint could not be written or read (the store's message says which file and why)."
);

fn store_error(error: StoreError) -> PyErr {
    CheckpointError::new_err(error.to_string())
}

/// A Python value as JSON: dicts with string keys, lists and tuples, strings, booleans,
/// `None`, integers of any size, finite floats and `Decimal`s (their text kept).
fn to_json(value: &Bound<'_, PyAny>) -> PyResult<Value> {
    if value.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(flag) = value.cast::<PyBool>() {
        return Ok(Value::Bool(flag.is_true()));
    }
    if value.is_instance_of::<PyInt>() {
        return number(&value.str()?.extract::<String>()?);
    }
    if let Ok(float) = value.cast::<PyFloat>() {
        let float = float.value();
        if !float.is_finite() {
            return Err(PyValueError::new_err(format!(
                "{float} cannot be stored: JSON has no NaN or infinity"
            )));
        }
        return number(&value.repr()?.extract::<String>()?);
    }
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(Value::String(text.extract()?));
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut object = Map::new();
        for (key, item) in dict.iter() {
            let Ok(key) = key.cast::<PyString>() else {
                return Err(PyTypeError::new_err(format!(
                    "dict keys must be strings to be stored as JSON, not {}",
                    key.get_type().name()?
                )));
            };
            object.insert(key.extract()?, to_json(&item)?);
        }
        return Ok(Value::Object(object));
    }
    if let Ok(list) = value.cast::<PyList>() {
        return list
            .iter()
            .map(|item| to_json(&item))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    if let Ok(tuple) = value.cast::<PyTuple>() {
        return tuple
            .iter()
            .map(|item| to_json(&item))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    if value.get_type().name()?.extract::<String>()? == "Decimal" {
        let text: String = value.str()?.extract()?;
        return number(&text).map_err(|_| {
            PyValueError::new_err(format!(
                "Decimal {text} cannot be stored: JSON has no NaN or infinity"
            ))
        });
    }
    Err(PyTypeError::new_err(format!(
        "a {} cannot be stored as JSON (use dicts, lists, strings, numbers, booleans and None)",
        value.get_type().name()?
    )))
}

fn number(text: &str) -> PyResult<Value> {
    serde_json::from_str::<Number>(text)
        .map(Value::Number)
        .map_err(|e| PyValueError::new_err(format!("{text} is not a JSON number: {e}")))
}

/// JSON as a Python value: integers as `int` whatever their size, a fraction as `float` when
/// the float reads back as the same text, else as `decimal.Decimal` (nothing rounded).
fn to_python<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(flag) => PyBool::new(py, *flag).to_owned().into_any(),
        Value::Number(number) => {
            let text = number.to_string();
            let builtins = py.import("builtins")?;
            if !text.contains(['.', 'e', 'E']) {
                builtins.getattr("int")?.call1((text,))?
            } else {
                let float = builtins.getattr("float")?.call1((text.as_str(),))?;
                if float.repr()?.extract::<String>()? == text {
                    float
                } else {
                    py.import("decimal")?.getattr("Decimal")?.call1((text,))?
                }
            }
        }
        Value::String(text) => PyString::new(py, text).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_python(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(object) => {
            let dict = PyDict::new(py);
            for (key, item) in object {
                dict.set_item(key, to_python(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// One checkpoint as read back: where the loop was, its state and what wrote it.
#[pyclass(module = "cairn", frozen, get_all)]
struct Checkpoint {
    /// The task the checkpoint belongs to.
    task: String,
    /// The phase (or loop) name recorded in it.
    phase: String,
    /// Completed iterations: the 0-based index of the next iteration to run.
    iteration: u64,
    /// The loop's state after `iteration` iterations.
    state: Py<PyAny>,
    /// Its generation (counts the task's checkpoint writes).
    generation: u64,
    /// Whether the loop had finished.
    done: bool,
    /// The loop's result, when done.
    output: Py<PyAny>,
    /// The summed cost recorded with it, if any.
    cost: Option<f64>,
    /// When it was written (RFC 3339, UTC).
    written_at: String,
    /// Which attempt of the task wrote it.
    attempt: u32,
}

#[pymethods]
impl Checkpoint {
    /// A checkpoint not read from a store: what a `worker` phase resumes from
    /// (`CAIRN_RESUME`), handed to Python in the same shape.
    #[new]
    #[pyo3(signature = (task, phase, iteration, state, *, generation = 0, done = false, output = None, cost = None, written_at = String::new(), attempt = 1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        task: String,
        phase: String,
        iteration: u64,
        state: Py<PyAny>,
        generation: u64,
        done: bool,
        output: Option<Py<PyAny>>,
        cost: Option<f64>,
        written_at: String,
        attempt: u32,
    ) -> Self {
        Checkpoint {
            task,
            phase,
            iteration,
            state,
            generation,
            done,
            output: output.unwrap_or_else(|| py.None()),
            cost,
            written_at,
            attempt,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Checkpoint(task={:?}, phase={:?}, iteration={}, generation={}, done={})",
            self.task,
            self.phase,
            self.iteration,
            self.generation,
            if self.done { "True" } else { "False" }
        )
    }
}

fn checkpoint(py: Python<'_>, cp: IterationCheckpoint) -> PyResult<Checkpoint> {
    Ok(Checkpoint {
        state: to_python(py, &cp.partial_results)?.unbind(),
        output: match &cp.output {
            Some(output) => to_python(py, output)?.unbind(),
            None => py.None(),
        },
        task: cp.task_id,
        phase: cp.phase,
        iteration: cp.iteration_count,
        generation: cp.generation,
        done: cp.done,
        cost: cp.cost,
        written_at: cp
            .last_checkpoint_at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        attempt: cp.attempt,
    })
}

/// One kept generation of a task's checkpoints, as `history` lists them.
#[pyclass(module = "cairn", frozen, get_all)]
struct Generation {
    generation: u64,
    /// The file, relative to the store's directory.
    file: String,
    /// Its size in bytes (gzip).
    bytes: u64,
    /// Completed iterations, when the file decodes.
    iteration: Option<u64>,
    /// When it was written, when the file decodes.
    written_at: Option<String>,
    /// Why the file does not decode, if it does not.
    error: Option<String>,
}

#[pymethods]
impl Generation {
    fn __repr__(&self) -> String {
        let iteration = self
            .iteration
            .map_or_else(|| "None".to_owned(), |n| n.to_string());
        format!(
            "Generation(generation={}, file={:?}, iteration={iteration})",
            self.generation, self.file
        )
    }
}

impl From<GenerationInfo> for Generation {
    fn from(info: GenerationInfo) -> Self {
        Generation {
            generation: info.generation,
            file: info.key,
            bytes: info.bytes,
            iteration: info.iteration_count,
            written_at: info
                .last_checkpoint_at
                .map(|at| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            error: info.error,
        }
    }
}

/// The checkpoints of a queue directory (`DIR/incremental/`), as the daemon keeps them: a
/// gzip JSON file per task, made durable through the directory's commit log, with older
/// generations kept.
#[pyclass(module = "cairn", name = "CheckpointStore", frozen)]
struct PyCheckpointStore {
    store: CheckpointStore,
    path: PathBuf,
}

#[pymethods]
impl PyCheckpointStore {
    /// Open (creating if needed) the store in the directory `path`, keeping
    /// `keep_generations` older generations of each task besides its latest (3, as the
    /// daemon does).
    #[new]
    #[pyo3(signature = (path, *, keep_generations = 3))]
    fn new(py: Python<'_>, path: PathBuf, keep_generations: usize) -> PyResult<Self> {
        let opened = py.detach(|| CheckpointStore::open(&path));
        Ok(PyCheckpointStore {
            store: opened
                .map_err(store_error)?
                .keep_generations(keep_generations),
            path,
        })
    }

    /// The directory this store is in.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Durably save `state` as `task`'s latest checkpoint after `iteration` completed
    /// iterations; returns its generation. Durable when it returns.
    #[pyo3(signature = (task, state, iteration, *, phase = "main", done = false, output = None, cost = None))]
    #[allow(clippy::too_many_arguments)]
    fn save(
        &self,
        py: Python<'_>,
        task: String,
        state: &Bound<'_, PyAny>,
        iteration: u64,
        phase: &str,
        done: bool,
        output: Option<&Bound<'_, PyAny>>,
        cost: Option<f64>,
    ) -> PyResult<u64> {
        let mut cp = IterationCheckpoint {
            format_version: FORMAT_VERSION,
            task_id: task,
            phase: phase.to_owned(),
            phase_index: 0,
            scope: phase.to_owned(),
            iteration_count: iteration,
            checkpoint_interval: 1,
            partial_results: to_json(state)?,
            last_checkpoint_at: chrono::Utc::now(),
            attempt: 1,
            generation: 0,
            done,
            output: output.map(to_json).transpose()?,
            cost,
            files: Default::default(),
        };
        py.detach(|| self.store.save(&mut cp)).map_err(store_error)
    }

    /// `task`'s newest checkpoint that decodes, or `None` when it has none.
    fn latest(&self, py: Python<'_>, task: &str) -> PyResult<Option<Checkpoint>> {
        let loaded = py.detach(|| self.store.latest(task)).map_err(store_error)?;
        loaded
            .map(|loaded| checkpoint(py, loaded.checkpoint))
            .transpose()
    }

    /// The generations kept for `task`, newest first.
    fn history(&self, py: Python<'_>, task: &str) -> PyResult<Vec<Generation>> {
        let history = py
            .detach(|| self.store.history(task))
            .map_err(store_error)?;
        Ok(history.into_iter().map(Generation::from).collect())
    }

    /// The checkpoint of one kept generation of `task`.
    fn generation(&self, py: Python<'_>, task: &str, generation: u64) -> PyResult<Checkpoint> {
        let cp = py
            .detach(|| self.store.generation(task, generation))
            .map_err(store_error)?;
        checkpoint(py, cp)
    }

    /// Remove every checkpoint file of `task`.
    fn delete(&self, py: Python<'_>, task: &str) -> PyResult<()> {
        py.detach(|| self.store.delete(task)).map_err(store_error)
    }

    /// Take the caller's word that `tasks` have no older-generation files (ids it makes
    /// unique), so that their first save, and a read of one that has no checkpoint, need not
    /// list the directory to look for them.
    fn assume_no_older_files(&self, tasks: Vec<String>) {
        self.store
            .assume_no_older_files(tasks.iter().map(String::as_str));
    }

    /// The tasks with a checkpoint here (those whose id starts with `prefix`, when given),
    /// sorted; one listing of the directory.
    #[pyo3(signature = (prefix = None))]
    fn tasks(&self, py: Python<'_>, prefix: Option<&str>) -> PyResult<Vec<String>> {
        let mut tasks = py.detach(|| self.store.tasks()).map_err(store_error)?;
        if let Some(prefix) = prefix {
            tasks.retain(|task| task.starts_with(prefix));
        }
        Ok(tasks)
    }

    /// A new task started from `task`'s checkpoint (generation `gen`, else the latest), its
    /// state merged with `patch` (RFC 7386: a dict merged key by key, `None` removes a key),
    /// under `as_id` (else `task` with a random suffix, as `cairn fork` names it). Returns the
    /// new task's id; its checkpoint is durable when this returns. An `as_id` that has a
    /// checkpoint already is refused.
    #[pyo3(signature = (task, gen = None, patch = None, as_id = None))]
    fn fork(
        &self,
        py: Python<'_>,
        task: &str,
        gen: Option<u64>,
        patch: Option<&Bound<'_, PyAny>>,
        as_id: Option<String>,
    ) -> PyResult<String> {
        let patch = patch.map(to_json).transpose()?;
        let new_id = match as_id {
            Some(id) => cairn::task_id::TaskId::parse(id.as_str())
                .map_err(|e| PyValueError::new_err(format!("as_id: {e}")))?,
            None => cairn::task_id::TaskId::generate(task, &cairn::task::random_suffix()),
        };
        py.detach(|| {
            if self
                .store
                .latest(new_id.as_str())
                .map_err(store_error)?
                .is_some()
            {
                return Err(CheckpointError::new_err(format!(
                    "cannot fork as {new_id:?}: that task has checkpoints already"
                )));
            }
            let mut cp = match gen {
                Some(gen) => self.store.generation(task, gen).map_err(store_error)?,
                None => match self.store.latest(task).map_err(store_error)? {
                    Some(loaded) => loaded.checkpoint,
                    None => {
                        return Err(CheckpointError::new_err(format!(
                            "cannot fork {task:?}: it has no checkpoint"
                        )))
                    }
                },
            };
            cp.fork_as(new_id.as_str(), patch.as_ref());
            self.store.save(&mut cp).map_err(store_error)
        })?;
        Ok(new_id.to_string())
    }

    fn __repr__(&self) -> String {
        format!("CheckpointStore({:?})", self.path.display().to_string())
    }
}

/// One loop's checkpoints in a store: resume where the last run stopped, checkpoint every
/// `every` completed iterations, flush the last one when the loop stops.
#[pyclass(module = "cairn", name = "LoopCheckpointer", frozen)]
struct PyLoopCheckpointer {
    inner: Mutex<LoopCheckpointer>,
}

impl PyLoopCheckpointer {
    fn with<T>(
        &self,
        py: Python<'_>,
        work: impl FnOnce(&mut LoopCheckpointer) -> Result<T, StoreError> + Send,
    ) -> PyResult<T>
    where
        T: Send,
    {
        py.detach(|| {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            work(&mut inner)
        })
        .map_err(store_error)
    }
}

#[pymethods]
impl PyLoopCheckpointer {
    #[new]
    #[pyo3(signature = (store, task, phase = String::from("main"), every = 1))]
    fn new(store: &PyCheckpointStore, task: String, phase: String, every: u64) -> PyResult<Self> {
        if every == 0 {
            return Err(PyValueError::new_err("every must be at least 1"));
        }
        let inner = LoopCheckpointer::new(store.store.clone(), task, phase).every(every);
        Ok(PyLoopCheckpointer {
            inner: Mutex::new(inner),
        })
    }

    /// The last committed checkpoint of this loop, or `None` for a first run.
    fn resume(&self, py: Python<'_>) -> PyResult<Option<Checkpoint>> {
        let resumed = self.with(py, |inner| inner.resume_checkpoint())?;
        resumed.map(|cp| checkpoint(py, cp)).transpose()
    }

    /// `iteration` iterations are complete, leaving `state`: written now when `iteration` is
    /// a multiple of `every` (returns `True`, durable), else kept for `flush`.
    fn checkpoint(
        &self,
        py: Python<'_>,
        iteration: u64,
        state: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let state = to_json(state)?;
        self.with(py, move |inner| inner.checkpoint(iteration, &state))
    }

    /// The loop's final checkpoint, marked done, with its `output`.
    #[pyo3(signature = (iteration, state, output = None))]
    fn finish(
        &self,
        py: Python<'_>,
        iteration: u64,
        state: &Bound<'_, PyAny>,
        output: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let state = to_json(state)?;
        let output = output.map(to_json).transpose()?;
        self.with(py, move |inner| inner.finish(iteration, &state, output))
    }

    /// Write the iteration kept back by `every`, if any.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |inner| inner.flush())
    }

    /// The iteration count of the last committed checkpoint.
    #[getter]
    fn committed(&self) -> Option<u64> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_committed()
    }
}

/// `value` as compact JSON text, numbers exact: integers of any size, and `Decimal`s with every
/// digit (the worker protocol's lines, in a worker phase).
#[pyfunction]
fn dumps(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let value = to_json(value)?;
    serde_json::to_string(&value).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// JSON `text` as Python values, numbers exact (as a checkpoint's state is read).
#[pyfunction]
fn loads<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("not JSON: {e}")))?;
    to_python(py, &value)
}

/// The source of the worker-protocol helper the binary writes into `<queue>/clients/python/`
/// (`cairn_worker.py`): the package runs the same file as `cairn.worker`.
#[pyfunction]
fn worker_helper_source() -> &'static str {
    cairn::clients::HELPERS
        .iter()
        .find(|(name, _)| name.ends_with("cairn_worker.py"))
        .map_or("", |(_, source)| source)
}

/// Run the `cairn` command line with `argv` (the program's name first); the exit code.
#[pyfunction]
fn run_cli(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| cairn::cli::run_args(argv))
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyCheckpointStore>()?;
    module.add_class::<PyLoopCheckpointer>()?;
    module.add_class::<Checkpoint>()?;
    module.add_class::<Generation>()?;
    module.add("CheckpointError", module.py().get_type::<CheckpointError>())?;
    queue::register(module)?;
    module.add_function(wrap_pyfunction!(run_cli, module)?)?;
    module.add_function(wrap_pyfunction!(worker_helper_source, module)?)?;
    module.add_function(wrap_pyfunction!(dumps, module)?)?;
    module.add_function(wrap_pyfunction!(loads, module)?)?;
    Ok(())
}
