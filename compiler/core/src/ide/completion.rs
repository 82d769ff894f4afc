//! Completion: the names that may go at the cursor.
//!
//! The position is classified from the text around the cursor (see
//! `cursor.rs`); the names come from the analysis: the steps that have
//! certainly run at the cursor, the fields of the type a path has reached,
//! recipes and their inputs, types, keywords. When the file has a syntax
//! error, the caller's analysis may lack the construct being typed, so the
//! query re-checks a repaired copy of the text (a placeholder name in place of
//! the path typed at the cursor, the open reference, string and brackets of
//! its line closed).

use std::sync::Arc;

use crate::Checked;
use crate::check::{
    Env, McpInfo, StepInfo, StepKind, Ty, approval_params, handoff_params, kb_write_params,
};
use crate::codes::Code;
use crate::diagnostic::{FileId, Span};
use crate::ide::scope::{Scope, Seg, walk};
use crate::ide::visit;
use crate::lock::LockedTool;
use crate::syntax::ast::Item;
use crate::syntax::cursor::{self, Lexical};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CompletionKind {
    Step,
    Field,
    /// An enum variant, inserted as a string literal.
    Variant,
    /// An input of the recipe or step kind being called.
    Argument,
    Recipe,
    McpServer,
    /// A tool of an MCP server, from `flow.lock`.
    Tool,
    Loop,
    /// A reference root: `workflow_input`, `step`, `loop_item`, ...
    Root,
    Type,
    Keyword,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub label: String,
    pub kind: CompletionKind,
    /// A one-line description: a type, a step's kind and output.
    pub detail: String,
    /// The text to insert when it differs from the label.
    pub insert: Option<String>,
}

/// The candidates and the span of source text they replace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completions {
    pub replace: Span,
    pub items: Vec<Completion>,
}

const TOP_LEVEL: &[&str] = &["import", "type", "recipe", "mcp", "workflow"];
const STATEMENTS: &[&str] = &["step", "if", "for", "parallel"];
const STEP_OPTIONS: &[&str] = &["retry", "timeout", "on_error", "idempotency"];
const RECIPE_MEMBERS: &[&str] = &["model", "input", "output", "prompt", "context"];
const MCP_MEMBERS: &[&str] = &["command", "args", "url", "env"];

/// The completions at byte `offset` of the root file of `checked`.
///
/// `recheck` checks another text in place of the root file (with the same
/// imports); it is called only when the root file has a syntax error, with a
/// copy repaired at the cursor (see [`completions_in_broken`]).
pub fn completions(
    checked: &Checked,
    offset: u32,
    recheck: &mut dyn FnMut(&str) -> Arc<Checked>,
) -> Completions {
    let Some(root) = checked.files.first() else {
        return Completions::default();
    };
    let broken = checked.diagnostics.iter().any(|d| {
        d.primary.file == FileId(0)
            && matches!(d.code, Code::Syntax | Code::Template | Code::TooDeep)
    });
    if broken {
        completions_in_broken(&root.text, offset, recheck)
    } else {
        let offset = cursor::floor_boundary(&root.text, offset as usize);
        complete_in(checked, &root.text, offset, offset)
    }
}

/// The completions at byte `offset` of `text`, a root file with a syntax
/// error, without an analysis of `text` itself: the parser's recovery drops
/// the half-typed construct, and with it what encloses the cursor, so the
/// names come from `recheck` of a copy repaired at the cursor.
///
/// Every keystroke within one reference path gives the same copy (see
/// `cursor::repair`), so a caller that keeps the last copy's analysis checks
/// once per path typed rather than once per keystroke.
pub fn completions_in_broken(
    text: &str,
    offset: u32,
    recheck: &mut dyn FnMut(&str) -> Arc<Checked>,
) -> Completions {
    let offset = cursor::floor_boundary(text, offset as usize);
    let (repaired, anchor) = cursor::repair(text, offset);
    complete_in(&recheck(&repaired), text, offset, anchor)
}

