//! The recorder, the JSON-lines format and well-formedness.

use std::thread;

use permit_check::{
    check_well_formed, Completion, History, HistoryError, Invariant, Invocation, Op, Outcome, Recorder,
};

use crate::support::{assert_passes, Script};

#[test]
fn a_history_survives_save_and_load() {
    let mut script = Script::new();
    script.create(1, "a", 2000, (0, 5));
    script.acquire(1, "a", "db", 2, (10, 20), 4);
    script.describe(2, "db", (30, 40), &[("a", 2, 4)]);
    script.validate(2, "db", 4, (50, 60), true);
    script.release(1, "a", "db", (70, 80), 2);
    script.acquire_unknown(1, "a", "db", 1, 90);
    script.write(3, "a", "counter", 4, (100, 110), false);
    let history = script.history();
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("history.jsonl");
    history.save(&path).unwrap();
    assert_eq!(History::load(&path).unwrap(), history);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), history.len());
    assert!(text.contains(r#""kind":{"type":"create_session","ttl_ms":2000}"#), "{text}");
}

#[test]
fn a_bad_line_is_reported_with_its_number() {
    let mut script = Script::new();
    script.create(1, "a", 2000, (0, 5));
    let text = format!("{}\n{{\"id\": 1}}\n", script.history().to_json_lines().trim_end());
    match History::from_json_lines(&text) {
        Err(HistoryError::Json { line, .. }) => assert_eq!(line, 2),
        other => panic!("expected a JSON error on line 2, got {other:?}"),
    }
    assert!(matches!(History::load("/nonexistent/history.jsonl"), Err(HistoryError::Io { .. })));
}

#[test]
fn many_threads_record_into_one_history_with_ordered_times() {
    let recorder = Recorder::new();
    let workers: Vec<_> = (0..8)
        .map(|client| {
            let recorder = recorder.clone();
            thread::spawn(move || {
                for token in 0..50 {
                    let call = recorder.invoke(Invocation::acquire(client, "s", "db", 1));
                    call.complete(Completion { token: Some(token), ..Completion::ok() });
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let history = recorder.history();
    assert_eq!(history.len(), 400);
    assert!(history.ops().windows(2).all(|pair| pair[0].invoke_ns <= pair[1].invoke_ns));
    assert!(history
        .ops()
        .iter()
        .all(|op| op.complete_ns.is_some_and(|complete_ns| complete_ns >= op.invoke_ns)));
    assert_passes(&check_well_formed(&history));
}

#[test]
fn a_dropped_handle_leaves_its_call_unknown_and_a_create_learns_its_session() {
    let recorder = Recorder::new();
    let create = recorder.invoke(Invocation::create_session(1, 2000));
    create.complete(Completion {
        session: Some("5f0c".into()),
        node: Some(2),
        raft_term: Some(7),
        ..Completion::ok()
    });
    drop(recorder.invoke(Invocation::keepalive(1, "5f0c")));
    let history = recorder.history();
    assert_eq!((history.ops()[0].session.as_str(), history.ops()[0].raft_term), ("5f0c", Some(7)));
    assert_eq!((history.ops()[1].outcome, history.ops()[1].complete_ns), (Outcome::Unknown, None));
}

#[test]
fn malformed_ops_are_reported() {
    let mut ops = Vec::new();
    let mut granted = Op::invoked(0, Invocation::acquire(1, "a", "db", 1), 10);
    granted.complete(20, Completion::ok());
    ops.push(granted);
    let mut backwards = Op::invoked(1, Invocation::release(1, "a", "db"), 50);
    backwards.complete(40, Completion { released: Some(0), ..Completion::ok() });
    ops.push(backwards);
    let mut no_answer_time = Op::invoked(1, Invocation::describe(1, "db"), 60);
    no_answer_time.outcome = Outcome::Fail;
    ops.push(no_answer_time);
    let mut anonymous = Op::invoked(3, Invocation::create_session(1, 2000), 70);
    anonymous.complete(80, Completion::ok());
    ops.push(anonymous);
    let report = check_well_formed(&ops.into_iter().collect());
    let messages: Vec<&str> = report.violations.iter().map(|violation| violation.message.as_str()).collect();
    assert_eq!(report.violations.len(), 5, "{report}");
    assert!(report.violations.iter().all(|violation| violation.invariant == Invariant::WellFormed));
    for expected in ["no token", "completed before", "used twice", "no completion time", "no id"] {
        assert!(
            messages.iter().any(|message| message.contains(expected)),
            "missing {expected:?} in {report}"
        );
    }
}
