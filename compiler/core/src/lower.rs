//! Lowering: from a checked program to the plan the runtime executes.
//!
//! Lowering runs only on a program without errors, so every name resolves
//! here; a failed lookup would be a checker bug, and is reported as one.

use std::cell::OnceCell;
use std::collections::HashMap;

use flow_plan as plan;
use flow_plan::budget::{Budget, Folding, StepBudget};
use serde_json::Value;

use crate::check::{Checked, DEFAULT_ATTEMPTS, DEFAULT_STEP_TIMEOUT_MS, Ty, WorkflowInfo};
use crate::codes::Code;
use crate::diagnostic::{Diagnostic, FileId, LineIndex, Span};
use crate::syntax::ast::{self, ErrorPolicy, ExprKind, Segment, StepCall, Stmt, TemplatePart};

/// The default backoff range between attempts: `min(30 s, 2 s * 2^attempt + jitter)`.
const DEFAULT_BACKOFF_MS: (u64, u64) = (2_000, 30_000);

/// Lowers every workflow of the root file, with the recipes and MCP servers in
/// scope, and seals the plan. `None` when the program has errors.
pub fn lower(checked: &Checked) -> Option<plan::Plan> {
    checked.program()?;
    Some(unsealed(checked, None).seal())
}

/// [`lower`] for a driver done with the check (`check_and_lower`): each
/// workflow's statements are taken out of the syntax tree and dropped as
/// they are lowered, so the tree shrinks as the plan grows and a big
/// program is not held twice. The rest of `checked` (its files, analysis
/// and diagnostics) stays with the caller.
pub(crate) fn lower_taking(checked: &mut Checked) -> Option<plan::Plan> {
    checked.program()?;
    let bodies = checked.files[0]
        .tree
        .items
        .iter_mut()
        .filter_map(|item| match item {
            ast::Item::Workflow(workflow) => Some(std::mem::take(&mut workflow.body)),
            _ => None,
        })
        .collect();
    Some(unsealed(checked, Some(bodies)).seal())
}

/// The plan's bound on its JSON, if the schemas the plan of `checked` would
/// hold come past it: measured from the types before any is written, at the
/// recipe or workflow whose schemas pass it. A schema is written out in full
/// wherever its type appears: 2,000 recipes each answering `{ x: Big }`, of
/// a 30,000-field `Big`, made an 800 KB source lower to a plan of gigabytes
/// (killed for want of memory after 24 GB); a type's field docs, written
/// into each recipe's output that names it, as much again. The measure is
/// exact but for escapes, which only add: a plan it lets through may still
/// be past the bound, and is refused once written, as before.
pub(crate) fn past_plan_bytes(checked: &Checked, most: u64) -> Option<plan::PlanProblems> {
    use crate::check::SchemaBytes;
    let env = &checked.analysis.env;
    let mut bytes = SchemaBytes::default();
    let mut total: u64 = 0;
    let past = |path: String| plan::PlanProblems {
        problems: vec![plan::PlanProblem {
            path,
            message: plan::limits::past_plan_bytes(most),
            step: None,
        }],
        stopped: false,
    };
    let aliases = alias_types(checked);
    let mut described = Descriptions {
        aliases: &aliases,
        of_alias: HashMap::new(),
        json_alias: HashMap::new(),
    };
    for (index, name) in sorted_names(&env.recipes).into_iter().enumerate() {
        let info = &env.recipes[name];
        let descriptions = info
            .decl
            .output
            .as_ref()
            .map_or(0, |written| described.bytes(written, 0));
        total = total
            .saturating_add(bytes.record(&info.input))
            .saturating_add(bytes.of(&info.output))
            .saturating_add(descriptions);
        if total > most {
            return Some(past(format!("/recipes/{index}")));
        }
    }
    for (index, info) in checked.analysis.workflows.iter().enumerate() {
        total = total.saturating_add(bytes.record(&info.input));
        if total > most {
            return Some(past(format!("/workflows/{index}/input_schema")));
        }
    }
    None
}

/// Each workflow's budget, in the order of the root file's workflows, and
/// whether the plan is within the limits of plans: lowered node by node,
/// each node folded into its budget (`budget::Folding`) and held to the
/// limits (`PlanInPieces`), then dropped, so that neither ever holds a
/// whole plan. `None` when the program has errors.
pub(crate) fn budgets_and_limits(
    checked: &Checked,
) -> Option<(Vec<Budget>, Result<(), plan::PlanProblems>)> {
    checked.program()?;
    if let Some(problems) = past_plan_bytes(checked, plan::limits::MAX_PLAN_BYTES) {
        return Some((Vec::new(), Err(problems)));
    }
    let env = &checked.analysis.env;
    let (recipe_names, recipe_index) = sorted_with_index(&env.recipes);
    let (server_names, server_index) = sorted_with_index(&env.mcp_servers);
    let lines = line_indexes(checked);
    let mut pieces = plan::PlanInPieces::new(
        &checked.files[0].path,
        &recipes(checked, &recipe_names),
        &servers(checked, &server_names),
        checked.files[0].tree.workflows().count(),
    );
    let budgets = workflows(checked, &recipe_index, &server_index, &lines)
        .enumerate()
        .map(|(index, (decl, mut lowerer))| {
            let header = lowerer.header(decl);
            pieces.workflow(index, &header, lowerer.info.steps.len());
            let mut folding = Folding::slowest(crate::budget::SLOWEST_NAMED);
            for (index, stmt) in decl.body.iter().enumerate() {
                let node = lowerer.stmt(stmt);
                pieces.node(index, &node);
                folding.node(&node);
            }
            let policy = lowerer.policy(decl.on_error.as_ref());
            pieces.on_error(&policy);
            pieces.workflow_end(&header);
            folding.finish(&policy)
        })
        .collect();
    Some((budgets, pieces.finish()))
}

