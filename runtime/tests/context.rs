//! Knowledge-base context and preflight, on the SQLite store with the fake
//! LLM server on loopback, which records every prompt it is sent.

use std::sync::Arc;
use std::time::Duration;

use flow_plan::Durability;
use flow_runtime::error::ErrorKind;
use flow_runtime::journal::Outcome;
use flow_runtime::llm::ProviderConfig;
use flow_runtime::openai::OpenAiProvider;
use flow_runtime::services::{Provider, Services};
use flow_runtime::sqlite::{RunJournal, SqliteStore};
use flow_tests::TempDir;
use flow_tests::fake_llm::FakeLlm;
use serde_json::{Value, json};

const SOURCE: &str = r#"recipe answer {
  model "default"
  input { question: string }
  output { text: string }
  prompt "Answer: {{input.question}}"
  context kb "resolutions"
}

recipe plain {
  model "default"
  input { question: string }
  output { text: string }
  prompt "Plainly: {{input.question}}"
}

workflow resolve {
  input { ticket: string, fix: string }
  step save = kb_write "resolutions" {
    title: "Ticket {{workflow_input.ticket}}"
    content: workflow_input.fix
  } idempotency "{{workflow_input.ticket}}"
  output { id: step.save.id }
}

workflow set_policy {
  input { name: string, text: string }
  step save = kb_write "policies" { title: workflow_input.name, content: workflow_input.text }
    idempotency "{{workflow_input.name}}"
}

workflow ask {
  input { question: string }
  step reply = answer { question: workflow_input.question }
  output { text: step.reply.text }
}

workflow support_note {
  input { title: string, text: string }
  department "support"
  step save = kb_write "notes" { title: workflow_input.title, content: workflow_input.text }
    idempotency "{{workflow_input.title}}"
}

workflow sales_note {
  input { title: string, text: string }
  department "sales"
  step save = kb_write "notes" { title: workflow_input.title, content: workflow_input.text }
    idempotency "{{workflow_input.title}}"
}

workflow support_desk {
  input { question: string }
  context kb "policies"
  department "support"
  step reply = plain { question: workflow_input.question }
  output { text: step.reply.text }
}

workflow with_policy {
  input { question: string }
  context kb "policies"
  step reply = plain { question: workflow_input.question }
  output { text: step.reply.text }
}
"#;

struct Setup {
    _dir: TempDir,
    store: Arc<SqliteStore>,
    plan: flow_plan::Plan,
    llm: FakeLlm,
    provider: Arc<dyn Provider>,
    runs: std::sync::atomic::AtomicUsize,
}

async fn setup(models: &[(&str, &str)]) -> Setup {
    let dir = TempDir::new("context");
    let store = SqliteStore::open(&dir.path().join("s.db")).expect("opens");
    let checked = flow_compiler::check_source("c.flow", SOURCE);
    assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
    let plan = flow_compiler::lower(&checked).expect("lowers");
    store.put_plan(&plan).unwrap();
    let llm = FakeLlm::start(vec![], json!({ "text": "ok" }), Duration::ZERO).await;
    let provider = Arc::new(
        OpenAiProvider::new(ProviderConfig {
            base_url: llm.url.clone(),
            api_key: None,
            models: models
                .iter()
                .map(|(alias, model)| (alias.to_string(), model.to_string()))
                .collect(),
        })
        .expect("a client"),
    );
    Setup {
        _dir: dir,
        store,
        plan,
        llm,
        provider,
        runs: Default::default(),
    }
}

impl Setup {
    /// Runs `workflow` with `input` as a run of `account`.
    async fn run(&self, account: &str, workflow: &str, input: Value) -> Outcome {
        let n = self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let id = format!("run-{n}");
        let run = flow_runtime::store::NewRun {
            workflow: workflow.to_string(),
            plan_hash: self.plan.hash.clone(),
            input: input.clone(),
            provider: None,
        };
        self.store
            .create_run(&id, account, &run, None)
            .await
            .unwrap();
        let journal = RunJournal::open(&self.store, &id, Durability::Full).unwrap();
        let services = Services {
            provider: Arc::clone(&self.provider),
            effects: journal.clone(),
            mcp: None,
            journal,
            steps: None,
            in_flight: None,
        };
        flow_runtime::run(&self.plan, workflow, &id, input, services).await
    }
}

/// One run writes a resolution; a later run's recipe, whose context is that
/// collection, gets it in its prompt, ranked first among the collection's
/// documents by what the prompt asks. Another account's run does not.
#[tokio::test]
async fn a_resolution_written_by_one_run_is_context_for_the_next() {
    let setup = setup(&[]).await;
    for (ticket, fix) in [
        (
            "T-1",
            "Printers jam when the tray is overfilled: remove half the paper.",
        ),
        (
            "T-2",
            "Error E42 on the router: reset its firmware from the admin page.",
        ),
        (
            "T-3",
            "Invoices in the wrong currency: change the account's billing country.",
        ),
    ] {
        let saved = setup
            .run("acme", "resolve", json!({ "ticket": ticket, "fix": fix }))
            .await;
        assert!(matches!(saved, Outcome::Completed { .. }), "{saved:?}");
    }
    let asked = setup
        .run(
            "acme",
            "ask",
            json!({ "question": "How do I fix error E42 on my router?" }),
        )
        .await;
    assert!(matches!(asked, Outcome::Completed { .. }), "{asked:?}");
    let prompt = setup.llm.prompts().pop().unwrap();
    assert!(
        prompt.starts_with("Answer: How do I fix error E42"),
        "{prompt}"
    );
    let e42 = prompt
        .find("reset its firmware")
        .expect("the E42 resolution is there");
    for other in ["remove half the paper", "billing country"] {
        if let Some(at) = prompt.find(other) {
            assert!(e42 < at, "the matching document comes first:\n{prompt}");
        }
    }
    assert!(
        prompt.contains("resolutions/Ticket T-2 (version 1)"),
        "{prompt}"
    );

    let foreign = setup
        .run(
            "globex",
            "ask",
            json!({ "question": "How do I fix error E42?" }),
        )
        .await;
    assert!(matches!(foreign, Outcome::Completed { .. }));
    let prompt = setup.llm.prompts().pop().unwrap();
    assert!(
        !prompt.contains("firmware"),
        "acme's documents are acme's: {prompt}"
    );
}