/// Whether the cursor at `offset` of `text` is in a reference or a plain
/// string that its line leaves open, as while `"{{step.` is being typed. The
/// text then certainly has a syntax error, so a caller may go straight to
/// [`completions_in_broken`] without checking the text itself, which for a
/// text with a syntax error takes the slower, recovering parser.
pub fn half_typed(text: &str, offset: u32) -> bool {
    let offset = cursor::floor_boundary(text, offset as usize);
    let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    cursor::left_open(cursor::scan(text, offset).lexical, &text[offset..line_end])
}

/// Completes at `offset` of `text`, with `checked` an analysis of `text` or
/// of its repaired copy, which agrees with `text` before `anchor`: the
/// analysis is asked about `anchor`, the text about `offset`.
fn complete_in(checked: &Checked, text: &str, offset: usize, anchor: usize) -> Completions {
    let state = cursor::scan(text, offset);
    let (start, typed) = cursor::path_before(text, offset);
    let replace_from = typed.rfind('.').map_or(start, |dot| start + dot + 1);
    let mut out = Completions {
        replace: Span::new(replace_from, offset),
        items: Vec::new(),
    };
    let scope = Scope::at(checked, anchor as u32);
    match state.lexical {
        Lexical::Comment | Lexical::String { .. } => {}
        Lexical::Template { .. } => {
            if let Some(scope) = &scope {
                reference(&checked.analysis.env, scope, typed, &mut out.items);
            } else if let Some(recipe) = recipe_at(checked, anchor) {
                prompt_reference(checked, &recipe, typed, &mut out.items);
            }
        }
        Lexical::Code => code(
            checked,
            text,
            offset,
            start,
            typed,
            &state,
            scope.as_ref(),
            &mut out.items,
        ),
    }
    // Most specific first, then alphabetical, as editors show them.
    out.items
        .sort_by(|a, b| (a.kind, &a.label).cmp(&(b.kind, &b.label)));
    out.items
        .dedup_by(|a, b| a.label == b.label && a.kind == b.kind);
    out
}

/// A reference being typed, in a template or as a bare value: roots before
/// the first dot, then the members of whatever the path has reached.
fn reference(env: &Env, scope: &Scope<'_>, typed: &str, items: &mut Vec<Completion>) {
    let Some((head, _partial)) = typed.rsplit_once('.') else {
        for (root, detail) in scope.roots() {
            items.push(simple(root, CompletionKind::Root, detail));
        }
        return;
    };
    let mut parts = head.split(['.', '?']).filter(|p| !p.is_empty());
    let Some(root) = parts.next() else { return };
    let segments: Vec<Seg> = parts.flat_map(segments_of).collect();
    match (root, segments.as_slice()) {
        ("step", []) => {
            for step in scope.ran_steps() {
                items.push(step_item(env, step));
            }
        }
        ("loop", []) => {
            for info in scope.loops() {
                items.push(simple(
                    &info.id,
                    CompletionKind::Loop,
                    &format!("loop over `{}`", env.show(&info.item)),
                ));
            }
        }
        _ => {
            if let Some(ty) = scope.resolve(root, &segments) {
                fields(env, &ty, items);
            }
        }
    }
}

/// The workflow run by the test whose block holds `offset`, if one does.
fn tested_at(checked: &Checked, offset: usize) -> Option<&crate::check::WorkflowInfo> {
    let test = checked
        .files
        .first()?
        .tree
        .tests()
        .find(|test| test.span.start as usize <= offset && offset <= test.span.end as usize)?;
    checked
        .analysis
        .test_workflow(&test.workflow.as_ref()?.text)
}

/// `name[0][1]` as a field and two indices.
fn segments_of(part: &str) -> Vec<Seg> {
    let mut pieces = part.split('[');
    let mut segments = Vec::new();
    if let Some(name) = pieces.next()
        && !name.is_empty()
    {
        segments.push(Seg::Field(name.to_string()));
    }
    segments.extend(pieces.map(|_| Seg::Index));
    segments
}