/// The worst case of one step of the root file's `workflow`-th workflow,
/// lowered on its own: the budgets keep only the slowest steps', and the
/// editor asks for any one. `None` when the program has errors.
pub(crate) fn step_budget(
    checked: &Checked,
    workflow: usize,
    step: &ast::Step,
) -> Option<StepBudget> {
    checked.program()?;
    let env = &checked.analysis.env;
    let (_, recipe_index) = sorted_with_index(&env.recipes);
    let (_, server_index) = sorted_with_index(&env.mcp_servers);
    let lines = line_indexes(checked);
    let (_, mut lowerer) =
        workflows(checked, &recipe_index, &server_index, &lines).nth(workflow)?;
    Some(StepBudget::of(&lowerer.step(step)))
}

/// E212 for the problems `Plan::validate` (or `PlanInPieces`) found in
/// the plan of `checked`: one for each workflow, recipe and MCP server
/// with any, at the step the first of them is in, else at the condition,
/// else at the declaration's name (a count past its limit at the first
/// declaration past it), else at the top of the root file. Both walks find
/// the same problems in the same order, so `check` and `check_and_lower`
/// give the same diagnostics.
pub(crate) fn past_plan_limits(
    checked: &Checked,
    problems: &plan::PlanProblems,
) -> Vec<Diagnostic> {
    // By what the plan holds them in (a list and an index into it), in
    // document order.
    type Owner = Option<(&'static str, usize)>;
    let mut by_owner: Vec<(Owner, Vec<&plan::PlanProblem>)> = Vec::new();
    for problem in &problems.problems {
        let owner = [
            ("workflows", plan::limits::MAX_WORKFLOWS),
            ("recipes", plan::limits::MAX_RECIPES),
            ("mcp_servers", plan::limits::MAX_MCP_SERVERS),
        ]
        .into_iter()
        .find_map(|(list, most)| {
            // Too many of them: shown at the first past the limit.
            if problem.path.strip_prefix('/') == Some(list) {
                return Some((list, most));
            }
            Some((list, index_after(&problem.path, &format!("/{list}/"))?))
        });
        match by_owner.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, found)) => found.push(problem),
            None => by_owner.push((owner, vec![problem])),
        }
    }
    let lines = line_indexes(checked);
    by_owner
        .into_iter()
        .map(|(owner, found)| {
            let first = found[0];
            let (file, span) = owner
                .and_then(|(list, index)| plan_place(checked, &lines, list, index, first))
                .unwrap_or((FileId(0), Span::new(0, 0)));
            let more = match found.len() - 1 {
                0 => String::new(),
                n => format!(", and {n} more past a limit there"),
            };
            Diagnostic::new(Code::PastPlanLimit, file, span, first.message.clone())
                .label("past a limit of plans")
                .hint(format!(
                    "`flow run` and flowd would refuse its plan (at {}{more}); keep it within the limit",
                    first.path
                ))
        })
        .collect()
}

/// Where in the source the `index`-th entry of the plan's `list` is, for
/// `problem` in it: the step or condition of the problem in a workflow,
/// else the declaration's name.
fn plan_place(
    checked: &Checked,
    lines: &[OnceCell<LineIndex>],
    list: &str,
    index: usize,
    problem: &plan::PlanProblem,
) -> Option<(FileId, Span)> {
    let env = &checked.analysis.env;
    match list {
        "recipes" => {
            let info = &env.recipes[*sorted_names(&env.recipes).get(index)?];
            Some((info.file, info.decl.name.span))
        }
        "mcp_servers" => {
            let info = &env.mcp_servers[*sorted_names(&env.mcp_servers).get(index)?];
            Some((info.file, info.decl.name.span))
        }
        _ => {
            let info = checked.analysis.workflows.get(index)?;
            let at_step = |id: &str| Some((info.file, info.step(id)?.1.id_span));
            // A condition's id is where its `if` is: `if@LINE:COLUMN`.
            let at_condition = |id: &str| {
                let (line, column) = id.strip_prefix("if@")?.split_once(':')?;
                let text = &checked.file(info.file).text;
                let lines = lines[info.file.0 as usize].get_or_init(|| LineIndex::new(text));
                let offset = lines.offset(text, line.parse().ok()?, column.parse().ok()?)?;
                Some((info.file, Span::new(offset as usize, offset as usize + 2)))
            };
            let at_name = || {
                let decl = checked.files.first()?.tree.workflows().nth(index)?;
                Some((FileId(0), decl.name.span))
            };
            problem
                .step
                .as_deref()
                .and_then(|id| at_step(id).or_else(|| at_condition(id)))
                .or_else(at_name)
        }
    }
}

