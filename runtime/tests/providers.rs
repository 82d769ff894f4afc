//! The OpenAI-compatible provider against a fake server on loopback: each
//! failure class gives the exact number of requests and the final status.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flow_runtime::anthropic::AnthropicProvider;
use flow_runtime::error::{ErrorKind, StepError};
use flow_runtime::journal::{Hold, Journal, Outcome, StepRecord};
use flow_runtime::llm::ProviderConfig;
use flow_runtime::memory::MemoryStore;
use flow_runtime::openai::OpenAiProvider;
use flow_runtime::services::Services;
use flow_runtime::services::{BoxFuture, Provider, RecipeCall};
use flow_tests::fake_llm::{FakeLlm, Reply, ok};
use flow_tests::tls_proxy::{Certificates, Protocol, TlsProxy};
use serde_json::json;

/// The scripted server of the end-to-end harness, answering validly past its script.
async fn fake_llm(script: Vec<Reply>) -> FakeLlm {
    FakeLlm::start(
        script,
        json!({ "text": "fine", "score": 1 }),
        Duration::ZERO,
    )
    .await
}

async fn run_against(server: &FakeLlm, options: &str) -> (Outcome, Arc<MemoryStore>) {
    let provider = OpenAiProvider::new(ProviderConfig {
        base_url: server.url.clone(),
        api_key: Some("test-key".into()),
        models: [("default".to_string(), "fake-model".to_string())].into(),
    })
    .expect("a client");
    run_with(Arc::new(provider), options).await
}

async fn run_with(provider: Arc<dyn Provider>, options: &str) -> (Outcome, Arc<MemoryStore>) {
    let source = format!(
        r#"recipe answer {{
  model "default"
  input {{ q: string }}
  output {{ text: string, score: int }}
  prompt "Answer {{{{input.q}}}}"
}}
workflow w {{
  step a = answer {{ q: "x" }} {options}
  output {{ text: step.a.text }}
}}"#
    );
    let checked = flow_compiler::check_source("p.flow", &source);
    assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
    let plan = flow_compiler::lower(&checked).expect("lowers");
    let store = Arc::new(MemoryStore::default());
    let services = Services {
        provider,
        effects: store.clone(),
        mcp: None,
        journal: store.clone(),
        steps: None,
        in_flight: None,
    };
    (
        flow_runtime::run(&plan, "w", "r", json!({}), services).await,
        store,
    )
}

const FAST_RETRIES: &str = "retry 3 backoff 1ms..5ms timeout 2s";

fn failed_with(outcome: &Outcome) -> Option<ErrorKind> {
    match outcome {
        Outcome::Failed { error, .. } => Some(error.kind),
        _ => None,
    }
}

/// The output of a run that completed.
fn output_of(outcome: &Outcome) -> &serde_json::Value {
    match outcome {
        Outcome::Completed { output } => output,
        other => panic!("not completed: {other:?}"),
    }
}

/// The error of the run's one step, once the run failed with `kind`.
fn failure(outcome: &Outcome, store: &MemoryStore, kind: ErrorKind) -> StepError {
    assert_eq!(failed_with(outcome), Some(kind), "{outcome:?}");
    store.records()[0]
        .error
        .clone()
        .expect("the failed step's error")
}

#[tokio::test]
async fn a_rate_limit_is_retried_after_its_retry_after() {
    let server = fake_llm(vec![Reply::Answer(
        429,
        vec![("retry-after", "1")],
        "slow down".into(),
    )])
    .await;
    let (outcome, store) = run_against(&server, "retry 3 backoff 1ms..2s timeout 2s").await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(server.requests(), 2);
    let attempts = &store.records()[0].attempts;
    assert_eq!(attempts.len(), 2);
    assert_eq!(
        attempts[0].delay_ms,
        Some(1000),
        "Retry-After: 1 within the 2 s cap"
    );
}

/// A `Retry-After` HTTP-date is a wait too, held to the cap like seconds are
/// (before, any non-number was ignored and the backoff alone decided).
#[tokio::test]
async fn a_retry_after_date_is_waited_for_within_the_cap() {
    let server = fake_llm(vec![Reply::Answer(
        429,
        vec![("retry-after", "Fri, 01 Jan 2100 00:00:00 GMT")],
        "slow down".into(),
    )])
    .await;
    let (outcome, store) = run_against(&server, "retry 3 backoff 1ms..1s timeout 2s").await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(server.requests(), 2);
    assert_eq!(
        store.records()[0].attempts[0].delay_ms,
        Some(1000),
        "a date decades away waits the 1 s cap, not the 1 ms backoff"
    );
    let said = store.records()[0].attempts[0]
        .error
        .clone()
        .unwrap_or_default();
    assert!(
        said.contains("past the backoff's MAX of 1s: raise MAX"),
        "the attempt says its wait was cut to the cap: {said}"
    );
}

