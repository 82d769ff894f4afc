//! `flow recover` when a stored plan no longer loads.

use flow_tests::{TempDir, run_in};

fn flow(dir: &TempDir, args: &[&str]) -> flow_tests::Run {
    run_in(
        std::path::Path::new(env!("CARGO_BIN_EXE_flow")),
        dir.path(),
        args,
    )
}

/// A gate that expires at once and lets the run go on as rejected; `tag`
/// makes plans of distinct hashes.
fn expiring_gate(tag: &str) -> String {
    format!(
        "workflow w {{\n  step g = approval {{ approvers: [\"a\"], message: \"{tag}\", expires: 10ms, on_reject: \"continue\", on_expire: \"reject\" }}\n}}\n"
    )
}

/// Parks a run of `file`; its id.
fn parked(dir: &TempDir, file: &str) -> String {
    let run = flow(dir, &["run", file, "--input", "in.json", "--json"]);
    assert_eq!(run.code, 3, "parked: {}", run.all());
    let record: serde_json::Value = serde_json::from_str(&run.stdout).expect("a run record");
    record["run_id"].as_str().expect("its id").to_string()
}

/// Regression: `flow recover` claimed each run before reading its plan and
/// stopped at the first plan that did not load, the runs after it (and the
/// one claimed) left behind. Now the runs of that plan are named and left
/// as they are, the others recover, the exit code says a store error (2),
/// and running the source again mends the stored plan.
#[test]
fn a_plan_that_does_not_load_holds_back_only_its_own_runs() {
    let dir = TempDir::new("flow-recover-unloadable");
    dir.write("a.flow", expiring_gate("a"));
    dir.write("b.flow", expiring_gate("b"));
    dir.write("in.json", "{}");
    let stuck = parked(&dir, "a.flow");
    let other = parked(&dir, "b.flow");
    let store = || {
        flow_runtime::sqlite::SqliteStore::open(&dir.path().join("flow.db"))
            .expect("the store opens")
    };
    {
        // Damaged as a disk or a hand might: text that does not match its
        // hash, which `Plan::from_json` refuses.
        let store = store();
        let hash = store.run(&stuck).unwrap().unwrap().plan_hash;
        let mut plan = store.plan(&hash).unwrap();
        // (Not its `source`, the file's path, which the hash leaves out.)
        plan.workflows[0].timeout_ms += 1;
        store.put_plan(&plan).expect("the stored copy is replaced");
    }
    std::thread::sleep(std::time::Duration::from_millis(50));

    let recovered = flow(&dir, &["recover", "--json"]);
    assert_eq!(recovered.code, 2, "{}", recovered.all());
    assert!(
        recovered.stderr.contains(&format!(
            "error: run {stuck} (w) stays unfinished: its plan does not load"
        )),
        "{}",
        recovered.stderr
    );
    let status = |id: &str| store().run(id).unwrap().unwrap().status.to_string();
    assert_eq!(status(&other), "completed", "{}", recovered.all());
    assert_eq!(status(&stuck), "pending_approval");

    // Run the source again: its plan is stored again, and the run recovers.
    let again = parked(&dir, "a.flow");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let recovered = flow(&dir, &["recover", "--json"]);
    assert_eq!(recovered.code, 0, "{}", recovered.all());
    for id in [&stuck, &again] {
        assert_eq!(status(id), "completed");
    }
}
