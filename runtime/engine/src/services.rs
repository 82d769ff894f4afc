//! The services a run uses, as traits the interpreter calls: a model
//! provider, an MCP client, the store's effects (KB writes, handoffs, KB
//! context). Stores, flowd and the CLI implement them; none of them needs the
//! interpreter to do so.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use flow_plan::StepKind;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::StepError;
use crate::journal::{Attempt, Journal};
use crate::sync::lock;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One call of a recipe, as a provider receives it. It borrows from the plan
/// and the step's arguments: a call is made per step, and copying a schema
/// for each would cost more than the engine's own work.
#[derive(Clone)]
pub struct RecipeCall<'a> {
    pub recipe: &'a str,
    /// The model alias; the provider's configuration resolves it.
    pub model: &'a str,
    pub prompt: String,
    pub input: &'a Value,
    pub output_schema: &'a Value,
    /// The step's execution path (`each[2]/classify`): where in the run
    /// the call is, the same in every run of the workflow.
    pub path: &'a str,
    /// Stable identity of this attempt (run id, path, attempt index), for
    /// deterministic providers and idempotent requests.
    pub call_id: &'a str,
    /// Set for a repair request: the answer of the attempt before, which did
    /// not fit the recipe's output, and what was wrong with it. The model
    /// is shown both and asked again.
    pub repair: Option<Repair>,
    /// The run's journal, asked again (`Journal::admit`) by a provider that
    /// waited before sending (for a permit of the account's limit): the
    /// interpreter's check before the attempt may be seconds old by then,
    /// and the run another process's. `None` outside a run.
    pub journal: Option<&'a dyn Journal>,
    /// When the attempt's timeout ends it: a provider that waits before
    /// sending (for a permit of the account's limit) says that this wait is
    /// what ran out, not the model. `None` outside a step.
    pub deadline: Option<tokio::time::Instant>,
    /// Where the call stands, for the step's timeout to say when it cuts
    /// the call short (`CallProgress`). `None` outside a step.
    pub progress: Option<&'a CallProgress>,
}

/// Where an attempt's call stands, as its provider last said: the step's
/// timeout names it when it ends the attempt. "The attempt ran past the
/// step's timeout of 1m" said neither which server had not answered nor
/// how far it had got (an audit: a model that hung after its headers
/// read as one never reached).
#[derive(Debug, Default)]
pub struct CallProgress(Mutex<Option<String>>);

impl CallProgress {
    /// Notes where the call stands, in words that follow "the step's
    /// timeout of 1m passed:" (`the model at URL had not answered`).
    pub fn say(&self, stage: String) {
        *lock(&self.0) = Some(stage);
    }

    /// The last stage said, if any.
    pub fn said(&self) -> Option<String> {
        lock(&self.0).clone()
    }
}

impl std::fmt::Debug for RecipeCall<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecipeCall")
            .field("recipe", &self.recipe)
            .field("model", &self.model)
            .field("prompt", &self.prompt)
            .field("input", &self.input)
            .field("output_schema", &self.output_schema)
            .field("call_id", &self.call_id)
            .field("repair", &self.repair)
            .field("journal", &self.journal.is_some())
            .field("progress", &self.progress)
            .finish()
    }
}

/// An answer that did not fit, for the repair request after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    pub answer: String,
    pub problem: String,
}

/// A model provider (OpenAI-compatible, Anthropic, the offline fabricator).
pub trait Provider: Send + Sync {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>>;

    /// What is wrong with calling these model aliases (preflight): nothing,
    /// for a provider that takes any (the offline one; one whose aliases
    /// pass through as model names).
    fn check_models(&self, aliases: &[String]) -> Vec<String> {
        let _ = aliases;
        Vec::new()
    }
}

