//! Walks over the syntax tree that the queries share: every reference path,
//! every step statement and every type name of an item.

use crate::syntax::ast::*;

/// Calls `f` on every reference path in `item`, bare or inside a template.
pub(crate) fn paths(item: &Item, f: &mut dyn FnMut(&Path)) {
    match item {
        // A test's values are data; its step names are not references of
        // a workflow's scope.
        Item::Import(_) | Item::Type(_) | Item::Test(_) => {}
        Item::Recipe(recipe) => {
            for lit in recipe
                .prompt
                .iter()
                .chain(&recipe.model)
                .chain(&recipe.context)
            {
                string(lit, f);
            }
        }
        Item::Mcp(server) => {
            for lit in server.command.iter().chain(&server.url) {
                string(lit, f);
            }
            for arg in &server.args {
                expr(arg, f);
            }
            if let Some(env) = &server.env {
                record(env, f);
            }
        }
        Item::Workflow(workflow) => {
            for lit in &workflow.context {
                string(lit, f);
            }
            if let Some(ErrorPolicy::Fallback(block)) = &workflow.on_error {
                stmts(&block.stmts, f);
            }
            stmts(&workflow.body, f);
            if let Some(output) = &workflow.output {
                record(output, f);
            }
            for destination in &workflow.destinations {
                match &destination.target {
                    DestinationTarget::Webhook { endpoint } => string(endpoint, f),
                    DestinationTarget::Email { to, subject, body } => {
                        for lit in to.iter().chain([subject, body]) {
                            string(lit, f);
                        }
                    }
                    DestinationTarget::Kb {
                        collection,
                        title,
                        content,
                    } => {
                        string(collection, f);
                        string(title, f);
                        expr(content, f);
                    }
                }
            }
        }
    }
}

fn stmts(stmts: &[Stmt], f: &mut dyn FnMut(&Path)) {
    for stmt in stmts {
        match stmt {
            Stmt::Step(step) => {
                match &step.call {
                    StepCall::KbWrite {
                        collection: lit, ..
                    }
                    | StepCall::Handoff {
                        department: lit, ..
                    } => string(lit, f),
                    _ => {}
                }
                record(step.call.args(), f);
                if let Some(key) = &step.options.idempotency {
                    expr(key, f);
                }
                if let Some(ErrorPolicy::Fallback(block)) = step.options.on_error.as_deref() {
                    self::stmts(&block.stmts, f);
                }
            }
            Stmt::If(stmt) => {
                for (condition, block) in &stmt.branches {
                    expr(condition, f);
                    self::stmts(&block.stmts, f);
                }
                if let Some(block) = &stmt.else_block {
                    self::stmts(&block.stmts, f);
                }
            }
            Stmt::For(stmt) => {
                expr(&stmt.collection, f);
                self::stmts(&stmt.body.stmts, f);
            }
            Stmt::Parallel(stmt) => {
                for branch in &stmt.branches {
                    self::stmts(&branch.body.stmts, f);
                }
            }
        }
    }
}

fn record(record: &RecordLit, f: &mut dyn FnMut(&Path)) {
    for field in &record.fields {
        expr(&field.value, f);
    }
}

fn string(lit: &StringLit, f: &mut dyn FnMut(&Path)) {
    for part in &lit.template.parts {
        if let TemplatePart::Ref(path) = part {
            f(path);
        }
    }
}

fn expr(expr: &Expr, f: &mut dyn FnMut(&Path)) {
    match &expr.kind {
        ExprKind::Path(path) => f(path),
        ExprKind::String(lit) => string(lit, f),
        ExprKind::List(items) => {
            for item in items {
                self::expr(item, f);
            }
        }
        ExprKind::Record(lit) => record(lit, f),
        ExprKind::Not(inner) => self::expr(inner, f),
        ExprKind::Binary(_, left, right) => {
            self::expr(left, f);
            self::expr(right, f);
        }
        ExprKind::Null
        | ExprKind::Bool(_)
        | ExprKind::Int(_)
        | ExprKind::Float(_)
        | ExprKind::Duration(_)
        | ExprKind::Error => {}
    }
}

