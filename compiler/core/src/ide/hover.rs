//! Hover: what the name under the cursor is, in Markdown.

use crate::Checked;
use crate::check::{StepInfo, StepKind, Ty};
use crate::diagnostic::{FileId, Span};
use crate::ide::completion::{signature, signature_of};
use crate::ide::fields;
use crate::ide::navigation::{Symbol, symbol_at};
use crate::ide::scope::{Scope, Seg, walk};
use crate::ide::visit;
use crate::syntax::ast::{self, Item, Path, Segment, path_text};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hover {
    /// The name the text describes.
    pub span: Span,
    pub markdown: String,
}

/// What to show for the name at `offset` of file `file`.
pub fn hover(checked: &Checked, file: FileId, offset: u32) -> Option<Hover> {
    if file == FileId(0)
        && let Some(hover) = path_hover(checked, offset)
    {
        return Some(hover);
    }
    if let Some(decl) = fields::field_decl_at(checked, file, offset) {
        let text = &checked.file(file).text;
        let ty = text
            .get(decl.ty.span.start as usize..decl.ty.span.end as usize)
            .unwrap_or_default();
        let mut markdown = format!("```flow\n{}: {ty}\n```", decl.name.text);
        docs(&mut markdown, &decl.docs);
        return Some(Hover {
            span: decl.name.span,
            markdown,
        });
    }
    let env = &checked.analysis.env;
    let (symbol, span) = symbol_at(checked, file, offset)?;
    let markdown = match &symbol {
        Symbol::Step { workflow, id, .. } => {
            let info = checked.analysis.test_workflow(workflow)?;
            // Budgets are the root file's workflows', in their order.
            let index = checked
                .analysis
                .workflows
                .iter()
                .position(|w| w.name == *workflow);
            let (_, step) = info.step(id)?;
            let decl = step_decl(checked, step.id_span);
            let mut text = step_text(checked, step, decl);
            // Present when the program has no errors.
            if let Some(worst) = index
                .zip(decl)
                .and_then(|(index, decl)| crate::lower::step_budget(checked, index, decl))
            {
                text.push_str("\n\nactive time at worst: ");
                text.push_str(&crate::budget::worst_case(&worst));
            }
            text
        }
        Symbol::Recipe { name, .. } => {
            let info = env.recipes.get(name)?;
            let mut text = format!("```flow\nrecipe {name}{}\n```", signature(env, info));
            docs(&mut text, &info.decl.docs);
            text
        }
        Symbol::Type { name, .. } => {
            let ty = env.types.get(name)?;
            format!("```flow\ntype {name} = {ty}\n```")
        }
        Symbol::Mcp { name, .. } => {
            let info = env.mcp_servers.get(name)?;
            let how = match (&info.decl.command, &info.decl.url) {
                (Some(command), _) => format!("runs `{}`", command.display_text()),
                (None, Some(url)) => format!("at `{}`", url.display_text()),
                (None, None) => "no command or url".to_string(),
            };
            let mut text = format!("MCP server `{name}`: {how}");
            docs(&mut text, &info.decl.docs);
            text
        }
        Symbol::Import { path } => format!("imports `{path}`"),
        Symbol::Workflow { name, .. } => {
            let workflow = checked.analysis.test_workflow(name)?;
            let signature = signature_of(env, &workflow.input, workflow.output.as_ref());
            format!("```flow\nworkflow {name}{signature}\n```")
        }
    };
    Some(Hover { span, markdown })
}

fn docs(text: &mut String, docs: &[String]) {
    if !docs.is_empty() {
        text.push_str("\n\n");
        text.push_str(&docs.join("\n"));
    }
}

/// The step of the root file whose id is written at `id_span`.
fn step_decl(checked: &Checked, id_span: Span) -> Option<&ast::Step> {
    let mut found = None;
    for item in &checked.files[0].tree.items {
        visit::steps(item, &mut |s| {
            if s.id.span == id_span {
                found = Some(s);
            }
        });
    }
    found
}

fn step_text(checked: &Checked, step: &StepInfo, decl: Option<&ast::Step>) -> String {
    let kind = match &step.kind {
        StepKind::Recipe(recipe) => format!("calls recipe `{recipe}`"),
        StepKind::Approval { .. } => "an approval".to_string(),
        StepKind::KbWrite => "a knowledge-base write".to_string(),
        StepKind::Handoff => "a handoff (no output)".to_string(),
        StepKind::Browser(call) => format!("calls MCP tool `{}.{}`", call.server, call.tool),
        StepKind::Loop => "a loop; its output is the list of iteration outputs".to_string(),
        StepKind::Parallel => "a parallel block; its output has one record per branch".to_string(),
        StepKind::Unknown => "a step that does not parse (see its syntax error)".to_string(),
    };
    let mut text = format!("step `{}`: {kind}", step.id);
    if let Some(output) = &step.output {
        text.push_str(&typed_block(checked, None, output));
    }
    if step.may_fail {
        text.push_str("\n\nmay end without output (`on_error continue` or a fallback)");
    }
    docs(&mut text, decl.map_or(&[], |decl| &decl.docs));
    text
}

