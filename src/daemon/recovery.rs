//! Start-up: finish half-done intake, then line up the tasks that were in flight (resuming
//! them first) and the accepted tasks that never started.

use super::*;
use crate::store::records::FailedRecord;

impl Scheduler {
    /// Finish half-done intake, then line up every task that was in flight and every accepted
    /// task that has not started, in that order.
    pub(super) async fn recover(&mut self) -> Result<(), DaemonError> {
        let intake = Arc::clone(&self.intake);
        let recovered = runner_blocking(move || lock(&intake).recover_claims()).await;
        if let Err(e) = recovered {
            tracing::error!("finishing interrupted intake: {e}");
        }

        let entries = self.ctx.work.snapshot().active_tasks;
        for entry in entries {
            self.recover_entry(entry).await;
        }
        self.load_pending().await?;
        if let Err(e) = self.ctx.work.persist().await {
            // Not fatal: every later change writes the whole file again.
            tracing::error!("{e}");
        }
        tracing::info!(
            resumed = self.resume.len(),
            waiting_retry = self.retries.len(),
            pending = self.pending.len(),
            "recovered the queue"
        );
        Ok(())
    }

    pub(super) async fn recover_entry(&mut self, mut entry: ActiveTask) {
        let id = entry.task_id.clone();
        if self.has_record(&id).await {
            if let Some(record) = self.retried_record(&entry).await {
                // `cairn retry` wrote this entry but died before archiving the old record.
                self.archive_failure(&id, &record).await;
            } else {
                // Finished, but the daemon died before it removed the entry.
                self.ctx.work.update(|w| w.remove(&id));
                return;
            }
        }
        let task = match self.read_task(&id).await {
            Ok(task) => Arc::new(task),
            Err(error) => {
                tracing::error!(task_id = %id, "cannot resume: {error}");
                let task = Task {
                    id: Some(id.clone()),
                    priority: 0,
                    cwd: None,
                    env: Default::default(),
                    retry: Default::default(),
                    budget: None,
                    phases: Vec::new(),
                    meta: None,
                };
                self.give_up(&Arc::new(task), entry, error).await;
                return;
            }
        };
        match entry.status {
            ActiveStatus::Running => {
                // The daemon died during this attempt. A crash is not the task's failure (a
                // power cut, an OOM kill of something else, an operator's SIGKILL), so it uses
                // up no attempt. Only a run of crashes in a row with no progress at all marks
                // the task as the likely cause: it goes to failed/ so the daemon can get on
                // with the rest of the queue.
                let progressed = self.attempt_progressed(&entry).await;
                entry.crashes_without_progress = if progressed {
                    0
                } else {
                    entry.crashes_without_progress + 1
                };
                let limit = crash_limit(&task);
                self.ctx.journal(
                    &id,
                    "resumed_after_crash",
                    serde_json::json!({
                        "attempt": entry.attempt,
                        "phase": entry.phase,
                        "progressed": progressed,
                        "crashes_without_progress": entry.crashes_without_progress,
                        "limit": limit,
                    }),
                );
                if entry.crashes_without_progress >= limit {
                    let error = format!(
                        "the daemon stopped unexpectedly {} times in a row while this task ran, without a checkpoint or a finished phase in between",
                        entry.crashes_without_progress
                    );
                    self.give_up(&task, entry, error).await;
                    return;
                }
                tracing::info!(task_id = %id, phase = %entry.phase, "resuming after a crash");
                entry.status = ActiveStatus::Interrupted;
                self.resume.push_back(id.clone());
            }
            ActiveStatus::Interrupted => self.resume.push_back(id.clone()),
            // Paused stays paused until `cairn resume`.
            ActiveStatus::Paused => {}
            ActiveStatus::WaitingRetry => {
                let at = entry.next_attempt_at.unwrap_or_else(Utc::now);
                self.retries.push((at, id.clone()));
            }
        }
        self.ctx.work.update(|w| w.upsert(entry));
        self.tasks.insert(id, task);
    }

    /// The failed record that `entry` was retried from, if it is still in `failed/`.
    async fn retried_record(&self, entry: &ActiveTask) -> Option<FailedRecord> {
        let retry_of = entry.retry_of?;
        let storage = Arc::clone(&self.ctx.storage);
        let key = QueueDir::failed_key(&entry.task_id);
        let bytes = runner_blocking(move || storage.get(&key)).await.ok()??;
        let record: FailedRecord = serde_json::from_slice(&bytes).ok()?;
        (record.failed_at == retry_of).then_some(record)
    }

    /// Did the attempt recorded in `entry` finish a phase or write a checkpoint?
    pub(super) async fn attempt_progressed(&self, entry: &ActiveTask) -> bool {
        if entry.phase_index > entry.attempt_started_phase {
            return true;
        }
        let checkpoints = self.ctx.checkpoints.clone();
        let id = entry.task_id.clone();
        match runner_blocking(move || checkpoints.latest(&id)).await {
            Ok(Some(loaded)) => {
                loaded.checkpoint.attempt == entry.attempt
                    && loaded.checkpoint.phase_index == entry.phase_index
            }
            _ => false,
        }
    }

    /// Accepted tasks that never started (not in current_work and without a record).
    pub(super) async fn load_pending(&mut self) -> Result<(), DaemonError> {
        let storage = Arc::clone(&self.ctx.storage);
        let names = runner_blocking(move || storage.list("tasks"))
            .await
            .map_err(|e| DaemonError::Setup(format!("listing tasks/: {e}")))?;
        let mut found = Vec::new();
        for name in names {
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if self.tasks.contains_key(id) || self.has_record(id).await {
                continue;
            }
            match self.read_task(id).await {
                Ok(task) => {
                    let accepted = std::fs::metadata(self.ctx.queue.tasks().join(&name))
                        .and_then(|m| m.modified())
                        .ok();
                    found.push((accepted, task));
                }
                Err(error) => tracing::error!(task_id = id, "skipping task: {error}"),
            }
        }
        found.sort_by_key(|(accepted, _)| *accepted);
        for (_, task) in found {
            self.add_pending(task);
        }
        Ok(())
    }

    pub(super) fn add_pending(&mut self, task: Task) {
        let id = task.id().to_string();
        self.pending
            .push((task.priority, Reverse(self.next_seq), id.clone()));
        self.next_seq += 1;
        self.tasks.insert(id, Arc::new(task));
    }

    pub(super) async fn has_record(&self, id: &str) -> bool {
        let storage = Arc::clone(&self.ctx.storage);
        let (done, failed) = (QueueDir::done_key(id), QueueDir::failed_key(id));
        runner_blocking(move || {
            matches!(storage.get(&done), Ok(Some(_))) || matches!(storage.get(&failed), Ok(Some(_)))
        })
        .await
    }

    pub(super) async fn read_task(&self, id: &str) -> Result<Task, String> {
        let storage = Arc::clone(&self.ctx.storage);
        let key = QueueDir::task_key(id);
        let get_key = key.clone();
        let bytes = runner_blocking(move || storage.get(&get_key))
            .await
            .map_err(|e| format!("reading {key}: {e}"))?
            .ok_or_else(|| format!("its definition {key} is missing"))?;
        let mut task = Task::parse_stored(&bytes).map_err(|e| format!("{key}: {e}"))?;
        task.id = Some(id.to_string());
        Ok(task)
    }
}

/// Crashes in a row without progress after which a task is taken for the cause of them:
/// more than its attempts, so that a few unlucky kills never fail a healthy task.
pub(super) fn crash_limit(task: &Task) -> u32 {
    task.retry.max_attempts.saturating_add(2)
}
