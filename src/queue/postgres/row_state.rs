//! A task row's `state` in `cairn_tasks`, typed: the values the schema's CHECK allows, read
//! and written through this enum, so that a misspelt state is a compile error, not a row no daemon
//! ever claims.

use std::error::Error;

use tokio_postgres::types::{FromSql, Type};

/// Where a task stands in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum RowState {
    /// Waiting to be claimed (never started, interrupted, or waiting for a retry).
    Queued,
    /// Claimed under a lease (which may have expired).
    Running,
    /// Held by `cairn pause` until `cairn resume`.
    Paused,
    Done,
    /// Failed, quarantined or stopped by its budget (the record's status tells which).
    Failed,
    Cancelled,
}

impl RowState {
    /// Every state, in the schema's order.
    pub(super) const ALL: [RowState; 6] = [
        RowState::Queued,
        RowState::Running,
        RowState::Paused,
        RowState::Done,
        RowState::Failed,
        RowState::Cancelled,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            RowState::Queued => "queued",
            RowState::Running => "running",
            RowState::Paused => "paused",
            RowState::Done => "done",
            RowState::Failed => "failed",
            RowState::Cancelled => "cancelled",
        }
    }

    pub(super) fn parse(text: &str) -> Option<RowState> {
        RowState::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
    }

    /// Whether the task has its final record: no daemon claims it again (but a retry).
    pub(super) fn is_final(self) -> bool {
        matches!(
            self,
            RowState::Done | RowState::Failed | RowState::Cancelled
        )
    }
}

/// A state the schema does not allow (a newer schema's, or a hand-edited row).
#[derive(Debug, thiserror::Error)]
#[error("a task row's state {0:?} is none this cairn knows")]
pub(super) struct UnknownRowState(String);

impl<'a> FromSql<'a> for RowState {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        let text = <&str as FromSql>::from_sql(ty, raw)?;
        RowState::parse(text).ok_or_else(|| UnknownRowState(text.to_string()).into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::RowState;

    /// The enum and the schema's CHECK name the same states.
    #[test]
    fn the_states_are_the_schemas() {
        let schema = include_str!("schema.sql");
        let check = schema
            .lines()
            .find(|line| line.contains("CHECK (state IN"))
            .expect("the schema checks the state");
        let listed: Vec<&str> = check.split('\'').skip(1).step_by(2).collect();
        let ours: Vec<&str> = RowState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(listed, ours);
        for state in RowState::ALL {
            assert_eq!(RowState::parse(state.as_str()), Some(state));
        }
        assert_eq!(RowState::parse("Queued"), None);
    }
}