/// The fields of `ty`, each with its type as written (an alias by name).
fn fields(env: &Env, ty: &Ty, items: &mut Vec<Completion>) {
    if let Ty::Record(fields) = ty.required() {
        for (name, field) in fields.iter() {
            items.push(simple(
                name,
                CompletionKind::Field,
                &env.show(field).to_string(),
            ));
        }
    }
}

fn step_item(env: &Env, step: &StepInfo) -> Completion {
    let kind = match &step.kind {
        StepKind::Recipe(recipe) => format!("recipe `{recipe}`"),
        StepKind::Approval { .. } => "approval".to_string(),
        StepKind::KbWrite => "kb_write".to_string(),
        StepKind::Handoff => "handoff".to_string(),
        StepKind::Browser(call) => format!("browser `{}.{}`", call.server, call.tool),
        StepKind::Loop => "loop".to_string(),
        StepKind::Parallel => "parallel".to_string(),
        StepKind::Unknown => "a step that does not parse".to_string(),
    };
    let output = step
        .output
        .as_ref()
        .map_or("no output".to_string(), |ty| env.show(ty).to_string());
    simple(
        &step.id,
        CompletionKind::Step,
        &format!("{kind} → {output}"),
    )
}

fn simple(label: &str, kind: CompletionKind, detail: &str) -> Completion {
    Completion {
        label: label.to_string(),
        kind,
        detail: detail.to_string(),
        insert: None,
    }
}

fn keywords(words: &[&str], items: &mut Vec<Completion>) {
    for word in words {
        items.push(simple(word, CompletionKind::Keyword, "keyword"));
    }
}

/// The recipe whose declaration spans `offset`, for `{{input.x}}` in a prompt.
fn recipe_at(checked: &Checked, offset: usize) -> Option<String> {
    match visit::item_at(checked, offset as u32)? {
        Item::Recipe(recipe) => Some(recipe.name.text.to_string()),
        _ => None,
    }
}

fn prompt_reference(checked: &Checked, recipe: &str, typed: &str, items: &mut Vec<Completion>) {
    let Some(info) = checked.analysis.env.recipes.get(recipe) else {
        return;
    };
    match typed.rsplit_once('.') {
        None => items.push(simple("input", CompletionKind::Root, "the recipe's input")),
        Some((head, _)) => {
            let mut parts = head.split(['.', '?']).filter(|p| !p.is_empty());
            if parts.next() != Some("input") {
                return;
            }
            let segments: Vec<Seg> = parts.flat_map(segments_of).collect();
            if let Some(ty) = walk(Ty::Record(info.input.clone()), &segments) {
                fields(&checked.analysis.env, &ty, items);
            }
        }
    }
}

