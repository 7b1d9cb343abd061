//! What a command sees: the request on stdin, its identity in the environment (stable
//! idempotency keys across attempts), and the queue directory as its working directory.

use crate::common::*;
use serde_json::json;

/// Replies with the request it read and the CAIRN_* environment it was given.
const ECHO: &str = "import json, os, sys
request = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith('CAIRN_') and k != 'CAIRN_RUN_DIR'}
reply = {'request': request, 'env': env, 'cwd': os.getcwd()}
if 'iteration' in request:
    seen = (request['state'] or []) + [reply]
    reply = {'state': seen}
print(json.dumps(reply))";

#[test]
fn commands_get_the_request_their_identity_and_the_queue_as_cwd() {
    let queue = TestQueue::new();
    queue.seed_task(
        "ident.json",
        &json!({
            "id": "ident",
            "env": {"MODEL": "tiny"},
            "phases": [
                {"name": "first", "run": ["python3", "-c", ECHO]},
                {"name": "steps", "kind": "loop", "run": ["python3", "-c", ECHO], "max_iterations": 2},
            ],
        }),
    );
    queue.run_until_idle(&[]);
    let done = queue.done("ident").expect("done/ident.json");
    let root = std::fs::canonicalize(queue.root()).unwrap();

    let first = &done["phase_outputs"]["first"];
    assert_eq!(
        first["request"],
        json!({"task_id": "ident", "phase": "first", "inputs": {}, "attempt": 1})
    );
    assert_eq!(
        first["env"],
        json!({
            "CAIRN_TASK_ID": "ident",
            "CAIRN_PHASE": "first",
            "CAIRN_ATTEMPT": "1",
            "CAIRN_IDEMPOTENCY_KEY": "ident:first:0",
            "CAIRN_CLIENTS": queue.path("clients"),
        })
    );
    assert_eq!(first["cwd"], json!(root));

    let steps = done["result"]
        .as_array()
        .expect("the loop's state is its output");
    assert_eq!(steps.len(), 2);
    for (i, step) in steps.iter().enumerate() {
        let request = &step["request"];
        assert_eq!(request["iteration"], i);
        assert_eq!(request["phase"], "steps");
        assert_eq!(request["attempt"], 1);
        assert_eq!(request["inputs"], json!({"first": first}));
        assert_eq!(step["env"]["CAIRN_ITERATION"], i.to_string());
        assert_eq!(
            step["env"]["CAIRN_IDEMPOTENCY_KEY"],
            format!("ident:steps:{i}")
        );
        assert_eq!(step["env"]["CAIRN_PHASE"], "steps");
    }
    // Iteration 1 got the state iteration 0 left.
    assert_eq!(steps[1]["request"]["state"], json!([steps[0]]));
}

#[test]
fn the_task_env_reaches_the_command() {
    let queue = TestQueue::new();
    queue.seed_task(
        "env.json",
        &json!({
            "id": "env",
            "env": {"MODEL": "tiny", "GREETING": "it's \"quoted\""},
            "phases": [{
                "name": "show",
                "run": ["python3", "-c", "import json, os; print(json.dumps([os.environ['MODEL'], os.environ['GREETING']]))"],
            }],
        }),
    );
    queue.run_until_idle(&[]);
    assert_eq!(
        queue.done("env").unwrap()["result"],
        json!(["tiny", "it's \"quoted\""])
    );
}
