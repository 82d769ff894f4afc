//! The interpreter's promises, one named case each: retries by error kind,
//! replay without re-execution, approvals at depth, exactly-once decisions,
//! input validation before the first step.
//!
//! The provider here is a scripted stand-in for a model, in process; the HTTP
//! providers and their loopback fake server come with the providers work.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use flow_plan::Plan;
use flow_runtime::error::{ErrorKind, StepError};
use flow_runtime::journal::{Outcome, StepStatus};
use flow_runtime::memory::{DecideError, MemoryStore};
use flow_runtime::offline::fabricate;
use flow_runtime::services::{BoxFuture, Provider, RecipeCall, Services};
use serde_json::{Value, json};

/// Answers from a script per recipe: each call takes the next entry (an error
/// kind to fail with, or `None` to answer with a valid value); past the end
/// of the script every call succeeds. Counts calls per recipe.
#[derive(Default)]
struct Scripted {
    script: Mutex<HashMap<String, Vec<Option<ErrorKind>>>>,
    calls: Mutex<HashMap<String, usize>>,
}

impl Scripted {
    fn with(recipe: &str, script: Vec<Option<ErrorKind>>) -> Scripted {
        let scripted = Scripted::default();
        scripted
            .script
            .lock()
            .unwrap()
            .insert(recipe.to_string(), script);
        scripted
    }

    fn calls(&self, recipe: &str) -> usize {
        self.calls.lock().unwrap().get(recipe).copied().unwrap_or(0)
    }
}

impl Provider for Scripted {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        let count = {
            let mut calls = self.calls.lock().unwrap();
            let count = calls.entry(call.recipe.to_string()).or_insert(0);
            *count += 1;
            *count
        };
        let next = self
            .script
            .lock()
            .unwrap()
            .get(call.recipe)
            .and_then(|script| script.get(count - 1).copied())
            .flatten();
        let result = match next {
            Some(kind) => Err(StepError::new(kind, format!("scripted {kind:?}"))),
            None => Ok(fabricate(call.output_schema, count as u64)),
        };
        Box::pin(async move { result })
    }
}

fn plan(source: &str) -> Plan {
    let checked = flow_compiler::check_source("test.flow", source);
    assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
    flow_compiler::lower(&checked).expect("lowers")
}

const RECIPE: &str = r#"
recipe answer {
  model "default"
  input { q: string }
  output { text: string, score: int }
  prompt "Answer {{input.q}}"
}
"#;

/// Runs workflow `w` of `plan` with no input on a fresh in-memory store.
async fn run_w(plan: &flow_plan::Plan, provider: Arc<dyn Provider>) -> (Outcome, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::default());
    let outcome = flow_runtime::run(plan, "w", "r", json!({}), services(provider, &store)).await;
    (outcome, store)
}

fn services(provider: Arc<dyn Provider>, store: &Arc<MemoryStore>) -> Services {
    Services {
        provider,
        effects: store.clone(),
        mcp: None,
        journal: store.clone(),
        steps: None,
        in_flight: None,
    }
}

#[tokio::test]
async fn retryable_errors_are_retried_and_each_attempt_is_recorded() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{ step a = answer {{ q: \"x\" }} retry 3 backoff 1ms..2ms\n output {{ t: step.a.text }} }}"
    ));
    let provider = Arc::new(Scripted::with(
        "answer",
        vec![Some(ErrorKind::RateLimited), Some(ErrorKind::Server)],
    ));
    let (outcome, store) = run_w(&plan, provider.clone()).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(provider.calls("answer"), 3);
    let record = &store.records()[0];
    assert_eq!(record.attempts.len(), 3);
    assert!(
        record.attempts[0]
            .error
            .as_deref()
            .unwrap()
            .starts_with("rate_limited")
    );
    assert!(record.attempts[0].delay_ms.is_some());
    assert!(record.attempts[2].error.is_none());
    // Each attempt is timed, inside the step's span and in order, with its
    // backoff between one's answer and the next one's call.
    let mut previous_end = record.started_ms;
    for (index, attempt) in record.attempts.iter().enumerate() {
        let (started, ended) = (attempt.started_ms.unwrap(), attempt.ended_ms.unwrap());
        assert!(
            previous_end <= started && started <= ended,
            "{:?}",
            record.attempts
        );
        if index > 0 {
            let delay = record.attempts[index - 1].delay_ms.unwrap();
            assert!(started >= previous_end + delay, "{:?}", record.attempts);
        }
        previous_end = ended;
    }
    assert!(previous_end <= record.ended_ms);
}

#[tokio::test]
async fn client_errors_fail_at_once_and_attempts_stop_at_the_limit() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{ step a = answer {{ q: \"x\" }} retry 3 backoff 1ms..2ms }}"
    ));
    let provider = Arc::new(Scripted::with("answer", vec![Some(ErrorKind::Client)]));
    let (outcome, _) = run_w(&plan, provider.clone()).await;
    assert!(
        matches!(&outcome, Outcome::Failed { error, .. } if error.kind == ErrorKind::Client),
        "{outcome:?}"
    );
    assert_eq!(provider.calls("answer"), 1);

    let provider = Arc::new(Scripted::with("answer", vec![Some(ErrorKind::Server); 5]));
    let (outcome, store) = run_w(&plan, provider.clone()).await;
    assert!(matches!(outcome, Outcome::Failed { .. }), "{outcome:?}");
    assert_eq!(provider.calls("answer"), 3, "three attempts in all");
    assert_eq!(store.records()[0].status, StepStatus::Failed);
}

