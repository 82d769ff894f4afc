//! A Mermaid flowchart of one workflow, for `flowc graph` and documentation.
//!
//! The graph is drawn from the syntax tree of the root file, not from the
//! checker's analysis, so that a workflow with errors can still be pictured
//! while it is being written. The output is a `flowchart TD`:
//!
//! * a node per step, labelled with its id and kind, shaped by kind (an
//!   approval is a hexagon, the gate the run parks at; a KB write is a
//!   cylinder; a browser action a subroutine; a handoff a flag);
//! * an `if` is a diamond with one labelled edge per branch (the condition as
//!   written) and a join node where the branches meet;
//! * a loop is a subgraph `for <collection> as <id>`;
//! * a parallel block is a fork node, one subgraph per branch, and a join;
//! * error fallbacks (a step's and the workflow's) hang off dashed edges.
//!
//! Every definition is written first and every edge last, because Mermaid puts
//! a node in the subgraph where it is first mentioned.

use std::collections::HashSet;

use crate::check::Checked;
use crate::diagnostic::Span;
use crate::syntax::ast::{
    Block, ErrorPolicy, ForStmt, IfStmt, ParallelStmt, Step, StepCall, Stmt, Workflow,
};

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
    Ok(Graph::new(&root.text).workflow(chosen))
}

/// Where control goes next: the nodes whose outgoing edge the next node takes.
#[derive(Clone)]
struct Exit {
    node: String,
    label: Option<String>,
    dashed: bool,
}

impl Exit {
    fn plain(node: &str) -> Exit {
        Exit {
            node: node.to_string(),
            label: None,
            dashed: false,
        }
    }
}

struct Graph<'s> {
    source: &'s str,
    definitions: Vec<String>,
    edges: Vec<String>,
    depth: usize,
    ids: HashSet<String>,
    ifs: usize,
}