/// Regression (an audit): the advice to raise the backoff's MAX was added
/// to failures the step never retries (a 400 that sent `Retry-After`, any
/// failure of a `retry 1` step), where no MAX would have helped.
#[tokio::test]
async fn a_retry_after_on_a_failure_not_retried_gives_no_advice_on_max() {
    for (status, policy) in [(400, FAST_RETRIES), (429, "retry 1 timeout 2s")] {
        let server = fake_llm(vec![Reply::Answer(
            status,
            vec![("retry-after", "100")],
            "no".into(),
        )])
        .await;
        let (outcome, store) = run_against(&server, policy).await;
        let kind = failed_with(&outcome).expect("failed");
        let error = failure(&outcome, &store, kind);
        assert_eq!(server.requests(), 1, "{status} {policy}");
        assert!(
            !error.message.contains("raise MAX"),
            "{status} {policy}: {}",
            error.message
        );
    }
}

/// Regression (a review): a short key (`none`, a local server's
/// placeholder) was hidden in answers too, where it changed what the model
/// said. It is hidden in errors only; a long key, everywhere.
#[tokio::test]
async fn a_short_key_changes_no_answer() {
    let server = fake_llm(vec![ok(json!({ "text": "none", "score": 1 }))]).await;
    let provider = OpenAiProvider::new(ProviderConfig {
        base_url: server.url.clone(),
        api_key: Some("none".into()),
        models: [("default".to_string(), "fake-model".to_string())].into(),
    })
    .expect("a client");
    let (outcome, _) = run_with(Arc::new(provider), FAST_RETRIES).await;
    assert_eq!(output_of(&outcome), &json!({ "text": "none" }));
}

#[tokio::test]
async fn server_errors_and_resets_are_retried() {
    let server = fake_llm(vec![
        Reply::Answer(500, vec![], "boom".into()),
        Reply::Answer(503, vec![], "busy".into()),
    ])
    .await;
    let (outcome, _) = run_against(&server, FAST_RETRIES).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(server.requests(), 3);

    let server = fake_llm(vec![Reply::Reset, Reply::Reset, Reply::Reset]).await;
    let (outcome, store) = run_against(&server, FAST_RETRIES).await;
    assert_eq!(
        failed_with(&outcome),
        Some(ErrorKind::Connection),
        "{outcome:?}"
    );
    assert_eq!(server.requests(), 3, "three attempts, all reset");
    assert_eq!(store.records()[0].attempts.len(), 3);
    // The run's error says how many attempts the step made, where the
    // user reads it (`flow run`, flowd's run).
    let Outcome::Failed { attempts, .. } = &outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(*attempts, 3);
    let record = flow_runtime::runner::run_record("r", &outcome);
    assert_eq!(record.error.map(|error| error.attempts), Some(3));
}

#[tokio::test]
async fn a_stall_past_the_timeout_is_retried() {
    let server = fake_llm(vec![Reply::Stall(Duration::from_secs(3))]).await;
    let (outcome, store) = run_against(&server, "retry 2 backoff 1ms..5ms timeout 300ms").await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    let attempts = &store.records()[0].attempts;
    assert_eq!(attempts.len(), 2);
    assert!(
        attempts[0].error.as_deref().unwrap().starts_with("timeout"),
        "{attempts:?}"
    );
}

/// An attempt its step's timeout ended says which server had not
/// answered and how far it had got. Regression: either read "the attempt
/// ran past the step's timeout", naming no server.
#[tokio::test]
async fn a_timeout_says_how_far_the_model_had_got() {
    let stall = Duration::from_secs(3);
    let server = fake_llm(vec![Reply::Stall(stall), Reply::StallBody(stall)]).await;
    let (outcome, store) = run_against(&server, "retry 2 backoff 1ms..5ms timeout 300ms").await;
    failure(&outcome, &store, ErrorKind::Timeout);
    let errors: Vec<_> = store.records()[0]
        .attempts
        .iter()
        .map(|attempt| attempt.error.clone().unwrap_or_default())
        .collect();
    let url = format!("{}/chat/completions", server.url);
    assert_eq!(
        errors,
        [
            format!(
                "timeout: the attempt ran past the step's timeout of 300ms: {url} had sent no reply, not even its headers"
            ),
            format!(
                "timeout: the attempt ran past the step's timeout of 300ms: {url} answered 200 OK, but the rest of its reply had not arrived"
            ),
        ]
    );
}

#[tokio::test]
async fn a_client_error_fails_at_once() {
    let server = fake_llm(vec![Reply::Answer(400, vec![], "bad request".into())]).await;
    let (outcome, _) = run_against(&server, FAST_RETRIES).await;
    assert_eq!(
        failed_with(&outcome),
        Some(ErrorKind::Client),
        "{outcome:?}"
    );
    assert_eq!(server.requests(), 1);
    assert!(
        matches!(outcome, Outcome::Failed { attempts: 1, .. }),
        "{outcome:?}"
    );
}