#[tokio::test]
async fn on_error_continue_and_fallback_keep_the_run_going() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          step a = answer {{ q: \"x\" }} retry 1 on_error continue
          step b = answer {{ q: \"y\" }} retry 1 on_error fallback {{
            step c = answer {{ q: \"{{{{error.kind}}}}: {{{{error.message}}}}\" }}
          }}
          output {{ a: step.a?.text ?? \"none\", c: step.c?.text ?? \"none\" }}
        }}"
    ));
    let provider = Arc::new(Scripted::with(
        "answer",
        vec![Some(ErrorKind::Client), Some(ErrorKind::Client)],
    ));
    let store = Arc::new(MemoryStore::default());
    let outcome = flow_runtime::run(&plan, "w", "r", json!({}), services(provider, &store)).await;
    let Outcome::Completed { output } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(output["a"], "none");
    assert_ne!(output["c"], "none", "the fallback ran");
    let paths: Vec<String> = store.records().iter().map(|r| r.path.clone()).collect();
    assert!(paths.contains(&"b/fallback/c".to_string()), "{paths:?}");
}

/// Two approvals pending at once, in parallel branches: deciding one leaves the
/// run parked at the other; deciding both completes it. Completed steps are
/// not run again on either resume.
#[tokio::test]
async fn approvals_in_parallel_branches_park_together_and_resume_by_replay() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          step first = answer {{ q: \"x\" }}
          parallel gates {{
            branch legal {{ step l = approval {{ approvers: [\"lee@x.io\"], message: \"ok?\" }} }}
            branch money {{ step m = approval {{ approvers: [\"mo@x.io\"], message: \"{{{{step.first.text}}}}\" }} }}
          }}
          step last = answer {{ q: \"{{{{step.l.approver}}}} {{{{step.m.approver}}}}\" }}
          output {{ who: step.last.text, legal: step.l.approved }}
        }}"
    ));
    let provider = Arc::new(Scripted::default());
    let store = Arc::new(MemoryStore::default());
    let services = services(provider.clone(), &store);
    let Outcome::Parked { pending } =
        flow_runtime::run(&plan, "w", "r", json!({}), services.clone()).await
    else {
        panic!("expected to park")
    };
    let mut paths: Vec<&str> = pending.iter().map(|p| p.path.as_str()).collect();
    paths.sort();
    assert_eq!(paths, ["gates/legal/l", "gates/money/m"]);

    store
        .decide("gates/legal/l", "lee@x.io", true, Some("fine"), "t")
        .unwrap();
    let Outcome::Parked { pending } =
        flow_runtime::run(&plan, "w", "r", json!({}), services.clone()).await
    else {
        panic!("still parked at the other gate")
    };
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].path, "gates/money/m");

    store
        .decide("gates/money/m", "mo@x.io", true, None, "t")
        .unwrap();
    let outcome = flow_runtime::run(&plan, "w", "r", json!({}), services).await;
    let Outcome::Completed { output } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(output["legal"], true);
    assert_eq!(
        provider.calls("answer"),
        2,
        "`first` ran once over three runs, `last` once"
    );
}

#[tokio::test]
async fn approvals_inside_loop_iterations_and_branches_of_a_condition() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          input {{ items: list<string>, urgent: bool }}
          if workflow_input.urgent {{
            step esc = approval {{ approvers: [\"boss\"], message: \"escalate?\" }}
          }}
          for workflow_input.items as each concurrency 2 {{
            step ok = approval {{ approvers: [\"boss\"], message: \"{{{{loop_item}}}}?\" }}
          }}
          output {{ n: step.each, esc: step.esc?.approved ?? false }}
        }}"
    ));
    let store = Arc::new(MemoryStore::default());
    let services = services(Arc::new(Scripted::default()), &store);
    let input = json!({ "items": ["a", "b"], "urgent": true });
    let Outcome::Parked { pending } =
        flow_runtime::run(&plan, "w", "r", input.clone(), services.clone()).await
    else {
        panic!("expected to park at the condition's approval")
    };
    assert_eq!(pending[0].path, "esc");
    store.decide("esc", "boss", true, None, "t").unwrap();
    let Outcome::Parked { pending } =
        flow_runtime::run(&plan, "w", "r", input.clone(), services.clone()).await
    else {
        panic!("expected to park in the loop")
    };
    let mut paths: Vec<&str> = pending.iter().map(|p| p.path.as_str()).collect();
    paths.sort();
    assert_eq!(
        paths,
        ["each[0]/ok", "each[1]/ok"],
        "both iterations in flight park"
    );
    for path in ["each[0]/ok", "each[1]/ok"] {
        store.decide(path, "boss", false, Some("no"), "t").unwrap();
    }
    let outcome = flow_runtime::run(&plan, "w", "r", input, services).await;
    // Rejections with the default `on_reject: "fail"` fail the step, and the run.
    assert!(
        matches!(&outcome, Outcome::Failed { error, .. } if error.kind == ErrorKind::Rejected),
        "{outcome:?}"
    );
}

/// Of fifty concurrent decisions on one gate, exactly one is applied.
#[tokio::test]
async fn a_gate_is_decided_exactly_once() {
    let plan = plan("workflow w { step g = approval { approvers: [\"a\"], message: \"m\" } }");
    let store = Arc::new(MemoryStore::default());
    let services = services(Arc::new(Scripted::default()), &store);
    let _ = flow_runtime::run(&plan, "w", "r", json!({}), services).await;
    let applied = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..50)
        .map(|i| {
            let store = Arc::clone(&store);
            let applied = Arc::clone(&applied);
            std::thread::spawn(move || {
                if store.decide("g", "a", i % 2 == 0, None, "t").is_ok() {
                    applied.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(applied.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.decide("g", "a", true, None, "t"),
        Err(DecideError::NotPending("g".into()))
    );
    assert!(matches!(
        store.decide("nope", "a", true, None, "t"),
        Err(DecideError::UnknownStep(_))
    ));
}

/// Regression: a decision on a step that is no approval was refused as
/// "already decided"; no approval is at its path.
#[tokio::test]
async fn a_decision_on_another_kind_of_step_finds_no_approval() {
    let plan = plan(
        "recipe r { model \"m\" input { q: string } output { a: string } prompt \"{{input.q}}\" }\nworkflow w {\n  step s = r { q: \"x\" }\n  step g = approval { approvers: [\"a\"], message: \"m\" }\n}",
    );
    let store = Arc::new(MemoryStore::default());
    let offline = Arc::new(flow_runtime::offline::OfflineProvider::default());
    let _ = flow_runtime::run(&plan, "w", "r", json!({}), services(offline, &store)).await;
    assert_eq!(
        store.decide("s", "a", true, None, "t"),
        Err(DecideError::UnknownStep("s".into()))
    );
    assert_eq!(store.decide("g", "a", true, None, "t"), Ok(()));
}

#[tokio::test]
async fn only_an_approver_decides() {
    let plan = plan("workflow w { step g = approval { approvers: [\"a@x.io\"], message: \"m\" } }");
    let store = Arc::new(MemoryStore::default());
    let _ = flow_runtime::run(
        &plan,
        "w",
        "r",
        json!({}),
        services(Arc::new(Scripted::default()), &store),
    )
    .await;
    assert!(matches!(
        store.decide("g", "eve@x.io", true, None, "t"),
        Err(DecideError::NotAnApprover { .. })
    ));
    assert_eq!(
        store.records()[0].status,
        StepStatus::Pending,
        "nothing changed"
    );
}

/// Regression (issue 13): an approver's address in another case
/// (`A@X.IO`, as mail may deliver it) was refused.
#[tokio::test]
async fn an_approvers_address_ignores_case() {
    let plan = plan("workflow w { step g = approval { approvers: [\"a@x.io\"], message: \"m\" } }");
    let store = Arc::new(MemoryStore::default());
    let _ = flow_runtime::run(
        &plan,
        "w",
        "r",
        json!({}),
        services(Arc::new(Scripted::default()), &store),
    )
    .await;
    store
        .decide("g", "A@X.IO", true, None, "t")
        .expect("the same address in capitals");
    assert_eq!(store.records()[0].status, StepStatus::Completed);
}

/// Regression (an audit): a run's input of 100 KB naming a thousand
/// approvers stored a thousand notifications each holding the whole
/// message, 200 MB in one commit. A gate names at most `MAX_APPROVERS`,
/// and a message to people has at most `MAX_MESSAGE_BYTES`.
#[tokio::test]
async fn messages_to_people_and_their_recipients_are_bounded() {
    let plan = plan(
        r#"workflow w {
  input { people: list<string>, message: string }
  step g = approval { approvers: workflow_input.people, message: workflow_input.message }
}
workflow h {
  input { message: string }
  step tell = handoff "ops" { message: workflow_input.message }
}"#,
    );
    let run = |workflow: &'static str, input: serde_json::Value| {
        let plan = plan.clone();
        async move {
            let store = Arc::new(MemoryStore::default());
            let services = services(Arc::new(Scripted::default()), &store);
            flow_runtime::run(&plan, workflow, "r", input, services).await
        }
    };
    let failure = |outcome: Outcome| match outcome {
        Outcome::Failed { error, .. } => error.message,
        other => panic!("not failed: {other:?}"),
    };
    let people: Vec<String> = (0..101).map(|i| format!("p{i}@x.io")).collect();
    let many = run("w", json!({ "people": people, "message": "m" })).await;
    assert!(failure(many).contains("names 101 approvers"));
    let long = "x".repeat(flow_plan::limits::MAX_MESSAGE_BYTES + 1);
    let gate = run("w", json!({ "people": ["a@x.io"], "message": long })).await;
    assert!(failure(gate).contains("the approval's message is 65537 bytes"));
    let handoff = run("h", json!({ "message": long })).await;
    assert!(failure(handoff).contains("the handoff's message is 65537 bytes"));
    // Regression (an audit): a blank approver parked the run, and a key
    // naming no one decided it.
    let blank = run("w", json!({ "people": ["a@x.io", " "], "message": "m" })).await;
    assert!(failure(blank).contains("a blank name"));
    let within = run(
        "w",
        json!({ "people": ["a@x.io"], "message": "x".repeat(65_536) }),
    )
    .await;
    assert!(matches!(within, Outcome::Parked { .. }), "{within:?}");
}

#[tokio::test]
async fn an_input_that_does_not_match_is_refused_before_the_first_step() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{ input {{ q: string, n: int }} step a = answer {{ q: workflow_input.q }} }}"
    ));
    let provider = Arc::new(Scripted::default());
    let store = Arc::new(MemoryStore::default());
    let outcome = flow_runtime::run(
        &plan,
        "w",
        "r",
        json!({ "q": 3, "extra": true }),
        services(provider.clone(), &store),
    )
    .await;
    let Outcome::Failed { error, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.message.contains("/q"), "{}", error.message);
    assert!(error.message.contains("/n"), "{}", error.message);
    assert!(error.message.contains("extra"), "{}", error.message);
    assert_eq!(provider.calls("answer"), 0);
    assert!(store.records().is_empty());
}

/// Found at preflight, before any step: a run that would fail half-way at
/// its first browser step does not start.
#[tokio::test]
async fn a_browser_step_without_an_mcp_client_fails_clearly() {
    let plan = plan(
        "mcp b { command \"npx\" }\nworkflow w { step p = b.browser_navigate { url: \"http://127.0.0.1\" } retry 1 }",
    );
    let store = Arc::new(MemoryStore::default());
    let outcome = flow_runtime::run(
        &plan,
        "w",
        "r",
        json!({}),
        services(Arc::new(Scripted::default()), &store),
    )
    .await;
    let Outcome::Failed { error, step, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(error.kind, ErrorKind::Preflight);
    assert!(
        error
            .message
            .contains("calls MCP servers (b) but this runtime has no MCP client"),
        "{}",
        error.message
    );
    assert_eq!(step, None);
    assert!(store.records().is_empty(), "nothing ran");
}

/// A `json` value as a condition must be a boolean. Regression: any
/// other value read as false, and the branch was skipped without a word.
#[tokio::test]
async fn a_json_condition_that_is_not_a_boolean_fails_the_run() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{ input {{ j: json }}\n if workflow_input.j {{ step a = answer {{ q: \"x\" }} }}\n output {{ ran: step.a?.text ?? \"no\" }} }}"
    ));
    for (j, ran) in [(json!(true), true), (json!(false), false)] {
        let store = Arc::new(MemoryStore::default());
        let services = services(Arc::new(Scripted::default()), &store);
        let outcome = flow_runtime::run(&plan, "w", "r", json!({ "j": j }), services).await;
        assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
        assert_eq!(store.records().len(), usize::from(ran), "{j}");
    }
    for j in [json!("yes"), json!(5), json!(null)] {
        let store = Arc::new(MemoryStore::default());
        let services = services(Arc::new(Scripted::default()), &store);
        let outcome = flow_runtime::run(&plan, "w", "r", json!({ "j": j }), services).await;
        let Outcome::Failed { error, .. } = outcome else {
            panic!("{j}: {outcome:?}")
        };
        assert_eq!(error.kind, ErrorKind::Expression, "{j}");
        assert!(
            error.message.starts_with("expected a boolean, found"),
            "{j}: {}",
            error.message
        );
    }
}

/// An MCP server that never answers a call.
struct Silent;

impl flow_runtime::services::McpClient for Silent {
    fn call_tool<'a>(
        &'a self,
        _server: &'a flow_plan::McpServer,
        _tool: &'a str,
        _args: &'a Value,
        _path: &'a str,
        _journal: Option<&'a dyn flow_runtime::journal::Journal>,
    ) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(std::future::pending())
    }

    fn check<'a>(
        &'a self,
        _server: &'a flow_plan::McpServer,
        _tools: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// A browser step its timeout ended names the tool and the server that
/// had not answered. Regression: it said only that the attempt "ran past
/// the step's timeout".
#[tokio::test]
async fn a_timed_out_tool_call_names_the_tool_and_its_server() {
    let plan = plan(
        "mcp browser { command \"npx\" }\nworkflow w { step p = browser.browser_navigate { url: \"http://127.0.0.1\" } retry 1 timeout 50ms }",
    );
    let store = Arc::new(MemoryStore::default());
    let mut services = services(Arc::new(Scripted::default()), &store);
    services.mcp = Some(Arc::new(Silent));
    let outcome = flow_runtime::run(&plan, "w", "r", json!({}), services).await;
    let Outcome::Failed { error, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert_eq!(
        error.message,
        "the attempt ran past the step's timeout of 50ms: the tool `browser_navigate` of MCP server `browser` had not answered"
    );
}

/// Answers after a long wait: for the workflow's deadline.
struct Slow;

impl Provider for Slow {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            Ok(fabricate(call.output_schema, 1))
        })
    }
}

/// The workflow's timeout cancels everything in flight, parallel branches
/// included, and counts only active time: a resume gets what is left.
#[tokio::test]
async fn the_workflow_deadline_cancels_work_in_flight() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          timeout 300ms
          parallel both {{
            branch one {{ step a = answer {{ q: \"1\" }} }}
            branch two {{ step b = answer {{ q: \"2\" }} }}
          }}
        }}"
    ));
    let store = Arc::new(MemoryStore::default());
    let started = std::time::Instant::now();
    let outcome =
        flow_runtime::run(&plan, "w", "r", json!({}), services(Arc::new(Slow), &store)).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "cancelled, not awaited"
    );
    let Outcome::Failed { error, step, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert!(error.message.contains("active time"), "{}", error.message);
    // Regression (issue 13): the steps in flight were missing from the
    // trace, and `error.step` was null.
    let records = store.records();
    let cut: Vec<(&str, StepStatus, usize)> = records
        .iter()
        .map(|r| (r.path.as_str(), r.status, r.attempts.len()))
        .collect();
    assert_eq!(
        cut,
        [
            ("both/one/a", StepStatus::Failed, 1),
            ("both/two/b", StepStatus::Failed, 1)
        ],
        "each step in flight is recorded with the attempt that was cut"
    );
    assert!(
        records
            .iter()
            .all(|r| r.error.as_ref().unwrap().kind == ErrorKind::Timeout)
    );
    assert!(
        matches!(step.as_deref(), Some("both/one/a" | "both/two/b")),
        "{step:?}"
    );

    let spent = std::time::Duration::from_millis(300);
    let outcome = flow_runtime::interp::run_within(
        &plan,
        "w",
        "r",
        json!({}),
        services(Arc::new(Scripted::default()), &store),
        spent,
        0,
    )
    .await;
    assert!(
        matches!(&outcome, Outcome::Failed { error, .. } if error.kind == ErrorKind::Timeout),
        "no active time left: {outcome:?}"
    );
}

/// Fails its first call at once; every later call waits long.
struct FailsThenSlow(AtomicUsize);

impl Provider for FailsThenSlow {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            return Box::pin(async { Err(StepError::new(ErrorKind::Client, "scripted Client")) });
        }
        Slow.complete(call)
    }
}

/// Regression: a failed step stayed in the table of steps in flight while
/// its fallback ran, so a workflow timeout during the fallback recorded the
/// failed step again as cut short (its own error replaced by the timeout's)
/// and named it as the step the timeout stopped. A step leaves that table
/// as its record is queued.
#[tokio::test]
async fn a_workflow_timeout_during_a_fallback_cuts_the_fallback_not_the_failed_step() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          timeout 300ms
          step a = answer {{ q: \"x\" }} retry 1 on_error fallback {{
            step b = answer {{ q: \"y\" }}
          }}
        }}"
    ));
    let store = Arc::new(MemoryStore::default());
    let provider = Arc::new(FailsThenSlow(AtomicUsize::new(0)));
    let outcome = flow_runtime::run(&plan, "w", "r", json!({}), services(provider, &store)).await;
    let Outcome::Failed { error, step, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(error.kind, ErrorKind::Timeout);
    assert_eq!(step.as_deref(), Some("a/fallback/b"));
    let records = store.records();
    let kinds: Vec<(&str, StepStatus, ErrorKind)> = records
        .iter()
        .map(|r| (r.path.as_str(), r.status, r.error.as_ref().unwrap().kind))
        .collect();
    assert_eq!(
        kinds,
        [
            ("a", StepStatus::Failed, ErrorKind::Client),
            ("a/fallback/b", StepStatus::Failed, ErrorKind::Timeout)
        ],
        "the failed step keeps its own error; only the fallback's step was cut"
    );
}

/// Slow for the workflow's own steps; the workflow handler's steps (their
/// path under `on_error/`) answer at once, with the prompts they were asked.
#[derive(Default)]
struct SlowBodyQuickHandler(std::sync::Mutex<Vec<String>>);

impl Provider for SlowBodyQuickHandler {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        if call.path.starts_with("on_error/") {
            self.0.lock().unwrap().push(call.input["q"].to_string());
            return Box::pin(async { Ok(fabricate(call.output_schema, 1)) });
        }
        Slow.complete(call)
    }
}

/// Regression (an audit with a model that never answers): after the
/// workflow's timeout, the workflow's `on_error fallback` saw `error.step`
/// empty, though the run's error named the step the timeout stopped (the
/// handler ran before the cut step was known).
#[tokio::test]
async fn a_workflow_timeout_names_the_cut_step_to_the_workflows_handler() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          timeout 300ms
          on_error fallback {{
            step note = answer {{ q: \"stopped at {{{{error.step}}}}\" }}
          }}
          step a = answer {{ q: \"x\" }}
        }}"
    ));
    let store = Arc::new(MemoryStore::default());
    let provider = Arc::new(SlowBodyQuickHandler::default());
    let outcome = flow_runtime::run(
        &plan,
        "w",
        "r",
        json!({}),
        services(provider.clone(), &store),
    )
    .await;
    let Outcome::Failed { error, step, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        (error.kind, step.as_deref()),
        (ErrorKind::Timeout, Some("a"))
    );
    assert_eq!(*provider.0.lock().unwrap(), ["\"stopped at a\""]);
}

/// Regression (issue 13): a `retry 3` step answering 500, killed during its
/// backoff and recovered, made 5 calls and its trace showed 3. The attempts
/// so far are journaled before each backoff, so the recovered run makes the
/// one attempt left.
#[tokio::test]
async fn a_crash_during_backoff_does_not_give_the_step_a_fresh_budget() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{ step a = answer {{ q: \"x\" }} retry 3 backoff 200ms..200ms\n output {{ t: step.a.text }} }}"
    ));
    let provider = Arc::new(Scripted::with("answer", vec![Some(ErrorKind::Server); 5]));
    let store = Arc::new(MemoryStore::default());
    // The process dies during the second backoff (at about 300 ms).
    let first = flow_runtime::run(
        &plan,
        "w",
        "r",
        json!({}),
        services(provider.clone(), &store),
    );
    let cut = tokio::time::timeout(std::time::Duration::from_millis(300), first).await;
    assert!(cut.is_err(), "still waiting to retry: {cut:?}");
    assert_eq!(provider.calls("answer"), 2);
    let record = &store.records()[0];
    assert_eq!(
        (record.status, record.attempts.len()),
        (StepStatus::Retrying, 2)
    );
    let outcome = flow_runtime::run(
        &plan,
        "w",
        "r",
        json!({}),
        services(provider.clone(), &store),
    )
    .await;
    assert!(matches!(outcome, Outcome::Failed { .. }), "{outcome:?}");
    assert_eq!(provider.calls("answer"), 3, "one attempt left, not three");
    let record = &store.records()[0];
    assert_eq!(
        (record.status, record.attempts.len()),
        (StepStatus::Failed, 3)
    );
    let indices: Vec<u32> = record.attempts.iter().map(|a| a.index).collect();
    assert_eq!(indices, [0, 1, 2], "the trace shows every call");
}

/// Regression (issue 13): a gate said when it expires only as a duration
/// (`expires_ms`) beside the run's creation time; it now says `expires_at`.
#[tokio::test]
async fn a_gate_says_when_it_expires() {
    let plan = plan(
        r#"workflow w {
          step ok = approval { approvers: ["a"], message: "m", expires: 1h }
          step open = approval { approvers: ["a"], message: "m" }
        }"#,
    );
    let before = flow_runtime::time::now_ms();
    let (outcome, _) = run_w(&plan, Arc::new(Scripted::default())).await;
    let after = flow_runtime::time::now_ms();
    let Outcome::Parked { pending } = outcome else {
        panic!("{outcome:?}")
    };
    let at = pending[0].expires_at.as_deref().expect("an expiry");
    let earliest = flow_runtime::time::rfc3339_utc(before + 3_600_000);
    let latest = flow_runtime::time::rfc3339_utc(after + 3_600_000);
    assert!(
        earliest.as_str() <= at && at <= latest.as_str(),
        "{earliest} <= {at} <= {latest}"
    );
    assert_eq!(pending[0].expires_ms, Some(3_600_000));
}

/// An approval past its expiry is decided by its `on_expire` when the run is
/// resumed: `reject` then `on_reject`, or `fail`.
#[tokio::test]
async fn an_expired_approval_applies_its_declared_behaviour() {
    let plan = plan(
        r#"workflow w {
          step soft = approval { approvers: ["a"], message: "m", expires: 1ms, on_reject: "continue" }
          step hard = approval { approvers: ["a"], message: "m", expires: 1ms, on_expire: "fail" }
          output { soft: step.soft.approved }
        }"#,
    );
    let store = Arc::new(MemoryStore::default());
    let services = services(Arc::new(Scripted::default()), &store);
    assert!(matches!(
        flow_runtime::run(&plan, "w", "r", json!({}), services.clone()).await,
        Outcome::Parked { .. }
    ));
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    // `soft` expires into a rejection that continues; the run parks at `hard`.
    assert!(matches!(
        flow_runtime::run(&plan, "w", "r", json!({}), services.clone()).await,
        Outcome::Parked { .. }
    ));
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let outcome = flow_runtime::run(&plan, "w", "r", json!({}), services).await;
    assert!(
        matches!(&outcome, Outcome::Failed { error, .. } if error.kind == ErrorKind::Expired),
        "{outcome:?}"
    );
    let soft = store
        .records()
        .into_iter()
        .find(|r| r.path == "soft")
        .unwrap();
    assert_eq!(soft.status, StepStatus::Completed);
    assert_eq!(soft.output.unwrap()["approved"], false);
}

/// Regression (review): a loop that runs in order went on after an
/// iteration failed, so later items still took effect.
#[tokio::test]
async fn a_sequential_loop_stops_at_the_first_failure() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          input {{ items: list<string> }}
          for workflow_input.items as each {{
            step a = answer {{ q: loop_item }} retry 1
          }}
        }}"
    ));
    let provider = Arc::new(Scripted::with("answer", vec![Some(ErrorKind::Client)]));
    let store = Arc::new(MemoryStore::default());
    let input = json!({ "items": ["x", "y", "z"] });
    let outcome =
        flow_runtime::run(&plan, "w", "r", input, services(provider.clone(), &store)).await;
    assert!(matches!(outcome, Outcome::Failed { .. }), "{outcome:?}");
    assert_eq!(
        provider.calls("answer"),
        1,
        "items after the failure never start"
    );
}