/// A workflow's `context kb` is resolved once, before the first step, and
/// given to every recipe of the run, whatever the recipe asks.
#[tokio::test]
async fn a_workflows_context_reaches_every_recipe() {
    let setup = setup(&[]).await;
    let saved = setup
        .run(
            "acme",
            "set_policy",
            json!({ "name": "refunds", "text": "Refunds above 100 EUR need a second approver." }),
        )
        .await;
    assert!(matches!(saved, Outcome::Completed { .. }), "{saved:?}");
    let unrelated = setup
        .run(
            "acme",
            "resolve",
            json!({ "ticket": "T-9", "fix": "Unplug the printer." }),
        )
        .await;
    assert!(matches!(unrelated, Outcome::Completed { .. }));
    let asked = setup
        .run(
            "acme",
            "with_policy",
            json!({ "question": "Anything new today?" }),
        )
        .await;
    assert!(matches!(asked, Outcome::Completed { .. }), "{asked:?}");
    let prompt = setup.llm.prompts().pop().unwrap();
    assert!(
        prompt.starts_with("Plainly: Anything new today?"),
        "{prompt}"
    );
    assert!(
        prompt.contains("second approver"),
        "the workflow's policies: {prompt}"
    );
    assert!(
        !prompt.contains("Unplug"),
        "not another collection: {prompt}"
    );
}

/// Auto-context: a workflow of a department gets the documents its
/// department's workflows wrote, whatever their collection, without naming
/// it, the ones matching the run's input first; another department's stay
/// out, and the documents the workflow names come first: six department
/// notes do not push out its one policy.
#[tokio::test]
async fn a_departments_documents_are_context_for_its_workflows() {
    let setup = setup(&[]).await;
    let policy = setup
        .run(
            "acme",
            "set_policy",
            json!({ "name": "refunds", "text": "Refunds above 100 EUR need a second approver." }),
        )
        .await;
    assert!(matches!(policy, Outcome::Completed { .. }), "{policy:?}");
    let mut notes = vec![(
        "support_note",
        "refund-rule".to_string(),
        "A refund goes back to the card that paid.".to_string(),
    )];
    for i in 0..5 {
        notes.push((
            "support_note",
            format!("note-{i}"),
            format!("Printer model {i} needs its own toner."),
        ));
    }
    notes.push((
        "sales_note",
        "discount-rule".to_string(),
        "Discounts above 20 percent need the sales lead; a refund too.".to_string(),
    ));
    for (workflow, title, text) in notes {
        let saved = setup
            .run("acme", workflow, json!({ "title": title, "text": text }))
            .await;
        assert!(matches!(saved, Outcome::Completed { .. }), "{saved:?}");
    }
    let asked = setup
        .run(
            "acme",
            "support_desk",
            json!({ "question": "Where does my refund go?" }),
        )
        .await;
    assert!(matches!(asked, Outcome::Completed { .. }), "{asked:?}");
    let prompt = setup.llm.prompts().pop().unwrap();
    assert!(
        prompt.contains("second approver"),
        "the policy the workflow names: {prompt}"
    );
    assert!(
        prompt.contains("notes/refund-rule (version 1)") && prompt.contains("card that paid"),
        "the support department's matching note: {prompt}"
    );
    assert_eq!(
        prompt.matches("\n--- ").count(),
        flow_runtime::kb::MOST_DOCUMENTS,
        "{prompt}"
    );
    assert!(
        !prompt.contains("sales lead"),
        "not the sales department's: {prompt}"
    );

    let foreign = setup
        .run("globex", "support_desk", json!({ "question": "Refund?" }))
        .await;
    assert!(matches!(foreign, Outcome::Completed { .. }));
    let prompt = setup.llm.prompts().pop().unwrap();
    assert!(
        !prompt.contains("card that paid"),
        "a department is a department of its account: {prompt}"
    );
}

/// Preflight lists every problem before anything runs: an input that does
/// not match and a model alias the provider does not map; no model call is
/// made and no step recorded.
#[tokio::test]
async fn preflight_lists_every_problem_and_runs_nothing() {
    let setup = setup(&[("fast", "tiny-model")]).await;
    let outcome = setup.run("acme", "ask", json!({ "question": 7 })).await;
    let Outcome::Failed { error, step, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(error.kind, ErrorKind::Preflight);
    assert_eq!(step, None);
    assert!(
        error.message.contains("input: /question"),
        "{}",
        error.message
    );
    assert!(
        error
            .message
            .contains("model alias `default` is not configured (the configured ones: fast)"),
        "{}",
        error.message
    );
    assert_eq!(setup.llm.requests(), 0);
    assert!(setup.store.step_records("run-0").unwrap().is_empty());
}
