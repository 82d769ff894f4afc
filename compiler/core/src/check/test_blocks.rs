//! Checking `test` blocks as workflows are checked: the workflow they run,
//! its input, what each mock answers against the recipe's output type, the
//! steps they name against the workflow's steps, and each expectation
//! against the workflow's output type.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::check::env::{Env, missing_member};
use crate::check::types::{Fields, Ty};
use crate::check::workflow::{
    Container, StepInfo, StepKind, WorkflowInfo, check_test_value, test_path_ty,
};
use crate::codes::Code;
use crate::diagnostic::{Diagnostic, FileId, Span};
use crate::suggest::{
    candidates_list, did_you_mean, did_you_mean_within, hint_listing, shown_list,
};
use crate::syntax::ast::*;

/// The statuses a run can end an invocation in, as `expect status` names them.
pub const STATUSES: &[&str] = &["completed", "failed", "parked"];

/// What the checker learnt of one test, in the order of the file's tests.
#[derive(Debug, Clone)]
pub struct TestInfo {
    pub name: String,
    pub span: Span,
    /// Where its name is written.
    pub name_span: Span,
    /// The workflow it runs and the file that declares it, when known.
    pub workflow: Option<(String, FileId)>,
}

/// Checks `decl` (in `file`) against the workflows it may run: the root
/// file's and its imports'.
pub(crate) fn check_test(
    decl: &TestDecl,
    file: FileId,
    workflows: &[&WorkflowInfo],
    env: &Env,
    diagnostics: &mut Vec<Diagnostic>,
) -> TestInfo {
    let mut info = TestInfo {
        name: decl.name.display_text(),
        span: decl.span,
        name_span: decl.name.span,
        workflow: None,
    };
    let Some(name) = &decl.workflow else {
        missing_member(
            decl.recovered,
            diagnostics,
            file,
            decl.name.span,
            "the test",
            "workflow",
            "workflow NAME",
        );
        return info;
    };
    let Some(workflow) = workflows.iter().find(|w| w.name == name.text) else {
        let names = workflows.iter().map(|w| w.name.as_str());
        let mut diagnostic = Diagnostic::new(
            Code::UnknownWorkflow,
            file,
            name.span,
            format!("unknown workflow `{}`", name.text),
        )
        .label("no workflow has this name");
        if let Some(best) = did_you_mean_within(&name.text, names.clone(), &env.suggestions) {
            diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
        } else if workflows.is_empty() {
            diagnostic = diagnostic
                .hint("a test runs a workflow of its file or of a file it imports (`import \"workflow.flow\"`)");
        } else {
            diagnostic = hint_listing(
                diagnostic,
                "the workflows here are",
                names,
                &env.suggestions,
            );
        }
        diagnostics.push(diagnostic);
        return info;
    };
    info.workflow = Some((workflow.name.clone(), workflow.file));
    let mut checker = TestChecker {
        file,
        env,
        workflow,
        diagnostics,
    };
    checker.input(decl);
    for mock in &decl.mocks {
        checker.mock(mock, &decl.mocks);
    }
    for decide in &decl.decisions {
        if let Some(step) = checker.step(&decide.step)
            && checker.kind_allows(&decide.step, step, "decide", |k| {
                matches!(k, StepKind::Approval { .. })
            })
        {
            checker.decide(decide, step);
        }
    }
    for expect in &decl.expects {
        checker.expect(expect);
    }
    checker.output_beside_status(&decl.expects);
    info
}