/// The number that follows `prefix` at the start of a JSON Pointer.
fn index_after(path: &str, prefix: &str) -> Option<usize> {
    let rest = path.strip_prefix(prefix)?;
    rest.split('/').next()?.parse().ok()
}

/// The plan of a program without errors, its hash left empty. `bodies`,
/// when given, holds each workflow's statements taken out of the tree.
fn unsealed(checked: &Checked, bodies: Option<Vec<Vec<Stmt>>>) -> plan::Plan {
    let env = &checked.analysis.env;
    let (recipe_names, recipe_index) = sorted_with_index(&env.recipes);
    let (server_names, server_index) = sorted_with_index(&env.mcp_servers);
    let lines = line_indexes(checked);
    let recipes = recipes(checked, &recipe_names);
    let mcp_servers = servers(checked, &server_names);

    let mut bodies = bodies.map(Vec::into_iter);
    let workflows = workflows(checked, &recipe_index, &server_index, &lines)
        .map(|(decl, lowerer)| {
            let body = match bodies.as_mut().and_then(Iterator::next) {
                Some(owned) => Body::Owned(owned),
                None => Body::Borrowed(&decl.body),
            };
            lowerer.workflow(decl, body)
        })
        .collect();

    plan::Plan {
        format_version: plan::FORMAT_VERSION,
        hash: String::new(),
        source: checked.files[0].path.clone(),
        workflows,
        recipes,
        mcp_servers,
    }
}

/// The recipes of `names` (the plan's order).
fn recipes(checked: &Checked, names: &[&String]) -> Vec<plan::Recipe> {
    let env = &checked.analysis.env;
    let aliases = alias_types(checked);
    names
        .iter()
        .map(|name| {
            let info = &env.recipes[*name];
            let input_fields: Vec<String> = info.input.iter().map(|(n, _)| n.clone()).collect();
            let prompt = info
                .decl
                .prompt
                .as_ref()
                .map(|prompt| recipe_template(prompt, &input_fields))
                .unwrap_or_default();
            plan::Recipe {
                name: (*name).clone(),
                model: info
                    .decl
                    .model
                    .as_ref()
                    .map(ast::StringLit::display_text)
                    .unwrap_or_default(),
                input_schema: Ty::Record(info.input.clone()).json_schema(),
                output_schema: described_schema(&info.output, info.decl.output.as_ref(), &aliases),
                input_fields,
                prompt,
                context: info
                    .decl
                    .context
                    .iter()
                    .map(ast::StringLit::display_text)
                    .collect(),
            }
        })
        .collect()
}

/// The MCP servers of `names` (the plan's order).
fn servers(checked: &Checked, names: &[&String]) -> Vec<plan::McpServer> {
    let servers = &checked.analysis.env.mcp_servers;
    names
        .iter()
        .map(|name| plan::McpServer {
            name: (*name).clone(),
            transport: servers[*name].transport.clone(),
        })
        .collect()
}

/// A line index for each file of `checked`, made the first time a lowerer
/// needs one (for a condition's `if@LINE:COLUMN`). One per file, not per
/// workflow: a file of 20,000 workflows indexed its 1.5 MB for each, and
/// took 43 s to check in a debug build.
fn line_indexes(checked: &Checked) -> Vec<OnceCell<LineIndex>> {
    checked.files.iter().map(|_| OnceCell::new()).collect()
}

/// The root file's workflows, each with a lowerer of its own.
fn workflows<'a>(
    checked: &'a Checked,
    recipe_index: &'a HashMap<&'a str, u32>,
    server_index: &'a HashMap<&'a str, u32>,
    lines: &'a [OnceCell<LineIndex>],
) -> impl Iterator<Item = (&'a ast::Workflow, Lowerer<'a>)> {
    checked.files[0]
        .tree
        .workflows()
        .zip(&checked.analysis.workflows)
        .map(move |(decl, info)| {
            let lowerer = Lowerer {
                info,
                text: &checked.file(info.file).text,
                lines: &lines[info.file.0 as usize],
                recipe_index,
                server_index,
                loops: Vec::new(),
            };
            (decl, lowerer)
        })
}

/// A workflow's top-level statements as lowering reads them: borrowed from
/// the tree, or taken out of it, each dropped once lowered.
enum Body<'t> {
    Borrowed(&'t [Stmt]),
    Owned(Vec<Stmt>),
}