/// Regression: a repair request that failed on the way (a 503) cost no
/// try, and the fresh attempt after it got a repair of its own, so that
/// `retry 3` made 6 calls ("after 6 attempts") and took twice its time.
/// The failed repair is asked again, within the budget: `retry N` makes at
/// most N calls, plus one repair past the last.
#[tokio::test]
async fn a_failed_repair_request_is_asked_again_within_the_retry_budget() {
    let busy = || Reply::Answer(503, vec![], "busy".into());
    let server = fake_llm(vec![
        ok(json!({ "text": 1 })),
        busy(),
        ok(json!({ "text": "repaired", "score": 2 })),
    ])
    .await;
    let (outcome, store) = run_against(&server, FAST_RETRIES).await;
    let output = output_of(&outcome);
    assert_eq!(output["text"], "repaired");
    let repairs: Vec<bool> = store.records()[0]
        .attempts
        .iter()
        .map(|a| a.repair)
        .collect();
    assert_eq!(repairs, [false, true, true], "the repair asked again");
    assert!(
        server.prompts()[2].contains("not valid"),
        "{:?}",
        server.prompts()
    );

    let server = fake_llm(vec![
        ok(json!({ "text": 1 })),
        busy(),
        busy(),
        busy(),
        busy(),
    ])
    .await;
    let (outcome, _) = run_against(&server, FAST_RETRIES).await;
    assert_eq!(
        failed_with(&outcome),
        Some(ErrorKind::Server),
        "{outcome:?}"
    );
    assert_eq!(server.requests(), 3, "retry 3: three calls in all");
    assert!(
        matches!(outcome, Outcome::Failed { attempts: 3, .. }),
        "{outcome:?}"
    );

    // The last attempt's answer that does not fit still gets its repair.
    let server = fake_llm(vec![busy(), busy(), ok(json!({ "text": 1 }))]).await;
    let (outcome, _) = run_against(&server, FAST_RETRIES).await;
    assert!(matches!(outcome, Outcome::Completed { .. }), "{outcome:?}");
    assert_eq!(server.requests(), 4);
}

#[tokio::test]
async fn invalid_output_gets_one_repair_then_fails_with_the_raw_text() {
    let server = fake_llm(vec![
        Reply::Answer(200, vec![], "not json at all".into()),
        ok(json!({ "text": "repaired", "score": 2 })),
    ])
    .await;
    let (outcome, store) = run_against(&server, FAST_RETRIES).await;
    let output = output_of(&outcome);
    assert_eq!(output["text"], "repaired");
    assert_eq!(server.requests(), 2);
    // Regression (issue 13): the repair request was inside one attempt, so
    // the trace showed one call where the model had two.
    let attempts = &store.records()[0].attempts;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert!(
        attempts[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("invalid_output") && e.contains("not json at all")),
        "{attempts:?}"
    );
    assert!(!attempts[0].repair && attempts[1].repair && attempts[1].error.is_none());

    let server = fake_llm(vec![
        ok(json!({ "text": 1 })),
        ok(json!({ "txt": "still wrong" })),
    ])
    .await;
    let (outcome, store) = run_against(&server, FAST_RETRIES).await;
    let error = failure(&outcome, &store, ErrorKind::InvalidOutput);
    assert_eq!(
        server.requests(),
        2,
        "one attempt with its repair, no retry"
    );
    assert!(error.message.contains("still wrong"), "{}", error.message);
    let attempts = &store.records()[0].attempts;
    assert_eq!(
        attempts.iter().map(|a| a.repair).collect::<Vec<_>>(),
        [false, true],
        "the answer, then its repair: {attempts:?}"
    );
}

/// A model without structured output often fences its JSON in Markdown
/// ("```json ... ```"): the answer inside is taken with no repair request.
#[tokio::test]
async fn a_fenced_answer_needs_no_repair() {
    let server = fake_llm(vec![Reply::Answer(
        200,
        vec![],
        "```json\n{\"text\": \"fenced\", \"score\": 2}\n```".into(),
    )])
    .await;
    let (outcome, _) = run_against(&server, FAST_RETRIES).await;
    let output = output_of(&outcome);
    assert_eq!(output["text"], "fenced");
    assert_eq!(server.requests(), 1);
}

/// A refusal (OpenAI's `message.refusal`, no content) is an answer that
/// does not fit, said as such: one repair request telling the model so,
/// then `invalid_output` with the refusal's words. Before, a reply without
/// content was a server error, retried like an outage.
#[tokio::test]
async fn a_refusal_gets_the_repair_request_then_fails_in_its_own_words() {
    let refusal = || {
        Reply::Body(json!({ "choices": [{
            "message": { "role": "assistant", "content": null, "refusal": "I can't help with that." },
            "finish_reason": "stop",
        }] }))
    };
    let server = fake_llm(vec![refusal(), refusal()]).await;
    let (outcome, store) = run_against(&server, FAST_RETRIES).await;
    let error = failure(&outcome, &store, ErrorKind::InvalidOutput);
    assert_eq!(server.requests(), 2, "the answer and its repair, no retry");
    assert!(
        server.prompts()[1].contains("it is a refusal, not an answer"),
        "the repair request says why: {:?}",
        server.prompts()
    );
    assert!(
        error.message.contains("refusal") && error.message.contains("I can't help with that."),
        "{}",
        error.message
    );
}

