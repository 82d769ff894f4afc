//! The compiler's kinds of tokens, completions and symbols as LSP's.

use flow_compiler::ide::{self, CompletionKind, SymbolKind as FlowSymbolKind, TokenKind};
use tower_lsp_server::ls_types::*;

use crate::convert::Encoding;
use crate::documents::Analysis;

/// The standard types, which every editor's theme colours: a flow token
/// kind is the one that reads like it in other languages.
pub(crate) const TOKEN_TYPES: &[SemanticTokenType] = &[
    SemanticTokenType::MACRO,
    SemanticTokenType::NAMESPACE,
    SemanticTokenType::VARIABLE,
    SemanticTokenType::PROPERTY,
    SemanticTokenType::FUNCTION,
    SemanticTokenType::TYPE,
    SemanticTokenType::CLASS,
    SemanticTokenType::KEYWORD,
    SemanticTokenType::STRING,
    SemanticTokenType::COMMENT,
    SemanticTokenType::NUMBER,
    SemanticTokenType::OPERATOR,
];

/// The modifiers, as bits in this order.
pub(crate) const TOKEN_MODIFIERS: &[SemanticTokenModifier] = &[
    SemanticTokenModifier::DECLARATION,
    SemanticTokenModifier::DOCUMENTATION,
];

/// The type and modifier bits of a token of `kind`: a duration is a number
/// to a theme, a doc comment a comment that documents.
pub(crate) fn token_type(kind: TokenKind) -> (u32, u32) {
    match kind {
        TokenKind::TemplateDelimiter => (0, 0),
        TokenKind::Root => (1, 0),
        TokenKind::Step => (2, 0),
        TokenKind::Field => (3, 0),
        TokenKind::Recipe => (4, 0),
        TokenKind::Type => (5, 0),
        TokenKind::McpServer => (6, 0),
        TokenKind::Keyword => (7, 0),
        TokenKind::String => (8, 0),
        TokenKind::Comment => (9, 0),
        TokenKind::DocComment => (9, 2),
        TokenKind::Number | TokenKind::Duration => (10, 0),
        TokenKind::Operator => (11, 0),
    }
}

pub(crate) fn completion_kind(kind: CompletionKind) -> CompletionItemKind {
    match kind {
        CompletionKind::Root => CompletionItemKind::MODULE,
        CompletionKind::Step => CompletionItemKind::VARIABLE,
        CompletionKind::Field => CompletionItemKind::FIELD,
        CompletionKind::Variant => CompletionItemKind::ENUM_MEMBER,
        CompletionKind::Recipe => CompletionItemKind::FUNCTION,
        CompletionKind::Argument => CompletionItemKind::PROPERTY,
        CompletionKind::McpServer => CompletionItemKind::MODULE,
        CompletionKind::Tool => CompletionItemKind::METHOD,
        CompletionKind::Loop => CompletionItemKind::VARIABLE,
        CompletionKind::Type => CompletionItemKind::CLASS,
        CompletionKind::Keyword => CompletionItemKind::KEYWORD,
    }
}

pub(crate) fn symbol_kind(kind: FlowSymbolKind) -> SymbolKind {
    match kind {
        FlowSymbolKind::Import => SymbolKind::FILE,
        FlowSymbolKind::Type => SymbolKind::STRUCT,
        FlowSymbolKind::Recipe => SymbolKind::FUNCTION,
        FlowSymbolKind::Mcp => SymbolKind::MODULE,
        FlowSymbolKind::Workflow => SymbolKind::CLASS,
        FlowSymbolKind::Step => SymbolKind::METHOD,
        FlowSymbolKind::Condition | FlowSymbolKind::Branch | FlowSymbolKind::Fallback => {
            SymbolKind::NAMESPACE
        }
        FlowSymbolKind::Loop => SymbolKind::ARRAY,
        FlowSymbolKind::Parallel => SymbolKind::EVENT,
        FlowSymbolKind::Test => SymbolKind::EVENT,
    }
}

#[allow(deprecated)] // reason: `DocumentSymbol::deprecated` must still be written
pub(crate) fn document_symbol(
    symbol: &ide::DocumentSymbol,
    analysis: &Analysis,
    encoding: Encoding,
) -> DocumentSymbol {
    let range = analysis.lines.range(&analysis.text, symbol.span, encoding);
    let selection = analysis
        .lines
        .range(&analysis.text, symbol.selection, encoding);
    DocumentSymbol {
        name: if symbol.name.is_empty() {
            "_".to_string()
        } else {
            symbol.name.clone()
        },
        detail: Some(symbol.detail.clone()),
        kind: symbol_kind(symbol.kind),
        tags: None,
        deprecated: None,
        range,
        // The selection must lie inside the range.
        selection_range: if symbol.span.start <= symbol.selection.start
            && symbol.selection.end <= symbol.span.end
        {
            selection
        } else {
            range
        },
        children: Some(
            symbol
                .children
                .iter()
                .map(|child| document_symbol(child, analysis, encoding))
                .collect(),
        ),
    }
}