/// Hover on a segment of a reference path: the type of the value up to it.
fn path_hover(checked: &Checked, offset: u32) -> Option<Hover> {
    let path = fields::path_at(checked, offset)?;
    let roots = Roots::at(checked, &path)?;
    let mut segments = Vec::new();
    if path.root.span.contains(offset) {
        let description = roots.describe(&path.root.text);
        let mut markdown = format!("`{}`: {description}", path.root.text);
        // What the root itself holds (`loop_item`'s element type, the
        // input's record), but not the table of all steps.
        if path.root.text != "step"
            && let Some(ty) = roots.resolve(&path.root.text, &[])
        {
            markdown.push_str(&typed_block(checked, None, &ty));
        }
        return Some(Hover {
            span: path.root.span,
            markdown,
        });
    }
    for (index, segment) in path.segments.iter().enumerate() {
        segments.push(match segment {
            Segment::Field { name, .. } => Seg::Field(name.text.to_string()),
            Segment::Index { .. } => Seg::Index,
        });
        if !segment.span().contains(offset) {
            continue;
        }
        if index == 0 && matches!(path.root.text.as_str(), "step") {
            let id = match segment {
                Segment::Field { name, .. } => &name.text,
                Segment::Index { .. } => return None,
            };
            let Roots::Workflow(scope) = &roots else {
                return None;
            };
            let (_, step) = scope.workflow.step(id)?;
            return Some(Hover {
                span: segment.span(),
                markdown: step_text(checked, step, step_decl(checked, step.id_span)),
            });
        }
        let mut ty = roots.resolve(&path.root.text, &segments)?;
        // Read through `?.`, the value may be absent, as the checker types it.
        if path.segments[..=index]
            .iter()
            .any(|segment| matches!(segment, Segment::Field { optional: true, .. }))
        {
            ty = ty.optional();
        }
        let shown = Path {
            root: path.root.clone(),
            segments: path.segments[..=index].to_vec(),
        };
        let mut markdown = typed_block(checked, Some(&path_text(&shown)), &ty)
            .trim_start()
            .to_string();
        // The field's `///` docs, from wherever its record is declared.
        if let Some(field) = fields::declared_field(checked, &path, index) {
            docs(&mut markdown, &field.decl.docs);
        }
        return Some(Hover {
            span: segment.span(),
            markdown,
        });
    }
    None
}

/// The roots a reference can start from where it is written: those of a
/// workflow's scope, or a recipe prompt's `input`.
enum Roots<'c> {
    Workflow(Scope<'c>),
    /// The recipe's inputs, as a record.
    Prompt(Ty),
}

impl<'c> Roots<'c> {
    fn at(checked: &'c Checked, path: &Path) -> Option<Roots<'c>> {
        if let Some(scope) = Scope::at(checked, path.span().start) {
            return Some(Roots::Workflow(scope));
        }
        let Item::Recipe(recipe) = visit::item_at(checked, path.span().start)? else {
            return None;
        };
        let info = checked
            .analysis
            .env
            .recipes
            .get(recipe.name.text.as_str())?;
        Some(Roots::Prompt(Ty::Record(info.input.clone())))
    }

    fn describe(&self, root: &str) -> &'static str {
        let roots = match self {
            Roots::Workflow(scope) => scope.roots(),
            Roots::Prompt(_) => vec![("input", "the recipe's input")],
        };
        roots
            .into_iter()
            .find(|(name, _)| *name == root)
            .map_or("not a reference root", |(_, description)| description)
    }

    fn resolve(&self, root: &str, segments: &[Seg]) -> Option<Ty> {
        match self {
            Roots::Workflow(scope) => scope.resolve(root, segments),
            Roots::Prompt(input) if root == "input" => walk(input.clone(), segments),
            Roots::Prompt(_) => None,
        }
    }
}

/// A code block of `ty` as written (an alias by its name), after `name: `
/// when given, then the alias's expansion, which says what its fields are.
fn typed_block(checked: &Checked, name: Option<&str>, ty: &Ty) -> String {
    let named = checked.analysis.env.show(ty).to_string();
    let expansion = ty.to_string();
    let label = name.map_or(String::new(), |name| format!("{name}: "));
    let mut text = format!("\n\n```flow\n{label}{named}\n```");
    if named != expansion {
        text.push_str(&format!("\n\n```flow\n{expansion}\n```"));
    }
    text
}
