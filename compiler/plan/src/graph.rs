//! The shapes of a workflow's flowchart: one builder for `flowc graph`, which
//! draws from the syntax tree (so that a workflow with errors can still be
//! pictured), and for flowd's inspector, which draws a run's plan.
//!
//! Each side describes its workflow as an [`Outline`] (its steps, branches,
//! loops and parallel blocks, labels as source would write them); [`build`]
//! turns an outline into a [`Graph`]:
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
//! Each step node and loop carries the execution path the interpreter gives
//! it, with a loop's iteration written `[]` (`pages[]/visit`), so that a run's
//! journal can be laid over the graph. [`Graph::mermaid`] writes it as a
//! Mermaid `flowchart TD`.

use std::collections::HashSet;

use serde::Serialize;

use crate::{Action, Node as PlanNode, OnError, Workflow, written};

/// A workflow as a flowchart sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outline {
    pub name: String,
    pub body: Vec<Item>,
    /// The workflow's `on_error fallback` block.
    pub on_error: Option<Vec<Item>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Step {
        id: String,
        kind: StepShape,
        /// The step's `on_error fallback` block.
        fallback: Option<Vec<Item>>,
    },
    If {
        /// Each condition as written, and its block.
        branches: Vec<(String, Vec<Item>)>,
        otherwise: Option<Vec<Item>>,
    },
    Loop {
        id: String,
        /// The collection as written.
        collection: String,
        /// As written; `None` when the source gave none.
        concurrency: Option<u32>,
        body: Vec<Item>,
    },
    Parallel {
        id: String,
        branches: Vec<(String, Vec<Item>)>,
    },
}

/// What a step does, which decides its node's shape and second line.
#[derive(Debug, Clone, PartialEq)]
pub enum StepShape {
    Recipe(String),
    Approval,
    /// The collection as written.
    KbWrite(String),
    /// The department as written.
    Handoff(String),
    /// `server.tool`.
    Browser(String),
    /// A step the parser could not read.
    Unknown,
}

impl Outline {
    /// The outline of a plan's workflow; `recipes` and `servers` name the
    /// plan's recipes and MCP servers by index.
    pub fn of_plan(plan: &crate::Plan, workflow: &Workflow) -> Outline {
        let items = |nodes: &[PlanNode]| plan_items(plan, workflow, nodes);
        Outline {
            name: workflow.name.clone(),
            body: items(&workflow.body),
            on_error: match &workflow.on_error {
                OnError::Fallback(nodes) => Some(items(nodes)),
                _ => None,
            },
        }
    }
}

fn plan_items(plan: &crate::Plan, workflow: &Workflow, nodes: &[PlanNode]) -> Vec<Item> {
    let items = |nodes: &[PlanNode]| plan_items(plan, workflow, nodes);
    nodes
        .iter()
        .map(|node| match node {
            PlanNode::Step(step) => Item::Step {
                id: step.id.clone(),
                kind: match &step.action {
                    Action::Recipe { recipe, .. } => plan
                        .recipes
                        .get(*recipe as usize)
                        .map_or(StepShape::Unknown, |r| StepShape::Recipe(r.name.clone())),
                    Action::Approval(_) => StepShape::Approval,
                    Action::KbWrite(write) => {
                        StepShape::KbWrite(written::template(workflow, &write.collection))
                    }
                    Action::Handoff(handoff) => {
                        StepShape::Handoff(written::template(workflow, &handoff.department))
                    }
                    Action::Browser(browser) => {
                        let server = plan
                            .mcp_servers
                            .get(browser.server as usize)
                            .map_or("?", |s| s.name.as_str());
                        StepShape::Browser(format!("{server}.{}", browser.tool))
                    }
                },
                fallback: match &step.on_error {
                    OnError::Fallback(nodes) => Some(items(nodes)),
                    _ => None,
                },
            },
            PlanNode::Condition {
                branches,
                otherwise,
                ..
            } => Item::If {
                branches: branches
                    .iter()
                    .map(|b| (written::expr(workflow, &b.condition), items(&b.body)))
                    .collect(),
                otherwise: otherwise.as_deref().map(items),
            },
            PlanNode::Loop {
                id,
                collection,
                concurrency,
                body,
                ..
            } => Item::Loop {
                id: id.clone(),
                collection: written::expr(workflow, collection),
                // A plan writes the default of 1 too; the source seldom does.
                concurrency: (*concurrency != 1).then_some(*concurrency),
                body: items(body),
            },
            PlanNode::Parallel { id, branches, .. } => Item::Parallel {
                id: id.clone(),
                branches: branches
                    .iter()
                    .map(|b| (b.name.clone(), items(&b.body)))
                    .collect(),
            },
        })
        .collect()
}

