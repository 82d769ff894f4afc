//! A Mermaid flowchart of one workflow, for `flowc graph` and documentation.
//!
//! The graph is drawn from the syntax tree of the root file, not from the
//! checker's analysis, so that a workflow with errors can still be pictured
//! while it is being written. This module only reads the tree into a
//! `flow_plan::graph::Outline` (labels as written); the shapes are built by
//! `flow_plan::graph`, which also draws flowd's inspector's graph of a plan.

use flow_plan::graph::{Item, Outline, StepShape};

use crate::check::Checked;
use crate::diagnostic::Span;
use crate::syntax::ast::{Block, ErrorPolicy, StepCall, Stmt, Workflow};

/// Draws the workflow `workflow` of the root file, or its only workflow when
/// `workflow` is `None`. The error says which workflows there are.
pub fn mermaid(checked: &Checked, workflow: Option<&str>) -> Result<String, String> {
    let root = checked
        .files
        .first()
        .ok_or_else(|| "no file was loaded".to_string())?;
    let workflows: Vec<&Workflow> = root.tree.workflows().collect();
    let names = || {
        workflows
            .iter()
            .map(|w| w.name.text.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let chosen =
        match workflow {
            Some(name) => workflows
                .iter()
                .find(|w| w.name.text == name)
                .ok_or_else(|| match workflows.len() {
                    0 => format!(
                        "no workflow named `{name}`: `{}` has no workflow",
                        root.path
                    ),
                    _ => format!(
                        "no workflow named `{name}` in `{}`; its workflows are: {}",
                        root.path,
                        names()
                    ),
                })?,
            None => match workflows.as_slice() {
                [only] => only,
                [] => return Err(format!("`{}` has no workflow", root.path)),
                _ => {
                    return Err(format!(
                        "`{}` has several workflows; choose one with --workflow: {}",
                        root.path,
                        names()
                    ));
                }
            },
        };
    Ok(flow_plan::graph::build(&Source { source: &root.text }.outline(chosen)).mermaid())
}

/// The root file's text, for conditions and collections as written.
struct Source<'s> {
    source: &'s str,
}

impl Source<'_> {
    fn outline(&self, workflow: &Workflow) -> Outline {
        Outline {
            name: workflow.name.text.to_string(),
            body: self.items(&workflow.body),
            on_error: match &workflow.on_error {
                Some(ErrorPolicy::Fallback(block)) => Some(self.items(&block.stmts)),
                _ => None,
            },
        }
    }

    fn items(&self, stmts: &[Stmt]) -> Vec<Item> {
        stmts
            .iter()
            .map(|stmt| match stmt {
                Stmt::Step(step) => Item::Step {
                    id: step.id.text.to_string(),
                    kind: match &step.call {
                        StepCall::Recipe { recipe, .. } => {
                            StepShape::Recipe(recipe.text.to_string())
                        }
                        StepCall::Approval { .. } => StepShape::Approval,
                        StepCall::KbWrite { collection, .. } => {
                            StepShape::KbWrite(collection.display_text())
                        }
                        StepCall::Handoff { department, .. } => {
                            StepShape::Handoff(department.display_text())
                        }
                        StepCall::Browser { server, tool, .. } => {
                            StepShape::Browser(format!("{}.{}", server.text, tool.text))
                        }
                        StepCall::Broken { .. } => StepShape::Unknown,
                    },
                    fallback: match step.options.on_error.as_deref() {
                        Some(ErrorPolicy::Fallback(block)) => Some(self.items(&block.stmts)),
                        _ => None,
                    },
                },
                Stmt::If(stmt) => Item::If {
                    branches: stmt
                        .branches
                        .iter()
                        .map(|(condition, block)| {
                            (self.condition(condition.span), self.items(&block.stmts))
                        })
                        .collect(),
                    otherwise: stmt
                        .else_block
                        .as_ref()
                        .map(|Block { stmts, .. }| self.items(stmts)),
                },
                Stmt::For(stmt) => Item::Loop {
                    id: stmt.id.text.to_string(),
                    collection: self.text(stmt.collection.span),
                    concurrency: stmt.concurrency.map(|(limit, _)| limit as u32),
                    body: self.items(&stmt.body.stmts),
                },
                Stmt::Parallel(stmt) => Item::Parallel {
                    id: stmt.id.text.to_string(),
                    branches: stmt
                        .branches
                        .iter()
                        .map(|branch| {
                            (branch.name.text.to_string(), self.items(&branch.body.stmts))
                        })
                        .collect(),
                },
            })
            .collect()
    }

    /// The text of a condition as written. The span of an expression that
    /// starts or ends with a parenthesised operand leaves out the outer
    /// parentheses, so the span is widened over the parentheses around it.
    fn condition(&self, span: Span) -> String {
        let bytes = self.source.as_bytes();
        let is_paren_or_space = |b: u8| b == b'(' || b == b')' || b.is_ascii_whitespace();
        let mut start = (span.start as usize).min(bytes.len());
        while start > 0 && is_paren_or_space(bytes[start - 1]) && bytes[start - 1] != b')' {
            start -= 1;
        }
        let mut end = (span.end as usize).clamp(start, bytes.len());
        while end < bytes.len() && is_paren_or_space(bytes[end]) && bytes[end] != b'(' {
            end += 1;
        }
        // Only the parentheses that balance the condition belong to it.
        let mut text = self.text(Span::new(start, end));
        loop {
            let opens = text.matches('(').count();
            let closes = text.matches(')').count();
            if opens > closes && text.starts_with('(') {
                text.remove(0);
            } else if closes > opens && text.ends_with(')') {
                text.pop();
            } else {
                break;
            }
            text = text.trim().to_string();
        }
        text
    }

    /// The source text of a span on one line, with runs of whitespace
    /// (newlines of a long condition) collapsed.
    fn text(&self, span: Span) -> String {
        let text = self
            .source
            .get(span.start as usize..span.end as usize)
            .unwrap_or("?");
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::check_source;

    const EVERY_CONSTRUCT: &str = r#"
mcp browser { command "npx" args ["@playwright/mcp"] }

recipe classify {
  model "fast"
  input { text: string }
  output { urgency: int, tags: list<string> }
  prompt "Classify {{input.text}}"
}

workflow triage {
  input { text: string, items: list<{ url: string }> }
  on_error fallback {
    step page = handoff "oncall" { message: "failed: {{error.message}}" } idempotency "p"
  }

  step first = classify { text: workflow_input.text }
    on_error fallback {
      step apologise = handoff "support" { message: "classification failed" } idempotency "a"
    }

  if step.first?.urgency ?? 0 >= 4 && workflow_input.text != "say \"hi\"" {
    step gate = approval { approvers: ["leads"], message: "Go?" }
  } else if (step.first?.urgency ?? 0) < 2 {
    step note = kb_write "notes" { title: "low", content: workflow_input.text } idempotency "n"
  }

  for workflow_input.items as pages concurrency 2 {
    step visit = browser.browser_navigate { url: loop_item.url } idempotency "{{loop_item.url}}"
  }

  parallel lookups {
    branch left { step l = classify { text: "left" } }
    branch right {
      step r = classify { text: "right" }
      step r2 = classify { text: "again" }
    }
  }
}
"#;

    #[test]
    fn every_construct() {
        let checked = check_source("every.flow", EVERY_CONSTRUCT);
        let graph = mermaid(&checked, None).expect("one workflow");
        insta::assert_snapshot!(graph);
    }

    #[test]
    fn workflow_by_name() {
        let source = "workflow a { step x = approval { approvers: [\"l\"], message: \"m\" } }\nworkflow b { }\n";
        let checked = check_source("two.flow", source);
        assert!(mermaid(&checked, Some("b")).is_ok());
        let unnamed = mermaid(&checked, None).unwrap_err();
        assert!(unnamed.contains("a, b"), "{unnamed}");
        let unknown = mermaid(&checked, Some("c")).unwrap_err();
        assert!(unknown.contains("no workflow named `c`"), "{unknown}");
    }

    /// The inspector draws a run's plan with the builder `flowc graph` uses:
    /// the same nodes, shapes, paths and edges; only conditions and
    /// collections are written from the plan's expressions.
    #[test]
    fn a_plan_draws_the_same_shapes() {
        use flow_plan::graph::{Element, Graph};
        fn shapes(elements: &[Element], out: &mut Vec<String>) {
            for element in elements {
                match element {
                    Element::Node(node) => out.push(format!(
                        "{} {:?} {} {:?}",
                        node.id, node.shape, node.label[0], node.path
                    )),
                    Element::Subgraph {
                        id, path, children, ..
                    } => {
                        out.push(format!("{id} {path:?} ["));
                        shapes(children, out);
                        out.push("]".to_string());
                    }
                }
            }
        }
        let outline = |graph: &Graph| {
            let mut out = Vec::new();
            shapes(&graph.elements, &mut out);
            let edges: Vec<_> = graph
                .edges
                .iter()
                .map(|e| (e.from.clone(), e.to.clone(), e.dashed))
                .collect();
            (out, edges)
        };
        // `??` binds looser than `>=`: the snapshot's source does not check.
        let source = EVERY_CONSTRUCT.replace(
            "if step.first?.urgency ?? 0 >= 4",
            "if (step.first?.urgency ?? 0) >= 4",
        );
        let checked = check_source("every.flow", &source);
        let root = &checked.files[0];
        let workflow = root.tree.workflows().next().expect("a workflow");
        let from_source = flow_plan::graph::build(&Source { source: &root.text }.outline(workflow));
        let errors: Vec<_> = checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.message.clone())
            .collect();
        assert!(errors.is_empty(), "{errors:?}");
        let plan = crate::lower::lower(&checked).expect("the example lowers");
        let from_plan = flow_plan::graph::build(&Outline::of_plan(&plan, &plan.workflows[0]));
        assert_eq!(outline(&from_source), outline(&from_plan));
        assert_eq!(from_source.mermaid(), mermaid(&checked, None).unwrap());
    }
}