/// An answer cut off at the model's output limit says so in its repair
/// request and its error, and a repaired answer completes the step.
#[tokio::test]
async fn an_answer_cut_at_the_output_limit_says_so() {
    let server = fake_llm(vec![
        Reply::Body(json!({ "choices": [{
            "message": { "role": "assistant", "content": "{\"text\": \"a long ans" },
            "finish_reason": "length",
        }] })),
        ok(json!({ "text": "short", "score": 1 })),
    ])
    .await;
    let (outcome, store) = run_against(&server, FAST_RETRIES).await;
    let output = output_of(&outcome);
    assert_eq!(output["text"], "short");
    let first = store.records()[0].attempts[0].error.clone();
    assert!(
        first
            .as_deref()
            .is_some_and(|e| e.contains("finish_reason `length`") && e.contains("a long ans")),
        "{first:?}"
    );
    assert!(
        server.prompts()[1].contains("output limit"),
        "{:?}",
        server.prompts()
    );
}

/// Regression: an answer cut off (or filtered) that still parsed and fit
/// was taken as the output, so that text cut inside a string went on
/// downstream. It gets the repair request, as language.md §7 says, on both
/// APIs.
#[tokio::test]
async fn a_cut_off_answer_that_parses_is_not_the_output() {
    for finish_reason in ["length", "content_filter"] {
        let server = fake_llm(vec![
            Reply::Body(json!({ "choices": [{
                "message": { "role": "assistant", "content": "{\"text\": \"The printer is on fi\", \"score\": 1}" },
                "finish_reason": finish_reason,
            }] })),
            ok(json!({ "text": "whole", "score": 1 })),
        ])
        .await;
        let (outcome, _) = run_against(&server, FAST_RETRIES).await;
        let output = output_of(&outcome);
        assert_eq!(output["text"], "whole", "{finish_reason}");
        assert_eq!(server.requests(), 2, "{finish_reason}");
        assert!(
            server.prompts()[1].contains(finish_reason),
            "{:?}",
            server.prompts()
        );
    }
    let server = fake_llm(vec![
        Reply::Body(json!({
            "content": [{ "type": "tool_use", "id": "t1", "name": "answer", "input": { "text": "cut", "score": 1 } }],
            "stop_reason": "max_tokens",
        })),
        ok(json!({ "text": "whole", "score": 1 })),
    ])
    .await;
    let (outcome, _) = run_with(anthropic(&server), FAST_RETRIES).await;
    let output = output_of(&outcome);
    assert_eq!(output["text"], "whole");
    assert_eq!(server.requests(), 2);
}

/// A reply that never ends is read no further than the cap: the attempt
/// fails as a server error (and is retried as one) instead of growing the
/// process until the step's timeout.
#[tokio::test]
async fn a_reply_without_end_is_cut_at_the_cap() {
    let server = fake_llm(vec![Reply::Endless, Reply::Endless, Reply::Endless]).await;
    let (outcome, store) = run_against(&server, "retry 3 backoff 1ms..5ms timeout 20s").await;
    let error = failure(&outcome, &store, ErrorKind::Server);
    assert_eq!(server.requests(), 3, "each attempt cut, then retried");
    assert!(
        error.message.contains("more than 16 MiB"),
        "{}",
        error.message
    );
}

fn anthropic(server: &FakeLlm) -> Arc<dyn Provider> {
    Arc::new(
        AnthropicProvider::new(ProviderConfig {
            base_url: server.url.trim_end_matches("/v1").to_string(),
            api_key: Some("test-key".into()),
            models: [("default".to_string(), "claude-test".to_string())].into(),
        })
        .expect("a client"),
    )
}

