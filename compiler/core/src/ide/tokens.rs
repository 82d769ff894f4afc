//! Semantic tokens: what a TextMate grammar cannot see. References are
//! highlighted by what they resolve to, inside strings as well as bare, with
//! the `{{` `}}` of templates marked, so that a template reads as code within
//! the text around it.

use crate::Checked;
use crate::diagnostic::{FileId, Span};
use crate::ide::visit;
use crate::syntax::ast::{Item, Segment, StepCall};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TokenKind {
    /// `{{` and `}}` around a template reference.
    TemplateDelimiter,
    /// `workflow_input`, `step`, `loop_item`, ...
    Root,
    /// A step id, where it is defined or referenced.
    Step,
    Field,
    Recipe,
    Type,
    McpServer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SemanticToken {
    pub span: Span,
    pub kind: TokenKind,
    /// Where the name is defined rather than used.
    pub definition: bool,
}

/// The tokens of file `file`, sorted and without overlaps.
pub fn semantic_tokens(checked: &Checked, file: FileId) -> Vec<SemanticToken> {
    let Some(loaded) = checked.files.get(file.0 as usize) else {
        return Vec::new();
    };
    let text = loaded.text.as_bytes();
    let mut tokens = Vec::new();
    let mut push = |span: Span, kind: TokenKind, definition: bool| {
        if !span.is_empty() {
            tokens.push(SemanticToken {
                span,
                kind,
                definition,
            });
        }
    };
    for item in &loaded.tree.items {
        match item {
            Item::Recipe(recipe) => push(recipe.name.span, TokenKind::Recipe, true),
            Item::Type(decl) => push(decl.name.span, TokenKind::Type, true),
            Item::Mcp(server) => push(server.name.span, TokenKind::McpServer, true),
            _ => {}
        }
        visit::type_names(item, &mut |name| push(name.span, TokenKind::Type, false));
        visit::steps(item, &mut |step| {
            push(step.id.span, TokenKind::Step, true);
            match &step.call {
                StepCall::Recipe { recipe, .. } => push(recipe.span, TokenKind::Recipe, false),
                StepCall::Browser { server, tool, .. } => {
                    push(server.span, TokenKind::McpServer, false);
                    push(tool.span, TokenKind::Field, false);
                }
                _ => {}
            }
        });
        visit::paths(item, &mut |path| {
            // A template reference is preceded by `{{` and blanks in the text.
            let mut before = path.span.start as usize;
            while before > 0 && text[before - 1].is_ascii_whitespace() {
                before -= 1;
            }
            if before >= 2 && &text[before - 2..before] == b"{{" {
                push(
                    Span::new(before - 2, before),
                    TokenKind::TemplateDelimiter,
                    false,
                );
                let mut after = path.span.end as usize;
                while after < text.len() && text[after].is_ascii_whitespace() {
                    after += 1;
                }
                if text[after..].starts_with(b"}}") {
                    push(
                        Span::new(after, after + 2),
                        TokenKind::TemplateDelimiter,
                        false,
                    );
                }
            }
            push(path.root.span, TokenKind::Root, false);
            for (index, segment) in path.segments.iter().enumerate() {
                if let Segment::Field { name, .. } = segment {
                    let kind = if index == 0 && matches!(path.root.text.as_str(), "step" | "loop") {
                        TokenKind::Step
                    } else {
                        TokenKind::Field
                    };
                    push(name.span, kind, false);
                }
            }
        });
    }
    tokens.sort();
    // Keep the first of overlapping tokens: editors refuse overlaps.
    let mut end = 0;
    tokens.retain(|token| {
        let keep = token.span.start >= end;
        if keep {
            end = token.span.end;
        }
        keep
    });
    tokens
}
