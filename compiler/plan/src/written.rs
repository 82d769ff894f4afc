//! Plan expressions written back as source would write them, with names
//! for slots: `compat` compares conditions across versions by this text, and
//! a graph drawn from a plan labels its conditions and loops with it.

use std::fmt::Write as _;

use crate::{BinaryOp, Expr, PathSegment, Ref, Root, Template, TemplatePart, Workflow};

/// An expression of `workflow` as source would write it, names for
/// slots: what `compat` compares across versions, and a condition's
/// label in a graph drawn from a plan.
pub fn expr(workflow: &Workflow, expr: &Expr) -> String {
    let mut out = String::new();
    write_expr(workflow, expr, &mut out);
    // The outermost operation needs no brackets.
    if matches!(expr, Expr::Binary { .. }) {
        out.pop();
        out.remove(0);
    }
    out
}

/// A length in milliseconds as source writes it, in the longest unit that
/// keeps it whole: 90000 is `90s`, 1209600000 is `14d`. Diagnostics and run
/// errors say a duration as its author wrote it, not as `90000 ms`.
pub fn duration(ms: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ];
    let (unit, per) = UNITS
        .into_iter()
        .find(|(_, per)| ms.is_multiple_of(*per) && ms > 0)
        .unwrap_or(("ms", 1));
    format!("{}{unit}", ms / per)
}

fn write_expr(workflow: &Workflow, expr: &Expr, out: &mut String) {
    match expr {
        Expr::Literal(value) => out.push_str(&value.to_string()),
        Expr::Duration(ms) => out.push_str(&duration(*ms)),
        Expr::Template(template) => {
            out.push('"');
            for part in &template.parts {
                match part {
                    TemplatePart::Text(text) => {
                        out.push_str(&text.replace('\\', "\\\\").replace('"', "\\\""));
                    }
                    TemplatePart::Ref(reference) => {
                        out.push_str("{{");
                        out.push_str(&reference_text(workflow, reference));
                        out.push_str("}}");
                    }
                }
            }
            out.push('"');
        }
        Expr::Ref(reference) => out.push_str(&reference_text(workflow, reference)),
        Expr::List(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                write_expr(workflow, item, out);
            }
            out.push(']');
        }
        Expr::Record(fields) => {
            out.push('{');
            for (index, field) in fields.iter().enumerate() {
                if index > 0 {
                    out.push_str(", ");
                }
                out.push_str(&field.name);
                out.push_str(": ");
                write_expr(workflow, &field.value, out);
            }
            out.push('}');
        }
        Expr::Not(inner) => {
            out.push_str("!(");
            write_expr(workflow, inner, out);
            out.push(')');
        }
        Expr::Binary { op, left, right } => {
            out.push('(');
            write_expr(workflow, left, out);
            let _ = write!(out, " {} ", op_text(*op));
            write_expr(workflow, right, out);
            out.push(')');
        }
    }
}

/// A reference as source writes it: `step.draft.tone`,
/// `workflow_input.items[0]`, `loop_item`.
pub fn reference_text(workflow: &Workflow, reference: &Ref) -> String {
    let slot_id = |slot: u32| {
        workflow
            .slots
            .get(slot as usize)
            .map_or("?", |s| s.id.as_str())
    };
    let mut out = match reference.root {
        Root::Input => "workflow_input".to_string(),
        Root::InputField(field) => format!(
            "workflow_input.{}",
            workflow
                .input_fields
                .get(field as usize)
                .map_or("?", String::as_str)
        ),
        Root::Step(slot) => format!("step.{}", slot_id(slot)),
        // The level is part of what is compared; people write the
        // innermost loop's item as `loop_item`.
        Root::LoopItem(level) => format!("loop_item@{level}"),
        Root::LoopIndex(level) => format!("loop_index@{level}"),
        Root::Error => "error".to_string(),
        Root::RecipeInput(field) => format!("input#{field}"),
        Root::Output => "output".to_string(),
    };
    for segment in &reference.path {
        match segment {
            PathSegment::Field(name) => {
                let _ = write!(out, "{}{name}", if reference.optional { "?." } else { "." });
            }
            PathSegment::Index(index) => {
                let _ = write!(out, "[{index}]");
            }
        }
    }
    out
}

fn op_text(op: BinaryOp) -> &'static str {
    use BinaryOp::*;
    match op {
        Coalesce => "??",
        Or => "||",
        And => "&&",
        Eq => "==",
        Ne => "!=",
        Lt => "<",
        Le => "<=",
        Gt => ">",
        Ge => ">=",
    }
}

/// A template as its string's contents: text, and references in `{{ }}`.
pub fn template(workflow: &Workflow, template: &Template) -> String {
    template
        .parts
        .iter()
        .map(|part| match part {
            TemplatePart::Text(text) => text.clone(),
            TemplatePart::Ref(reference) => {
                format!("{{{{{}}}}}", reference_text(workflow, reference))
            }
        })
        .collect()
}