/// A position in code: a name being typed where a reference, a callee, a
/// type, an argument name or a keyword may go.
#[allow(clippy::too_many_arguments)] // reason: the classified position, passed on rather than re-derived
fn code(
    checked: &Checked,
    text: &str,
    offset: usize,
    start: usize,
    typed: &str,
    state: &cursor::Cursor,
    scope: Option<&Scope<'_>>,
    items: &mut Vec<Completion>,
) {
    let env = &checked.analysis.env;
    let previous = cursor::previous_byte(text, start);
    let enclosing = state.open.last().copied();
    // `keyword name` just before `at`, as in `step id =` and `recipe r {`.
    let declares = |at: usize, keyword: &str| matches!(cursor::words_before(text, at, 2).as_slice(), [word, _] if *word == keyword);
    let step_call = matches!(previous, Some((at, b'=')) if declares(at, "step"));

    if typed.contains('.') {
        let root = typed.split(['.', '?']).next().unwrap_or_default();
        match env.mcp_servers.get(root) {
            // `step id = server.|`: the tools that flow.lock recorded for it.
            Some(info) => {
                if step_call && is_name(&typed[root.len() + 1..]) {
                    tools(info, items);
                }
            }
            None => {
                if let Some(scope) = scope {
                    reference(env, scope, typed, items);
                } else if typed
                    .split_once('.')
                    .is_some_and(|(root, rest)| root == "step" && !rest.contains(['.', '?', '[']))
                    && let Some(workflow) = tested_at(checked, offset)
                {
                    // `mock step.|`, `decide step.|`, `expect ran step.|` in a
                    // test: the steps of the workflow it runs, those the
                    // member applies to (E402 otherwise).
                    let member = cursor::words_before(text, start, 1);
                    let fits = |kind: &StepKind| match member.as_slice() {
                        ["mock"] => kind.is_mockable(),
                        ["decide"] => matches!(kind, StepKind::Approval { .. }),
                        _ => kind.is_step(),
                    };
                    for step in &workflow.steps {
                        if fits(&step.kind) {
                            items.push(step_item(env, step));
                        }
                    }
                }
            }
        }
        return;
    }

    match previous {
        // `step id = |`: what a step can call.
        Some(_) if step_call => {
            for (name, info) in &env.recipes {
                items.push(simple(name, CompletionKind::Recipe, &signature(env, info)));
            }
            for name in env.mcp_servers.keys() {
                items.push(simple(
                    name,
                    CompletionKind::McpServer,
                    "MCP server: `server.tool { ... }`",
                ));
            }
            keywords(&["approval", "kb_write", "handoff"], items);
        }
        // `type T = |`, `list<|`, `a | |`, `output |` in a recipe: a type.
        Some((at, b'=')) if declares(at, "type") => types(checked, items),
        Some((_, b'<' | b'|'))
            if in_type(text, enclosing)
                || previous.is_some_and(|(at, _)| text[..at].trim_end().ends_with("list")) =>
        {
            types(checked, items)
        }
        Some((_, b':')) if in_type(text, enclosing) => types(checked, items),
        Some((at, _))
            if cursor::words_before(text, at + 1, 1) == ["output"]
                && enclosing.is_some_and(|(brace, _)| declares(brace, "recipe")) =>
        {
            types(checked, items)
        }
        // A value: after `:` in a record literal, an operator, `if`, `for`, `[`, `(`.
        Some((_, b':' | b'(' | b'[' | b'!' | b'&' | b'|' | b'?' | b'<' | b'>')) => {
            value(scope, items)
        }
        Some((at, b'=')) if text[..=at].ends_with("==") || text[..=at].ends_with("!=") => {
            value(scope, items);
            variants(text, at - 1, scope, items);
        }
        Some((_, b',')) if enclosing.is_some_and(|(_, b)| b == b'[') => value(scope, items),
        Some((at, _))
            if matches!(
                cursor::words_before(text, at + 1, 1).as_slice(),
                ["if" | "for" | "idempotency"]
            ) =>
        {
            value(scope, items)
        }
        _ => member(checked, text, offset, enclosing, items),
    }
}

/// Names at the start of a member, statement or argument: what the
/// enclosing brace holds decides.
fn member(
    checked: &Checked,
    text: &str,
    offset: usize,
    enclosing: Option<(usize, u8)>,
    items: &mut Vec<Completion>,
) {
    let Some((brace, b'{')) = enclosing else {
        if enclosing.is_none() {
            keywords(TOP_LEVEL, items);
        }
        return;
    };
    if let Some(output) = mocked_value(checked, text, brace) {
        // `mock step.classify = { | }`: the fields of the recipe's output,
        // or of the record nested in it that the cursor is in.
        fields(&checked.analysis.env, &output, items);
        return;
    }
    let words = cursor::words_before(text, brace, 3);
    match words.as_slice() {
        [.., "recipe", _] => keywords(RECIPE_MEMBERS, items),
        [.., "mcp", _] => keywords(MCP_MEMBERS, items),
        [.., "workflow", _] => {
            keywords(STATEMENTS, items);
            keywords(crate::syntax::WORKFLOW_SETTINGS, items);
            keywords(&["output"], items);
            after_step(text, offset, items);
        }
        [.., "parallel", _] => keywords(&["branch"], items),
        _ if step_callee(text, brace).is_some() => {
            let callee = step_callee(text, brace).unwrap_or_default();
            arguments(checked, text, brace, offset, callee, items)
        }
        _ => {
            // A block of statements: `if ... {`, `else {`, `as id {`, `branch b {`, `fallback {`.
            keywords(STATEMENTS, items);
            after_step(text, offset, items);
        }
    }
}