#[tokio::test]
async fn anthropic_overload_is_retried_and_the_tool_input_is_the_answer() {
    let server = fake_llm(vec![Reply::Answer(529, vec![], "overloaded".into())]).await;
    let (outcome, _) = run_with(anthropic(&server), FAST_RETRIES).await;
    let output = output_of(&outcome);
    assert_eq!(output["text"], "fine");
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn anthropic_text_instead_of_the_tool_gets_the_repair_request() {
    let server = fake_llm(vec![
        Reply::Answer(200, vec![], "I think the answer is fine".into()),
        ok(json!({ "text": "repaired", "score": 3 })),
    ])
    .await;
    let (outcome, _) = run_with(anthropic(&server), FAST_RETRIES).await;
    let output = output_of(&outcome);
    assert_eq!(output["text"], "repaired");
    assert_eq!(server.requests(), 2);
}

/// Of two tool calls, the one of the tool the request forced is the
/// answer, wherever it is in the reply; the first was taken before.
#[tokio::test]
async fn anthropic_the_forced_tools_call_is_the_answer() {
    let server = fake_llm(vec![Reply::Body(json!({
        "content": [
            { "type": "tool_use", "id": "t1", "name": "search", "input": { "text": "not it", "score": 1 } },
            { "type": "tool_use", "id": "t2", "name": "answer", "input": { "text": "named", "score": 2 } },
        ],
        "stop_reason": "tool_use",
    }))])
    .await;
    let (outcome, _) = run_with(anthropic(&server), FAST_RETRIES).await;
    assert_eq!(output_of(&outcome)["text"], "named");
    assert_eq!(server.requests(), 1);
}

/// Anthropic's refusal (`stop_reason: "refusal"`) and an answer cut at
/// `max_tokens` are named as OpenAI's are.
#[tokio::test]
async fn anthropic_refusals_and_max_tokens_are_named() {
    let server = fake_llm(vec![
        Reply::Body(json!({
            "content": [{ "type": "text", "text": "I won't." }],
            "stop_reason": "refusal",
        })),
        Reply::Body(json!({
            "content": [{ "type": "tool_use", "id": "t1", "name": "answer", "input": { "text": "cut" } }],
            "stop_reason": "max_tokens",
        })),
    ])
    .await;
    let (outcome, store) = run_with(anthropic(&server), FAST_RETRIES).await;
    assert_eq!(
        failed_with(&outcome),
        Some(ErrorKind::InvalidOutput),
        "{outcome:?}"
    );
    let attempts = &store.records()[0].attempts;
    let errors: Vec<&str> = attempts.iter().filter_map(|a| a.error.as_deref()).collect();
    assert!(
        errors[0].contains("refusal") && errors[0].contains("I won't."),
        "{errors:?}"
    );
    assert!(errors[1].contains("stop_reason `max_tokens`"), "{errors:?}");
}

/// Regression: a refusal with no text (`content: []`) was repaired with an
/// empty assistant message, which Anthropic's API refuses with a 400: the
/// step failed as a client error that hid the refusal, and the model was
/// never asked again.
#[tokio::test]
async fn anthropic_a_refusal_without_text_is_repaired_with_a_turn_the_api_takes() {
    for stop in ["refusal", "max_tokens"] {
        let server = fake_llm(vec![Reply::Body(
            json!({ "content": [], "stop_reason": stop }),
        )])
        .await;
        let (outcome, store) = run_with(anthropic(&server), FAST_RETRIES).await;
        assert_eq!(output_of(&outcome)["text"], "fine", "{stop}");
        assert_eq!(server.requests(), 2, "{stop}: the answer, then its repair");
        let attempts = &store.records()[0].attempts;
        assert!(
            attempts[0]
                .error
                .as_deref()
                .is_some_and(|e| e.contains(stop)),
            "{stop}: {attempts:?}"
        );
    }
}

/// Regression: an error reply whose body could not be read (cut off, or
/// past the size cap) lost its status: a 401 was retried as a connection
/// failure, and a 429's `Retry-After` was not waited for.
#[tokio::test]
async fn an_errors_status_holds_when_its_body_is_cut_off() {
    let server = fake_llm(vec![Reply::CutBody(401, vec![])]).await;
    let (outcome, store) = run_against(&server, FAST_RETRIES).await;
    let error = failure(&outcome, &store, ErrorKind::Client);
    assert_eq!(server.requests(), 1, "a 401 is not retried");
    assert!(
        error.message.contains("401") && error.message.contains("body not read"),
        "{error:?}"
    );

    let server = fake_llm(vec![Reply::CutBody(429, vec![("retry-after", "1")])]).await;
    let (outcome, store) = run_against(&server, "retry 3 backoff 1ms..2s timeout 2s").await;
    assert_eq!(output_of(&outcome)["text"], "fine");
    assert_eq!(
        store.records()[0].attempts[0].delay_ms,
        Some(1000),
        "the 429's Retry-After, not the 1 ms backoff"
    );
}

/// Regression: an `https://` base URL of a server that speaks plain HTTP
/// was retried as a connection failure ("received corrupt message of type
/// InvalidContentType"), three times, and never said what was wrong.
#[tokio::test]
async fn https_to_a_plain_http_server_fails_at_once_and_says_so() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // What an HTTP server says to a TLS handshake it cannot read.
            let mut hello = [0u8; 512];
            let _ = socket.read(&mut hello).await;
            let _ = socket
                .write_all(
                    b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
        }
    });
    let provider = OpenAiProvider::new(ProviderConfig {
        base_url: format!("https://127.0.0.1:{port}/v1"),
        api_key: None,
        models: Default::default(),
    })
    .expect("a client");
    let (outcome, store) = run_with(Arc::new(provider), FAST_RETRIES).await;
    let error = failure(&outcome, &store, ErrorKind::Client);
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(
        error.message.contains("answered without TLS") && error.message.contains("`http://`"),
        "{}",
        error.message
    );
}

/// A base URL that cannot be called is refused when the provider is made,
/// naming the URL; before, every step retried it as a connection failure.
#[test]
fn a_malformed_base_url_is_a_configuration_error() {
    for (base_url, says) in [
        ("localhost:11434/v1", "not an http(s) address"),
        ("http//127.0.0.1/v1", "not a URL"),
        ("ftp://example.com/v1", "not an http(s) address"),
    ] {
        let config = ProviderConfig {
            base_url: base_url.into(),
            api_key: None,
            models: Default::default(),
        };
        let error = OpenAiProvider::new(config.clone())
            .err()
            .unwrap_or_else(|| panic!("{base_url} was accepted"));
        assert!(
            error.contains(base_url) && error.contains(says),
            "{base_url}: {error}"
        );
        assert!(AnthropicProvider::new(config).is_err(), "{base_url}");
    }
}

