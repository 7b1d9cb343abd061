//! `once` phases: run the command one time; its stdout (JSON) is the phase output.
//! An interrupted `once` phase is run again from the start.

use serde_json::{json, Value};

use super::{PhaseEnd, PhaseError, PhaseRun};

pub(super) async fn run(run: &PhaseRun<'_>) -> Result<PhaseEnd, PhaseError> {
    run.check_budget(true, "")?;
    let request = json!({
        "task_id": run.task.id(),
        "phase": run.phase.name,
        "inputs": run.inputs,
        "attempt": run.attempt,
    });
    let Some(stdout) = run.call(&request, None).await? else {
        return Ok(PhaseEnd::Interrupted);
    };
    // A command that prints nothing (such as `true`) has the output null.
    if stdout.iter().all(u8::is_ascii_whitespace) {
        return Ok(PhaseEnd::Completed(Value::Null));
    }
    Ok(PhaseEnd::Completed(run.parse_reply(&stdout, None)?))
}