/// The names of a declaration table in a stable order (the plan's indices) and
/// each name's index; plans must not depend on hash map order.
/// The type each alias of the program stands for, as written.
fn alias_types(checked: &Checked) -> HashMap<&str, &ast::TypeExpr> {
    let mut aliases = HashMap::new();
    for file in &checked.files {
        for item in &file.tree.items {
            if let ast::Item::Type(decl) = item {
                aliases.entry(decl.name.text.as_str()).or_insert(&decl.ty);
            }
        }
    }
    aliases
}

/// The schema of `ty` with each record field's `///` doc as its
/// `description`: what a model reads of what a field means ("1 (can wait a
/// week) to 5"), and what the offline provider keeps its answers within.
/// `written` is the type as the source spells it, aliases followed.
fn described_schema(
    ty: &Ty,
    written: Option<&ast::TypeExpr>,
    aliases: &HashMap<&str, &ast::TypeExpr>,
) -> Value {
    let mut schema = ty.json_schema();
    if let Some(written) = written {
        describe(&mut schema, written, aliases, 0);
    }
    schema
}

fn describe(
    schema: &mut Value,
    written: &ast::TypeExpr,
    aliases: &HashMap<&str, &ast::TypeExpr>,
    depth: usize,
) {
    // Aliases cannot refer to themselves (the checker refuses cycles); the
    // bound keeps this walk within the schema's own even so.
    if depth > plan::limits::MAX_SCHEMA_DEPTH {
        return;
    }
    match &written.kind {
        ast::TypeExprKind::Record(fields) => {
            for field in fields {
                let Some(property) = schema
                    .get_mut("properties")
                    .and_then(|properties| properties.get_mut(field.name.text.as_str()))
                else {
                    continue;
                };
                // `{}` (json) stays empty: it means "anything" to every
                // reader of schemas, a description beside it would not.
                if !field.docs.is_empty()
                    && let Value::Object(map) = property
                    && !map.is_empty()
                {
                    map.insert(
                        "description".to_string(),
                        Value::String(description(&field.docs)),
                    );
                }
                describe(property, &field.ty, aliases, depth + 1);
            }
        }
        ast::TypeExprKind::List(item) => {
            if let Some(items) = schema.get_mut("items") {
                describe(items, item, aliases, depth + 1);
            }
        }
        // `T??` is one optional (the checker warns of the second `?`).
        ast::TypeExprKind::Optional(inner)
            if matches!(inner.kind, ast::TypeExprKind::Optional(_)) =>
        {
            describe(schema, inner, aliases, depth + 1);
        }
        ast::TypeExprKind::Optional(inner) => {
            if let Some(inner_schema) = schema.pointer_mut("/anyOf/0") {
                describe(inner_schema, inner, aliases, depth + 1);
            }
        }
        ast::TypeExprKind::Named(name) => {
            if let Some(aliased) = aliases.get(name.text.as_str()) {
                describe(schema, aliased, aliases, depth + 1);
            }
        }
        ast::TypeExprKind::Literal(_) | ast::TypeExprKind::Union(_) => {}
    }
}

/// The bytes that [`describe`] adds to a schema (`,"description":"…"` for
/// each documented field whose schema is not `{}`), from the type as it is
/// written: each alias's once, however often it is named.
struct Descriptions<'a> {
    aliases: &'a HashMap<&'a str, &'a ast::TypeExpr>,
    of_alias: HashMap<&'a str, u64>,
    json_alias: HashMap<&'a str, bool>,
}

impl<'a> Descriptions<'a> {
    fn bytes(&mut self, written: &'a ast::TypeExpr, depth: usize) -> u64 {
        if depth > plan::limits::MAX_SCHEMA_DEPTH {
            return 0;
        }
        match &written.kind {
            ast::TypeExprKind::Record(fields) => fields.iter().fold(0u64, |bytes, field| {
                let own = match field.docs.is_empty() || self.is_json(&field.ty) {
                    true => 0,
                    false => 17 + description(&field.docs).len() as u64,
                };
                bytes
                    .saturating_add(own)
                    .saturating_add(self.bytes(&field.ty, depth + 1))
            }),
            ast::TypeExprKind::List(inner) | ast::TypeExprKind::Optional(inner) => {
                self.bytes(inner, depth + 1)
            }
            ast::TypeExprKind::Named(name) => {
                let name = name.text.as_str();
                if let Some(&known) = self.of_alias.get(name) {
                    return known;
                }
                let Some(&aliased) = self.aliases.get(name) else {
                    return 0;
                };
                let bytes = self.bytes(aliased, depth + 1);
                self.of_alias.insert(name, bytes);
                bytes
            }
            ast::TypeExprKind::Literal(_) | ast::TypeExprKind::Union(_) => 0,
        }
    }

