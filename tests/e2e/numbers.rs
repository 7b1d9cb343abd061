//! Numbers a command writes come back exactly as written: integers beyond 64 bits, floats with
//! more digits than an f64 keeps or out of its range, and spellings such as `1.10` and `1E+2`,
//! through a loop's iterations, its checkpoint and a resume from it, items' results, phase
//! outputs and inputs, the done record, a worker's `CAIRN_RESUME`, `cairn checkpoint` and
//! `cairn fork --patch`. The commands (`tests/fixtures/exact_numbers.py`) copy number tokens as
//! text, never through a float, so any re-encoding on the way shows as a changed token.

use std::collections::BTreeMap;
use std::fs;

use crate::common::*;
use serde_json::Value;

/// The numbers under test, by state key: as the commands write them, and as they come back.
/// Every digit is kept; only an exponent's spelling is normalized (`E` → `e`, an explicit
/// sign), which is how Python, JavaScript and Go write exponents in the first place.
const NUMBERS: [(&str, &str, &str); 8] = [
    (
        "big",
        "170141183460469231731687303715884118073",
        "170141183460469231731687303715884118073",
    ), // 2**127 + 12345
    ("neg", "-9223372036854775809", "-9223372036854775809"), // -2**63 - 1
    ("tenth", "0.1", "0.1"),
    ("padded", "1.10", "1.10"),
    (
        "long",
        "3.14159265358979323846264338327950288",
        "3.14159265358979323846264338327950288",
    ),
    ("python", "1e+16", "1e+16"),
    ("huge", "1e400", "1e+400"),  // beyond f64
    ("tiny", "1E-400", "1e-400"), // below the smallest f64
];

fn expected_tokens() -> BTreeMap<String, String> {
    NUMBERS
        .iter()
        .map(|(key, _, kept)| (key.to_string(), kept.to_string()))
        .collect()
}

/// `{"big": 170…, "neg": …, "count": N}` as text, with the numbers' tokens as written.
fn state_text(count: u64) -> String {
    let fields: Vec<String> = NUMBERS
        .iter()
        .map(|(key, written, _)| format!("\"{key}\": {written}"))
        .collect();
    format!("{{{}, \"count\": {count}}}", fields.join(", "))
}

/// Each number of `NUMBERS` under `value`'s keys, as its JSON text.
fn tokens_of(value: &Value) -> BTreeMap<String, String> {
    NUMBERS
        .iter()
        .map(|(key, _, _)| (key.to_string(), value[key].to_string()))
        .collect()
}

/// `text` holds every number's token, each as a whole JSON number after its key.
fn assert_holds_every_token(what: &str, text: &str) {
    let compact: String = text.split_whitespace().collect();
    for (key, _, token) in NUMBERS {
        assert!(
            compact.contains(&format!("\"{key}\":{token}")),
            "{what} lost \"{key}\": {token}:\n{text}"
        );
    }
}

/// The task's done record once the queue is idle; its failure or rejection otherwise.
fn done_record(queue: &TestQueue, id: &str) -> Value {
    queue.done(id).unwrap_or_else(|| {
        panic!(
            "task {id} is not done: failed {:?}, rejected {:?}",
            queue.failed(id),
            queue.rejections()
        )
    })
}

