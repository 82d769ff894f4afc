//! Quick fixes: the changes the checker proposes with its diagnostics, the
//! "did you mean" replacements (`Diagnostic::fix`) and the fixes that carry
//! out a hint (`Diagnostic::fixes`), offered as the checker made them.

use crate::Checked;
use crate::diagnostic::{Edit, FileId, Span};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuickFix {
    pub title: String,
    /// Non-overlapping edits in the file of the diagnostic, in source order.
    pub edits: Vec<Edit>,
    /// The code of the diagnostic it fixes.
    pub code: &'static str,
    /// Whether it is the fix an editor applies when asked for "the" fix:
    /// the one replacement the diagnostic's hint names.
    pub preferred: bool,
}

/// The fixes for the diagnostics of file `file` whose span meets `range`.
pub fn quick_fixes(checked: &Checked, file: FileId, range: Span) -> Vec<QuickFix> {
    let Some(loaded) = checked.files.get(file.0 as usize) else {
        return Vec::new();
    };
    let mut fixes = Vec::new();
    let diagnostics = checked
        .diagnostics
        .iter()
        .filter(|d| d.primary.file == file)
        .filter(|d| d.primary.span.start <= range.end && range.start <= d.primary.span.end);
    for d in diagnostics {
        let span = d.primary.span;
        if let Some(replacement) = &d.fix
            && let Some(old) = loaded.text.get(span.start as usize..span.end as usize)
        {
            fixes.push(QuickFix {
                title: format!("Replace `{old}` with `{replacement}`"),
                edits: vec![Edit {
                    span,
                    text: replacement.clone(),
                }],
                code: d.code.as_str(),
                preferred: d.fixes.is_empty(),
            });
        }
        for fix in &d.fixes {
            // A fix is only offered on the text it was made for: every edit
            // within the file, on character boundaries.
            let fits = fix.edits.iter().all(|edit| {
                edit.span.start <= edit.span.end
                    && loaded.text.is_char_boundary(edit.span.start as usize)
                    && loaded.text.is_char_boundary(edit.span.end as usize)
            });
            if fits {
                fixes.push(QuickFix {
                    title: fix.title.clone(),
                    edits: fix.edits.clone(),
                    code: d.code.as_str(),
                    preferred: d.fix.is_none() && d.fixes.len() == 1,
                });
            }
        }
    }
    fixes
}

/// `text` with the fix's edits applied.
pub fn apply(text: &str, fix: &QuickFix) -> String {
    let mut out = text.to_string();
    let mut edits = fix.edits.clone();
    edits.sort_by_key(|edit| std::cmp::Reverse((edit.span.start, edit.span.end)));
    for edit in edits {
        let range = edit.span.start as usize..edit.span.end as usize;
        if out.get(range.clone()).is_some() {
            out.replace_range(range, &edit.text);
        }
    }
    out
}
