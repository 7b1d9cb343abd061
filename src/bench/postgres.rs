//! `cairn bench checkpoint --db URL`: the same checkpoint workload through a shared queue's
//! checkpoint path — a loop checkpointer whose saves go to PostgreSQL under the task's lease,
//! one fenced statement each — for comparing with the file backend in the same run.
//!
//! The benchmark adds its tasks to the database and removes them afterwards, so it refuses a
//! database that already holds tasks: give it one of its own (`createdb cairn_bench`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};

use cairn::queue::postgres::{NewTask, PgQueue};
use cairn::queue::Queue;

/// The node name the benchmark claims its tasks under.
const NODE: &str = "cairn-bench";

/// A lease no benchmark run outlasts (nothing renews it).
const LEASE: Duration = Duration::from_secs(3600);

/// Open a share of the queue at `url` for `tasks` benchmark tasks (ids as the workload names
/// them), with `root` as the local directory. The returned guard removes them when dropped.
pub(crate) fn open(
    root: &std::path::Path,
    url: &str,
    task_ids: &[String],
) -> anyhow::Result<(Queue, BenchTasks)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime for the database")?;
    let db = PgQueue::connect(url).context("connecting to the database")?;
    runtime.block_on(async {
        db.migrate().await?;
        let count = db.count_tasks().await?;
        if count > 0 {
            bail!(
                "the database holds {count} tasks; the benchmark adds and removes tasks of its \
                 own, so give it an empty database (createdb cairn_bench)"
            );
        }
        for id in task_ids {
            let definition =
                format!(r#"{{"id": "{id}", "phases": [{{"name": "bench", "run": ["true"]}}]}}"#);
            db.submit(&NewTask {
                id,
                priority: 0,
                crash_limit: 5,
                definition: &definition,
                submitted_by: None,
            })
            .await?;
        }
        anyhow::Ok(())
    })?;
    let node = format!("{NODE}-{}", std::process::id());
    let queue =
        Queue::open_postgres(root, url, &node, LEASE, false).context("opening the shared queue")?;
    let guard = BenchTasks {
        db,
        runtime: Arc::new(runtime),
        ids: task_ids.to_vec(),
        node,
    };
    Ok((queue, guard))
}

/// The benchmark's tasks in the database; removed (with their checkpoints) on drop.
pub(crate) struct BenchTasks {
    db: PgQueue,
    runtime: Arc<tokio::runtime::Runtime>,
    ids: Vec<String>,
    node: String,
}

impl Drop for BenchTasks {
    fn drop(&mut self) {
        let removed = self
            .runtime
            .block_on(self.db.remove_tasks(&self.ids, &self.node));
        if let Err(error) = removed {
            eprintln!("warning: removing the benchmark's tasks: {error}");
        }
    }
}