    /// Whether `written` is `json` (its schema `{}`, which `describe` leaves
    /// without a description), through the aliases it names: each alias's
    /// answer is kept, so that a long chain of them is followed once.
    fn is_json(&mut self, mut written: &'a ast::TypeExpr) -> bool {
        let mut chain: Vec<&'a str> = Vec::new();
        let json = loop {
            let ast::TypeExprKind::Named(name) = &written.kind else {
                break false;
            };
            let name = name.text.as_str();
            if name == "json" {
                break true;
            }
            if let Some(&known) = self.json_alias.get(name) {
                break known;
            }
            // The checker refuses cycles; the bound holds even without it.
            match self.aliases.get(name) {
                Some(&aliased) if chain.len() <= self.aliases.len() => {
                    chain.push(name);
                    written = aliased;
                }
                _ => break false,
            }
        };
        for name in chain {
            self.json_alias.insert(name, json);
        }
        json
    }
}

/// A field's doc lines as one description, within the plan's bound.
fn description(docs: &[String]) -> String {
    let text = docs
        .iter()
        .map(|line| line.trim())
        .collect::<Vec<_>>()
        .join(" ");
    let mut end = text.len().min(plan::limits::MAX_DESCRIPTION_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].trim_end().to_string()
}

fn sorted_with_index<V>(table: &HashMap<String, V>) -> (Vec<&String>, HashMap<&str, u32>) {
    let names = sorted_names(table);
    let index = names
        .iter()
        .enumerate()
        .map(|(i, name)| (name.as_str(), i as u32))
        .collect();
    (names, index)
}

/// The names of a declaration table in the plan's order.
fn sorted_names<V>(table: &HashMap<String, V>) -> Vec<&String> {
    let mut names: Vec<&String> = table.keys().collect();
    names.sort();
    names
}

fn segments(path: &[Segment]) -> Vec<plan::PathSegment> {
    path.iter()
        .map(|segment| match segment {
            Segment::Field { name, .. } => plan::PathSegment::Field(name.text.to_string()),
            Segment::Index { index, .. } => plan::PathSegment::Index(*index),
        })
        .collect()
}

fn is_optional(path: &ast::Path) -> bool {
    path.segments
        .iter()
        .any(|s| matches!(s, Segment::Field { optional: true, .. }))
}

/// A recipe prompt: its references are `input.<field>` only.
fn recipe_template(lit: &ast::StringLit, input_fields: &[String]) -> plan::Template {
    let positions = crate::check::Positions::new(input_fields, String::as_str);
    let parts = lit
        .template
        .parts
        .iter()
        .map(|part| match part {
            TemplatePart::Text(text) => plan::TemplatePart::Text(text.to_string()),
            TemplatePart::Ref(path) => {
                let (field, rest) = match path.segments.split_first() {
                    Some((Segment::Field { name, .. }, rest)) => (name.text.as_str(), rest),
                    _ => ("", &path.segments[..]),
                };
                let index = positions.of(field).unwrap_or(0) as u32;
                plan::TemplatePart::Ref(plan::Ref {
                    root: plan::Root::RecipeInput(index),
                    path: segments(rest),
                    optional: is_optional(path),
                })
            }
        })
        .collect();
    plan::Template { parts }
}

struct Lowerer<'a> {
    info: &'a WorkflowInfo,
    text: &'a str,
    lines: &'a OnceCell<LineIndex>,
    recipe_index: &'a HashMap<&'a str, u32>,
    server_index: &'a HashMap<&'a str, u32>,
    /// Enclosing loop ids, outermost first; the index is the loop's level.
    loops: Vec<String>,
}

impl<'a> Lowerer<'a> {
    fn workflow(mut self, decl: &ast::Workflow, body: Body<'_>) -> plan::Workflow {
        let on_error = self.policy(decl.on_error.as_ref());
        let body = match body {
            Body::Borrowed(stmts) => self.block(stmts),
            Body::Owned(stmts) => stmts.into_iter().map(|stmt| self.stmt(&stmt)).collect(),
        };
        plan::Workflow {
            on_error,
            slots: self.slots(),
            body,
            ..self.header(decl)
        }
    }

    /// The workflow of `decl` without its slot table, body or fallback
    /// (it fails on errors): what it takes and gives.
    fn header(&mut self, decl: &ast::Workflow) -> plan::Workflow {
        let output = decl
            .output
            .iter()
            .flat_map(|record| &record.fields)
            .map(|field| plan::Field {
                name: field.name.text.to_string(),
                value: self.expr(&field.value, false),
            })
            .collect();
        plan::Workflow {
            name: decl.name.text.to_string(),
            input_fields: self.info.input.iter().map(|(n, _)| n.clone()).collect(),
            input_schema: Ty::Record(self.info.input.clone()).json_schema(),
            timeout_ms: self.info.timeout_ms,
            durability: match decl.durability.as_ref().map(|d| d.text.as_str()) {
                Some("approval") => plan::Durability::Approval,
                _ => plan::Durability::Full,
            },
            context: decl
                .context
                .iter()
                .map(ast::StringLit::display_text)
                .collect(),
            department: decl.department.as_ref().map(ast::StringLit::display_text),
            on_error: plan::OnError::Fail,
            destinations: decl
                .destinations
                .iter()
                .map(|destination| self.destination(destination))
                .collect(),
            slots: Vec::new(),
            body: Vec::new(),
            output,
        }
    }