/// Regression: a key ending in a line break (a key file's, a secret's)
/// made reqwest keep an error in the request, and copying it for the
/// attempt panicked: `flow run` crashed and flowd's run stayed `running`.
/// It is a configuration error now, which says where and does not show
/// the key.
#[test]
fn a_key_a_header_cannot_carry_is_a_configuration_error() {
    for (key, says) in [
        ("sk-secret-key\n", "a line break at its end"),
        ("sk-secret\r\n", "a line break at character 10"),
        ("sk-se\u{7}cret", "a control character at character 6"),
        ("sk-sécret", "a character outside ASCII at character 5"),
    ] {
        let config = ProviderConfig {
            base_url: "http://127.0.0.1:1/v1".into(),
            api_key: Some(key.into()),
            models: Default::default(),
        };
        let error = OpenAiProvider::new(config.clone())
            .err()
            .unwrap_or_else(|| panic!("{key:?} was accepted"));
        assert!(
            error.starts_with("the LLM API key holds") && error.contains(says),
            "{key:?}: {error}"
        );
        assert!(
            !error.contains("secret") && !error.contains("sécret"),
            "{error}"
        );
        assert!(AnthropicProvider::new(config).is_err(), "{key:?}");
    }
}

/// Regression: redirects were followed, and Anthropic's `x-api-key`
/// (which reqwest strips from none) went to the other host; a 301 or 302
/// turned the completion into a GET without its prompt. A redirect is now
/// a client error naming where it points, and nothing is sent there.
#[tokio::test]
async fn a_redirect_is_not_followed_and_says_where_it_points() {
    let to = "http://elsewhere.invalid/v1/chat/completions";
    for status in [301, 302, 307, 308] {
        let server = fake_llm(vec![Reply::Answer(
            status,
            vec![("location", to)],
            String::new(),
        )])
        .await;
        let (outcome, store) = run_against(&server, FAST_RETRIES).await;
        let error = failure(&outcome, &store, ErrorKind::Client);
        assert_eq!(server.requests(), 1, "{status}: not retried");
        assert!(
            error
                .message
                .contains(&format!("a redirect to `{to}`, which is not followed")),
            "{}",
            error.message
        );
    }
}

/// Regression: a reply compressed though the client asked for no
/// compression (a proxy's doing) read as "not JSON", its binary quoted,
/// and was retried. An answer so compressed is a client error that names
/// the encoding; an error status so compressed is still that status.
#[tokio::test]
async fn a_compressed_reply_says_so() {
    let gzip = String::from_utf8_lossy(&[0x1f, 0x8b, 0x08, 0x00, 0xff]).into_owned();
    let server = fake_llm(vec![Reply::Answer(
        200,
        vec![("content-encoding", "gzip")],
        gzip.clone(),
    )])
    .await;
    let (outcome, store) = run_against(&server, FAST_RETRIES).await;
    let error = failure(&outcome, &store, ErrorKind::Client);
    assert_eq!(server.requests(), 1, "not retried");
    assert!(
        error
            .message
            .contains("answered compressed (`Content-Encoding: gzip`)")
            && !error.message.contains('\u{fffd}'),
        "{}",
        error.message
    );
    let server = fake_llm(vec![Reply::Answer(
        401,
        vec![("content-encoding", "gzip")],
        gzip,
    )])
    .await;
    let (outcome, store) = run_against(&server, FAST_RETRIES).await;
    let error = failure(&outcome, &store, ErrorKind::Client);
    assert!(
        error
            .message
            .contains("answered 401 Unauthorized: (a body compressed with `gzip`, not read)"),
        "{}",
        error.message
    );
}

/// Errors show the provider's URL with its password masked, and never
/// the API key, should the server quote it back (reqwest's own errors
/// dropped the password; the step's words did not).
#[tokio::test]
async fn errors_show_neither_the_urls_password_nor_the_key() {
    let server = fake_llm(vec![Reply::Answer(
        401,
        vec![],
        "Incorrect API key provided: test-key-0123456789".into(),
    )])
    .await;
    let base_url = server.url.replace("http://", "http://proxy:hunter2secret@");
    let provider = OpenAiProvider::new(ProviderConfig {
        base_url,
        api_key: Some("test-key-0123456789".into()),
        models: Default::default(),
    })
    .expect("a client");
    let (outcome, store) = run_with(Arc::new(provider), FAST_RETRIES).await;
    let error = failure(&outcome, &store, ErrorKind::Client);
    assert!(
        error.message.starts_with("http://***@127.0.0.1:")
            && error
                .message
                .contains("Incorrect API key provided: [the API key]"),
        "{}",
        error.message
    );
    assert!(!error.message.contains("hunter2"), "{}", error.message);
}

