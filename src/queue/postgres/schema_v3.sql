-- cairn's schema, version 3. Applied once, inside the migration's transaction, after version 2.
-- Precise crash blame (docs/cluster.md, "Crash blame"): an expired lease is judged once, and
-- only a task that was in flight alone on its node, without progress, has a crash counted.

-- The lease epoch under which the task last made progress (a checkpoint or a finished phase).
ALTER TABLE cairn_tasks ADD COLUMN progressed_epoch bigint;
-- The lease epoch whose expiry was judged, so that each expiry is judged once.
ALTER TABLE cairn_tasks ADD COLUMN judged_epoch bigint;
-- Expired together with other tasks of its node, without progress: to be tried alone.
ALTER TABLE cairn_tasks ADD COLUMN suspect boolean NOT NULL DEFAULT false;
CREATE INDEX cairn_tasks_suspects ON cairn_tasks (priority DESC, submitted_at, id)
    WHERE suspect;