/// A loop's `max` is the bound `flowc check` took its time from: a longer
/// collection fails the loop before any iteration calls the model, and one
/// within it runs.
#[tokio::test]
async fn a_loop_longer_than_its_max_fails_before_its_first_iteration() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          input {{ items: list<string> }}
          for workflow_input.items as each max 2 {{
            step a = answer {{ q: loop_item }}
          }}
        }}"
    ));
    let provider = Arc::new(Scripted::with("answer", vec![]));
    let store = Arc::new(MemoryStore::default());
    let input = json!({ "items": ["x", "y", "z"] });
    let outcome =
        flow_runtime::run(&plan, "w", "r", input, services(provider.clone(), &store)).await;
    let Outcome::Failed { error, step, .. } = &outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        error.message.contains("3 items, more than its `max 2`"),
        "{error:?}"
    );
    assert_eq!(step.as_deref(), Some("each"));
    assert_eq!(provider.calls("answer"), 0);
    let input = json!({ "items": ["x", "y"] });
    let outcome =
        flow_runtime::run(&plan, "w", "r2", input, services(provider.clone(), &store)).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
}

/// Regression: a nested loop past its `max` failed the run "at" its bare
/// id, which no comparison of versions could place (`flow redrive --to`
/// said the run's version had no step there); it is its execution path.
#[tokio::test]
async fn a_nested_loop_fails_at_its_execution_path() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          input {{ rows: list<list<string>> }}
          for workflow_input.rows as row {{
            for loop_item as cell max 1 {{
              step a = answer {{ q: loop_item }}
            }}
          }}
        }}"
    ));
    let provider = Arc::new(Scripted::with("answer", vec![]));
    let store = Arc::new(MemoryStore::default());
    let input = json!({ "rows": [["x", "y"]] });
    let outcome = flow_runtime::run(&plan, "w", "r", input, services(provider, &store)).await;
    let Outcome::Failed { step, .. } = &outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(step.as_deref(), Some("row[0]/cell"));
}