/// A flowchart: nodes and subgraphs in the order they are defined (nested
/// as drawn), then the edges.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Graph {
    pub elements: Vec<Element>,
    pub edges: Vec<Edge>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "element", rename_all = "snake_case")]
pub enum Element {
    Node(GraphNode),
    Subgraph {
        id: String,
        title: String,
        /// A loop's execution path; `None` for other subgraphs.
        path: Option<String>,
        children: Vec<Element>,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphNode {
    /// Unique in the graph, `[A-Za-z0-9_]` only.
    pub id: String,
    pub shape: Shape,
    /// The label's lines, as text (not escaped for any format).
    pub label: Vec<String>,
    /// A step's execution path, loops' iterations written `[]`.
    pub path: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// The workflow's start and end.
    Terminal,
    /// A recipe call.
    Rectangle,
    /// An approval gate.
    Hexagon,
    /// A KB write.
    Cylinder,
    /// A handoff.
    Flag,
    /// A browser action.
    Subroutine,
    /// An `if`.
    Diamond,
    /// Where an `if`'s branches meet.
    Circle,
    /// A parallel block's start.
    Fork,
    /// A parallel block's join.
    Join,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub label: Option<String>,
    pub dashed: bool,
}

/// The graph of `outline`.
pub fn build(outline: &Outline) -> Graph {
    Builder::default().workflow(outline)
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

#[derive(Default)]
struct Builder {
    /// The subgraphs being defined, innermost last; the first is the graph.
    open: Vec<Vec<Element>>,
    edges: Vec<Edge>,
    ids: HashSet<String>,
    ifs: usize,
}

impl Builder {
    fn workflow(mut self, outline: &Outline) -> Graph {
        self.open.push(Vec::new());
        let start = self.id("start");
        self.node(
            &start,
            Shape::Terminal,
            vec![format!("workflow {}", outline.name)],
            None,
        );
        let exits = self.block(&outline.body, "", vec![Exit::plain(&start)]);
        let end = self.id("end");
        self.node(&end, Shape::Terminal, vec!["end".to_string()], None);
        self.connect(&exits, &end);
        if let Some(block) = &outline.on_error {
            // The handler can take over from any step: one dashed edge from the
            // start stands for all of them.
            let handler = self.id("on_error");
            self.subgraph(&handler, "on_error (workflow)", None, |graph| {
                graph.block(block, "on_error/", Vec::new());
            });
            self.edge(&start, &handler, Some("on error"), true);
        }
        Graph {
            elements: self.open.pop().unwrap_or_default(),
            edges: self.edges,
        }
    }

    /// Draws `items` in sequence after `entry`, their paths under `prefix`;
    /// returns the block's exits.
    fn block(&mut self, items: &[Item], prefix: &str, entry: Vec<Exit>) -> Vec<Exit> {
        items.iter().fold(entry, |exits, item| match item {
            Item::Step { id, kind, fallback } => {
                self.step(id, kind, fallback.as_deref(), prefix, exits)
            }
            Item::If {
                branches,
                otherwise,
            } => self.if_stmt(branches, otherwise.as_deref(), prefix, exits),
            Item::Loop {
                id,
                collection,
                concurrency,
                body,
            } => {
                let node = self.id(&format!("loop_{id}"));
                let mut title = format!("for {collection} as {id}");
                if let Some(limit) = concurrency {
                    title.push_str(&format!(" concurrency {limit}"));
                }
                let path = format!("{prefix}{id}[]");
                let inner = format!("{path}/");
                self.subgraph(&node, &title, Some(path), |graph| {
                    graph.block(body, &inner, Vec::new());
                });
                self.connect(&exits, &node);
                vec![Exit::plain(&node)]
            }
            Item::Parallel { id, branches } => self.parallel(id, branches, prefix, exits),
        })
    }

    fn step(
        &mut self,
        id: &str,
        kind: &StepShape,
        fallback: Option<&[Item]>,
        prefix: &str,
        entry: Vec<Exit>,
    ) -> Vec<Exit> {
        let node = self.id(&format!("step_{id}"));
        let (shape, second) = match kind {
            StepShape::Recipe(recipe) => (Shape::Rectangle, recipe.clone()),
            StepShape::Approval => (Shape::Hexagon, "approval".to_string()),
            StepShape::KbWrite(collection) => (Shape::Cylinder, format!("kb_write {collection}")),
            StepShape::Handoff(department) => (Shape::Flag, format!("handoff {department}")),
            StepShape::Browser(action) => (Shape::Subroutine, action.clone()),
            StepShape::Unknown => (Shape::Rectangle, "?".to_string()),
        };
        let path = format!("{prefix}{id}");
        self.node(
            &node,
            shape,
            vec![id.to_string(), second],
            Some(path.clone()),
        );
        self.connect(&entry, &node);
        let mut exits = vec![Exit::plain(&node)];
        if let Some(block) = fallback {
            let handler = self.id(&format!("fallback_{id}"));
            let inner = format!("{path}/fallback/");
            self.subgraph(
                &handler,
                &format!("on_error fallback of {id}"),
                None,
                |graph| {
                    graph.block(block, &inner, Vec::new());
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

    fn if_stmt(
        &mut self,
        branches: &[(String, Vec<Item>)],
        otherwise: Option<&[Item]>,
        prefix: &str,
        entry: Vec<Exit>,
    ) -> Vec<Exit> {
        self.ifs += 1;
        let decision = self.id(&format!("if_{}", self.ifs));
        let join = self.id(&format!("if_{}_join", self.ifs));
        self.node(&decision, Shape::Diamond, vec!["if".to_string()], None);
        self.connect(&entry, &decision);
        let mut exits = Vec::new();
        let arms = branches
            .iter()
            .map(|(condition, block)| (condition.clone(), Some(block.as_slice())))
            .chain(std::iter::once(("else".to_string(), otherwise)));
        for (label, block) in arms {
            let entry = vec![Exit {
                node: decision.clone(),
                label: Some(label),
                dashed: false,
            }];
            exits.extend(match block {
                Some(items) => self.block(items, prefix, entry),
                None => entry,
            });
        }
        self.node(&join, Shape::Circle, vec![" ".to_string()], None);
        self.connect(&exits, &join);
        vec![Exit::plain(&join)]
    }

    fn parallel(
        &mut self,
        id: &str,
        branches: &[(String, Vec<Item>)],
        prefix: &str,
        entry: Vec<Exit>,
    ) -> Vec<Exit> {
        let fork = self.id(&format!("parallel_{id}"));
        let join = self.id(&format!("parallel_{id}_join"));
        self.node(&fork, Shape::Fork, vec![format!("parallel {id}")], None);
        self.connect(&entry, &fork);
        let mut exits = Vec::new();
        for (name, body) in branches {
            let node = self.id(&format!("branch_{id}_{name}"));
            let inner = format!("{prefix}{id}/{name}/");
            self.subgraph(&node, &format!("branch {name}"), None, |graph| {
                graph.block(body, &inner, Vec::new());
            });
            self.edge(&fork, &node, None, false);
            exits.push(Exit::plain(&node));
        }
        self.node(&join, Shape::Join, vec![format!("join {id}")], None);
        if exits.is_empty() {
            self.edge(&fork, &join, None, false);
        }
        self.connect(&exits, &join);
        vec![Exit::plain(&join)]
    }

    fn node(&mut self, id: &str, shape: Shape, label: Vec<String>, path: Option<String>) {
        self.define(Element::Node(GraphNode {
            id: id.to_string(),
            shape,
            label,
            path,
        }));
    }

    fn subgraph(
        &mut self,
        id: &str,
        title: &str,
        path: Option<String>,
        body: impl FnOnce(&mut Self),
    ) {
        self.open.push(Vec::new());
        body(self);
        let children = self.open.pop().unwrap_or_default();
        self.define(Element::Subgraph {
            id: id.to_string(),
            title: title.to_string(),
            path,
            children,
        });
    }

    fn define(&mut self, element: Element) {
        if let Some(open) = self.open.last_mut() {
            open.push(element);
        }
    }

    fn connect(&mut self, from: &[Exit], to: &str) {
        for exit in from {
            self.edge(&exit.node, to, exit.label.as_deref(), exit.dashed);
        }
    }

    fn edge(&mut self, from: &str, to: &str, label: Option<&str>, dashed: bool) {
        self.edges.push(Edge {
            from: from.to_string(),
            to: to.to_string(),
            label: label.map(str::to_string),
            dashed,
        });
    }

    /// A fresh id from `wanted`: only `[A-Za-z0-9_]`, never a Mermaid
    /// keyword (`end`, `subgraph`...: every id has a prefix), and unique,
    /// because a file with errors may repeat a step id.
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
}

impl Graph {
    /// The graph as a Mermaid `flowchart TD`. Every definition is written
    /// first and every edge last, because Mermaid puts a node in the
    /// subgraph where it is first mentioned.
    pub fn mermaid(&self) -> String {
        let mut out = String::from("flowchart TD\n");
        write_elements(&self.elements, 1, &mut out);
        for edge in &self.edges {
            let arrow = if edge.dashed { "-.->" } else { "-->" };
            let line = match &edge.label {
                Some(label) => format!(
                    "  {} {arrow}|\"{}\"| {}",
                    edge.from,
                    mermaid_escape(label),
                    edge.to
                ),
                None => format!("  {} {arrow} {}", edge.from, edge.to),
            };
            out.push_str(&line);
            out.push('\n');
        }
        out
    }
}

fn write_elements(elements: &[Element], depth: usize, out: &mut String) {
    let indent = "  ".repeat(depth);
    for element in elements {
        match element {
            Element::Node(node) => {
                let (open, close) = match node.shape {
                    Shape::Terminal => ("([", "])"),
                    Shape::Rectangle => ("[", "]"),
                    Shape::Hexagon => ("{{", "}}"),
                    Shape::Cylinder => ("[(", ")]"),
                    Shape::Flag => (">", "]"),
                    Shape::Subroutine => ("[[", "]]"),
                    Shape::Diamond => ("{", "}"),
                    Shape::Circle => ("((", "))"),
                    Shape::Fork => ("[/", "\\]"),
                    Shape::Join => ("[\\", "/]"),
                };
                let label: Vec<String> = node.label.iter().map(|l| mermaid_escape(l)).collect();
                out.push_str(&format!(
                    "{indent}{}{open}\"{}\"{close}\n",
                    node.id,
                    label.join("<br/>")
                ));
            }
            Element::Subgraph {
                id,
                title,
                children,
                ..
            } => {
                out.push_str(&format!(
                    "{indent}subgraph {id}[\"{}\"]\n",
                    mermaid_escape(title)
                ));
                write_elements(children, depth + 1, out);
                out.push_str(&format!("{indent}end\n"));
            }
        }
    }
}

/// Escapes text for a quoted Mermaid label. Mermaid reads `#name;` as an
/// entity, so `#` goes first; `"` ends the label; `<`, `>` and `&` would be
/// read as HTML.
fn mermaid_escape(text: &str) -> String {
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

    #[test]
    fn ids_are_sanitised_and_unique() {
        let mut graph = Builder::default();
        assert_eq!(graph.id("end"), "n_end");
        assert_eq!(graph.id("end"), "n_end_2");
        assert_eq!(graph.id("a-b.c"), "n_a_b_c");
    }

    #[test]
    fn labels_are_escaped() {
        assert_eq!(
            mermaid_escape(r#"a "b" <c> #d"#),
            "a #quot;b#quot; #lt;c#gt; #35;d"
        );
    }

    #[test]
    fn paths_follow_the_interpreter() {
        let step = |id: &str, fallback| Item::Step {
            id: id.to_string(),
            kind: StepShape::Approval,
            fallback,
        };
        let outline = Outline {
            name: "w".to_string(),
            body: vec![
                step("a", Some(vec![step("b", None)])),
                Item::Loop {
                    id: "each".to_string(),
                    collection: "workflow_input.items".to_string(),
                    concurrency: None,
                    body: vec![Item::Parallel {
                        id: "p".to_string(),
                        branches: vec![("left".to_string(), vec![step("c", None)])],
                    }],
                },
            ],
            on_error: Some(vec![step("d", None)]),
        };
        let mut paths = Vec::new();
        fn walk(elements: &[Element], paths: &mut Vec<String>) {
            for element in elements {
                match element {
                    Element::Node(node) => paths.extend(node.path.clone()),
                    Element::Subgraph { path, children, .. } => {
                        paths.extend(path.clone());
                        walk(children, paths);
                    }
                }
            }
        }
        walk(&build(&outline).elements, &mut paths);
        assert_eq!(
            paths,
            [
                "a",
                "a/fallback/b",
                "each[]",
                "each[]/p/left/c",
                "on_error/d"
            ]
        );
    }
}