fn stdout_text(queue: &TestQueue, args: &[&str]) -> String {
    let output = queue.cairn_output(args, b"");
    assert_eq!(
        output.status.code(),
        Some(0),
        "cairn {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

#[test]
fn a_loop_items_and_once_phases_keep_every_number_exactly() {
    let queue = TestQueue::new();
    let side = queue.aux("numbers.side");
    let items: Vec<&str> = NUMBERS.iter().map(|(_, written, _)| *written).collect();
    let kept_items: Vec<&str> = NUMBERS.iter().map(|(_, _, kept)| *kept).collect();
    // Written by hand: serializing a Value here would already decide how the numbers look.
    let task = format!(
        r#"{{
  "id": "numbers",
  "retry": {{"max_attempts": 2, "backoff": "1s"}},
  "phases": [
    {{"name": "grow", "kind": "loop", "max_iterations": 10,
      "run": ["python3", {script}, "loop", {side}, "4", "2"],
      "initial_state": {state}}},
    {{"name": "each", "kind": "items", "items": [{items}], "concurrency": 2,
      "run": ["python3", {script}, "item"]}},
    {{"name": "echo", "run": ["cat"]}}
  ]
}}"#,
        script = Value::from(fixture("exact_numbers.py").display().to_string()),
        side = Value::from(side.display().to_string()),
        state = state_text(0),
        items = items.join(", "),
    );
    queue.drop_bytes("numbers.json", task.as_bytes(), true);
    queue.run_until_idle(&[]);
    let done = done_record(&queue, "numbers");

    // Every iteration saw every number as written: iteration 2 twice (it failed in attempt 1,
    // and attempt 2 resumed from the checkpoint of iteration 1's state).
    let lines: Vec<Value> = fs::read_to_string(&side)
        .expect("the loop's side file")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a side line"))
        .collect();
    let seen: Vec<(u64, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["iteration"].as_u64().unwrap(),
                l["attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(seen, [(0, 1), (1, 1), (2, 1), (2, 2), (3, 2)], "{lines:?}");
    for line in &lines {
        let tokens: BTreeMap<String, String> =
            serde_json::from_value(line["tokens"].clone()).unwrap();
        assert_eq!(tokens, expected_tokens(), "iteration {line}");
    }

    // The done record, read as text and as values: the loop's output, the items' results in
    // order, and the echoed inputs of the last phase.
    let record_text = fs::read_to_string(queue.path("done/numbers.json")).unwrap();
    assert_holds_every_token("done/numbers.json", &record_text);
    let outputs = &done["phase_outputs"];
    assert_eq!(tokens_of(&outputs["grow"]["final"]), expected_tokens());
    assert_eq!(outputs["grow"]["final"]["count"], 4);
    let results: Vec<String> = outputs["each"]
        .as_array()
        .expect("the items' results")
        .iter()
        .map(|result| result["item"].to_string())
        .collect();
    assert_eq!(results, kept_items);
    let echoed = &outputs["echo"]["inputs"];
    assert_eq!(tokens_of(&echoed["grow"]["final"]), expected_tokens());
    assert_eq!(echoed["each"], outputs["each"]);
    assert_eq!(done["result"], outputs["echo"]);

    // The last checkpoint (the items phase's) as `cairn checkpoint` prints it.
    let printed = stdout_text(&queue, &["checkpoint", "numbers"]);
    let checkpoint: Value = serde_json::from_str(&printed).unwrap();
    let kept: Vec<String> = (0..NUMBERS.len())
        .map(|i| checkpoint["partial_results"]["results"][i.to_string()]["item"].to_string())
        .collect();
    assert_eq!(kept, kept_items, "{printed}");
}

#[test]
fn a_worker_resumes_with_its_numbers_exactly_and_fork_patches_keep_them() {
    let queue = TestQueue::new();
    let side = queue.aux("worker.side");
    let task = serde_json::json!({
        "id": "wnumbers",
        "retry": {"backoff": "1s"},
        "phases": [{
            "name": "work",
            "kind": "worker",
            "run": ["python3", fixture("exact_numbers.py"), "worker", side, state_text(1)],
        }],
    });
    queue.seed_task("wnumbers.json", &task);
    queue.run_until_idle(&[]);
    let done = done_record(&queue, "wnumbers");

    // The resume file as the worker read it: the iteration and the state, numbers as sent.
    let resumes: Vec<String> = fs::read_to_string(&side)
        .expect("the worker's side file")
        .lines()
        .map(|line| {
            let line: Value = serde_json::from_str(line).unwrap();
            line["resume"].as_str().expect("a resume line").to_string()
        })
        .collect();
    assert_eq!(resumes.len(), 1, "{resumes:?}");
    let sent: Value = serde_json::from_str(&state_text(1)).unwrap();
    assert_eq!(
        resumes[0],
        format!("{{\"iteration\":1,\"state\":{sent}}}\n"),
        "CAIRN_RESUME"
    );
    assert_holds_every_token("the resume file", &resumes[0]);
    assert_eq!(tokens_of(&done["result"]["final"]), expected_tokens());

    // `cairn checkpoint` of the worker's final checkpoint, and a fork whose patch adds more.
    let printed = stdout_text(&queue, &["checkpoint", "wnumbers"]);
    assert_holds_every_token("cairn checkpoint", &printed);
    // The state's keys in the order the worker wrote them, not sorted.
    let written: Vec<&str> = NUMBERS.iter().map(|(key, _, _)| *key).collect();
    let state = &serde_json::from_str::<Value>(&printed).unwrap()["partial_results"];
    let printed_keys: Vec<&str> = state
        .as_object()
        .expect("the state")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(printed_keys[..written.len()], written[..], "{printed}");
    let patch = r#"{"added": 340282366920938463463374607431768211457, "tenth": 0.10}"#;
    let new_id = stdout_text(
        &queue,
        &["fork", "wnumbers", "--patch", patch, "--as", "wfork"],
    );
    assert_eq!(new_id.trim(), "wfork");
    let forked: Value =
        serde_json::from_str(&stdout_text(&queue, &["checkpoint", "wfork"])).unwrap();
    let state = &forked["partial_results"];
    assert_eq!(
        state["added"].to_string(),
        "340282366920938463463374607431768211457"
    );
    assert_eq!(state["tenth"].to_string(), "0.10");
    assert_eq!(state["big"].to_string(), NUMBERS[0].2);
    assert_eq!(state["huge"].to_string(), "1e+400");
}