/// The workflow's `on_error continue` ends the run at the first failure,
/// without output and without the rest, as completed (docs/language.md §7).
#[tokio::test]
async fn workflow_on_error_continue_ends_the_run_quietly() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          on_error continue
          step a = answer {{ q: \"x\" }} retry 1
          step b = answer {{ q: \"y\" }}
        }}"
    ));
    let provider = Arc::new(Scripted::with("answer", vec![Some(ErrorKind::Client)]));
    let (outcome, _) = run_w(&plan, provider.clone()).await;
    assert_eq!(
        outcome,
        Outcome::Completed {
            output: Value::Null
        }
    );
    assert_eq!(provider.calls("answer"), 1, "`b` never runs");
}

/// Regression (review): the workflow's handler did not run when the deadline
/// cancelled the run.
#[tokio::test]
async fn the_handler_runs_after_the_deadline() {
    let plan = plan(&format!(
        "{RECIPE}workflow w {{
          timeout 200ms
          on_error fallback {{
            step page = handoff \"ops\" {{ message: \"{{{{error.kind}}}}: {{{{error.message}}}}\" }} retry 1
          }}
          step a = answer {{ q: \"x\" }}
        }}"
    ));
    let store = Arc::new(MemoryStore::default());
    let outcome =
        flow_runtime::run(&plan, "w", "r", json!({}), services(Arc::new(Slow), &store)).await;
    assert!(
        matches!(&outcome, Outcome::Failed { error, .. } if error.kind == ErrorKind::Timeout),
        "{outcome:?}"
    );
    let notes = store.notifications();
    assert_eq!(notes.len(), 1, "the handler paged ops");
    assert!(
        notes[0].message.starts_with("timeout: "),
        "{}",
        notes[0].message
    );
}

