-- cairn's schema, version 2. Applied once, inside the migration's transaction, after version 1.

-- Where a forked task starts instead of its first phase (`cairn fork --db`): the phase index,
-- the outputs of the phases before it, and the task and checkpoint generation it came from.
ALTER TABLE cairn_tasks ADD COLUMN start_point json;

-- Final records a retry replaced, kept as the task's history (`archived/` of the file queue's
-- runs/<id>/failed-*.json).
CREATE TABLE cairn_record_history (
    id bigserial PRIMARY KEY,
    task_id text NOT NULL REFERENCES cairn_tasks (id) ON DELETE CASCADE,
    status text NOT NULL,
    record json NOT NULL,
    finished_at timestamptz NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cairn_record_history_by_task ON cairn_record_history (task_id, id);

-- Who handled a control request, and what became of it (`applied`, `refused: <why>`,
-- `unknown task`), for the command that waits for it.
ALTER TABLE cairn_control ADD COLUMN handled_by text;
ALTER TABLE cairn_control ADD COLUMN outcome text;