    fn slots(&self) -> Vec<plan::Slot> {
        self.info
            .steps
            .iter()
            .map(|step| plan::Slot {
                id: step.id.to_string(),
                kind: match step.kind {
                    crate::check::StepKind::Recipe(_) => plan::StepKind::Recipe,
                    crate::check::StepKind::Approval { .. } => plan::StepKind::Approval,
                    crate::check::StepKind::KbWrite => plan::StepKind::KbWrite,
                    crate::check::StepKind::Handoff => plan::StepKind::Handoff,
                    crate::check::StepKind::Browser(_) => plan::StepKind::Browser,
                    crate::check::StepKind::Loop => plan::StepKind::Loop,
                    crate::check::StepKind::Parallel => plan::StepKind::Parallel,
                    crate::check::StepKind::Unknown => {
                        unreachable!("a program with a syntax error is not lowered")
                    }
                },
            })
            .collect()
    }

    fn destination(&mut self, destination: &ast::Destination) -> plan::Destination {
        let target = match &destination.target {
            ast::DestinationTarget::Webhook { endpoint } => plan::DestinationTarget::Webhook {
                endpoint: endpoint.display_text(),
            },
            ast::DestinationTarget::Email { to, subject, body } => plan::DestinationTarget::Email {
                to: to.iter().map(ast::StringLit::display_text).collect(),
                subject: self.template(subject, false),
                body: self.template(body, false),
            },
            ast::DestinationTarget::Kb {
                collection,
                title,
                content,
            } => plan::DestinationTarget::Kb {
                collection: collection.display_text(),
                title: self.template(title, false),
                content: self.expr(content, false),
            },
        };
        plan::Destination {
            events: destination
                .events
                .iter()
                .filter_map(|event| plan::RunEvent::parse(&event.text))
                .collect(),
            target,
        }
    }

    fn policy(&mut self, policy: Option<&ErrorPolicy>) -> plan::OnError {
        match policy {
            None | Some(ErrorPolicy::Fail(_)) => plan::OnError::Fail,
            Some(ErrorPolicy::Continue(_)) => plan::OnError::Continue,
            Some(ErrorPolicy::Fallback(block)) => plan::OnError::Fallback(self.block(&block.stmts)),
        }
    }

    fn slot(&self, id: &str) -> u32 {
        let (slot, _) = self.info.step(id).expect("the checker registered every id");
        slot as u32
    }

    fn block(&mut self, stmts: &[Stmt]) -> Vec<plan::Node> {
        stmts.iter().map(|stmt| self.stmt(stmt)).collect()
    }

    fn stmt(&mut self, stmt: &Stmt) -> plan::Node {
        match stmt {
            Stmt::Step(step) => plan::Node::Step(self.step(step)),
            Stmt::If(stmt) => {
                let lines = self.lines.get_or_init(|| LineIndex::new(self.text));
                let (line, column) = lines.line_col(self.text, stmt.span.start);
                plan::Node::Condition {
                    id: format!("if@{line}:{column}"),
                    branches: stmt
                        .branches
                        .iter()
                        .map(|(condition, block)| plan::ConditionBranch {
                            condition: self.expr(condition, false),
                            body: self.block(&block.stmts),
                        })
                        .collect(),
                    otherwise: stmt
                        .else_block
                        .as_ref()
                        .map(|block| self.block(&block.stmts)),
                }
            }
            Stmt::For(stmt) => {
                let collection = self.expr(&stmt.collection, false);
                let level = self.loops.len() as u32;
                self.loops.push(stmt.id.text.to_string());
                let body = self.block(&stmt.body.stmts);
                self.loops.pop();
                plan::Node::Loop {
                    slot: self.slot(&stmt.id.text),
                    id: stmt.id.text.to_string(),
                    collection,
                    concurrency: stmt.concurrency.map_or(1, |(n, _)| n.max(1) as u32),
                    max_items: stmt.max_items.map(|(n, _)| n.max(1) as u32),
                    level,
                    body,
                }
            }
            Stmt::Parallel(stmt) => plan::Node::Parallel {
                slot: self.slot(&stmt.id.text),
                id: stmt.id.text.to_string(),
                branches: stmt
                    .branches
                    .iter()
                    .map(|branch| plan::ParallelBranch {
                        name: branch.name.text.to_string(),
                        body: self.block(&branch.body.stmts),
                    })
                    .collect(),
            },
        }
    }