/// Calls `f` on every step statement of `item` (a workflow), nested ones included.
pub(crate) fn steps<'t>(item: &'t Item, f: &mut dyn FnMut(&'t Step)) {
    fn walk<'t>(stmts: &'t [Stmt], f: &mut dyn FnMut(&'t Step)) {
        for stmt in stmts {
            match stmt {
                Stmt::Step(step) => {
                    f(step);
                    if let Some(ErrorPolicy::Fallback(block)) = step.options.on_error.as_deref() {
                        walk(&block.stmts, f);
                    }
                }
                Stmt::If(stmt) => {
                    for (_, block) in &stmt.branches {
                        walk(&block.stmts, f);
                    }
                    if let Some(block) = &stmt.else_block {
                        walk(&block.stmts, f);
                    }
                }
                Stmt::For(stmt) => walk(&stmt.body.stmts, f),
                Stmt::Parallel(stmt) => {
                    for branch in &stmt.branches {
                        walk(&branch.body.stmts, f);
                    }
                }
            }
        }
    }
    if let Item::Workflow(workflow) = item {
        walk(&workflow.body, f);
        if let Some(ErrorPolicy::Fallback(block)) = &workflow.on_error {
            walk(&block.stmts, f);
        }
    }
}

/// Calls `f` on every named type written in `item` (`Customer` in
/// `customer: Customer`), built-in names included.
pub(crate) fn type_names(item: &Item, f: &mut dyn FnMut(&Name)) {
    fn ty(expr: &TypeExpr, f: &mut dyn FnMut(&Name)) {
        match &expr.kind {
            TypeExprKind::Named(name) => f(name),
            TypeExprKind::List(inner) | TypeExprKind::Optional(inner) => ty(inner, f),
            TypeExprKind::Record(fields) => {
                for field in fields {
                    ty(&field.ty, f);
                }
            }
            TypeExprKind::Union(members) => {
                for member in members {
                    ty(member, f);
                }
            }
            TypeExprKind::Literal(_) => {}
        }
    }
    let record = |decl: &Option<RecordTypeDecl>, f: &mut dyn FnMut(&Name)| {
        for field in decl.iter().flat_map(|d| &d.fields) {
            ty(&field.ty, f);
        }
    };
    match item {
        Item::Type(decl) => ty(&decl.ty, f),
        Item::Recipe(recipe) => {
            record(&recipe.input, f);
            if let Some(output) = &recipe.output {
                ty(output, f);
            }
        }
        Item::Workflow(workflow) => record(&workflow.input, f),
        Item::Import(_) | Item::Mcp(_) | Item::Test(_) => {}
    }
}

/// Calls `f` on every field declaration written in `item`: members'
/// records (`input { ... }`) and record types, nested ones included.
pub(crate) fn field_decls<'i>(item: &'i Item, f: &mut dyn FnMut(&'i FieldDecl)) {
    fn ty<'i>(expr: &'i TypeExpr, f: &mut dyn FnMut(&'i FieldDecl)) {
        match &expr.kind {
            TypeExprKind::Record(fields) => fields_of(fields, f),
            TypeExprKind::List(inner) | TypeExprKind::Optional(inner) => ty(inner, f),
            TypeExprKind::Union(members) => {
                for member in members {
                    ty(member, f);
                }
            }
            TypeExprKind::Named(_) | TypeExprKind::Literal(_) => {}
        }
    }
    fn fields_of<'i>(fields: &'i [FieldDecl], f: &mut dyn FnMut(&'i FieldDecl)) {
        for field in fields {
            f(field);
            ty(&field.ty, f);
        }
    }
    match item {
        Item::Type(decl) => ty(&decl.ty, f),
        Item::Recipe(recipe) => {
            if let Some(input) = &recipe.input {
                fields_of(&input.fields, f);
            }
            if let Some(output) = &recipe.output {
                ty(output, f);
            }
        }
        Item::Workflow(workflow) => {
            if let Some(input) = &workflow.input {
                fields_of(&input.fields, f);
            }
        }
        Item::Import(_) | Item::Mcp(_) | Item::Test(_) => {}
    }
}

/// The item of the root file whose span holds offset `at`.
pub(crate) fn item_at(checked: &crate::Checked, at: u32) -> Option<&Item> {
    let items = &checked.files.first()?.tree.items;
    items.iter().find(|item| item.span().contains(at))
}