impl<'s> Graph<'s> {
    fn new(source: &'s str) -> Graph<'s> {
        Graph {
            source,
            definitions: Vec::new(),
            edges: Vec::new(),
            depth: 1,
            ids: HashSet::new(),
            ifs: 0,
        }
    }

    fn workflow(mut self, workflow: &Workflow) -> String {
        let start = self.id("start");
        self.define(&format!(
            "{start}([\"{}\"])",
            escape(&format!("workflow {}", workflow.name.text))
        ));
        let exits = self.block(&workflow.body, vec![Exit::plain(&start)]);
        let end = self.id("end");
        self.define(&format!("{end}([\"end\"])"));
        self.connect(&exits, &end);
        if let Some(ErrorPolicy::Fallback(block)) = &workflow.on_error {
            // The handler can take over from any step: one dashed edge from the
            // start stands for all of them.
            let handler = self.id("on_error");
            self.subgraph(&handler, "on_error (workflow)", |graph| {
                graph.block(&block.stmts, Vec::new());
            });
            self.edge(&start, &handler, Some("on error"), true);
        }
        let mut out = String::from("flowchart TD\n");
        for line in self.definitions.iter().chain(&self.edges) {
            out.push_str(line);
            out.push('\n');
        }
        out
    }

    /// Draws `stmts` in sequence after `entry`; returns the block's exits.
    fn block(&mut self, stmts: &[Stmt], entry: Vec<Exit>) -> Vec<Exit> {
        stmts.iter().fold(entry, |exits, stmt| match stmt {
            Stmt::Step(step) => self.step(step, exits),
            Stmt::If(stmt) => self.if_stmt(stmt, exits),
            Stmt::For(stmt) => self.for_stmt(stmt, exits),
            Stmt::Parallel(stmt) => self.parallel(stmt, exits),
        })
    }

    fn step(&mut self, step: &Step, entry: Vec<Exit>) -> Vec<Exit> {
        let node = self.id(&format!("step_{}", step.id.text));
        let kind = match &step.call {
            StepCall::Recipe { recipe, .. } => recipe.text.clone(),
            StepCall::Approval { .. } => "approval".to_string(),
            StepCall::KbWrite { collection, .. } => {
                format!("kb_write {}", collection.display_text())
            }
            StepCall::Handoff { department, .. } => {
                format!("handoff {}", department.display_text())
            }
            StepCall::Browser { server, tool, .. } => format!("{}.{}", server.text, tool.text),
            StepCall::Broken { .. } => "?".to_string(),
        };
        let label = format!("{}<br/>{}", escape(&step.id.text), escape(&kind));
        let (open, close) = match &step.call {
            StepCall::Recipe { .. } | StepCall::Broken { .. } => ("[", "]"),
            StepCall::Approval { .. } => ("{{", "}}"),
            StepCall::KbWrite { .. } => ("[(", ")]"),
            StepCall::Handoff { .. } => (">", "]"),
            StepCall::Browser { .. } => ("[[", "]]"),
        };
        self.define(&format!("{node}{open}\"{label}\"{close}"));
        self.connect(&entry, &node);
        let mut exits = vec![Exit::plain(&node)];
        if let Some(ErrorPolicy::Fallback(block)) = &step.options.on_error {
            let handler = self.id(&format!("fallback_{}", step.id.text));
            self.subgraph(
                &handler,
                &format!("on_error fallback of {}", step.id.text),
                |graph| {
                    graph.block(&block.stmts, Vec::new());
                },
            );
            self.edge(&node, &handler, Some("on error"), true);
            // After the fallback block the run goes on with the next
            // statement: a dashed edge leaves the block for it.
            exits.push(Exit {
                node: handler,
                label: None,
                dashed: true,
            });
        }
        exits
    }

    fn if_stmt(&mut self, stmt: &IfStmt, entry: Vec<Exit>) -> Vec<Exit> {
        self.ifs += 1;
        let decision = self.id(&format!("if_{}", self.ifs));
        let join = self.id(&format!("if_{}_join", self.ifs));
        self.define(&format!("{decision}{{\"if\"}}"));
        self.connect(&entry, &decision);
        let mut exits = Vec::new();
        let branches = stmt
            .branches
            .iter()
            .map(|(condition, block)| (self.condition(condition.span), Some(block)))
            .chain(std::iter::once((
                "else".to_string(),
                stmt.else_block.as_ref(),
            )));
        for (label, block) in branches.collect::<Vec<_>>() {
            let entry = vec![Exit {
                node: decision.clone(),
                label: Some(label),
                dashed: false,
            }];
            exits.extend(match block {
                Some(Block { stmts, .. }) => self.block(stmts, entry),
                None => entry,
            });
        }
        self.define(&format!("{join}((\" \"))"));
        self.connect(&exits, &join);
        vec![Exit::plain(&join)]
    }

    fn for_stmt(&mut self, stmt: &ForStmt, entry: Vec<Exit>) -> Vec<Exit> {
        let node = self.id(&format!("loop_{}", stmt.id.text));
        let mut title = format!(
            "for {} as {}",
            self.text(stmt.collection.span),
            stmt.id.text
        );
        if let Some((limit, _)) = stmt.concurrency {
            title.push_str(&format!(" concurrency {limit}"));
        }
        self.subgraph(&node, &title, |graph| {
            graph.block(&stmt.body.stmts, Vec::new());
        });
        self.connect(&entry, &node);
        vec![Exit::plain(&node)]
    }

    fn parallel(&mut self, stmt: &ParallelStmt, entry: Vec<Exit>) -> Vec<Exit> {
        let fork = self.id(&format!("parallel_{}", stmt.id.text));
        let join = self.id(&format!("parallel_{}_join", stmt.id.text));
        self.define(&format!(
            "{fork}[/\"{}\"\\]",
            escape(&format!("parallel {}", stmt.id.text))
        ));
        self.connect(&entry, &fork);
        let mut branches = Vec::new();
        for branch in &stmt.branches {
            let node = self.id(&format!("branch_{}_{}", stmt.id.text, branch.name.text));
            self.subgraph(&node, &format!("branch {}", branch.name.text), |graph| {
                graph.block(&branch.body.stmts, Vec::new());
            });
            self.edge(&fork, &node, None, false);
            branches.push(Exit::plain(&node));
        }
        self.define(&format!(
            "{join}[\\\"{}\"/]",
            escape(&format!("join {}", stmt.id.text))
        ));
        if branches.is_empty() {
            self.edge(&fork, &join, None, false);
        }
        self.connect(&branches, &join);
        vec![Exit::plain(&join)]
    }

    fn subgraph(&mut self, id: &str, title: &str, body: impl FnOnce(&mut Self)) {
        self.define(&format!("subgraph {id}[\"{}\"]", escape(title)));
        self.depth += 1;
        body(self);
        self.depth -= 1;
        self.define("end");
    }

    fn define(&mut self, line: &str) {
        self.definitions
            .push(format!("{}{line}", "  ".repeat(self.depth)));
    }

    fn connect(&mut self, from: &[Exit], to: &str) {
        for exit in from {
            self.edge(&exit.node, to, exit.label.as_deref(), exit.dashed);
        }
    }

    fn edge(&mut self, from: &str, to: &str, label: Option<&str>, dashed: bool) {
        let arrow = if dashed { "-.->" } else { "-->" };
        let line = match label {
            Some(label) => format!("  {from} {arrow}|\"{}\"| {to}", escape(label)),
            None => format!("  {from} {arrow} {to}"),
        };
        self.edges.push(line);
    }

    /// A fresh Mermaid id from `wanted`: only `[A-Za-z0-9_]`, never a keyword
    /// (`end`, `subgraph`...: every id has a prefix), and unique, because a
    /// file with errors may repeat a step id.
    fn id(&mut self, wanted: &str) -> String {
        let base: String = wanted
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let base = format!("n_{base}");
        let mut id = base.clone();
        let mut n = 1;
        while !self.ids.insert(id.clone()) {
            n += 1;
            id = format!("{base}_{n}");
        }
        id
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

/// Escapes text for a quoted Mermaid label. Mermaid reads `#name;` as an
/// entity, so `#` goes first; `"` ends the label; `<`, `>` and `&` would be
/// read as HTML.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '#' => out.push_str("#35;"),
            '"' => out.push_str("#quot;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '&' => out.push_str("#amp;"),
            '\n' | '\r' | '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
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

    #[test]
    fn ids_are_sanitised_and_unique() {
        let mut graph = Graph::new("");
        assert_eq!(graph.id("end"), "n_end");
        assert_eq!(graph.id("end"), "n_end_2");
        assert_eq!(graph.id("a-b.c"), "n_a_b_c");
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape(r#"a "b" <c> #d"#), "a #quot;b#quot; #lt;c#gt; #35;d");
    }
}