/// Regression: loops and parallels keep their outputs as their iterations
/// and branches set them, shared, rather than copied into one value when
/// they end. Every way of reading them must give what the copied value gave:
/// a whole loop, an iteration, a branch, a leaf deep inside, a miss, a loop
/// of a branch read after the join, a template rendering a parallel. The
/// expected output was recorded from the interpreter of 503a983, before
/// the change.
#[tokio::test]
async fn block_outputs_read_as_before_at_any_depth() {
    let nested = plan(&format!(
        r#"{RECIPE}
workflow nest {{
  input {{ items: list<string> }}
  for workflow_input.items as outer concurrency 1 {{
    step a = answer {{ q: loop_item }}
    for workflow_input.items as inner concurrency 1 {{
      step b = answer {{ q: "{{{{loop_item}}}}" }}
    }}
    parallel fork {{
      branch left {{ step c = answer {{ q: "l" }} }}
      branch right {{
        for workflow_input.items as deep concurrency 1 {{
          step d = answer {{ q: "r" }}
        }}
      }}
    }}
  }}
  parallel top {{
    branch one {{
      for workflow_input.items as lone concurrency 1 {{
        step e = answer {{ q: "e" }}
      }}
    }}
    branch two {{ step f = answer {{ q: "f" }} }}
  }}
  output {{
    whole: step.outer,
    first: step.outer[0],
    inner: step.outer[1].inner,
    leaf: step.outer[1].fork.right.deep[0].d.score,
    branch: step.top.one,
    missed: step.outer[1].fork.right.deep[7]?.d,
    joined: step.lone[1].e.text,
    rendered: "{{{{step.top}}}}"
  }}
}}
"#
    ));
    let store = Arc::new(MemoryStore::default());
    let input = json!({ "items": ["x", "y"] });
    let outcome = flow_runtime::run(
        &nested,
        "nest",
        "run",
        input,
        services(Arc::new(ByPath), &store),
    )
    .await;
    let Outcome::Completed { output } = outcome else {
        panic!("{outcome:?}");
    };
    let expected: Value =
        serde_json::from_str(include_str!("fixtures/block_outputs.json")).unwrap();
    assert_eq!(output, expected);
}