/// A request that got no answer says why, not only reqwest's "error
/// sending request".
#[tokio::test]
async fn a_refused_connection_says_so() {
    let provider = OpenAiProvider::new(ProviderConfig {
        base_url: "http://127.0.0.1:1/v1".into(),
        api_key: None,
        models: Default::default(),
    })
    .expect("a client");
    let (outcome, store) = run_with(Arc::new(provider), "retry 1 timeout 5s").await;
    let error = failure(&outcome, &store, ErrorKind::Connection);
    assert!(
        error
            .message
            .starts_with("http://127.0.0.1:1/v1/chat/completions: ")
            && error.message.to_lowercase().contains("connection refused"),
        "{}",
        error.message
    );
}

/// Regression: a server certificate that TLS refuses (here signed by an
/// authority nobody trusts) was a connection failure, retried with its
/// backoff although no attempt could meet another certificate.
#[tokio::test]
async fn a_refused_certificate_fails_at_once_and_says_so() {
    let dir = flow_tests::TempDir::new("provider-tls");
    let (server, proxy) = behind_tls(&dir).await;
    let provider = OpenAiProvider::new(ProviderConfig {
        base_url: format!("https://localhost:{}/v1", proxy.port),
        api_key: None,
        models: Default::default(),
    })
    .expect("a client");
    let (outcome, store) = run_with(Arc::new(provider), FAST_RETRIES).await;
    let error = failure(&outcome, &store, ErrorKind::Client);
    assert_eq!(store.records()[0].attempts.len(), 1, "not retried");
    assert_eq!(server.requests(), 0, "nothing got through");
    assert!(
        error.message.contains("certificate") && error.message.contains("SSL_CERT_FILE"),
        "{}",
        error.message
    );
}

/// The fake model behind a TLS proxy whose certificate is signed by an
/// authority (in `dir`) that nobody trusts, for `localhost`.
async fn behind_tls(dir: &flow_tests::TempDir) -> (FakeLlm, TlsProxy) {
    let authority = Certificates::make(dir.path(), "private", &["localhost"]);
    let server = fake_llm(vec![]).await;
    let upstream = server
        .url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .and_then(|address| address.parse().ok())
        .expect("the fake server's address");
    let proxy = TlsProxy::start(&authority, Protocol::Tls, upstream).await;
    (server, proxy)
}

/// Regression (an audit): an `http://` base URL of a server that speaks
/// TLS was three attempts of "connection reset" or a closed connection,
/// and no word of why. The error says what to check.
#[tokio::test]
async fn plain_http_to_a_tls_server_says_what_to_check() {
    let dir = flow_tests::TempDir::new("provider-plain-to-tls");
    let (server, proxy) = behind_tls(&dir).await;
    // Nothing gets through the proxy: it speaks TLS and the client does not.
    let provider = OpenAiProvider::new(ProviderConfig {
        base_url: format!("http://localhost:{}/v1", proxy.port),
        api_key: None,
        models: Default::default(),
    })
    .expect("a client");
    let (outcome, store) = run_with(Arc::new(provider), FAST_RETRIES).await;
    let kind = failed_with(&outcome).expect("failed");
    let error = failure(&outcome, &store, kind);
    assert_eq!(server.requests(), 0);
    assert!(
        error.message.contains("starts with `https://`"),
        "{kind:?}: {}",
        error.message
    );
}

/// OpenAI-compatible servers give an answer in other shapes than a string
/// of content: read as a server error and retried, each cost a whole
/// completion again and failed the same way.
#[tokio::test]
async fn answers_in_each_shape_servers_give_are_read() {
    let answer = json!({ "text": "fine", "score": 2 });
    for (shape, message) in [
        (
            "text parts",
            json!({ "role": "assistant", "content": [
                { "type": "text", "text": "{\"text\": \"fine\", " },
                { "type": "text", "text": "\"score\": 2}" },
            ] }),
        ),
        (
            "the value itself",
            json!({ "role": "assistant", "content": answer }),
        ),
        (
            "a tool call",
            json!({ "role": "assistant", "content": null, "tool_calls": [{
                "id": "c1", "type": "function",
                "function": { "name": "answer", "arguments": answer.to_string() },
            }] }),
        ),
        (
            "an empty refusal beside the answer",
            json!({ "role": "assistant", "content": answer.to_string(), "refusal": "" }),
        ),
    ] {
        let server = fake_llm(vec![Reply::Body(
            json!({ "choices": [{ "message": message, "finish_reason": "stop" }] }),
        )])
        .await;
        let (outcome, _) = run_against(&server, FAST_RETRIES).await;
        let Outcome::Completed { output } = &outcome else {
            panic!("{shape}: {outcome:?}")
        };
        assert_eq!(output["text"], "fine", "{shape}");
        assert_eq!(server.requests(), 1, "{shape}");
    }
}

/// A run's journal whose hold was live at its `admit` and ran out before
/// the request went out, as in a process stopped (SIGSTOP) in between;
/// asked again, it does as its `Renewal` says.
struct RanOut(Arc<Hold>, Renewal);