/// The type the literal opening at `open` (a `{` or `[`) inside a mock's
/// answer is checked against: the answer's own (`mocked_output`), a
/// field's of the record around it (`customer: {`), or an item's of the
/// list around it (`[{`, `, {`).
fn mocked_value(checked: &Checked, text: &str, open: usize) -> Option<Ty> {
    // The brackets open around `open`, outermost first, then `open`: one
    // scan for them all, and a walk without recursion (4,000 open `{` had
    // a frame and a scan each, and overflowed the server's stack).
    let mut chain = cursor::scan(text, open).open;
    chain.push((open, *text.as_bytes().get(open)?));
    // The answer's literal is within the deepest literal could nest.
    let (answer, mut ty) = (0..chain.len())
        .rev()
        .take(crate::syntax::MAX_DEPTH)
        .find_map(|at| Some((at, mocked_output(checked, text, chain[at].0)?)))?;
    for pair in chain[answer..].windows(2) {
        let ((_, bracket), (at, _)) = (pair[0], pair[1]);
        let before = text[..at].trim_end();
        ty = match (bracket, ty.required()) {
            (b'{', outer) => {
                let name = before.strip_suffix(':')?.trim_end();
                let name = &name[name.len() - cursor::name_len_before(name)..];
                outer.field(name).cloned()?
            }
            (b'[', Ty::List(item)) if before.ends_with(['[', ',']) => item.as_ref().clone(),
            _ => return None,
        };
    }
    Some(ty)
}

/// The output type a mock's answer opening at `brace` is checked against:
/// `mock step.ID = {`, `mock recipe NAME ... then {` in a test, on one
/// line; the recipe's output, the step's in the test's workflow.
fn mocked_output(checked: &Checked, text: &str, brace: usize) -> Option<Ty> {
    let line = text[..brace].rsplit('\n').next()?.trim_start();
    let rest = line.strip_prefix("mock")?.trim_start();
    let before = line.trim_end();
    if !(before.ends_with('=') || before.ends_with("then")) {
        return None;
    }
    let target = rest
        .strip_prefix("step.")
        .or_else(|| rest.strip_prefix("recipe "))?
        .trim_start();
    let name: String = target
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    let env = &checked.analysis.env;
    if rest.starts_with("recipe ") {
        return env.recipes.get(&name).map(|info| info.output.clone());
    }
    let step = tested_at(checked, brace)?.step(&name)?.1;
    match &step.kind {
        StepKind::Recipe(recipe) => env
            .recipes
            .get(recipe.as_str())
            .map(|info| info.output.clone()),
        _ => None,
    }
}

/// Options after a step's closing brace on the same statement.
fn after_step(text: &str, offset: usize, items: &mut Vec<Completion>) {
    if let Some((_, b'}')) = cursor::previous_byte(text, cursor::path_before(text, offset).0) {
        keywords(STEP_OPTIONS, items);
    }
}

/// The callee of the step call whose argument list opens at `brace`:
/// `step id = recipe {`, `approval {`, `kb_write "c" {`, `handoff "d" {`,
/// `server.tool {`.
pub(crate) fn step_callee(text: &str, brace: usize) -> Option<&str> {
    let line_start = text[..brace].rfind('\n').map_or(0, |i| i + 1);
    let head = text[line_start..brace].trim();
    let rest = head.strip_prefix("step")?.trim_start();
    let (_, call) = rest.split_once('=')?;
    let call = call.trim();
    let callee = call.split(|c: char| c.is_whitespace() || c == '"').next()?;
    let mut parts = callee.splitn(2, '.');
    parts
        .all(|part| is_name(part) && !part.is_empty())
        .then_some(callee)
}

