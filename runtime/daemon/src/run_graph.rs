//! A run's graph for the inspector (`GET /v1/runs/{id}/graph`): the
//! workflow's flowchart from the run's plan, built by `flow_plan::graph`
//! (the shapes `flowc graph` draws), laid out here and marked with the path
//! the run took and where it is now.
//!
//! The layout follows the graph's nesting: a subgraph (a loop, a parallel
//! branch, a fallback block) is laid out inside its box first; in each
//! container its children go in rows by their longest distance from the
//! container's first element along the graph's edges, side by side within a
//! row, rows centred. Edges are drawn from the bottom of their source to the
//! top of their target with one horizontal run just above the target. Sizes
//! are counted in characters of the page's monospace font, so the server
//! needs no font metrics; the page draws what it is given as SVG.

use std::collections::{HashMap, HashSet};

use flow_plan::graph::{Element, Graph, GraphNode, Shape};
use flow_runtime::journal::{StepRecord, StepStatus};
use serde::Serialize;
use utoipa::ToSchema;

/// The width of a character of the page's 12 px monospace font.
const CHAR_WIDTH: f64 = 7.3;
const LINE_HEIGHT: f64 = 16.0;
/// Space between elements of a row and between rows.
const GAP_X: f64 = 24.0;
const GAP_Y: f64 = 36.0;
/// A subgraph's margin around its contents, and the height of its title.
const FRAME_PAD: f64 = 12.0;
const FRAME_TITLE: f64 = 20.0;
/// A label longer than this is cut, with `…`; the whole is in `full`.
const MAX_LABEL_CHARS: usize = 40;

/// The graph of one run, laid out.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunGraph {
    run_id: String,
    workflow: String,
    width: f64,
    height: f64,
    nodes: Vec<LaidNode>,
    /// Subgraphs, outermost first, so that drawing in order puts inner
    /// frames over outer ones.
    frames: Vec<Frame>,
    edges: Vec<LaidEdge>,
}