/// Answers each call with a valid value made of its step's path, so that
/// the order calls are made in does not matter.
struct ByPath;

impl Provider for ByPath {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        let answer = json!({ "text": call.path, "score": call.path.len() });
        Box::pin(async move { Ok(answer) })
    }
}

/// The inputs each recipe call was given, answered with fabricated outputs.
#[derive(Default)]
struct Recording(Mutex<Vec<Value>>);

impl Provider for Recording {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        self.0.lock().unwrap().push(call.input.clone());
        let output = fabricate(call.output_schema, 1);
        Box::pin(async move { Ok(output) })
    }
}

/// Regression: a `json` value given to a typed recipe input reached the
/// model whatever its shape (`"not-an-int"` for an `int`, any string for
/// an enum). It is checked as the step runs, before the model is asked; a
/// `string` input takes a value of another shape as its JSON text.
#[tokio::test]
async fn a_json_value_given_to_a_typed_recipe_input_is_checked_as_the_step_runs() {
    let plan = plan(
        r#"recipe r {
  model "default"
  input { n: int, tier: "a" | "b", page: string }
  output { s: string }
  prompt "{{input.n}} {{input.tier}} {{input.page}}"
}
workflow w {
  input { j: json }
  step s = r { n: workflow_input.j.n, tier: workflow_input.j.tier, page: workflow_input.j.page }
}"#,
    );
    let run = |input: Value| {
        let plan = plan.clone();
        async move {
            let provider = Arc::new(Recording::default());
            let store = Arc::new(MemoryStore::default());
            let outcome =
                flow_runtime::run(&plan, "w", "r", input, services(provider.clone(), &store)).await;
            let inputs = provider.0.lock().unwrap().clone();
            (outcome, inputs)
        }
    };
    let (outcome, inputs) =
        run(json!({ "j": { "n": 3, "tier": "b", "page": { "title": "x" } } })).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(
        inputs,
        vec![json!({ "n": 3, "tier": "b", "page": "{\"title\":\"x\"}" })]
    );
    let (outcome, inputs) =
        run(json!({ "j": { "n": "not-an-int", "tier": "c", "page": "p" } })).await;
    let Outcome::Failed { error, .. } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(error.kind, ErrorKind::Expression);
    assert!(
        error
            .message
            .contains("the input does not match recipe `r`")
            && error.message.contains("/n")
            && error.message.contains("/tier"),
        "{}",
        error.message
    );
    assert!(inputs.is_empty(), "the model was not asked");
}

