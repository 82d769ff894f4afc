//! Where the fields that a reference reads are declared: `email` in
//! `workflow_input.customer.email` is the `email: string` of the record type
//! that `customer` has, wherever that type is written (the workflow's input,
//! a `type` alias in an imported file, a recipe's output). Hover shows the
//! field's `///` docs from there, and go to definition goes there.
//!
//! The walk follows the syntax of the declarations rather than the checked
//! types, which have no spans: from the root of the path to its declared
//! record, then field by field through type expressions, aliases resolved by
//! name.

use crate::Checked;
use crate::diagnostic::{FileId, Span};
use crate::ide::visit;
use crate::syntax::ast::{
    Expr, ExprKind, FieldDecl, ForStmt, Item, Path, Segment, StepCall, Stmt, TypeExpr, TypeExprKind,
};

/// Aliases of aliases are followed this deep at most; the checker reports
/// cycles, and a file being typed may have one.
const MOST_ALIASES: usize = 32;

/// A declared field: its file and declaration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeclaredField<'c> {
    pub(crate) file: FileId,
    pub(crate) decl: &'c FieldDecl,
}

/// What a part of a path reads, as declared.
#[derive(Clone, Copy)]
enum Shape<'c> {
    /// The fields of a record written as a member (`input { ... }`).
    Fields(FileId, &'c [FieldDecl]),
    Type(FileId, &'c TypeExpr),
}

/// The declaration of segment `index` of `path`, a path in the root file,
/// when that segment is a field and its record is written in a loaded file.
pub(crate) fn declared_field<'c>(
    checked: &'c Checked,
    path: &Path,
    index: usize,
) -> Option<DeclaredField<'c>> {
    declared(checked, path, index, 0)
}

fn declared<'c>(
    checked: &'c Checked,
    path: &Path,
    index: usize,
    depth: usize,
) -> Option<DeclaredField<'c>> {
    if depth > MOST_ALIASES {
        return None;
    }
    let (mut shape, first) = root_shape(checked, path, depth)?;
    let mut found = None;
    for segment in path.segments.get(first..=index)? {
        match segment {
            Segment::Field { name, .. } => {
                let fields = fields_of(checked, shape)?;
                let decl = fields.1.iter().find(|f| f.name.text == name.text)?;
                found = Some(DeclaredField {
                    file: fields.0,
                    decl,
                });
                shape = Shape::Type(fields.0, &decl.ty);
            }
            Segment::Index { .. } => {
                found = None;
                shape = element_of(checked, shape)?;
            }
        }
    }
    found
}

/// The shape that the root of `path` reads, and the index of the first
/// segment after the root's own (`step.ID.` and `loop.ID.item.` take one
/// and two).
fn root_shape<'c>(checked: &'c Checked, path: &Path, depth: usize) -> Option<(Shape<'c>, usize)> {
    let at = path.span().start;
    let container = visit::item_at(checked, at)?;
    match (path.root.text.as_str(), container) {
        ("workflow_input", Item::Workflow(workflow)) => Some((
            Shape::Fields(FileId(0), &workflow.input.as_ref()?.fields),
            0,
        )),
        ("input", Item::Recipe(recipe)) => {
            Some((Shape::Fields(FileId(0), &recipe.input.as_ref()?.fields), 0))
        }
        ("step", Item::Workflow(_)) => {
            let Some(Segment::Field { name: id, .. }) = path.segments.first() else {
                return None;
            };
            let mut recipe = None;
            visit::steps(container, &mut |step| {
                if step.id.text == id.text
                    && let StepCall::Recipe { recipe: name, .. } = &step.call
                {
                    recipe = Some(name.text.clone());
                }
            });
            let info = checked.analysis.env.recipes.get(recipe?.as_str())?;
            Some((Shape::Type(info.file, info.decl.output.as_ref()?), 1))
        }
        ("loop_item", Item::Workflow(workflow)) => {
            let innermost = loops_around(&workflow.body, at).pop()?;
            Some((item_shape(checked, &innermost.collection, depth)?, 0))
        }
        ("loop", Item::Workflow(workflow)) => {
            let (Some(Segment::Field { name: id, .. }), Some(Segment::Field { name: item, .. })) =
                (path.segments.first(), path.segments.get(1))
            else {
                return None;
            };
            if item.text != "item" {
                return None;
            }
            let named = loops_around(&workflow.body, at)
                .into_iter()
                .rev()
                .find(|stmt| stmt.id.text == id.text)?;
            Some((item_shape(checked, &named.collection, depth)?, 2))
        }
        _ => None,
    }
}

