-- cairn's schema, version 4. Applied once, inside the migration's transaction, after version 3.
-- Each daemon's lease length, so that `cairn status --db` judges a daemon gone once it was not
-- seen for its own lease (renewals note it alive every sixth of it), not after a constant.
ALTER TABLE cairn_nodes ADD COLUMN lease_seconds float8;
