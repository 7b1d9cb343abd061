-- cairn's schema, version 1. Applied once, inside the migration's transaction.

-- One row per daemon name: who is alive (renewals update last_seen_at).
CREATE TABLE cairn_nodes (
    name text PRIMARY KEY,
    -- Tells a restarted daemon from another one that uses the same name.
    instance bigint NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now()
);

-- Every task, from submission to its final record. A task is leased while state = 'running':
-- lease_node holds it until lease_expires_at (by the database's clock), and every write for it
-- names lease_epoch, which each claim raises.
CREATE TABLE cairn_tasks (
    id text PRIMARY KEY,
    -- The task file as submitted, kept verbatim (json, not jsonb: every digit and key order).
    definition json NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'queued'
        CHECK (state IN ('queued', 'running', 'paused', 'done', 'failed', 'cancelled')),
    submitted_at timestamptz NOT NULL DEFAULT now(),
    -- A retry waiting for its backoff is not claimed before this.
    not_before timestamptz,
    lease_node text,
    lease_epoch bigint NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    -- Leases that expired in a row with no checkpoint or clean release in between, and after
    -- how many the task is taken for their cause and quarantined.
    crash_count integer NOT NULL DEFAULT 0,
    crash_limit integer NOT NULL,
    -- The phase-level state of the task in flight (what current_work.json holds per task).
    phase_state json,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cairn_tasks_claimable ON cairn_tasks (priority DESC, submitted_at, id)
    WHERE state IN ('queued', 'running');
CREATE INDEX cairn_tasks_by_lease_node ON cairn_tasks (lease_node) WHERE lease_node IS NOT NULL;

-- Iteration checkpoints: the same gzip bytes as the files, one row per generation kept.
CREATE TABLE cairn_checkpoints (
    task_id text NOT NULL REFERENCES cairn_tasks (id) ON DELETE CASCADE,
    generation bigint NOT NULL,
    bytes bytea NOT NULL,
    iteration_count bigint NOT NULL,
    lease_epoch bigint NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, generation)
);

-- Outputs of finished phases.
CREATE TABLE cairn_outputs (
    task_id text NOT NULL REFERENCES cairn_tasks (id) ON DELETE CASCADE,
    phase_index integer NOT NULL,
    phase text NOT NULL,
    output json NOT NULL,
    lease_epoch bigint NOT NULL,
    PRIMARY KEY (task_id, phase_index)
);

-- Final records (what done/ and failed/ hold for the file queue).
CREATE TABLE cairn_records (
    task_id text PRIMARY KEY REFERENCES cairn_tasks (id) ON DELETE CASCADE,
    status text NOT NULL,
    record json NOT NULL,
    lease_epoch bigint NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
);

-- Each task's event journal.
CREATE TABLE cairn_events (
    id bigserial PRIMARY KEY,
    task_id text NOT NULL REFERENCES cairn_tasks (id) ON DELETE CASCADE,
    at timestamptz NOT NULL DEFAULT now(),
    node text NOT NULL,
    lease_epoch bigint NOT NULL,
    event json NOT NULL
);
CREATE INDEX cairn_events_by_task ON cairn_events (task_id, id);

-- Requests of cairn pause, resume, cancel and retry, until the daemon holding the task (or
-- the next one to claim it) has handled them.
CREATE TABLE cairn_control (
    id bigserial PRIMARY KEY,
    task_id text NOT NULL,
    action text NOT NULL CHECK (action IN ('pause', 'resume', 'cancel', 'retry')),
    requested_at timestamptz NOT NULL DEFAULT now(),
    handled_at timestamptz
);
CREATE INDEX cairn_control_pending ON cairn_control (task_id) WHERE handled_at IS NULL;
