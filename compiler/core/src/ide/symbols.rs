//! Document symbols: the outline of a file, with each workflow's steps nested
//! under the conditions, loops and parallel branches that hold them.

use crate::Checked;
use crate::diagnostic::{FileId, Span};
use crate::syntax::ast::{ErrorPolicy, Item, SourceFile, StepCall, Stmt};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbolKind {
    Import,
    Type,
    Recipe,
    Mcp,
    Workflow,
    Step,
    Condition,
    Loop,
    Parallel,
    Branch,
    Fallback,
    Test,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentSymbol {
    pub name: String,
    pub detail: String,
    pub kind: SymbolKind,
    /// The whole construct.
    pub span: Span,
    /// Its name, or its keyword when it has none.
    pub selection: Span,
    pub children: Vec<DocumentSymbol>,
}

/// The outline of file `file` of `checked`.
pub fn document_symbols(checked: &Checked, file: FileId) -> Vec<DocumentSymbol> {
    checked
        .files
        .get(file.0 as usize)
        .map_or_else(Vec::new, |loaded| outline(&loaded.tree))
}

/// The outline of a file's syntax tree: what it declares is all there, so
/// a workspace-wide search parses files and checks none.
pub fn outline(tree: &SourceFile) -> Vec<DocumentSymbol> {
    tree.items
        .iter()
        .map(|item| match item {
            Item::Import(import) => leaf(
                &import.path.display_text(),
                "import",
                SymbolKind::Import,
                import.span,
                import.path.span,
            ),
            Item::Type(decl) => leaf(
                &decl.name.text,
                "type",
                SymbolKind::Type,
                decl.span,
                decl.name.span,
            ),
            Item::Recipe(recipe) => leaf(
                &recipe.name.text,
                "recipe",
                SymbolKind::Recipe,
                recipe.span,
                recipe.name.span,
            ),
            Item::Test(test) => leaf(
                &test.name.display_text(),
                "test",
                SymbolKind::Test,
                test.span,
                test.name.span,
            ),
            Item::Mcp(server) => leaf(
                &server.name.text,
                "mcp",
                SymbolKind::Mcp,
                server.span,
                server.name.span,
            ),
            Item::Workflow(workflow) => {
                let mut children = stmts(&workflow.body);
                if let Some(ErrorPolicy::Fallback(block)) = &workflow.on_error {
                    children.push(DocumentSymbol {
                        name: "on_error".to_string(),
                        detail: "fallback".to_string(),
                        kind: SymbolKind::Fallback,
                        span: block.span,
                        selection: block.span,
                        children: stmts(&block.stmts),
                    });
                }
                DocumentSymbol {
                    children,
                    ..leaf(
                        &workflow.name.text,
                        "workflow",
                        SymbolKind::Workflow,
                        workflow.span,
                        workflow.name.span,
                    )
                }
            }
        })
        .collect()
}

fn leaf(name: &str, detail: &str, kind: SymbolKind, span: Span, selection: Span) -> DocumentSymbol {
    DocumentSymbol {
        // An editor refuses a symbol with an empty name, and a declaration
        // whose name is missing (a syntax error) has one.
        name: match name.is_empty() {
            true => format!("({detail} with no name)"),
            false => name.to_string(),
        },
        detail: detail.to_string(),
        kind,
        span,
        selection,
        children: Vec::new(),
    }
}

fn stmts(stmts: &[Stmt]) -> Vec<DocumentSymbol> {
    stmts
        .iter()
        .map(|stmt| match stmt {
            Stmt::Step(step) => {
                let detail = match &step.call {
                    StepCall::Recipe { recipe, .. } => recipe.text.to_string(),
                    StepCall::Browser { server, tool, .. } => {
                        format!("{}.{}", server.text, tool.text)
                    }
                    other => other.kind_name().to_string(),
                };
                let mut symbol = leaf(
                    &step.id.text,
                    &detail,
                    SymbolKind::Step,
                    step.span,
                    step.id.span,
                );
                if let Some(ErrorPolicy::Fallback(block)) = step.options.on_error.as_deref() {
                    symbol.children.push(DocumentSymbol {
                        children: self::stmts(&block.stmts),
                        ..leaf(
                            "fallback",
                            "on_error",
                            SymbolKind::Fallback,
                            block.span,
                            block.span,
                        )
                    });
                }
                symbol
            }
            Stmt::If(stmt) => {
                let mut children = Vec::new();
                for (index, (condition, block)) in stmt.branches.iter().enumerate() {
                    let name = if index == 0 { "if" } else { "else if" };
                    children.push(DocumentSymbol {
                        children: self::stmts(&block.stmts),
                        ..leaf(
                            name,
                            "branch",
                            SymbolKind::Branch,
                            condition.span.to(block.span),
                            condition.span,
                        )
                    });
                }
                if let Some(block) = &stmt.else_block {
                    children.push(DocumentSymbol {
                        children: self::stmts(&block.stmts),
                        ..leaf("else", "branch", SymbolKind::Branch, block.span, block.span)
                    });
                }
                let keyword = Span::new(stmt.span.start as usize, stmt.span.start as usize + 2);
                DocumentSymbol {
                    children,
                    ..leaf("if", "condition", SymbolKind::Condition, stmt.span, keyword)
                }
            }
            Stmt::For(stmt) => DocumentSymbol {
                children: self::stmts(&stmt.body.stmts),
                ..leaf(
                    &stmt.id.text,
                    "for",
                    SymbolKind::Loop,
                    stmt.span,
                    stmt.id.span,
                )
            },
            Stmt::Parallel(stmt) => DocumentSymbol {
                children: stmt
                    .branches
                    .iter()
                    .map(|branch| DocumentSymbol {
                        children: self::stmts(&branch.body.stmts),
                        ..leaf(
                            &branch.name.text,
                            "branch",
                            SymbolKind::Branch,
                            branch.span,
                            branch.name.span,
                        )
                    })
                    .collect(),
                ..leaf(
                    &stmt.id.text,
                    "parallel",
                    SymbolKind::Parallel,
                    stmt.span,
                    stmt.id.span,
                )
            },
        })
        .collect()
}

/// A symbol found by a workspace-wide search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundSymbol {
    pub name: String,
    pub kind: SymbolKind,
    /// Its name in the file.
    pub span: Span,
    /// The symbol it is in (a step's workflow), if any.
    pub container: Option<String>,
}

/// The symbols of a file's outline whose name has the characters of
/// `query` in order, in any case (as editors filter), outermost first; an
/// empty query matches every one.
pub fn matching_symbols(tree: &SourceFile, query: &str) -> Vec<FoundSymbol> {
    fn walk(
        symbols: &[DocumentSymbol],
        container: Option<&str>,
        query: &[char],
        out: &mut Vec<FoundSymbol>,
    ) {
        for symbol in symbols {
            let mut wanted = query.iter().peekable();
            for c in symbol.name.chars().flat_map(char::to_lowercase) {
                if wanted.peek() == Some(&&c) {
                    wanted.next();
                }
            }
            if wanted.peek().is_none() && !symbol.name.is_empty() {
                out.push(FoundSymbol {
                    name: symbol.name.clone(),
                    kind: symbol.kind,
                    span: symbol.selection,
                    container: container.map(str::to_string),
                });
            }
            walk(&symbol.children, Some(&symbol.name), query, out);
        }
    }
    let query: Vec<char> = query.chars().flat_map(char::to_lowercase).collect();
    let mut found = Vec::new();
    walk(&outline(tree), None, &query, &mut found);
    found
}