fn is_name(word: &str) -> bool {
    word.bytes().all(cursor::is_name_byte)
}

/// The inputs that `callee` (as `step_callee` reads it) takes.
pub(crate) fn callee_params(env: &Env, callee: &str) -> Option<Vec<(String, Ty)>> {
    Some(match callee.split_once('.') {
        // A tool's arguments are the properties of its input schema.
        Some((server, tool)) => {
            crate::lock::tool_params(&locked_tool(env, server, tool)?.input_schema)
        }
        None => match callee {
            "approval" => approval_params(),
            "kb_write" => kb_write_params(),
            "handoff" => handoff_params(),
            recipe => env.recipes.get(recipe)?.input.to_vec(),
        },
    })
}

/// The inputs of the callee that the argument list does not give yet.
fn arguments(
    checked: &Checked,
    text: &str,
    brace: usize,
    offset: usize,
    callee: &str,
    items: &mut Vec<Completion>,
) {
    let env = &checked.analysis.env;
    let Some(params) = callee_params(env, callee) else {
        return;
    };
    let given = given_fields(&text[brace + 1..offset.max(brace + 1)]);
    for (name, ty) in params {
        if !given.contains(&name.as_str()) {
            items.push(Completion {
                label: name.clone(),
                kind: CompletionKind::Argument,
                detail: env.show(&ty).to_string(),
                insert: Some(format!("{name}: ")),
            });
        }
    }
}

/// The tools of an MCP server as `flow.lock` recorded them.
fn tools(info: &McpInfo, items: &mut Vec<Completion>) {
    for tool in info.locked.iter().flat_map(|locked| &locked.tools) {
        // The description's first line: some run to pages.
        let detail = tool
            .description
            .as_deref()
            .and_then(|d| d.lines().find(|line| !line.trim().is_empty()))
            .map_or("MCP tool".to_string(), |line| line.trim().to_string());
        items.push(simple(&tool.name, CompletionKind::Tool, &detail));
    }
}

fn locked_tool<'e>(env: &'e Env, server: &str, tool: &str) -> Option<&'e LockedTool> {
    let locked = env.mcp_servers.get(server)?.locked.as_ref()?;
    locked.tools.iter().find(|t| t.name == tool)
}

/// The field names already written at the top level of a record literal.
pub(crate) fn given_fields(body: &str) -> Vec<&str> {
    let bytes = body.as_bytes();
    let mut names = Vec::new();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut word_start = None;
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'"' => in_string = !in_string,
            _ if in_string => {}
            b'{' | b'[' | b'(' => depth += 1,
            b'}' | b']' | b')' => depth = depth.saturating_sub(1),
            b':' if depth == 0 => {
                if let Some(start) = word_start {
                    let name = body[start..i].trim();
                    if is_name(name) && !name.is_empty() {
                        names.push(name);
                    }
                }
            }
            b',' | b'\n' if depth == 0 => word_start = Some(i + 1),
            _ => {}
        }
        if i == 0 && word_start.is_none() {
            word_start = Some(0);
        }
    }
    names
}

/// A value position: reference roots, and literals.
fn value(scope: Option<&Scope<'_>>, items: &mut Vec<Completion>) {
    if let Some(scope) = scope {
        for (root, detail) in scope.roots() {
            items.push(simple(root, CompletionKind::Root, detail));
        }
    }
    keywords(&["true", "false", "null"], items);
}