/// What a journal whose hold ran out does when asked again.
#[derive(PartialEq)]
enum Renewal {
    /// Leaves it run out: another process has the run.
    Refused,
    /// Renews it: the run was still this process's.
    Renewed,
    /// Never answers, as a store that does not answer.
    Stuck,
}

impl Journal for RanOut {
    fn lookup(&self, _: &str) -> Option<StepRecord> {
        None
    }

    fn resumed(&self) -> bool {
        false
    }

    fn record<'a>(&'a self, _: StepRecord) -> BoxFuture<'a, Result<(), StepError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    fn hold(&self) -> Option<Arc<Hold>> {
        Some(Arc::clone(&self.0))
    }

    fn admit(&self) -> BoxFuture<'_, Result<(), StepError>> {
        match self.1 {
            Renewal::Refused => {}
            Renewal::Renewed => self.0.renewed(Instant::now() + Duration::from_secs(60)),
            Renewal::Stuck => return Box::pin(std::future::pending()),
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

/// The call of step `first` with `prompt`, in `journal`'s run.
fn call_of<'a>(
    prompt: &str,
    input: &'a serde_json::Value,
    schema: &'a serde_json::Value,
    journal: &'a dyn Journal,
) -> RecipeCall<'a> {
    RecipeCall {
        recipe: "r",
        model: "default",
        prompt: prompt.to_string(),
        input,
        output_schema: schema,
        path: "first",
        call_id: "run:first:0",
        repair: None,
        journal: Some(journal),
        deadline: None,
        progress: None,
    }
}

/// Regression guard for the chaos test (seed 1796225237056460129): a call
/// whose run passed to another process while this one was stopped between
/// the check before the attempt and the request's send is not sent, on
/// either provider, and its error is the lost lease rather than a
/// connection failure worth retrying.
#[tokio::test]
async fn a_call_whose_hold_ran_out_before_it_went_out_is_not_sent() {
    let server = fake_llm(vec![]).await;
    let openai: Arc<dyn Provider> = Arc::new(
        OpenAiProvider::new(ProviderConfig {
            base_url: server.url.clone(),
            api_key: None,
            models: Default::default(),
        })
        .expect("a client"),
    );
    let schema = json!({ "type": "object", "properties": { "text": { "type": "string" } } });
    let input = json!({});
    for provider in [openai, anthropic(&server)] {
        for hold in [
            Hold::new(true, Some(Instant::now())),
            Hold::new(false, None),
        ] {
            let journal = RanOut(Arc::new(hold), Renewal::Refused);
            let call = call_of("late", &input, &schema, &journal);
            let error = provider.complete(&call).await.expect_err("not sent");
            assert!(error.message.contains("lease"), "{error:?}");
        }
    }
    assert_eq!(server.requests(), 0, "{:?}", server.calls());
    // The same request with a live hold goes out.
    let journal = RanOut(
        Arc::new(Hold::new(
            true,
            Some(Instant::now() + Duration::from_secs(60)),
        )),
        Renewal::Refused,
    );
    let call = call_of("in time", &input, &schema, &journal);
    anthropic(&server).complete(&call).await.expect("sent");
    assert_eq!(server.prompts(), ["in time"]);
}

/// A process that merely stalled past nine tenths of its lease (the run
/// still its own) renews the hold and sends the call once, rather than
/// failing an attempt of the step's budget.
#[tokio::test]
async fn a_call_whose_hold_ran_out_unrenewed_is_sent_once_renewed() {
    let server = fake_llm(vec![]).await;
    let schema = json!({ "type": "object", "properties": { "text": { "type": "string" } } });
    let input = json!({});
    let journal = RanOut(
        Arc::new(Hold::new(true, Some(Instant::now()))),
        Renewal::Renewed,
    );
    let call = call_of("stalled", &input, &schema, &journal);
    anthropic(&server)
        .complete(&call)
        .await
        .expect("sent once renewed");
    assert_eq!(server.prompts(), ["stalled"]);
}

/// A step's timeout that ends a call while its hold is being renewed says
/// so, rather than blaming the model, which was never sent the request.
/// Regression (a review): it said the model "had sent no reply".
#[tokio::test]
async fn a_timeout_while_the_hold_is_renewed_does_not_blame_the_model() {
    let server = fake_llm(vec![]).await;
    let schema = json!({ "type": "object", "properties": { "text": { "type": "string" } } });
    let input = json!({});
    let journal = RanOut(
        Arc::new(Hold::new(true, Some(Instant::now()))),
        Renewal::Stuck,
    );
    let progress = flow_runtime::services::CallProgress::default();
    let call = RecipeCall {
        progress: Some(&progress),
        ..call_of("stalled", &input, &schema, &journal)
    };
    let provider = anthropic(&server);
    let cut = tokio::time::timeout(Duration::from_millis(300), provider.complete(&call));
    assert!(cut.await.is_err(), "the renewal never answers");
    let said = progress.said().unwrap_or_default();
    assert!(
        said.contains("was not sent yet") && said.contains("renewed"),
        "{said}"
    );
    assert_eq!(server.requests(), 0);
}
