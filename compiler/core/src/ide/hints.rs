//! Inlay hints: the type of each step's output after its id, and of a
//! loop's item after `as ID`, as the checker inferred them (aliases by
//! name), so that a reader sees what `step.ID.` and `loop_item.` offer.

use crate::Checked;
use crate::check::StepKind;
use crate::diagnostic::Span;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlayHint {
    /// Where the hint goes: right after the name it describes.
    pub offset: u32,
    /// `: Type`.
    pub label: String,
}

/// The hints of the root file within `range`, in source order.
pub fn inlay_hints(checked: &Checked, range: Span) -> Vec<InlayHint> {
    let env = &checked.analysis.env;
    let mut hints = Vec::new();
    let workflows = checked.analysis.workflows.iter();
    for workflow in workflows.filter(|w| w.file == crate::FileId(0)) {
        for step in &workflow.steps {
            let at = step.id_span.end;
            if at < range.start || range.end < at || step.id_span.is_empty() {
                continue;
            }
            let ty = match step.kind {
                // A loop's own output is the list of its iterations'; what
                // its body reads is the item.
                StepKind::Loop => workflow
                    .loops
                    .iter()
                    .find(|info| info.id == step.id)
                    .map(|info| format!(": item {}", env.show(&info.item))),
                // A parallel block's output repeats its branches' steps.
                StepKind::Parallel | StepKind::Unknown => None,
                _ => step
                    .output
                    .as_ref()
                    .map(|output| format!(": {}", env.show(output))),
            };
            if let Some(label) = ty {
                hints.push(InlayHint { offset: at, label });
            }
        }
    }
    hints.sort_by_key(|hint| hint.offset);
    hints
}
