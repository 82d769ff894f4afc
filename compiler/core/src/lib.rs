//! The `.flow` compiler core.
//!
//! Pure: no function here reads a file, a clock or the environment. Drivers
//! (`flowc`, `flow-lsp`, the runtime's CLIs) load sources and hand them in, so
//! that the command line and the editor report exactly the same diagnostics.

// pest's generated parser names `alloc` directly when pest is built without
// `std` (see the workspace Cargo.toml for why it is).
extern crate alloc;

pub mod budget;
pub mod check;
pub mod codes;
pub mod diagnostic;
pub mod format;
pub mod graph;
pub mod ide;
pub mod lock;
pub mod lower;
pub mod suggest;
pub mod syntax;
pub mod test_case;

pub use check::{Checked, LoadError, LoadFailure, SourceLoader};
pub use diagnostic::{Diagnostic, FileId, Label, Severity, Span};

/// Checks the file at `root` and everything it imports: the one way every
/// driver (`flowc check` and `build`, `flow run`, flowd's deploy, the
/// language server) compiles a program (see [`check::check`]). A program
/// without errors is also held to its static budgets ([`budget`]).
pub fn check(root: &str, loader: &dyn SourceLoader) -> Result<Checked, LoadError> {
    check::check(root, loader).map(budget::with_budgets)
}

/// [`check`] of one in-memory source that imports nothing from disk.
pub fn check_source(path: &str, text: &str) -> Checked {
    budget::with_budgets(check::check_source(path, text))
}

/// [`check`] against the tools of a `flow.lock` already read.
pub fn check_with_tools(
    root: &str,
    loader: &dyn SourceLoader,
    tools: Option<&lock::ToolLock>,
) -> Result<Checked, LoadError> {
    check::check_with_tools(root, loader, tools).map(budget::with_budgets)
}

/// The sealed plan of a program without errors (`None` with errors).
pub fn lower(checked: &Checked) -> Option<flow_plan::Plan> {
    lower::lower(checked)
}

/// [`check`], then the plan of a program without errors (`None` with
/// errors): how a driver that wants the plan compiles (`flowc build`, `flow
/// run`, flowd's deploy). The program is lowered once, its statements
/// dropped as they are (a big program's tree and plan are never whole at
/// once), and the budgets are those of that plan, where [`check`] followed
/// by [`lower`] lowers twice (a sixth of a cold `flowc build` of a
/// 100,000-step file). The diagnostics and budgets are
/// [`check`]'s; the root file's workflows are left without statements.
pub fn check_and_lower(
    root: &str,
    loader: &dyn SourceLoader,
) -> Result<(Checked, Option<flow_plan::Plan>), LoadError> {
    check_and_lower_within(root, loader, flow_plan::limits::MAX_PLAN_BYTES)
}

/// [`check_and_lower`] with a lower bound on the plan's JSON than the
/// plan format's (flowd's for deploys), held before the plan is written
/// as far as the plan's schemas go (E212): what a type named in many
/// places makes of a small source.
pub fn check_and_lower_within(
    root: &str,
    loader: &dyn SourceLoader,
    most_plan_bytes: u64,
) -> Result<(Checked, Option<flow_plan::Plan>), LoadError> {
    let most = most_plan_bytes.min(flow_plan::limits::MAX_PLAN_BYTES);
    let mut checked = check::check(root, loader)?;
    // A plan whose schemas are past the bound on its JSON is not written.
    if checked.program().is_some()
        && let Some(problems) = lower::past_plan_bytes(&checked, most)
    {
        checked
            .diagnostics
            .extend(lower::past_plan_limits(&checked, &problems));
        check::sort_diagnostics(&mut checked.diagnostics);
        return Ok((checked, None));
    }
    let mut plan = lower::lower_taking(&mut checked);
    // What the checker lets through must be a plan the runtime takes: the
    // plan's limits that no check names are held here (E212), once, for
    // every driver that compiles to a plan.
    if let Some(Err(problems)) = plan.as_ref().map(flow_plan::Plan::validate_content) {
        checked
            .diagnostics
            .extend(lower::past_plan_limits(&checked, &problems));
        check::sort_diagnostics(&mut checked.diagnostics);
        plan = None;
    }
    if let Some(plan) = &plan {
        let budgets = plan
            .workflows
            .iter()
            .map(flow_plan::budget::Budget::of)
            .collect();
        budget::add_budgets(&mut checked, budgets);
    }
    Ok((checked, plan))
}
