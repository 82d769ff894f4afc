//! Quick fixes: the "did you mean" replacements the checker proposes.

use crate::Checked;
use crate::diagnostic::{FileId, Span};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuickFix {
    pub title: String,
    pub span: Span,
    pub replacement: String,
    /// The code of the diagnostic it fixes.
    pub code: &'static str,
}

/// The fixes for the diagnostics of file `file` whose span meets `range`.
pub fn quick_fixes(checked: &Checked, file: FileId, range: Span) -> Vec<QuickFix> {
    checked
        .diagnostics
        .iter()
        .filter(|d| d.primary.file == file)
        .filter(|d| d.primary.span.start <= range.end && range.start <= d.primary.span.end)
        .filter_map(|d| {
            let replacement = d.fix.clone()?;
            let text = &checked.file(file).text;
            let old = text.get(d.primary.span.start as usize..d.primary.span.end as usize)?;
            Some(QuickFix {
                title: format!("Replace `{old}` with `{replacement}`"),
                span: d.primary.span,
                replacement,
                code: d.code.as_str(),
            })
        })
        .collect()
}
