//! The bounds that [`Plan::validate`](crate::Plan::validate) holds a plan to.
//!
//! A plan from outside (deployed to flowd, or handed to `flow run`) is data
//! anyone could have written, and the runtime trusts its numbers: it sleeps
//! for its backoffs, keeps its loop concurrency in flight and walks its
//! schemas for every input. Each bound below is comfortably above what real
//! programs compile to (the largest the project knows of is the 100,000-step
//! workflow that `compiler/core/benches/check.rs` generates), so that only a
//! plan nobody wrote with the compiler meets one. The numbers the checker
//! also enforces ([`MAX_ATTEMPTS`], [`MAX_CONCURRENCY`]) are the checker's
//! own: `flow-compiler` reads them from here.

/// The compact JSON of a whole plan. The 100,000-step benchmark workflow
/// lowers to 52 MiB; five times that is room for any program people write,
/// and keeps a plan a thing one process can hold several of.
pub const MAX_PLAN_BYTES: u64 = 256 * 1024 * 1024;

/// What a plan past a bound of `most` bytes ([`MAX_PLAN_BYTES`], or a
/// lower one of flowd's) is told, by the validator and by a compiler that
/// measures the plan before writing it.
pub fn past_plan_bytes(most: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    if most.is_multiple_of(MIB) {
        format!("the plan's JSON is over {} MiB", most / MIB)
    } else {
        format!("the plan's JSON is over {most} bytes")
    }
}

/// Workflows in one plan (one source file's). Files hold a handful; a
/// generated file of thousands is still far below this.
pub const MAX_WORKFLOWS: usize = 10_000;

/// Recipes in one plan: those of the root file and everything it imports.
pub const MAX_RECIPES: usize = 10_000;

/// MCP servers in one plan. The runtime runs at most 20 at once; a plan that
/// declares a thousand has stopped describing what one run talks to.
pub const MAX_MCP_SERVERS: usize = 1_000;

/// Steps (every step, loop and parallel block) in one plan, across its
/// workflows: ten times the largest benchmark workflow.
pub const MAX_STEPS: usize = 1_000_000;

/// How deep blocks nest: branches, loop bodies, parallel branches and
/// fallbacks. Every block is a `{` in the source, and the parser refuses
/// brackets nested deeper than 128 (`syntax/parse.rs`, `MAX_DEPTH`).
pub const MAX_BLOCK_DEPTH: usize = 128;

/// The stack of a thread that checks, reads or runs plans: the interpreter
/// recurses once per block (at most [`MAX_BLOCK_DEPTH`]) and serde once per
/// level of a plan's JSON (at most 1024), more than a tokio worker's or a
/// spawned thread's 2 MiB in a debug build (an audit: flowd died of a
/// stack overflow at a run of 90 nested loops, and at each restart as it
/// resumed the run; a raw plan of 400 nested loops killed it as it was
/// read). Only the pages a thread touches are ever backed by memory.
pub const STACK_BYTES: usize = 32 << 20;

/// How deep one expression nests. The parser allows 128 levels of brackets
/// and 128 operators in one chain; hand-written expressions nest a few
/// levels. Twice the parser's bound, and far inside the stack that the
/// runtime evaluates on.
pub const MAX_EXPR_DEPTH: usize = 256;

/// How deep a JSON Schema nests, counting each list item, record field and
/// optional as a level. A type is written in one declaration nested at most
/// 128 brackets deep; the runtime's validator descends 256 levels, so every
/// level a valid plan's schema declares is checked.
pub const MAX_SCHEMA_DEPTH: usize = 128;

/// JSON values in one schema (each schema object, enum variant and required
/// name). A record of a few hundred fields is a few thousand.
pub const MAX_SCHEMA_NODES: usize = 100_000;

/// Variants of one string enum. The longest real lists are codes (ISO 639-3
/// has about 7,900 languages).
pub const MAX_ENUM_VARIANTS: usize = 10_000;

/// Bytes of one enum variant: variants are labels such as `"billing"`.
pub const MAX_VARIANT_BYTES: usize = 1_024;

/// Bytes of a schema's `description`: a record field's `///` doc, which
/// tells a model what the field means. Docs run to a few sentences; the
/// compiler cuts a longer one here.
pub const MAX_DESCRIPTION_BYTES: usize = 4 * 1024;

/// Bytes of a name: workflows, recipes, servers, steps, fields, branches,
/// tools, model aliases, departments. Names end up in journal paths, metric
/// labels and messages, and people write them in tens of characters.
pub const MAX_NAME_BYTES: usize = 256;

/// Bytes of text in one string literal, and of all text parts of one
/// template together. Long prompts run to tens of kilobytes.
pub const MAX_TEXT_BYTES: usize = 1024 * 1024;

/// Parts (text runs and references) of one template.
pub const MAX_TEMPLATE_PARTS: usize = 10_000;

/// Segments of one reference's path (`step.a.b[0].c` has three).
pub const MAX_PATH_SEGMENTS: usize = 256;

/// Knowledge-base ids in one `context kb` list, and bytes of each
/// (`collection` or `collection/title`).
pub const MAX_CONTEXT_IDS: usize = 1_000;
pub const MAX_KB_ID_BYTES: usize = 1_024;

/// Bytes of an MCP server's command, of each argument and environment value,
/// of its URL, and of the plan's source path: `PATH_MAX` on Linux.
pub const MAX_SETTING_BYTES: usize = 4_096;

/// Destinations of one workflow, and recipients of one email destination:
/// each is an outbox delivery per run event, so a workflow that needs more
/// wants a webhook that fans out.
pub const MAX_DESTINATIONS: usize = 100;
pub const MAX_RECIPIENTS: usize = 100;

/// Approvers of one approval, and the bytes of a message to people (an
/// approval's, a handoff's message and subject), checked as a run
/// evaluates them: each approver is a notification and an email holding
/// the message, so without them a run's input of a megabyte naming a
/// thousand approvers stored a gigabyte in one commit, past the account's
/// quota before it was measured again.
pub const MAX_APPROVERS: usize = 100;
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Arguments and environment variables of one MCP server.
pub const MAX_MCP_ARGS: usize = 1_000;

/// Attempts of a step's `retry`: more than this is a loop, not a retry.
pub const MAX_ATTEMPTS: u32 = 100;

/// A loop's `concurrency`: more iterations in flight than this would only
/// queue on the account's limit of LLM calls.
pub const MAX_CONCURRENCY: u32 = 1_000;

/// The model calls an account has in flight at once unless flowd's
/// configuration says otherwise (`llm_concurrency`); `flowc check` holds
/// a workflow's most calls at once against it.
pub const DEFAULT_MODEL_CALLS: u64 = 10;

/// The largest `max` a loop may state: a bound on its items that is any
/// use for a budget of time.
pub const MAX_LOOP_ITEMS: u32 = 1_000_000;

/// Timeouts, backoffs and approval expiries: one year. A run's deadline and
/// an approval's expiry are added to clocks; nobody waits longer on purpose.
pub const MAX_DURATION_MS: u64 = 365 * 24 * 60 * 60 * 1_000;

/// Problems listed for one plan: enough to fix a hand-edited plan, and a
/// bound on the answer for one that is entirely wrong.
pub const MAX_PROBLEMS: usize = 100;

/// Characters of one problem, its path included: values it quotes are cut.
pub const MAX_PROBLEM_CHARS: usize = 300;