/// Answers every call with one value.
struct Answering(Value);

impl Provider for Answering {
    fn complete<'a>(&'a self, _: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(std::future::ready(Ok(self.0.clone())))
    }
}

/// Regression: an answer (or a run's input) that left out an optional
/// field failed the run where the field was read ("no field `o` in an
/// object"), though the checker accepts the read and language.md §3 says
/// an absent optional is null; the offline provider, which leaves optional
/// fields out half the time, failed such runs by chance.
#[tokio::test]
async fn an_optional_field_left_out_reads_as_null() {
    let plan = plan(
        "recipe r { model \"m\" input { text: string, note: string? } output { v: int, o: string? } prompt \"{{input.text}} {{input.note}}\" }
workflow w {
  input { n: int? }
  step a = r { text: \"x\" }
  output { o: step.a.o, n: workflow_input.n, same: step.a.o == null }
}",
    );
    let store = Arc::new(MemoryStore::default());
    let provider = Arc::new(Answering(json!({ "v": 1 })));
    let outcome = flow_runtime::run(&plan, "w", "r", json!({}), services(provider, &store)).await;
    let Outcome::Completed { output } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(output, json!({ "o": null, "n": null, "same": true }));
}

/// Answers that do not fit, then a valid one: a repair's setting.
struct UnfitFirst(AtomicUsize);

impl Provider for UnfitFirst {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        let result = if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            let mut error = StepError::new(ErrorKind::InvalidOutput, "does not fit");
            error.repairable = Some(flow_runtime::services::Repair {
                answer: "{}".into(),
                problem: "no `text`".into(),
            });
            Err(error)
        } else {
            Ok(fabricate(call.output_schema, 1))
        };
        Box::pin(std::future::ready(result))
    }
}

