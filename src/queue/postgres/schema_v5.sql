-- cairn's schema, version 5. Applied once, inside the migration's transaction, after version 4.
-- Who submitted a task and who asked for a control request, as the database knows them (the
-- session's role, never what the client sent), and the roles cairn trusts: the ground on which
-- `cairn run --db --run-as-submitter` runs a task as a local user (docs/security.md).

-- The role of the session that inserted the row, set by the triggers below.
ALTER TABLE cairn_tasks ADD COLUMN submitted_role text;
ALTER TABLE cairn_control ADD COLUMN requested_role text;

-- The roles of a shared queue, written by the owner of cairn's tables alone (`cairn db grant`):
-- `daemon` roles (the tasks they insert came through a host's inbox, whose owner the daemon
-- checked) and `submitter` roles, each with the local user its tasks run as.
CREATE TABLE cairn_roles (
    role text PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('daemon', 'submitter')),
    local_user text,
    CHECK ((kind = 'submitter') = (local_user IS NOT NULL))
);

-- Whatever the client sends, the row gets the session's role; an update cannot change it.
CREATE FUNCTION cairn_stamp_submitted_role() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.submitted_role := session_user;
    ELSE
        NEW.submitted_role := OLD.submitted_role;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER cairn_tasks_submitted_role
    BEFORE INSERT OR UPDATE OF submitted_role ON cairn_tasks
    FOR EACH ROW EXECUTE FUNCTION cairn_stamp_submitted_role();

CREATE FUNCTION cairn_stamp_requested_role() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.requested_role := session_user;
    ELSE
        NEW.requested_role := OLD.requested_role;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER cairn_control_requested_role
    BEFORE INSERT OR UPDATE OF requested_role ON cairn_control
    FOR EACH ROW EXECUTE FUNCTION cairn_stamp_requested_role();

-- Whether the session's role is a registered daemon. Runs as the owner: submitters may not
-- read cairn_roles.
CREATE FUNCTION cairn_is_daemon() RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path FROM CURRENT AS $$
    SELECT EXISTS (SELECT 1 FROM cairn_roles WHERE role = session_user AND kind = 'daemon')
$$;

-- Row-level security, in force once `cairn db grant` enables it: daemons read and write every
-- row; a submitter inserts tasks, requests and events of its own tasks, and reads only rows of
-- its own tasks and requests. The owner of the tables is not bound by them.
CREATE POLICY cairn_daemon ON cairn_tasks USING ((SELECT cairn_is_daemon())) WITH CHECK ((SELECT cairn_is_daemon()));
CREATE POLICY cairn_submit ON cairn_tasks FOR INSERT WITH CHECK (
    state = 'queued' AND lease_node IS NULL AND lease_expires_at IS NULL AND lease_epoch = 0
    AND phase_state IS NULL AND crash_count = 0 AND NOT suspect
    AND progressed_epoch IS NULL AND judged_epoch IS NULL);
CREATE POLICY cairn_own ON cairn_tasks FOR SELECT USING (submitted_role = session_user);

CREATE POLICY cairn_daemon ON cairn_control USING ((SELECT cairn_is_daemon())) WITH CHECK ((SELECT cairn_is_daemon()));
CREATE POLICY cairn_request ON cairn_control FOR INSERT WITH CHECK (handled_at IS NULL);
CREATE POLICY cairn_own ON cairn_control FOR SELECT USING (requested_role = session_user);

CREATE POLICY cairn_daemon ON cairn_events USING ((SELECT cairn_is_daemon())) WITH CHECK ((SELECT cairn_is_daemon()));
CREATE POLICY cairn_journal ON cairn_events FOR INSERT WITH CHECK (
    node = '' AND task_id IN (SELECT id FROM cairn_tasks WHERE submitted_role = session_user));
CREATE POLICY cairn_own ON cairn_events FOR SELECT
    USING (task_id IN (SELECT id FROM cairn_tasks WHERE submitted_role = session_user));

CREATE POLICY cairn_daemon ON cairn_checkpoints USING ((SELECT cairn_is_daemon())) WITH CHECK ((SELECT cairn_is_daemon()));
CREATE POLICY cairn_fork ON cairn_checkpoints FOR INSERT WITH CHECK (
    lease_epoch = 0 AND task_id IN (SELECT id FROM cairn_tasks WHERE submitted_role = session_user));
CREATE POLICY cairn_own ON cairn_checkpoints FOR SELECT
    USING (task_id IN (SELECT id FROM cairn_tasks WHERE submitted_role = session_user));

CREATE POLICY cairn_daemon ON cairn_outputs USING ((SELECT cairn_is_daemon())) WITH CHECK ((SELECT cairn_is_daemon()));
CREATE POLICY cairn_own ON cairn_outputs FOR SELECT
    USING (task_id IN (SELECT id FROM cairn_tasks WHERE submitted_role = session_user));

CREATE POLICY cairn_daemon ON cairn_records USING ((SELECT cairn_is_daemon())) WITH CHECK ((SELECT cairn_is_daemon()));
CREATE POLICY cairn_own ON cairn_records FOR SELECT
    USING (task_id IN (SELECT id FROM cairn_tasks WHERE submitted_role = session_user));

CREATE POLICY cairn_daemon ON cairn_record_history USING ((SELECT cairn_is_daemon())) WITH CHECK ((SELECT cairn_is_daemon()));
CREATE POLICY cairn_own ON cairn_record_history FOR SELECT
    USING (task_id IN (SELECT id FROM cairn_tasks WHERE submitted_role = session_user));