/// The element shape of a loop's collection, when it is a reference.
fn item_shape<'c>(checked: &'c Checked, collection: &Expr, depth: usize) -> Option<Shape<'c>> {
    let ExprKind::Path(path) = &collection.kind else {
        return None;
    };
    let last = path.segments.len().checked_sub(1)?;
    let field = declared(checked, path, last, depth + 1)?;
    element_of(checked, Shape::Type(field.file, &field.decl.ty))
}

/// The loops around offset `at`, outermost first.
pub(crate) fn loops_around(stmts: &[Stmt], at: u32) -> Vec<&ForStmt> {
    let mut found = Vec::new();
    let mut level = stmts;
    'descend: loop {
        for stmt in level {
            let inner: Vec<&[Stmt]> = match stmt {
                Stmt::For(stmt) if stmt.body.span.contains(at) => {
                    found.push(&**stmt);
                    vec![&stmt.body.stmts]
                }
                Stmt::If(stmt) => stmt
                    .branches
                    .iter()
                    .map(|(_, block)| block)
                    .chain(&stmt.else_block)
                    .filter(|block| block.span.contains(at))
                    .map(|block| block.stmts.as_slice())
                    .collect(),
                Stmt::Parallel(stmt) => stmt
                    .branches
                    .iter()
                    .filter(|branch| branch.body.span.contains(at))
                    .map(|branch| branch.body.stmts.as_slice())
                    .collect(),
                Stmt::Step(step) => match step.options.on_error.as_deref() {
                    Some(crate::syntax::ast::ErrorPolicy::Fallback(block))
                        if block.span.contains(at) =>
                    {
                        vec![&block.stmts]
                    }
                    _ => Vec::new(),
                },
                Stmt::For(_) => Vec::new(),
            };
            if let Some(next) = inner.first() {
                level = next;
                continue 'descend;
            }
        }
        return found;
    }
}

/// The fields of a record shape, aliases and optionals seen through.
fn fields_of<'c>(checked: &'c Checked, shape: Shape<'c>) -> Option<(FileId, &'c [FieldDecl])> {
    let (file, mut ty) = match shape {
        Shape::Fields(file, fields) => return Some((file, fields)),
        Shape::Type(file, ty) => (file, ty),
    };
    let mut file = file;
    for _ in 0..MOST_ALIASES {
        match &ty.kind {
            TypeExprKind::Record(fields) => return Some((file, fields)),
            TypeExprKind::Optional(inner) => ty = inner,
            TypeExprKind::Named(name) => (file, ty) = alias(checked, &name.text)?,
            _ => return None,
        }
    }
    None
}

/// The element shape of a list shape, aliases and optionals seen through.
fn element_of<'c>(checked: &'c Checked, shape: Shape<'c>) -> Option<Shape<'c>> {
    let Shape::Type(mut file, mut ty) = shape else {
        return None;
    };
    for _ in 0..MOST_ALIASES {
        match &ty.kind {
            TypeExprKind::List(inner) => return Some(Shape::Type(file, inner)),
            TypeExprKind::Optional(inner) => ty = inner,
            TypeExprKind::Named(name) => (file, ty) = alias(checked, &name.text)?,
            _ => return None,
        }
    }
    None
}

/// The type expression that alias `name` stands for, and its file.
fn alias<'c>(checked: &'c Checked, name: &str) -> Option<(FileId, &'c TypeExpr)> {
    checked.files.iter().enumerate().find_map(|(index, file)| {
        file.tree.items.iter().find_map(|item| match item {
            Item::Type(decl) if decl.name.text == name => Some((FileId(index as u32), &decl.ty)),
            _ => None,
        })
    })
}

/// The reference path of the root file whose span holds `offset`.
pub(crate) fn path_at(checked: &Checked, offset: u32) -> Option<Path> {
    let mut target: Option<Path> = None;
    for item in &checked.files.first()?.tree.items {
        visit::paths(item, &mut |path| {
            if path.span().contains(offset) {
                target = Some(path.clone());
            }
        });
    }
    target
}

/// The field declaration whose name is at `offset` of file `file`.
pub(crate) fn field_decl_at(checked: &Checked, file: FileId, offset: u32) -> Option<&FieldDecl> {
    let loaded = checked.files.get(file.0 as usize)?;
    let mut found = None;
    for item in &loaded.tree.items {
        visit::field_decls(item, &mut |decl| {
            if decl.name.span.contains(offset) {
                found = Some(decl);
            }
        });
    }
    found
}

/// The span of the `as ID` name of the innermost loop around `at` in the
/// root file, which `loop_item` there is the item of.
pub(crate) fn loop_of_item(checked: &Checked, at: u32) -> Option<Span> {
    match visit::item_at(checked, at)? {
        Item::Workflow(workflow) => loops_around(&workflow.body, at).pop().map(|s| s.id.span),
        _ => None,
    }
}