/// `ty` as `value`, compared with it, may be: where `value` writes a
/// fraction (`expect output.n == 2.0`), an `int` anywhere in `ty` as a
/// `float`, since the two compare as numbers. A value given (a mock's
/// answer, the run's input) keeps `int`: a mock's `2.0` is no `int` (a
/// real model's is read as one, `schema::whole_floats_to_integers`); and
/// a value without a fraction keeps the messages saying `int`.
fn numbers_compared(ty: &Ty, value: &Expr) -> Ty {
    fn has_fraction(expr: &Expr) -> bool {
        match &expr.kind {
            ExprKind::Float(_) => true,
            ExprKind::List(items) => items.iter().any(has_fraction),
            ExprKind::Record(record) => record.fields.iter().any(|f| has_fraction(&f.value)),
            _ => false,
        }
    }
    fn widened(ty: &Ty) -> Ty {
        match ty {
            Ty::Int => Ty::Float,
            Ty::List(item) => Ty::list(widened(item)),
            Ty::Optional(inner) => widened(inner).optional(),
            Ty::Record(fields) => Ty::record(
                fields
                    .iter()
                    .map(|(name, ty)| (name.clone(), widened(ty)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    if has_fraction(value) {
        widened(ty)
    } else {
        ty.clone()
    }
}

/// A second test of a name in one file, or a test without one: `--filter`,
/// the reports and CI's test reports tell tests apart by name.
pub(crate) fn check_names(tests: &[TestInfo], file: FileId, diagnostics: &mut Vec<Diagnostic>) {
    // The first test of each name, by name: a scan of those before each
    // test was quadratic in a file's tests.
    let mut firsts: HashMap<&str, &TestInfo> = HashMap::with_capacity(tests.len());
    for test in tests {
        if test.name.trim().is_empty() {
            diagnostics.push(
                Diagnostic::new(Code::DuplicateTest, file, test.name_span, "the test's name is empty")
                    .label("no name")
                    .hint("name the test for what it shows, e.g. `test \"a refund over the limit is rejected\"`"),
            );
            continue;
        }
        let first = *firsts.entry(test.name.as_str()).or_insert(test);
        if !std::ptr::eq(first, test) {
            diagnostics.push(
                Diagnostic::new(
                    Code::DuplicateTest,
                    file,
                    test.name_span,
                    format!("a second test named \"{}\"", test.name),
                )
                .label("this name is taken")
                .secondary(file, first.name_span, "the first test of this name")
                .hint("name each test of a file for what it shows"),
            );
        }
    }
}

/// A `decide` of the approval `id` as a test would write it, by its first
/// approver when the workflow names them.
fn decide_example(id: &str, kind: &StepKind) -> String {
    let by = match kind {
        StepKind::Approval {
            approvers: Some(approvers),
            ..
        } => approvers.first().map(|a| a.as_str()),
        _ => None,
    };
    format!("decide step.{id} approve by \"{}\"", by.unwrap_or("..."))
}

struct TestChecker<'a> {
    file: FileId,
    env: &'a Env,
    workflow: &'a WorkflowInfo,
    diagnostics: &'a mut Vec<Diagnostic>,
}

impl<'a> TestChecker<'a> {
    fn input(&mut self, decl: &TestDecl) {
        let expected = Ty::Record(self.workflow.input.clone());
        match &decl.input {
            Some(input) => {
                let expr = Expr {
                    kind: ExprKind::Record(input.clone()),
                    span: input.span,
                };
                self.literal(&expr, &expected, "the workflow's input");
            }
            None if !self.workflow.input.is_empty() => missing_member(
                decl.recovered,
                self.diagnostics,
                self.file,
                decl.name.span,
                "the test",
                "input",
                "input { ... }",
            ),
            None => {}
        }
    }

    /// `decide step.ID ...` of an approval: a gate let expire must have an
    /// `expires`, and each decision is made by one of its approvers, when
    /// the workflow writes them out (the run refuses anyone else's).
    fn decide(&mut self, decide: &Decide, step: &StepInfo) {
        let StepKind::Approval { expires, approvers } = &step.kind else {
            return;
        };
        if decide.decisions.contains(&Decision::Expire) && !expires {
            self.diagnostics.push(
                Diagnostic::new(
                    Code::NeverExpires,
                    self.file,
                    decide.step.span,
                    format!(
                        "approval `{}` has no `expires`, so it never expires",
                        decide.step.text
                    ),
                )
                .label("this gate waits until someone decides")
                .secondary(self.workflow.file, step.span, "no `expires` here")
                .hint(format!(
                    "decide it (`{}`), or give the gate an `expires: 48h`",
                    decide_example(&decide.step.text, &step.kind)
                )),
            );
        }
        let Some(approvers) = approvers else { return };
        for decision in &decide.decisions {
            let Decision::Decided { by, .. } = decision else {
                continue;
            };
            let Some(who) = by.as_plain() else { continue };
            // As the runtime compares them: addresses without regard to
            // case. A person the gate does not name decides as a member of
            // its groups, if it has any (a test knows no group's members).
            if approvers.iter().any(|a| a.eq_ignore_ascii_case(who))
                || (who.contains('@') && approvers.iter().any(|a| !a.contains('@')))
            {
                continue;
            }
            let listed: Vec<String> = approvers.iter().map(|a| format!("\"{a}\"")).collect();
            let mut diagnostic = Diagnostic::new(
                Code::NotAnApprover,
                self.file,
                by.span,
                format!("\"{who}\" is not an approver of `{}`", decide.step.text),
            )
            .label("the run refuses this decision")
            .secondary(
                self.workflow.file,
                step.span,
                "its approvers are written here",
            )
            .hint(format!(
                "its approvers are {}",
                shown_list(listed.into_iter())
            ));
            if let Some(best) = did_you_mean(who, approvers.iter().map(|a| a.as_str())) {
                diagnostic = diagnostic.fix(format!("\"{best}\""));
            }
            self.diagnostics.push(diagnostic);
        }
    }

    fn mock(&mut self, mock: &Mock, all: &[Mock]) {
        let expected = match &mock.target {
            MockTarget::Step(name) => {
                let Some(step) = self.step(name) else { return };
                if !self.kind_allows(name, step, "mock", StepKind::is_mockable) {
                    return;
                }
                if let Some(owner) = never_failing_owner(step, all, self.workflow) {
                    self.diagnostics.push(
                        Diagnostic::new(
                            Code::UnusedMock,
                            self.file,
                            name.span,
                            format!(
                                "`{}` runs only when `{owner}` fails, which this test never lets happen",
                                name.text
                            ),
                        )
                        .label("this step never runs in this test")
                        .hint(format!(
                            "make `{owner}` fail first, as `mock step.{owner} fails 500 3 times`, or drop this mock"
                        )),
                    );
                }
                // A tool's answer is JSON of any shape: it cannot fail to
                // fit, as a model's answer can.
                if let StepKind::Browser(_) = &step.kind {
                    for answer in &mock.answers {
                        if let MockAnswer::Fails {
                            failure: Failure::InvalidOutput,
                            span,
                            ..
                        } = answer
                        {
                            self.diagnostics.push(
                                Diagnostic::new(
                                    Code::TestStepKind,
                                    self.file,
                                    *span,
                                    format!(
                                        "`{}` is a browser step, whose answer is any JSON: it is never invalid output",
                                        name.text
                                    ),
                                )
                                .label("a model's failure")
                                .hint("a tool fails with an HTTP status, `timeout` or `connection`"),
                            );
                        }
                    }
                }
                match &step.kind {
                    StepKind::Recipe(recipe) => self.recipe_output(recipe),
                    _ => Ty::Json,
                }
            }
            MockTarget::Recipe(name) => {
                if !self.env.recipes.contains_key(name.text.as_str()) {
                    let mut diagnostic = Diagnostic::new(
                        Code::UnknownRecipe,
                        self.file,
                        name.span,
                        format!("unknown recipe `{}`", name.text),
                    )
                    .label("no recipe has this name");
                    if let Some(best) = did_you_mean_within(
                        &name.text,
                        self.env.recipes.keys().map(String::as_str),
                        &self.env.suggestions,
                    ) {
                        diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                    }
                    self.diagnostics.push(diagnostic);
                    return;
                }
                let callers = || {
                    self.workflow
                        .steps
                        .iter()
                        .filter(|s| matches!(&s.kind, StepKind::Recipe(r) if *r == name.text))
                };
                // A step's own mock answers before its recipe's (as
                // `flowc test` runs them): with every caller mocked by
                // step, this one answers nothing.
                let mocked_by_step: HashSet<&str> = all
                    .iter()
                    .filter_map(|m| match &m.target {
                        MockTarget::Step(step) => Some(step.text.as_str()),
                        MockTarget::Recipe(_) => None,
                    })
                    .collect();
                if callers().next().is_some()
                    && callers().all(|s| mocked_by_step.contains(s.id.as_str()))
                {
                    let ids: Vec<String> = callers().map(|s| format!("`{}`", s.id)).collect();
                    self.diagnostics.push(
                        Diagnostic::new(
                            Code::UnusedMock,
                            self.file,
                            name.span,
                            format!(
                                "every step of recipe `{}` has a mock of its own, which answers first",
                                name.text
                            ),
                        )
                        .label("no call uses this mock")
                        .hint(format!(
                            "drop this mock, or the step mocks of {}",
                            crate::suggest::shown_list(ids.into_iter())
                        )),
                    );
                } else if callers().next().is_none() {
                    self.diagnostics.push(
                        Diagnostic::new(
                            Code::UnusedMock,
                            self.file,
                            name.span,
                            format!(
                                "workflow `{}` calls no step of recipe `{}`",
                                self.workflow.name, name.text
                            ),
                        )
                        .label("no call uses this mock"),
                    );
                }
                self.recipe_output(&name.text)
            }
        };
        let what = format!("the answer of `{}`", mock.target.name().text);
        for answer in &mock.answers {
            if let MockAnswer::Value(value) = answer {
                self.literal(value, &expected, &what);
            }
        }
    }

    /// `expect ran step.x with { ... }`: each field one of the step's
    /// arguments, each value a literal of its type.
    fn ran_with(&mut self, name: &Name, kind: &StepKind, with: &RecordLit) {
        let text = Ty::String;
        // A recipe's inputs keep an index of their names, which a call's
        // arguments are each found through.
        let fields = |list: Vec<(String, Ty)>| Arc::new(Fields::new(list));
        // A handoff's and a KB write's arguments are typed as in a step,
        // with the department or collection the step names.
        let with_target = |target: &str, params: Vec<(String, Ty)>| {
            let mut list = vec![(target.to_string(), text.clone())];
            list.extend(params);
            fields(list)
        };
        let arguments: Arc<Fields> = match kind {
            StepKind::Handoff => {
                with_target("department", crate::check::workflow::handoff_params())
            }
            StepKind::KbWrite => {
                with_target("collection", crate::check::workflow::kb_write_params())
            }
            StepKind::Recipe(recipe) => self
                .env
                .recipes
                .get(recipe.as_str())
                .map_or_else(|| fields(Vec::new()), |info| Arc::clone(&info.input)),
            StepKind::Approval { .. } => {
                self.diagnostics.push(
                    Diagnostic::new(
                        Code::TestStepKind,
                        self.file,
                        with.span,
                        format!("`{}` is an approval, which has no arguments to compare", name.text),
                    )
                    .label("nothing to compare")
                    .hint("expect what its decision led to: `expect output.FIELD == value`, or `expect ran step.NEXT`"),
                );
                return;
            }
            // A tool's arguments are its server's business.
            _ => {
                for field in &with.fields {
                    self.literal(&field.value, &Ty::Json, "the argument");
                }
                return;
            }
        };
        for field in &with.fields {
            match arguments.get(&field.name.text) {
                Some((_, ty)) => {
                    let what = format!("argument `{}`", field.name.text);
                    // As the argument is typed: `null` only for an optional one.
                    self.literal(&field.value, &numbers_compared(ty, &field.value), &what);
                }
                None => {
                    let names = arguments.iter().map(|(n, _)| n.as_str());
                    let mut diagnostic = Diagnostic::new(
                        Code::BadExpectation,
                        self.file,
                        field.name.span,
                        format!("step `{}` has no argument `{}`", name.text, field.name.text),
                    )
                    .label("not an argument of the step");
                    if let Some(best) =
                        did_you_mean_within(&field.name.text, names.clone(), &self.env.suggestions)
                    {
                        diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                    } else {
                        diagnostic = hint_listing(
                            diagnostic,
                            "its arguments are",
                            names,
                            &self.env.suggestions,
                        );
                    }
                    self.diagnostics.push(diagnostic);
                }
            }
        }
    }

    fn recipe_output(&self, recipe: &str) -> Ty {
        self.env
            .recipes
            .get(recipe)
            .map_or(Ty::Any, |info| info.output.clone())
    }

    /// An `expect output` beside an `expect status` that ends the run with
    /// none (parked, failed) cannot hold, whatever the run does.
    fn output_beside_status(&mut self, expects: &[Expect]) {
        let Some(status) = expects.iter().find_map(|expect| match &expect.kind {
            ExpectKind::Status(status) if matches!(status.text.as_str(), "parked" | "failed") => {
                Some(status)
            }
            _ => None,
        }) else {
            return;
        };
        for expect in expects {
            // A field of a workflow without output is told once, by `output`.
            if let ExpectKind::Output { path, .. } = &expect.kind
                && (self.workflow.output.is_some() || path.segments.is_empty())
            {
                self.diagnostics.push(
                    Diagnostic::new(
                        Code::BadExpectation,
                        self.file,
                        expect.span,
                        format!("a run that ends {} has no output", status.text),
                    )
                    .label("cannot hold")
                    .secondary(self.file, status.span, "the run is expected to end so here")
                    .hint("expect what the run did instead (`expect ran step.x with { ... }`), or drop one of the two"),
                );
            }
        }
    }

    fn expect(&mut self, expect: &Expect) {
        match &expect.kind {
            ExpectKind::Status(status) => {
                if !STATUSES.contains(&status.text.as_str()) {
                    let mut diagnostic = Diagnostic::new(
                        Code::BadExpectation,
                        self.file,
                        status.span,
                        format!("`{}` is not a status a run ends in", status.text),
                    )
                    .label("unknown status")
                    .hint(format!(
                        "a run ends {}",
                        candidates_list(STATUSES.iter().copied())
                    ));
                    if let Some(best) = did_you_mean(&status.text, STATUSES.iter().copied()) {
                        diagnostic = diagnostic.fix(best);
                    }
                    self.diagnostics.push(diagnostic);
                }
            }
            ExpectKind::Ran {
                step: name, with, ..
            } => {
                if let Some(step) = self.step(name)
                    && self.kind_allows(name, step, "ran", |k| k.is_step())
                    && let Some(with) = with
                {
                    self.ran_with(name, &step.kind, with);
                }
            }
            ExpectKind::Attempts {
                step: name,
                count,
                count_span,
            } => {
                if let Some(step) = self.step(name) {
                    self.kind_allows(name, step, "attempts", |k| {
                        !matches!(
                            k,
                            StepKind::Loop | StepKind::Parallel | StepKind::Approval { .. }
                        )
                    });
                }
                if *count < 1 {
                    self.diagnostics.push(
                        Diagnostic::new(
                            Code::BadExpectation,
                            self.file,
                            *count_span,
                            "a step that ran made at least one attempt",
                        )
                        .label("never true")
                        .hint("to say that the step did not run, write `expect not ran step.ID`"),
                    );
                }
            }
            ExpectKind::Output { path, op, value } => self.output(path, *op, value),
            ExpectKind::Other(expr) => {
                let mut diagnostic = Diagnostic::new(
                    Code::BadExpectation,
                    self.file,
                    expr.span,
                    "this expectation cannot be tested",
                )
                .label("not an expectation")
                .hint("expect `status completed`, `ran step.ID`, `not ran step.ID`, `attempts step.ID == N`, or `output.FIELD == value`");
                // `expect status == completed`: the status is a word, not a
                // value to compare.
                if let ExprKind::Binary(_, left, right) = &expr.kind
                    && let (ExprKind::Path(status), ExprKind::Path(word)) =
                        (&left.kind, &right.kind)
                    && status.root.text == "status"
                    && status.segments.is_empty()
                    && word.segments.is_empty()
                {
                    let meant = format!("status {}", word.root.text);
                    diagnostic = diagnostic.hint(format!("write `{meant}`")).fix(meant);
                }
                if let ExprKind::Binary(_, left, _) = &expr.kind
                    && let ExprKind::Path(path) = &left.kind
                    && path.root.text == "step"
                {
                    diagnostic = diagnostic.hint(
                        "a test sees what the run produced: the workflow's `output`, which steps ran, and their attempts",
                    );
                }
                self.diagnostics.push(diagnostic);
            }
        }
    }

    /// `expect output.a.b OP value`: the path along the workflow's output
    /// type, then the value against the type found.
    fn output(&mut self, path: &Path, op: BinaryOp, value: &Expr) {
        // Without `output`, a run's output is the empty record (an audit:
        // `expect output == {}` was refused); a field of it is nothing.
        let declared = match &self.workflow.output {
            None if path.segments.is_empty() => Some(Ty::record(Vec::new())),
            declared => declared.clone(),
        };
        let Some(ty) = declared else {
            self.diagnostics.push(
                Diagnostic::new(
                    Code::BadExpectation,
                    self.file,
                    path.span(),
                    format!("workflow `{}` has no output", self.workflow.name),
                )
                .label("nothing to compare")
                .hint("give the workflow an `output { ... }`, or expect its status and steps"),
            );
            return;
        };
        let ty = test_path_ty(ty, &path.segments, self.file, self.env, self.diagnostics);
        match op {
            BinaryOp::Eq | BinaryOp::Ne => {
                // Compared, not given: `int` and `float` compare as numbers.
                let ty = numbers_compared(&ty, value);
                let expected = if matches!(value.kind, ExprKind::Null) {
                    ty.optional()
                } else {
                    ty
                };
                self.literal(value, &expected, "the expected output");
            }
            _ => {
                if !ty.is_numeric() && !ty.is_unchecked() {
                    self.diagnostics.push(
                        Diagnostic::new(
                            Code::BadExpectation,
                            self.file,
                            path.span(),
                            format!(
                                "`{}` compares numbers; this is `{}`",
                                op.symbol(),
                                self.env.show(&ty)
                            ),
                        )
                        .label("not a number"),
                    );
                    return;
                }
                self.literal(value, &Ty::Float, "the expected output");
            }
        }
    }

    /// Checks a value the test writes: a literal, of the expected type.
    fn literal(&mut self, expr: &Expr, expected: &Ty, what: &str) {
        if let Some(span) = reference_in(expr) {
            self.diagnostics.push(
                Diagnostic::new(
                    Code::BadExpectation,
                    self.file,
                    span,
                    "a test's values are literals",
                )
                .label("a reference")
                .hint("write the value itself: a test states what goes in and what must come out"),
            );
            return;
        }
        check_test_value(expr, expected, what, self.file, self.env, self.diagnostics);
    }

    /// The step `name` of the workflow, or an E101 with a suggestion.
    fn step(&mut self, name: &Name) -> Option<&'a StepInfo> {
        let workflow = self.workflow;
        if let Some((_, step)) = workflow.step(&name.text) {
            return Some(step);
        }
        let ids = workflow.steps.iter().map(|s| s.id.as_str());
        let mut diagnostic = Diagnostic::new(
            Code::UnknownStep,
            self.file,
            name.span,
            format!("workflow `{}` has no step `{}`", workflow.name, name.text),
        )
        .label("no step has this id");
        if let Some(best) = did_you_mean_within(&name.text, ids.clone(), &self.env.suggestions) {
            diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
        } else if workflow.steps.is_empty() {
            diagnostic = diagnostic.hint("the workflow has no steps");
        } else {
            diagnostic = hint_listing(diagnostic, "its steps are", ids, &self.env.suggestions);
        }
        self.diagnostics.push(diagnostic);
        None
    }

    /// Whether `what` (`mock`, `decide`, `ran`, `attempts`) fits the kind
    /// of `step`; an E402 saying what does when it does not.
    fn kind_allows(
        &mut self,
        name: &Name,
        step: &StepInfo,
        what: &str,
        allowed: impl Fn(&StepKind) -> bool,
    ) -> bool {
        if allowed(&step.kind) {
            return true;
        }
        let kind = match &step.kind {
            StepKind::Recipe(_) => "a recipe step",
            StepKind::Approval { .. } => "an approval",
            StepKind::KbWrite => "a kb_write step",
            StepKind::Handoff => "a handoff step",
            StepKind::Browser(_) => "a browser step",
            StepKind::Loop => "a loop",
            StepKind::Parallel => "a parallel block",
            StepKind::Unknown => "a step",
        };
        let hint = match (what, &step.kind) {
            ("mock", StepKind::Approval { .. }) => {
                format!("decide it: `{}`", decide_example(&name.text, &step.kind))
            }
            ("mock", _) => "only recipe and browser steps call something a test can answer for; this step's effect is kept in memory".to_string(),
            ("decide", _) => "only an approval is decided".to_string(),
            (_, StepKind::Approval { .. }) => format!(
                "an approval is decided, not attempted: expect `ran step.{}` or the output its decision leads to",
                name.text
            ),
            _ => "name a step inside it".to_string(),
        };
        self.diagnostics.push(
            Diagnostic::new(
                Code::TestStepKind,
                self.file,
                name.span,
                format!(
                    "`{what}` does not apply to `{}`, which is {kind}",
                    name.text
                ),
            )
            .label(kind)
            .hint(hint),
        );
        false
    }
}

/// The step whose fallback holds `step`, when the test mocks that step and
/// none of its answers fails: then the fallback, and `step` in it, never
/// run. A step the test does not mock is not judged, since what it does is
/// not the test's to say.
fn never_failing_owner<'s>(
    step: &'s StepInfo,
    mocks: &[Mock],
    workflow: &WorkflowInfo,
) -> Option<&'s str> {
    step.containers.iter().rev().find_map(|container| {
        let Container::Fallback { step: owner, .. } = container else {
            return None;
        };
        let recipe = workflow.step(owner).and_then(|(_, s)| match &s.kind {
            StepKind::Recipe(recipe) => Some(recipe.as_str()),
            _ => None,
        });
        let answers: Vec<&MockAnswer> = mocks
            .iter()
            .filter(|mock| match &mock.target {
                MockTarget::Step(name) => name.text == *owner,
                MockTarget::Recipe(name) => Some(name.text.as_str()) == recipe,
            })
            .flat_map(|mock| &mock.answers)
            .collect();
        let fails = answers
            .iter()
            .any(|a| matches!(a, MockAnswer::Fails { .. }));
        (!answers.is_empty() && !fails).then_some(owner.as_str())
    })
}

/// The first reference in a value a test writes, where only literals go.
fn reference_in(expr: &Expr) -> Option<Span> {
    match &expr.kind {
        ExprKind::Path(_) => Some(expr.span),
        ExprKind::String(lit) => lit
            .template
            .parts
            .iter()
            .any(|part| matches!(part, TemplatePart::Ref(_)))
            .then_some(lit.span),
        ExprKind::List(items) => items.iter().find_map(reference_in),
        ExprKind::Record(record) => record.fields.iter().find_map(|f| reference_in(&f.value)),
        ExprKind::Not(inner) => reference_in(inner),
        ExprKind::Binary(_, left, right) => reference_in(left).or_else(|| reference_in(right)),
        ExprKind::Null
        | ExprKind::Bool(_)
        | ExprKind::Int(_)
        | ExprKind::Float(_)
        | ExprKind::Duration(_)
        | ExprKind::Error => None,
    }
}