/// After `path ==`: the variants of the path's enum type, as literals.
fn variants(text: &str, operator: usize, scope: Option<&Scope<'_>>, items: &mut Vec<Completion>) {
    let Some(scope) = scope else { return };
    let end = text[..operator].trim_end().len();
    let (_, path) = cursor::path_before(text, end);
    let mut parts = path.split(['.', '?']).filter(|p| !p.is_empty());
    let Some(root) = parts.next() else { return };
    let segments: Vec<Seg> = parts.flat_map(segments_of).collect();
    if let Some(Ty::Enum(names)) = scope.resolve(root, &segments).as_ref().map(Ty::required) {
        for name in names.iter() {
            items.push(Completion {
                label: format!("\"{name}\""),
                kind: CompletionKind::Variant,
                detail: format!("variant of `{path}`"),
                insert: None,
            });
        }
    }
}

fn types(checked: &Checked, items: &mut Vec<Completion>) {
    for name in crate::check::BUILTIN_TYPE_NAMES {
        items.push(simple(name, CompletionKind::Type, "built-in type"));
    }
    for (name, ty) in &checked.analysis.env.types {
        items.push(simple(name, CompletionKind::Type, &ty.to_string()));
    }
}

/// Whether the brace around the cursor holds field declarations of a type
/// (`input {`, `output {`, `type T = {`, a record type nested in one).
fn in_type(text: &str, enclosing: Option<(usize, u8)>) -> bool {
    let Some((mut brace, b'{')) = enclosing else {
        return false;
    };
    // The braces around, outermost first, from one scan: a walk out
    // through them without recursion (thousands of open `{` had a frame
    // and a scan each, and overflowed the server's stack).
    let mut around = cursor::scan(text, brace).open;
    loop {
        let enclosing = around.pop();
        let words = cursor::words_before(text, brace, 1);
        // A recipe's `input` and `output` and a workflow's `input` are
        // types; a workflow's `output` and a test's `input` are values.
        let outer = || {
            let (outer, _) = enclosing?;
            let line_start = text[..outer].rfind('\n').map_or(0, |i| i + 1);
            let head = text[line_start..outer].trim_start();
            let word_len = cursor::name_len(head);
            Some(head[..word_len].to_string())
        };
        match words.as_slice() {
            ["input"] => return outer().as_deref() != Some("test"),
            ["output"] => return outer().as_deref() == Some("recipe"),
            _ => {}
        }
        // `type T = {`, or a record type as a field's type (`a: {`) in one.
        if cursor::words_before(text, brace, 3).first() == Some(&"type") {
            return true;
        }
        let nested = matches!(
            cursor::previous_byte(text, brace),
            Some((_, b'=' | b':' | b'<' | b'|'))
        );
        match enclosing {
            Some((outer, b'{')) if nested => brace = outer,
            _ => return false,
        }
    }
}

/// `recipe(input { ... }) -> output` for a completion's detail line, with
/// types as written (an alias by name).
pub(crate) fn signature(env: &Env, info: &crate::check::RecipeInfo) -> String {
    signature_of(env, &info.input, Some(&info.output))
}

/// `(inputs) → output`, a recipe's or a workflow's (one without an
/// `output` record shows none).
pub(crate) fn signature_of(env: &Env, input: &crate::check::Fields, output: Option<&Ty>) -> String {
    let inputs: Vec<String> = input
        .iter()
        .map(|(n, t)| format!("{n}: {}", env.show(t)))
        .collect();
    match output {
        Some(output) => format!("({}) → {}", inputs.join(", "), env.show(output)),
        None => format!("({})", inputs.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_typed_means_left_open_on_the_line() {
        let line = "  s = r { t: \"{{step.";
        assert!(half_typed(&format!("{line}\n}}\n"), line.len() as u32));
        assert!(half_typed("t: \"abc\nx", 6));
        assert!(!half_typed("t: \"{{step.}}\"\n", 11), "closed on its line");
        assert!(!half_typed("t: \"abc\"\n", 6));
        assert!(!half_typed("t: step.\n", 8), "code is not certainly broken");
    }

    #[test]
    fn given_fields_are_found_at_the_top_level_only() {
        assert_eq!(
            given_fields(" a: 1, b: { c: 2 }\n d: \"e: f\", "),
            vec!["a", "b", "d"]
        );
    }
}
