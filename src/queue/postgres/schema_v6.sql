-- cairn's schema, version 6. Applied once, inside the migration's transaction, after version 5.
-- `cairn budget ID --max-cost X --db`: a control request that sets a task's spending limit,
-- the limit in its own column.

ALTER TABLE cairn_control DROP CONSTRAINT IF EXISTS cairn_control_action_check;
ALTER TABLE cairn_control ADD CONSTRAINT cairn_control_action_check
    CHECK (action IN ('pause', 'resume', 'cancel', 'retry', 'budget'));
ALTER TABLE cairn_control ADD COLUMN max_cost double precision
    CHECK (max_cost IS NULL OR (max_cost >= 0 AND max_cost < 'Infinity'));
