//! The provider and MCP client of a test's run: they answer from the
//! test's mocks, by step or by recipe, call after call, and fail as told.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use flow_compiler::syntax::ast::Failure;
use flow_compiler::test_case::{Answer, MockCase, Target};
use flow_engine::error::{ErrorKind, StepError};
use flow_engine::journal::Journal;
use flow_engine::offline::OfflineProvider;
use flow_engine::services::{BoxFuture, McpClient, Provider, RecipeCall, Repair};
use flow_engine::sync::lock;
use flow_plan::McpServer;
use serde_json::Value;

/// How long a mocked timeout keeps its call waiting: past any step's
/// timeout, so that the interpreter's own timeout ends the attempt, as it
/// would a provider that does not answer. Virtual time makes it instant.
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// A call that no mock answers: the test fails naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unmocked {
    pub(crate) step: String,
    /// The call's execution path (`each[0]/classify`), when the call
    /// names it (a recipe's does; an MCP call names no step).
    pub(crate) path: Option<String>,
    /// `recipe `r`` or `tool `server.tool``.
    pub(crate) what: String,
}

pub(crate) struct Mocks {
    answers: HashMap<Target, Vec<Answer>>,
    /// How many calls each target has answered.
    calls: Mutex<HashMap<Target, usize>>,
    unmocked: Mutex<Vec<Unmocked>>,
    /// Answers the recipe calls no mock answers, when the test run was
    /// asked to (`flowc test --offline`); else such a call fails the test.
    offline: Option<OfflineProvider>,
}

impl Mocks {
    pub(crate) fn new(mocks: &[MockCase], offline: Option<OfflineProvider>) -> Mocks {
        let mut answers: HashMap<Target, Vec<Answer>> = HashMap::new();
        for mock in mocks {
            answers
                .entry(mock.target.clone())
                .or_default()
                .extend(mock.answers.iter().cloned());
        }
        Mocks {
            answers,
            calls: Mutex::new(HashMap::new()),
            unmocked: Mutex::new(Vec::new()),
            offline,
        }
    }

    /// The calls no mock answered, in the order they were made.
    pub(crate) fn unmocked(&self) -> Vec<Unmocked> {
        lock(&self.unmocked).clone()
    }

    /// The next answer for a call of `step` (of `recipe`): the step's
    /// mocks first, then the recipe's.
    fn next(&self, step: &str, recipe: Option<&str>) -> Option<Answer> {
        let by_step = Target::Step(step.to_string());
        let target = if self.answers.contains_key(&by_step) {
            by_step
        } else {
            Target::Recipe(recipe?.to_string())
        };
        let answers = self.answers.get(&target)?;
        let mut calls = lock(&self.calls);
        let made = calls.entry(target).or_insert(0);
        let answer = answers.get(*made).or(answers.last())?.clone();
        *made += 1;
        Some(answer)
    }

    /// The answer a mock gives: its value, or its failure.
    async fn reply(answer: Answer) -> Result<Value, StepError> {
        match answer {
            Answer::Value(value) => Ok(value),
            Answer::Fails(failure) => Err(failed(failure).await),
        }
    }

    /// The answer a mock gives to a recipe's call. An answer that does not
    /// fit (`fails invalid_output`) is repaired as a provider's is: the
    /// interpreter asks again, as an attempt of its own, and the repair
    /// fails too ([`repair_of_mocked`]).
    async fn reply_to_recipe(answer: Answer) -> Result<Value, StepError> {
        let mut error = match answer {
            Answer::Fails(Failure::InvalidOutput) => StepError::new(
                ErrorKind::InvalidOutput,
                "the answer does not fit the recipe's output (mocked)",
            ),
            answer => return Self::reply(answer).await,
        };
        error.repairable = Some(Repair {
            answer: MOCKED_MISFIT.to_string(),
            problem: "it does not fit the recipe's output (mocked)".to_string(),
        });
        Err(error)
    }

    /// Notes a call that no mock answers, and the error that ends it.
    fn unanswered(&self, step: &str, path: Option<&str>, what: String) -> StepError {
        let error = StepError::new(
            ErrorKind::Unsupported,
            format!("the test does not mock {what} of step `{step}`"),
        );
        lock(&self.unmocked).push(Unmocked {
            step: step.to_string(),
            path: path.map(str::to_string),
            what,
        });
        error
    }
}

/// The answer a mock made not fit (`fails invalid_output`), as the repair
/// request shows it to the model.
const MOCKED_MISFIT: &str = "(an answer that does not fit, mocked)";

/// The failure of the repair request of an answer a mock made not fit:
/// `fails invalid_output` says the answer does not fit after the repair
/// (so the step makes two attempts, as against a model), and the repair
/// takes no answer of the mock's sequence.
fn repair_of_mocked(call: &RecipeCall<'_>) -> Option<StepError> {
    let repair = call.repair.as_ref()?;
    (repair.answer == MOCKED_MISFIT).then(|| {
        StepError::new(
            ErrorKind::InvalidOutput,
            "the answer does not fit the recipe's output, after the repair attempt (mocked)",
        )
    })
}

/// The error a failure gives, as a provider reports it.
async fn failed(failure: Failure) -> StepError {
    let (kind, message) = match failure {
        Failure::Status(status) => (
            ErrorKind::of_status(status),
            format!("HTTP {status} (mocked)"),
        ),
        Failure::Timeout => {
            tokio::time::sleep(NEVER).await;
            (ErrorKind::Timeout, "no answer (mocked)".to_string())
        }
        Failure::Connection => (
            ErrorKind::Connection,
            "connection refused (mocked)".to_string(),
        ),
        Failure::InvalidOutput => (
            ErrorKind::InvalidOutput,
            "the answer does not fit the recipe's output, after the repair attempt (mocked)"
                .to_string(),
        ),
    };
    StepError::new(kind, message)
}

impl Provider for Mocks {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            // A path's last part is the step's id (`scans[3]/page` is step `page`).
            let step = call.path.rsplit('/').next().unwrap_or(call.path);
            if let Some(error) = repair_of_mocked(call) {
                return Err(error);
            }
            match (self.next(step, Some(call.recipe)), &self.offline) {
                (Some(answer), _) => Self::reply_to_recipe(answer).await,
                (None, Some(offline)) => {
                    Ok(offline.answer(call.recipe, call.path, call.input, call.output_schema))
                }
                (None, None) => {
                    Err(self.unanswered(step, Some(call.path), format!("recipe `{}`", call.recipe)))
                }
            }
        })
    }
}

impl McpClient for Mocks {
    fn call_tool<'a>(
        &'a self,
        server: &'a McpServer,
        tool: &'a str,
        _args: &'a Value,
        path: &'a str,
        _journal: Option<&'a dyn Journal>,
    ) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(async move {
            let what = format!("tool `{}.{tool}`", server.name);
            // A path's last part is the step's id, as for a recipe's call:
            // two steps that call one tool are mocked each on its own.
            let step = path.rsplit('/').next().unwrap_or(path);
            match self.next(step, None) {
                Some(answer) => Self::reply(answer).await,
                None => Err(self.unanswered(step, Some(path), what)),
            }
        })
    }

    /// A test reaches no server: every one answers.
    fn check<'a>(
        &'a self,
        _server: &'a McpServer,
        _tools: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}