/// A call to an MCP server's tool.
pub trait McpClient: Send + Sync {
    /// Calls `tool` for the step at `path` (`scans[3]/page`: what a test's
    /// mocks answer by; a server is not told). `journal`, the run's, is
    /// asked again (`Journal::admit`) once the call has its turn on a
    /// connection, just before it goes out: the wait can outlast the run's
    /// hold on the run.
    fn call_tool<'a>(
        &'a self,
        server: &'a flow_plan::McpServer,
        tool: &'a str,
        args: &'a Value,
        path: &'a str,
        journal: Option<&'a dyn Journal>,
    ) -> BoxFuture<'a, Result<Value, StepError>>;

    /// Whether `server` answers `initialize` and lists every one of `tools`
    /// (preflight); what went wrong otherwise.
    fn check<'a>(
        &'a self,
        server: &'a flow_plan::McpServer,
        tools: &'a [String],
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// The effects of KB writes and handoffs, kept by the store.
pub trait Effects: Send + Sync {
    /// Creates or updates a document; the same idempotency key returns the
    /// first write's result instead of writing again.
    fn kb_write<'a>(&'a self, write: &'a KbWrite) -> BoxFuture<'a, Result<Value, StepError>>;
    /// Records an in-app notification for a department; never blocks the run.
    fn handoff<'a>(&'a self, handoff: &'a Handoff) -> BoxFuture<'a, Result<(), StepError>>;
    /// At most `limit` of the run's account's documents that `ids` name (a
    /// collection, or one document as `collection/title`) or that
    /// `department` owns, those that match `terms` best first
    /// (`crate::kb::search_terms`), then the others by collection and title.
    fn kb_context<'a>(
        &'a self,
        ids: &'a [String],
        department: Option<&'a str>,
        terms: &'a [String],
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<KbDocument>, StepError>>;
}

/// A knowledge-base document as a recipe's context gets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KbDocument {
    pub collection: String,
    pub title: String,
    pub version: i64,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KbWrite {
    pub collection: String,
    pub title: String,
    pub content: String,
    pub metadata: Option<Value>,
    pub key: Option<String>,
    /// The department of the workflow that writes: the document becomes
    /// its. A write from a workflow without one keeps the document's owner.
    /// Absent from the arguments journaled before departments existed.
    #[serde(default)]
    pub department: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Handoff {
    pub run_id: String,
    pub department: String,
    pub message: String,
    pub subject: Option<String>,
    pub key: Option<String>,
}

/// The services a run uses.
#[derive(Clone)]
pub struct Services {
    pub provider: Arc<dyn Provider>,
    pub effects: Arc<dyn Effects>,
    pub mcp: Option<Arc<dyn McpClient>>,
    pub journal: Arc<dyn Journal>,
    /// Places for steps executing at once, shared by the runs of one
    /// account (flowd): a step holds one from its first attempt until its
    /// record is journaled, so that one account's loop at `concurrency
    /// 1000` runs at most this many steps at a time and cannot fill the
    /// journal's commits and the runtime's threads for everyone else.
    /// Closed, they start no attempt (a stopping flowd's runs end between
    /// two steps).
    pub steps: Option<Arc<tokio::sync::Semaphore>>,
    /// The table of the steps the run executes now, for its driver to read
    /// (`StepsInFlight::now`); the run keeps one of its own without it.
    pub in_flight: Option<Arc<StepsInFlight>>,
}

/// The steps a run is executing now, by path: the interpreter's table,
/// shared with whoever drives the run (`Services::in_flight`) so that it
/// can tell what the run is doing between two records. A hash table keeps
/// its room when it empties, where a B-tree gave back its node after every
/// step of a run whose steps go one at a time and took a new one for the
/// next.
#[derive(Default)]
pub struct StepsInFlight(Mutex<HashMap<String, InFlight>>);

impl std::fmt::Debug for StepsInFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepsInFlight").finish_non_exhaustive()
    }
}

/// A step executing now, as `StepsInFlight::now` tells it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepNow {
    /// Its execution path, as its record will have it.
    pub path: String,
    pub kind: StepKind,
    pub started_ms: u64,
    /// Its attempts that ended without success (retried, or waiting to be).
    pub attempts_failed: u32,
    /// When the call now out went out; absent while it waits to retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calling_since_ms: Option<u64>,
}

impl StepsInFlight {
    pub(crate) fn table(&self) -> MutexGuard<'_, HashMap<String, InFlight>> {
        lock(&self.0)
    }

    /// The steps executing now, in path order.
    pub fn now(&self) -> Vec<StepNow> {
        let mut steps: Vec<StepNow> = self
            .table()
            .iter()
            .map(|(path, step)| StepNow {
                path: path.clone(),
                kind: step.kind,
                started_ms: step.started_ms,
                attempts_failed: step.attempts.len() as u32,
                calling_since_ms: step.calling_since,
            })
            .collect();
        steps.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        steps
    }
}

/// A step executing now. Its input is not kept: copying every step's
/// arguments for the rare timeout would cost every run.
pub(crate) struct InFlight {
    /// Its slot in the workflow, which names it: the id is not copied for
    /// every step for the rare timeout.
    pub(crate) slot: u32,
    pub(crate) kind: StepKind,
    pub(crate) started_ms: u64,
    /// Its attempts that ended.
    pub(crate) attempts: Vec<Attempt>,
    /// When the call out now went out (`None`: it waits to retry).
    pub(crate) calling_since: Option<u64>,
}