    fn step(&mut self, step: &ast::Step) -> plan::Step {
        let args = step.call.args();
        let arg = |this: &mut Self, name: &str| -> Option<plan::Expr> {
            args.fields
                .iter()
                .find(|f| f.name.text == name)
                .map(|f| this.expr(&f.value, false))
        };
        let literal = |name: &str| -> Option<String> {
            args.fields
                .iter()
                .find(|f| f.name.text == name)
                .and_then(|f| match &f.value.kind {
                    ExprKind::String(lit) => lit.as_plain().map(str::to_string),
                    _ => None,
                })
        };
        let action = match &step.call {
            StepCall::Recipe { recipe, .. } => plan::Action::Recipe {
                recipe: *self
                    .recipe_index
                    .get(recipe.text.as_str())
                    .expect("checked recipe"),
                args: self.fields(args),
            },
            StepCall::Approval { .. } => plan::Action::Approval(Box::new(plan::ApprovalAction {
                approvers: arg(self, "approvers").unwrap_or(plan::Expr::List(Vec::new())),
                message: arg(self, "message").unwrap_or(plan::Expr::Literal(Value::Null)),
                expires_ms: args
                    .fields
                    .iter()
                    .find(|f| f.name.text == "expires")
                    .and_then(|f| match &f.value.kind {
                        ExprKind::Duration(duration) => duration.millis(),
                        _ => None,
                    }),
                on_reject: match literal("on_reject").as_deref() {
                    Some("continue") => plan::OnReject::Continue,
                    _ => plan::OnReject::Fail,
                },
                on_expire: match literal("on_expire").as_deref() {
                    Some("fail") => plan::OnExpire::Fail,
                    _ => plan::OnExpire::Reject,
                },
            })),
            StepCall::KbWrite { collection, .. } => {
                plan::Action::KbWrite(Box::new(plan::KbWriteAction {
                    collection: self.template(collection, false),
                    title: arg(self, "title").unwrap_or(plan::Expr::Literal(Value::Null)),
                    content: arg(self, "content").unwrap_or(plan::Expr::Literal(Value::Null)),
                    metadata: arg(self, "metadata"),
                }))
            }
            StepCall::Handoff { department, .. } => {
                plan::Action::Handoff(Box::new(plan::HandoffAction {
                    department: self.template(department, false),
                    message: arg(self, "message").unwrap_or(plan::Expr::Literal(Value::Null)),
                    subject: arg(self, "subject"),
                }))
            }
            StepCall::Browser { server, tool, .. } => {
                plan::Action::Browser(Box::new(plan::BrowserAction {
                    server: *self
                        .server_index
                        .get(server.text.as_str())
                        .expect("checked server"),
                    tool: tool.text.to_string(),
                    args: self.fields(args),
                }))
            }
            StepCall::Broken { .. } => unreachable!("a program with a syntax error is not lowered"),
        };
        let options = &step.options;
        let retry = options.retry.as_ref();
        let backoff = retry
            .and_then(|r| r.backoff.as_ref())
            .and_then(|(min, max)| Some((min.millis()?, max.millis()?)))
            .unwrap_or(DEFAULT_BACKOFF_MS);
        plan::Step {
            slot: self.slot(&step.id.text),
            id: step.id.text.to_string(),
            action,
            retry: plan::Retry {
                attempts: retry
                    .map_or(DEFAULT_ATTEMPTS, |r| r.attempts)
                    .clamp(1, i64::from(u32::MAX)) as u32,
                backoff_min_ms: backoff.0,
                backoff_max_ms: backoff.1,
            },
            timeout_ms: options
                .timeout
                .as_ref()
                .and_then(ast::DurationLit::millis)
                .unwrap_or(DEFAULT_STEP_TIMEOUT_MS),
            on_error: self.policy(options.on_error.as_deref()),
            idempotency_key: options
                .idempotency
                .as_ref()
                .map(|key| Box::new(self.expr(key, false))),
        }
    }

    fn fields(&mut self, record: &ast::RecordLit) -> Vec<plan::Field> {
        record
            .fields
            .iter()
            .map(|field| plan::Field {
                name: field.name.text.to_string(),
                value: self.expr(&field.value, false),
            })
            .collect()
    }

    fn template(&mut self, lit: &ast::StringLit, optional: bool) -> plan::Template {
        plan::Template {
            parts: lit
                .template
                .parts
                .iter()
                .map(|part| match part {
                    TemplatePart::Text(text) => plan::TemplatePart::Text(text.to_string()),
                    TemplatePart::Ref(path) => {
                        plan::TemplatePart::Ref(self.reference(path, optional))
                    }
                })
                .collect(),
        }
    }