/// Whether the run went through an element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Mark {
    /// Not (yet) reached.
    NotTaken,
    /// The run went through it.
    Taken,
    /// Where the run is: a gate it is parked at, a step between attempts.
    Current,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LaidNode {
    id: String,
    /// `terminal`, `rectangle`, `hexagon`, `cylinder`, `flag`,
    /// `subroutine`, `diamond`, `circle`, `fork` or `join`.
    shape: String,
    /// The label's lines, each at most 40 characters.
    label: Vec<String>,
    /// A step's execution path, loop iterations written `[]`.
    path: Option<String>,
    mark: Mark,
    /// The statuses of the step's records (one per loop iteration), in
    /// the order recorded.
    statuses: Vec<String>,
    x: f64,
    y: f64,
    width: f64,
    height: f64,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Frame {
    id: String,
    title: String,
    /// The whole title when `title` was cut.
    full: String,
    path: Option<String>,
    mark: Mark,
    x: f64,
    y: f64,
    width: f64,
    height: f64,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LaidEdge {
    from: String,
    to: String,
    /// Cut to 40 characters; the whole is in `full`.
    label: Option<String>,
    full: Option<String>,
    dashed: bool,
    taken: bool,
    /// The polyline, `[x, y]` pairs.
    points: Vec<[f64; 2]>,
}

/// Lays out `graph` and marks it with `records`, the run's journal; `ended`
/// says whether the run completed (which takes it to the end node).
pub(crate) fn run_graph(
    run_id: &str,
    workflow: &str,
    graph: &Graph,
    records: &[StepRecord],
    completed: bool,
) -> RunGraph {
    let mut layout = Layout {
        edges: graph
            .edges
            .iter()
            .map(|e| (e.from.clone(), e.to.clone()))
            .collect(),
        ..Layout::default()
    };
    let size = layout.size(ROOT, &graph.elements);
    layout.place(ROOT, &graph.elements, 0.0, 0.0, size.0);
    let marks = Marks::new(graph, records, completed);
    let mut nodes = Vec::new();
    let mut frames = Vec::new();
    collect(&graph.elements, &layout, &marks, &mut nodes, &mut frames);
    let edges = graph
        .edges
        .iter()
        .map(|edge| {
            let (fx, fy, fw, fh) = layout.boxes[&edge.from];
            let (tx, ty, tw, _) = layout.boxes[&edge.to];
            let (x1, y1) = (fx + fw / 2.0, fy + fh);
            let (x2, y2) = (tx + tw / 2.0, ty);
            let turn = (y2 - GAP_Y / 3.0).max(y1);
            let points = match layout.in_the_way(&edge.from, &edge.to, x1, y1, turn) {
                // Past the elements in the way, on their right: an edge
                // that skips rows (an empty `else`) would cross them.
                Some(right) => {
                    let side = right + GAP_X / 2.0;
                    let leave = y1 + GAP_Y / 3.0;
                    vec![
                        [x1, y1],
                        [x1, leave],
                        [side, leave],
                        [side, turn],
                        [x2, turn],
                        [x2, y2],
                    ]
                }
                None => vec![[x1, y1], [x1, turn], [x2, turn], [x2, y2]],
            };
            LaidEdge {
                from: edge.from.clone(),
                to: edge.to.clone(),
                label: edge.label.as_deref().map(cut),
                full: edge.label.clone(),
                dashed: edge.dashed,
                taken: marks.edge_taken(graph, &edge.from, &edge.to),
                points,
            }
        })
        .collect();
    RunGraph {
        run_id: run_id.to_string(),
        workflow: workflow.to_string(),
        width: size.0,
        height: size.1,
        nodes,
        frames,
        edges,
    }
}

fn cut(text: &str) -> String {
    if text.chars().count() <= MAX_LABEL_CHARS {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(MAX_LABEL_CHARS - 1).collect();
    cut.push('…');
    cut
}

fn shape_name(shape: Shape) -> String {
    serde_json::to_value(shape)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn element_id(element: &Element) -> &str {
    match element {
        Element::Node(node) => &node.id,
        Element::Subgraph { id, .. } => id,
    }
}

fn collect(
    elements: &[Element],
    layout: &Layout,
    marks: &Marks,
    nodes: &mut Vec<LaidNode>,
    frames: &mut Vec<Frame>,
) {
    for element in elements {
        let (x, y, width, height) = layout.boxes[element_id(element)];
        match element {
            Element::Node(node) => nodes.push(LaidNode {
                id: node.id.clone(),
                shape: shape_name(node.shape),
                label: node.label.iter().map(|l| cut(l)).collect(),
                path: node.path.clone(),
                mark: marks.of(&node.id),
                statuses: node
                    .path
                    .as_deref()
                    .map(|path| marks.statuses(path))
                    .unwrap_or_default(),
                x,
                y,
                width,
                height,
            }),
            Element::Subgraph {
                id,
                title,
                path,
                children,
            } => {
                frames.push(Frame {
                    id: id.clone(),
                    title: cut(title),
                    full: title.clone(),
                    path: path.clone(),
                    mark: marks.of(id),
                    x,
                    y,
                    width,
                    height,
                });
                collect(children, layout, marks, nodes, frames);
            }
        }
    }
}

/// Boxes by element id: first each element's size, then its place.
#[derive(Default)]
struct Layout {
    edges: Vec<(String, String)>,
    sizes: HashMap<String, (f64, f64)>,
    /// Each container's rows (the ids of its children by row), by the
    /// container's id.
    rows: HashMap<String, Vec<Vec<String>>>,
    boxes: HashMap<String, (f64, f64, f64, f64)>,
}

/// The key of the graph's outermost container in `Layout::rows`.
const ROOT: &str = "";

impl Layout {
    /// Sizes the children of the container `key`, then their rows; answers
    /// the container's inner size.
    fn size(&mut self, key: &str, elements: &[Element]) -> (f64, f64) {
        for element in elements {
            let size = match element {
                Element::Node(node) => node_size(node.shape, &node.label),
                Element::Subgraph {
                    id,
                    title,
                    children,
                    ..
                } => {
                    let (w, h) = self.size(id, children);
                    let title_width = cut(title).chars().count() as f64 * CHAR_WIDTH;
                    (
                        w.max(title_width) + 2.0 * FRAME_PAD,
                        h + FRAME_TITLE + 2.0 * FRAME_PAD,
                    )
                }
            };
            self.sizes.insert(element_id(element).to_string(), size);
        }
        let rows = rows(elements, &self.edges);
        let mut width: f64 = 0.0;
        let mut height: f64 = 0.0;
        for (index, row) in rows.iter().enumerate() {
            width = width.max(self.row_width(row));
            height += self.row_height(row);
            if index > 0 {
                height += GAP_Y;
            }
        }
        self.rows.insert(key.to_string(), rows);
        (width, height)
    }

    fn row_width(&self, row: &[String]) -> f64 {
        row.iter().map(|id| self.sizes[id].0).sum::<f64>()
            + GAP_X * row.len().saturating_sub(1) as f64
    }

    fn row_height(&self, row: &[String]) -> f64 {
        row.iter().map(|id| self.sizes[id].1).fold(0.0, f64::max)
    }

    /// Places the children of the container `key` from its inner top-left
    /// corner, rows centred in `width`.
    fn place(&mut self, key: &str, elements: &[Element], left: f64, top: f64, width: f64) {
        let rows = self.rows.get(key).cloned().unwrap_or_default();
        let mut y = top;
        for row in rows {
            let row_height = self.row_height(&row);
            let mut x = left + (width - self.row_width(&row)) / 2.0;
            for id in row {
                let (w, h) = self.sizes[&id];
                // Vertically centred in the row, so a branch's short
                // elements line up with its neighbours' middles.
                let element_top = y + (row_height - h) / 2.0;
                self.boxes.insert(id.clone(), (x, element_top, w, h));
                if let Some(Element::Subgraph { children, .. }) =
                    elements.iter().find(|e| element_id(e) == id)
                {
                    self.place(
                        &id,
                        children,
                        x + FRAME_PAD,
                        element_top + FRAME_PAD + FRAME_TITLE,
                        w - 2.0 * FRAME_PAD,
                    );
                }
                x += w + GAP_X;
            }
            y += row_height + GAP_Y;
        }
    }
}

impl Layout {
    /// The right edge of the elements that the vertical line at `x` from
    /// `top` to `bottom` would cross, when any does: boxes other than the
    /// edge's ends and the frames around either.
    fn in_the_way(&self, from: &str, to: &str, x: f64, top: f64, bottom: f64) -> Option<f64> {
        let ends = [self.boxes[from], self.boxes[to]];
        let contains = |outer: &(f64, f64, f64, f64), inner: &(f64, f64, f64, f64)| {
            outer.0 <= inner.0
                && outer.1 <= inner.1
                && inner.0 + inner.2 <= outer.0 + outer.2
                && inner.1 + inner.3 <= outer.1 + outer.3
        };
        self.boxes
            .iter()
            .filter(|(id, _)| id.as_str() != from && id.as_str() != to)
            .map(|(_, b)| b)
            .filter(|b| !ends.iter().any(|end| contains(b, end)))
            .filter(|b| b.0 < x && x < b.0 + b.2 && top < b.1 + b.3 && b.1 < bottom)
            .map(|b| b.0 + b.2)
            .reduce(f64::max)
    }
}

/// A node's size: its longest line's width, and a line height per line,
/// with room for the shape's slanted or rounded sides.
fn node_size(shape: Shape, label: &[String]) -> (f64, f64) {
    let chars = label
        .iter()
        .map(|line| cut(line).chars().count())
        .max()
        .unwrap_or(0) as f64;
    let lines = label.len().max(1) as f64;
    match shape {
        Shape::Circle => (18.0, 18.0),
        Shape::Diamond => (chars * CHAR_WIDTH + 40.0, LINE_HEIGHT * lines + 24.0),
        Shape::Hexagon | Shape::Fork | Shape::Join | Shape::Flag => {
            (chars * CHAR_WIDTH + 44.0, LINE_HEIGHT * lines + 14.0)
        }
        _ => (chars * CHAR_WIDTH + 28.0, LINE_HEIGHT * lines + 14.0),
    }
}

/// The rows of one container: each child's row is its longest distance
/// from the container's start along edges between the container's
/// children (an edge between elements nested in two children counts as
/// one between them). The graph's edges all point forward, so this is a
/// longest path in a DAG; a child no edge reaches stays in row 0.
fn rows(elements: &[Element], edges: &[(String, String)]) -> Vec<Vec<String>> {
    let ids: Vec<String> = elements.iter().map(|e| element_id(e).to_string()).collect();
    // Every id at any depth below each child, to map edge ends.
    let mut child_of: HashMap<String, usize> = HashMap::new();
    fn under(element: &Element, index: usize, into: &mut HashMap<String, usize>) {
        into.insert(element_id(element).to_string(), index);
        if let Element::Subgraph { children, .. } = element {
            for child in children {
                under(child, index, into);
            }
        }
    }
    for (index, element) in elements.iter().enumerate() {
        under(element, index, &mut child_of);
    }
    let mut rank = vec![0usize; elements.len()];
    // Longest path by relaxation: at most one pass per element, since the
    // children are in definition order and every edge points forward.
    for _ in 0..elements.len() {
        let mut changed = false;
        for (from, to) in edges {
            if let (Some(&a), Some(&b)) = (child_of.get(from), child_of.get(to))
                && a != b
                && rank[b] < rank[a] + 1
            {
                rank[b] = rank[a] + 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (index, id) in ids.into_iter().enumerate() {
        let row = rank[index];
        if rows.len() <= row {
            rows.resize(row + 1, Vec::new());
        }
        rows[row].push(id);
    }
    rows.retain(|row| !row.is_empty());
    rows
}

/// Which elements the run went through.
struct Marks {
    marks: HashMap<String, Mark>,
    /// Record statuses by path pattern (loop indices as `[]`).
    statuses: HashMap<String, Vec<String>>,
    /// The `if` diamonds and the joins where their arms meet, so that an
    /// edge straight from one to the other is taken only when no arm was.
    diamonds: HashSet<String>,
    joins: HashSet<String>,
}

impl Marks {
    fn new(graph: &Graph, records: &[StepRecord], completed: bool) -> Marks {
        let mut statuses: HashMap<String, Vec<String>> = HashMap::new();
        let mut current: HashSet<String> = HashSet::new();
        for record in records {
            let pattern = pattern(&record.path);
            statuses
                .entry(pattern.clone())
                .or_default()
                .push(record.status.as_str().to_string());
            if matches!(record.status, StepStatus::Pending | StepStatus::Retrying) {
                current.insert(pattern);
            }
        }
        let mut marks: HashMap<String, Mark> = HashMap::new();
        let mut structural = HashSet::new();
        let mut diamonds = HashSet::new();
        let mut joins = HashSet::new();
        let mut nodes = Vec::new();
        nodes_in(&graph.elements, &mut Vec::new(), &mut nodes);
        for (node, chain) in nodes {
            match &node.path {
                Some(path) => {
                    let mark = if current.contains(path) {
                        Mark::Current
                    } else if statuses.contains_key(path) {
                        Mark::Taken
                    } else {
                        Mark::NotTaken
                    };
                    marks.insert(node.id.clone(), mark);
                    // A subgraph is taken when a step inside it is.
                    if mark != Mark::NotTaken {
                        for subgraph in chain {
                            marks.insert(subgraph, Mark::Taken);
                        }
                    }
                }
                None => {
                    structural.insert(node.id.clone());
                    match node.shape {
                        Shape::Diamond => diamonds.insert(node.id.clone()),
                        Shape::Circle => joins.insert(node.id.clone()),
                        _ => false,
                    };
                }
            }
        }
        // The start always; the end once the run completed.
        if let Some(Element::Node(start)) = graph.elements.first() {
            marks.insert(start.id.clone(), Mark::Taken);
        }
        if completed {
            for element in &graph.elements {
                if let Element::Node(node) = element
                    && node.shape == Shape::Terminal
                {
                    marks.insert(node.id.clone(), Mark::Taken);
                }
            }
        }
        // A structural node (a diamond, a join, a fork) is taken when a
        // taken element reaches it and it reaches a taken element, through
        // structural nodes only.
        let taken = |marks: &HashMap<String, Mark>, id: &str| {
            marks.get(id).is_some_and(|m| *m != Mark::NotTaken)
        };
        let reach = |forward: bool, marks: &HashMap<String, Mark>| {
            let mut found: HashSet<String> = HashSet::new();
            let mut frontier: Vec<String> = graph
                .edges
                .iter()
                .filter_map(|e| {
                    let (from, to) = if forward {
                        (&e.from, &e.to)
                    } else {
                        (&e.to, &e.from)
                    };
                    (taken(marks, from) && structural.contains(to)).then(|| to.clone())
                })
                .collect();
            while let Some(id) = frontier.pop() {
                if !found.insert(id.clone()) {
                    continue;
                }
                for edge in &graph.edges {
                    let (from, to) = if forward {
                        (&edge.from, &edge.to)
                    } else {
                        (&edge.to, &edge.from)
                    };
                    if *from == id && structural.contains(to) {
                        frontier.push(to.clone());
                    }
                }
            }
            found
        };
        let after = reach(true, &marks);
        let before = reach(false, &marks);
        for id in after.intersection(&before) {
            marks.insert(id.clone(), Mark::Taken);
        }
        Marks {
            marks,
            statuses,
            diamonds,
            joins,
        }
    }

    fn of(&self, id: &str) -> Mark {
        self.marks.get(id).copied().unwrap_or(Mark::NotTaken)
    }

    fn statuses(&self, path: &str) -> Vec<String> {
        self.statuses.get(path).cloned().unwrap_or_default()
    }

    /// An edge is taken when both its ends are; out of an `if`, an edge
    /// straight to its join (an arm with no steps, or no `else`) is taken
    /// only when no other arm was.
    fn edge_taken(&self, graph: &Graph, from: &str, to: &str) -> bool {
        let taken = |id: &str| self.of(id) != Mark::NotTaken;
        if !taken(from) || !taken(to) {
            return false;
        }
        if self.diamonds.contains(from) && self.joins.contains(to) {
            let other_arm = graph.edges.iter().any(|e| {
                e.from == from && e.to != to && taken(&e.to) && !self.joins.contains(&e.to)
            });
            return !other_arm;
        }
        true
    }
}

/// Every node at any depth, with the ids of the subgraphs around it.
fn nodes_in<'g>(
    elements: &'g [Element],
    chain: &mut Vec<String>,
    out: &mut Vec<(&'g GraphNode, Vec<String>)>,
) {
    for element in elements {
        match element {
            Element::Node(node) => out.push((node, chain.clone())),
            Element::Subgraph { id, children, .. } => {
                chain.push(id.clone());
                nodes_in(children, chain, out);
                chain.pop();
            }
        }
    }
}

/// A record's path with each loop iteration's index left out: `each[2]/a`
/// is `each[]/a`, the path a graph's node carries.
fn pattern(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push('[');
            }
            ']' => {
                in_index = false;
                out.push(']');
            }
            _ if in_index => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use flow_plan::StepKind;
    use flow_plan::graph::{Item, Outline, StepShape, build};
    use serde_json::Value;

    use super::*;

    fn step(id: &str, kind: StepShape) -> Item {
        Item::Step {
            id: id.to_string(),
            kind,
            fallback: None,
        }
    }

    fn record(path: &str, status: StepStatus) -> StepRecord {
        StepRecord {
            path: path.to_string(),
            step_id: path.rsplit('/').next().unwrap_or(path).to_string(),
            kind: StepKind::Recipe,
            status,
            input: Value::Null,
            output: None,
            error: None,
            attempts: Vec::new(),
            started_ms: 1,
            ended_ms: 2,
            round: 0,
        }
    }

    /// `a`, an `if` whose only arm (`b`) was not taken, a gate `c` the run
    /// is parked at, a loop `each` over `d`, then `e`.
    fn parked() -> RunGraph {
        let recipe = || StepShape::Recipe("r".to_string());
        let outline = Outline {
            name: "w".to_string(),
            body: vec![
                step("a", recipe()),
                Item::If {
                    branches: vec![("workflow_input.x".to_string(), vec![step("b", recipe())])],
                    otherwise: None,
                },
                step("c", StepShape::Approval),
                Item::Loop {
                    id: "each".to_string(),
                    collection: "workflow_input.items".to_string(),
                    concurrency: None,
                    body: vec![step("d", recipe())],
                },
                step("e", recipe()),
            ],
            on_error: None,
        };
        let records = [
            record("a", StepStatus::Completed),
            record("c", StepStatus::Pending),
        ];
        run_graph("r1", "w", &build(&outline), &records, false)
    }

    fn node<'g>(graph: &'g RunGraph, id: &str) -> &'g LaidNode {
        graph.nodes.iter().find(|n| n.id == id).expect(id)
    }

    #[test]
    fn the_run_s_path_and_position_are_marked() {
        let graph = parked();
        let marks: Vec<(&str, Mark)> = graph
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.mark))
            .collect();
        assert_eq!(
            marks,
            [
                ("n_start", Mark::Taken),
                ("n_step_a", Mark::Taken),
                ("n_if_1", Mark::Taken),
                ("n_step_b", Mark::NotTaken),
                ("n_if_1_join", Mark::Taken),
                ("n_step_c", Mark::Current),
                ("n_step_d", Mark::NotTaken),
                ("n_step_e", Mark::NotTaken),
                ("n_end", Mark::NotTaken),
            ]
        );
        assert_eq!(node(&graph, "n_step_c").statuses, ["pending"]);
        assert_eq!(graph.frames[0].mark, Mark::NotTaken);
        let taken = |from: &str, to: &str| {
            graph
                .edges
                .iter()
                .find(|e| e.from == from && e.to == to)
                .map(|e| e.taken)
                .expect("an edge")
        };
        assert!(!taken("n_if_1", "n_step_b"), "the arm not taken");
        assert!(taken("n_if_1", "n_if_1_join"), "the way around it");
        assert!(taken("n_if_1_join", "n_step_c"));
        assert!(!taken("n_step_c", "n_loop_each"));
    }

    #[test]
    fn elements_do_not_overlap_and_skipping_edges_go_around() {
        let graph = parked();
        let boxes: Vec<(f64, f64, f64, f64)> = graph
            .nodes
            .iter()
            .map(|n| (n.x, n.y, n.width, n.height))
            .chain(graph.frames.iter().map(|f| (f.x, f.y, f.width, f.height)))
            .collect();
        let inside = |a: &(f64, f64, f64, f64), b: &(f64, f64, f64, f64)| {
            b.0 <= a.0 && b.1 <= a.1 && a.0 + a.2 <= b.0 + b.2 && a.1 + a.3 <= b.1 + b.3
        };
        for (i, a) in boxes.iter().enumerate() {
            assert!(a.0 >= 0.0 && a.1 >= 0.0 && a.0 + a.2 <= graph.width + 0.01);
            for b in &boxes[i + 1..] {
                let apart =
                    a.0 + a.2 <= b.0 || b.0 + b.2 <= a.0 || a.1 + a.3 <= b.1 || b.1 + b.3 <= a.1;
                assert!(
                    apart || inside(a, b) || inside(b, a),
                    "{a:?} overlaps {b:?}"
                );
            }
        }
        // Each element below the one before it: a straight sequence.
        let tops: Vec<f64> = [
            "n_start",
            "n_step_a",
            "n_if_1",
            "n_step_b",
            "n_if_1_join",
            "n_step_c",
        ]
        .iter()
        .map(|id| node(&graph, id).y)
        .collect();
        assert!(tops.windows(2).all(|w| w[0] < w[1]), "{tops:?}");
        let around = graph
            .edges
            .iter()
            .find(|e| e.from == "n_if_1" && e.to == "n_if_1_join")
            .expect("the else edge");
        let b = node(&graph, "n_step_b");
        assert!(
            around.points.iter().any(|p| p[0] > b.x + b.width),
            "the else edge passes right of b: {:?}",
            around.points
        );
    }

    /// Every example's workflow lays out without overlaps, with each node
    /// inside the picture: fallbacks, nested ifs, loops and parallels.
    #[test]
    fn the_examples_lay_out() {
        let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
        let mut files = std::collections::BTreeMap::new();
        for folder in [examples.clone(), examples.join("recipes")] {
            for entry in std::fs::read_dir(&folder).expect("examples/ lists") {
                let path = entry.expect("an entry").path();
                if path.extension().is_some_and(|e| e == "flow") {
                    let name = path.strip_prefix(&examples).unwrap().display().to_string();
                    files.insert(name, std::fs::read_to_string(&path).unwrap());
                }
            }
        }
        let roots: Vec<String> = files
            .keys()
            .filter(|name| !name.contains('/') && !name.ends_with(".test.flow"))
            .cloned()
            .collect();
        assert!(roots.len() >= 4, "{roots:?}");
        let loader = crate::sources::DeployedFiles::new(files).expect("the examples load");
        for root in roots {
            let checked = flow_compiler::check(&root, &loader).expect("checks");
            let plan = flow_compiler::lower::lower(&checked).expect("lowers");
            for workflow in &plan.workflows {
                let graph = build(&Outline::of_plan(&plan, workflow));
                let laid = run_graph("r", &workflow.name, &graph, &[], false);
                for node in &laid.nodes {
                    assert!(
                        node.x >= 0.0
                            && node.y >= 0.0
                            && node.x + node.width <= laid.width + 0.01
                            && node.y + node.height <= laid.height + 0.01,
                        "{root}: {} lies outside the picture",
                        node.id
                    );
                }
                for (i, a) in laid.nodes.iter().enumerate() {
                    for b in &laid.nodes[i + 1..] {
                        let apart = a.x + a.width <= b.x
                            || b.x + b.width <= a.x
                            || a.y + a.height <= b.y
                            || b.y + b.height <= a.y;
                        assert!(apart, "{root}: {} overlaps {}", a.id, b.id);
                    }
                }
                assert_eq!(laid.edges.len(), graph.edges.len());
            }
        }
    }

    #[test]
    fn loop_indices_leave_the_path() {
        assert_eq!(pattern("each[12]/p/left/a"), "each[]/p/left/a");
        assert_eq!(pattern("a/fallback/b"), "a/fallback/b");
    }
}