/// A journal that notes the status of each record written, over a store.
struct Noted(Arc<MemoryStore>, Mutex<Vec<StepStatus>>);

impl flow_runtime::journal::Journal for Noted {
    fn lookup(&self, path: &str) -> Option<flow_runtime::journal::StepRecord> {
        self.0.lookup(path)
    }

    fn resumed(&self) -> bool {
        self.0.resumed()
    }

    fn record<'a>(
        &'a self,
        record: flow_runtime::journal::StepRecord,
    ) -> BoxFuture<'a, Result<(), StepError>> {
        self.1.lock().unwrap().push(record.status);
        self.0.record(record)
    }
}

/// Regression: the answer that did not fit was not journaled before its
/// repair request went out, so a crash lost both and the resumed step
/// started afresh, past "at most its allowed attempts". It is journaled
/// (`retrying`) first, as before a retry.
#[tokio::test]
async fn an_answer_that_does_not_fit_is_journaled_before_its_repair() {
    let plan = plan(
        "recipe r { model \"m\" input { q: string } output { text: string } prompt \"{{input.q}}\" }
workflow w { step a = r { q: \"x\" } }",
    );
    let store = Arc::new(MemoryStore::default());
    let noted = Arc::new(Noted(store.clone(), Mutex::new(Vec::new())));
    let services = Services {
        provider: Arc::new(UnfitFirst(AtomicUsize::new(0))),
        effects: store.clone(),
        mcp: None,
        journal: noted.clone(),
        steps: None,
        in_flight: None,
    };
    let outcome = flow_runtime::run(&plan, "w", "r", json!({}), services).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(
        *noted.1.lock().unwrap(),
        [StepStatus::Retrying, StepStatus::Completed]
    );
}

/// Regression: a handoff whose department a template made empty (an
/// input's `""`) completed, queued to no one, as did a KB write under an
/// empty collection and an effect keyed `""`; the checker refuses them
/// written empty, and the run now refuses them computed so.
#[tokio::test]
async fn an_effect_named_empty_by_its_template_fails_its_step() {
    for (step, says) in [
        (
            "step tell = handoff \"{{workflow_input.who}}\" { message: \"m\" } retry 1",
            "handoff: its department is empty",
        ),
        (
            "step keep = kb_write \"{{workflow_input.who}}\" { title: \"t\", content: \"c\" } retry 1",
            "kb_write: its collection is empty",
        ),
        (
            "step tell = handoff \"ops\" { message: \"m\" } idempotency \"{{workflow_input.who}}\" retry 1",
            "handoff: its idempotency key is empty",
        ),
    ] {
        let plan = plan(&format!(
            "workflow w {{\n  input {{ who: string }}\n  {step}\n}}"
        ));
        let store = Arc::new(MemoryStore::default());
        let outcome = flow_runtime::run(
            &plan,
            "w",
            "r",
            json!({ "who": " " }),
            services(
                Arc::new(flow_runtime::offline::OfflineProvider::default()),
                &store,
            ),
        )
        .await;
        assert!(
            matches!(&outcome, Outcome::Failed { error, .. }
                if error.kind == ErrorKind::Expression && error.message.contains(says)),
            "{step}: {outcome:?}"
        );
        assert!(store.notifications().is_empty(), "{step}");
    }
}