    /// `optional`: the expression is the left side of `??`.
    fn expr(&mut self, expr: &ast::Expr, optional: bool) -> plan::Expr {
        match &expr.kind {
            ExprKind::Null | ExprKind::Error => plan::Expr::Literal(Value::Null),
            ExprKind::Bool(b) => plan::Expr::Literal(Value::Bool(*b)),
            ExprKind::Int(i) => plan::Expr::Literal(Value::from(*i)),
            ExprKind::Float(f) => plan::Expr::Literal(
                serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            ),
            ExprKind::Duration(duration) => plan::Expr::Duration(duration.millis().unwrap_or(0)),
            ExprKind::String(lit) => match lit.as_plain() {
                Some(text) => plan::Expr::Literal(Value::String(text.to_string())),
                None => plan::Expr::Template(self.template(lit, optional)),
            },
            ExprKind::List(items) => {
                plan::Expr::List(items.iter().map(|item| self.expr(item, false)).collect())
            }
            ExprKind::Record(record) => plan::Expr::Record(self.fields(record)),
            ExprKind::Path(path) => plan::Expr::Ref(self.reference(path, optional)),
            ExprKind::Not(inner) => plan::Expr::Not(Box::new(self.expr(inner, false))),
            ExprKind::Binary(op, left, right) => plan::Expr::Binary {
                op: match op {
                    ast::BinaryOp::Coalesce => plan::BinaryOp::Coalesce,
                    ast::BinaryOp::Or => plan::BinaryOp::Or,
                    ast::BinaryOp::And => plan::BinaryOp::And,
                    ast::BinaryOp::Eq => plan::BinaryOp::Eq,
                    ast::BinaryOp::Ne => plan::BinaryOp::Ne,
                    ast::BinaryOp::Lt => plan::BinaryOp::Lt,
                    ast::BinaryOp::Le => plan::BinaryOp::Le,
                    ast::BinaryOp::Gt => plan::BinaryOp::Gt,
                    ast::BinaryOp::Ge => plan::BinaryOp::Ge,
                },
                left: Box::new(self.expr(left, *op == ast::BinaryOp::Coalesce)),
                right: Box::new(self.expr(right, false)),
            },
        }
    }

    fn reference(&mut self, path: &ast::Path, optional: bool) -> plan::Ref {
        let optional = optional || is_optional(path);
        let field_name = |index: usize| match path.segments.get(index) {
            Some(Segment::Field { name, .. }) => Some(name.text.as_str()),
            _ => None,
        };
        let innermost = self.loops.len().saturating_sub(1) as u32;
        let (root, rest) = match path.root.text.as_str() {
            "workflow_input" => match field_name(0).and_then(|f| self.info.input.position(f)) {
                Some(index) => (plan::Root::InputField(index as u32), 1),
                None => (plan::Root::Input, 0),
            },
            "step" => (
                plan::Root::Step(self.slot(field_name(0).unwrap_or_default())),
                1,
            ),
            "loop_item" => (plan::Root::LoopItem(innermost), 0),
            "loop_index" => (plan::Root::LoopIndex(innermost), 0),
            "loop" => {
                let level = field_name(0)
                    .and_then(|id| self.loops.iter().rposition(|l| l == id))
                    .unwrap_or(innermost as usize) as u32;
                match field_name(1) {
                    Some("index") => (plan::Root::LoopIndex(level), 2),
                    _ => (plan::Root::LoopItem(level), 2),
                }
            }
            "output" => (plan::Root::Output, 0),
            _ => (plan::Root::Error, 0),
        };
        plan::Ref {
            root,
            path: segments(&path.segments[rest.min(path.segments.len())..]),
            optional,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// A field's doc reaches the model as its schema's `description`,
    /// through aliases, optionals and lists; `json` stays `{}`.
    #[test]
    fn field_docs_become_descriptions() {
        let source = r#"
type Item = {
  /// 0 to 10
  weight: int
}
recipe r {
  model "m"
  output {
    /// 1 to 5
    urgency: int
    /// Dollars, if named.
    amount: float?
    items: list<Item>
    /// Anything.
    extra: json
  }
  prompt "p"
}
workflow w { step a = r {} }
"#;
        let checked = crate::check_source("d.flow", source);
        assert!(!checked.has_errors(), "{:#?}", checked.diagnostics);
        let plan = crate::lower(&checked).expect("lowers");
        plan.validate().expect("a valid plan");
        let schema = &plan.recipes[0].output_schema["properties"];
        assert_eq!(schema["urgency"]["description"], json!("1 to 5"));
        assert_eq!(schema["amount"]["description"], json!("Dollars, if named."));
        assert_eq!(
            schema["items"]["items"]["properties"]["weight"]["description"],
            json!("0 to 10")
        );
        assert_eq!(schema["extra"], json!({}));

        // What the plan's bound is held to before the plan is written: the
        // bytes of each schema, descriptions included, as written.
        let info = &checked.analysis.env.recipes["r"];
        let aliases = super::alias_types(&checked);
        let mut described = super::Descriptions {
            aliases: &aliases,
            of_alias: Default::default(),
            json_alias: Default::default(),
        };
        let mut bytes = crate::check::SchemaBytes::default();
        let measured = bytes.of(&info.output)
            + described.bytes(info.decl.output.as_ref().expect("an output"), 0);
        let written = serde_json::to_vec(&plan.recipes[0].output_schema).unwrap();
        assert_eq!(measured, written.len() as u64);
    }
}
