//! Static budgets of a workflow, from its plan alone: the most active time
//! a run can take (every attempt running to its timeout, every backoff at
//! its cap, along the longest path) and the most model calls it can have
//! in flight at once. `flowc check` warns when the first can pass the
//! workflow's `timeout` or the second the account's limit; flowd answers
//! the second against the deploying account's own limit; the editor shows
//! a step's worst case on hover.
//!
//! These are bounds, not estimates: a run never takes longer, though most
//! take far less. Time parked at an approval is not active time, so an
//! approval's is nil; a loop's is bounded only when its items are (a list
//! written out, or `max N`).

use ecow::EcoString;

use crate::{Action, Expr, Node, OnError, Step, Workflow};

/// What a workflow can take at worst.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The most active time a run can take, in milliseconds; `None` when
    /// a loop over a collection of unknown size leaves it unbounded.
    pub active_ms: Option<u64>,
    /// The loops whose collections have no bound, by id, in plan order.
    pub unbounded_loops: Vec<String>,
    /// The most model (recipe) calls in flight at once.
    pub model_calls: u64,
    /// Every step's own worst case, in plan order; only the slowest after
    /// [`Budget::keep_slowest`] (as a [`Folding::slowest`] gives it).
    pub steps: Vec<StepBudget>,
}

/// A step's worst case: each of its attempts running to the step's
/// timeout, each wait between attempts at the backoff's cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepBudget {
    /// An `EcoString`: an id of up to 15 bytes (nearly every one) is held
    /// in it rather than allocated, and `flowc check` keeps one budget per
    /// step of a file (1.6 MB of allocations at 100,000 steps).
    pub id: EcoString,
    pub attempts: u32,
    /// Whether a call past the attempts can follow: a recipe's answer that
    /// does not fit its output type gets one repair request, which counts
    /// as an attempt but is made past the last one too.
    pub repair: bool,
    pub timeout_ms: u64,
    /// The longest wait between two attempts.
    pub backoff_ms: u64,
    /// Active time at worst; nil for an approval, whose waiting is not.
    pub worst_ms: u64,
}

impl StepBudget {
    pub fn of(step: &Step) -> StepBudget {
        let attempts = step.retry.attempts.max(1);
        let (repair, active) = match step.action {
            Action::Recipe { .. } => (true, true),
            Action::Approval(_) => (false, false),
            _ => (false, true),
        };
        let backoff_ms = step.retry.backoff_max_ms.max(step.retry.backoff_min_ms);
        let worst_ms = if active {
            (u64::from(attempts) + u64::from(repair))
                .saturating_mul(step.timeout_ms)
                .saturating_add(u64::from(attempts - 1).saturating_mul(backoff_ms))
        } else {
            0
        };
        StepBudget {
            id: step.id.as_str().into(),
            attempts,
            repair,
            timeout_ms: step.timeout_ms,
            backoff_ms,
            worst_ms,
        }
    }
}

impl Budget {
    pub fn of(workflow: &Workflow) -> Budget {
        let mut folding = Folding::new();
        for node in &workflow.body {
            folding.node(node);
        }
        folding.finish(&workflow.on_error)
    }

    /// The worst case of the step `id`.
    pub fn step(&self, id: &str) -> Option<&StepBudget> {
        self.steps.iter().find(|step| step.id == id)
    }

    /// Keeps the `n` steps with the longest worst case (the earlier in plan
    /// order among equals), in plan order: what a warning that names the
    /// slowest steps needs, without a record per step of a large workflow.
    pub fn keep_slowest(&mut self, n: usize) {
        if self.steps.len() <= n {
            return;
        }
        let mut order: Vec<usize> = (0..self.steps.len()).collect();
        order.sort_by_key(|&at| (std::cmp::Reverse(self.steps[at].worst_ms), at));
        let mut kept = vec![false; self.steps.len()];
        for &at in &order[..n] {
            kept[at] = true;
        }
        let mut at = 0;
        self.steps.retain(|_| {
            at += 1;
            kept[at - 1]
        });
    }

    fn block(&mut self, nodes: &[Node]) -> Cost {
        let mut cost = Cost::NONE;
        for node in nodes {
            cost = cost.then(self.node(node));
        }
        cost
    }

    fn node(&mut self, node: &Node) -> Cost {
        match node {
            Node::Step(step) => {
                let own = StepBudget::of(step);
                let mut cost = Cost {
                    active_ms: Some(own.worst_ms),
                    model_calls: u64::from(matches!(step.action, Action::Recipe { .. })),
                };
                self.steps.push(own);
                if let OnError::Fallback(fallback) = &step.on_error {
                    cost = cost.then(self.block(fallback));
                }
                cost
            }
            Node::Condition {
                branches,
                otherwise,
                ..
            } => {
                let mut cost = Cost::NONE;
                for body in branches
                    .iter()
                    .map(|branch| &branch.body)
                    .chain(otherwise.as_ref())
                {
                    cost = cost.either(self.block(body));
                }
                cost
            }
            Node::Loop {
                id,
                collection,
                concurrency,
                max_items,
                body,
                ..
            } => {
                let iteration = self.block(body);
                let items = max_items
                    .map(u64::from)
                    .or_else(|| written_length(collection));
                if items.is_none() {
                    self.unbounded_loops.push(id.clone());
                }
                let at_once = u64::from((*concurrency).max(1));
                Cost {
                    // Iterations start as others end, so no more than
                    // ceil(items / at_once) of them follow one another.
                    active_ms: items.and_then(|items| {
                        iteration
                            .active_ms
                            .map(|each| items.div_ceil(at_once).saturating_mul(each))
                    }),
                    model_calls: iteration
                        .model_calls
                        .saturating_mul(items.map_or(at_once, |items| items.min(at_once))),
                }
            }
            Node::Parallel { branches, .. } => {
                let mut cost = Cost::NONE;
                for branch in branches {
                    let branch = self.block(&branch.body);
                    cost.active_ms = longer(cost.active_ms, branch.active_ms);
                    cost.model_calls = cost.model_calls.saturating_add(branch.model_calls);
                }
                cost
            }
        }
    }
}

/// A workflow's [`Budget`] worked out one top-level node at a time, in
/// order: the compiler lowers a workflow's body node by node for its
/// budget and drops each node once folded in, so that a large workflow's
/// plan is never whole in memory only to be measured.
#[derive(Debug)]
pub struct Folding {
    budget: Budget,
    body: Cost,
    /// How many of the slowest steps the budget keeps; all when `None`.
    slowest: Option<usize>,
}

impl Folding {
    /// A folding that keeps every step's worst case.
    pub fn new() -> Folding {
        Folding {
            budget: Budget {
                active_ms: Some(0),
                unbounded_loops: Vec::new(),
                model_calls: 0,
                steps: Vec::new(),
            },
            body: Cost::NONE,
            slowest: None,
        }
    }

    /// A folding that keeps the worst cases of the `n` slowest steps only
    /// ([`Budget::keep_slowest`]), as it goes: the list of every step's
    /// was 5.3 MB at the compiler's peak on a 100,000-step workflow.
    pub fn slowest(n: usize) -> Folding {
        Folding {
            slowest: Some(n),
            ..Folding::new()
        }
    }

    /// Folds in the next node of the workflow's body.
    pub fn node(&mut self, node: &Node) {
        let cost = self.budget.node(node);
        self.body = self.body.then(cost);
        // Trimmed once the list has twice the room, so that each step is
        // sorted a few times at most, not once per node.
        if let Some(n) = self.slowest
            && self.budget.steps.len() >= 2 * n.max(16)
        {
            self.budget.keep_slowest(n);
        }
    }

    /// The budget of the body folded in, with the workflow's error handler.
    pub fn finish(mut self, on_error: &OnError) -> Budget {
        let handler = match on_error {
            OnError::Fallback(handler) => self.budget.block(handler),
            _ => Cost::NONE,
        };
        // The handler runs after the body failed: its time adds up, its
        // calls never overlap the body's.
        self.budget.active_ms = add(self.body.active_ms, handler.active_ms);
        self.budget.model_calls = self.body.model_calls.max(handler.model_calls);
        if let Some(n) = self.slowest {
            self.budget.keep_slowest(n);
        }
        self.budget.steps.shrink_to_fit();
        self.budget
    }
}

impl Default for Folding {
    fn default() -> Folding {
        Folding::new()
    }
}

/// The number of items of a collection written out in the source.
fn written_length(collection: &Expr) -> Option<u64> {
    match collection {
        Expr::List(items) => Some(items.len() as u64),
        Expr::Literal(serde_json::Value::Array(items)) => Some(items.len() as u64),
        _ => None,
    }
}

/// What a part of a workflow can take at worst.
#[derive(Debug, Clone, Copy)]
struct Cost {
    active_ms: Option<u64>,
    model_calls: u64,
}

impl Cost {
    const NONE: Cost = Cost {
        active_ms: Some(0),
        model_calls: 0,
    };

    /// Two parts, the second after the first.
    fn then(self, next: Cost) -> Cost {
        Cost {
            active_ms: add(self.active_ms, next.active_ms),
            model_calls: self.model_calls.max(next.model_calls),
        }
    }

    /// The worse of two parts of which one runs.
    fn either(self, other: Cost) -> Cost {
        Cost {
            active_ms: longer(self.active_ms, other.active_ms),
            model_calls: self.model_calls.max(other.model_calls),
        }
    }
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a?.saturating_add(b?))
}

fn longer(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a?.max(b?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ParallelBranch, Retry};

    fn recipe(id: &str, attempts: u32, timeout_ms: u64, backoff_max_ms: u64) -> Node {
        Node::Step(Step {
            slot: 0,
            id: id.to_string(),
            action: Action::Recipe {
                recipe: 0,
                args: Vec::new(),
            },
            retry: Retry {
                attempts,
                backoff_min_ms: 1_000,
                backoff_max_ms,
            },
            timeout_ms,
            on_error: OnError::Fail,
            idempotency_key: None,
        })
    }

    fn workflow(body: Vec<Node>) -> Workflow {
        Workflow {
            name: "w".to_string(),
            input_fields: Vec::new(),
            input_schema: serde_json::json!({}),
            timeout_ms: 1_000,
            durability: crate::Durability::Full,
            context: Vec::new(),
            department: None,
            on_error: OnError::Fail,
            slots: Vec::new(),
            body,
            output: Vec::new(),
            destinations: Vec::new(),
        }
    }

    fn looping(max_items: Option<u32>, concurrency: u32, body: Vec<Node>) -> Node {
        Node::Loop {
            slot: 0,
            id: "each".to_string(),
            collection: Expr::Ref(crate::Ref {
                root: crate::Root::InputField(0),
                path: Vec::new(),
                optional: false,
            }),
            concurrency,
            max_items,
            level: 0,
            body,
        }
    }

    #[test]
    fn a_step_takes_every_attempt_and_repair_to_its_timeout_and_each_backoff_at_its_cap() {
        // 3 attempts and a repair request of 10 s, 2 waits of 30 s.
        let budget = Budget::of(&workflow(vec![recipe("a", 3, 10_000, 30_000)]));
        assert_eq!(budget.active_ms, Some((3 + 1) * 10_000 + 2 * 30_000));
        assert_eq!(budget.step("a").unwrap().worst_ms, 100_000);
        assert_eq!(budget.model_calls, 1);
    }

    #[test]
    fn parallel_branches_overlap_in_time_and_add_up_in_calls() {
        let budget = Budget::of(&workflow(vec![Node::Parallel {
            slot: 0,
            id: "p".to_string(),
            branches: vec![
                ParallelBranch {
                    name: "x".to_string(),
                    body: vec![recipe("a", 1, 1_000, 0)],
                },
                ParallelBranch {
                    name: "y".to_string(),
                    body: vec![recipe("b", 1, 5_000, 0), recipe("c", 1, 5_000, 0)],
                },
            ],
        }]));
        assert_eq!(budget.active_ms, Some(20_000));
        assert_eq!(budget.model_calls, 2);
    }

    #[test]
    fn a_loop_is_bounded_by_its_max_in_rounds_of_its_concurrency() {
        let body = vec![recipe("a", 1, 1_000, 0)];
        let budget = Budget::of(&workflow(vec![looping(Some(10), 4, body.clone())]));
        // ceil(10 / 4) = 3 rounds of 2 s; 4 calls at once.
        assert_eq!(budget.active_ms, Some(6_000));
        assert_eq!(budget.model_calls, 4);
        let unbounded = Budget::of(&workflow(vec![looping(None, 20, body)]));
        assert_eq!(unbounded.active_ms, None);
        assert_eq!(unbounded.unbounded_loops, ["each"]);
        assert_eq!(unbounded.model_calls, 20);
    }

    /// Guards the compiler's folding: keeping the slowest steps as it goes
    /// names the same steps, in plan order, as a whole list cut after.
    #[test]
    fn a_folding_of_the_slowest_keeps_what_a_whole_list_cut_would() {
        // Worst cases of an attempt and a repair each: ties go to the
        // earlier step.
        let timeouts = [5, 9, 1, 9, 3, 7, 9, 2, 8, 9, 4, 6, 9, 1, 5, 7, 3, 9, 2, 8];
        let body: Vec<Node> = (0..40)
            .map(|i| recipe(&format!("s{i}"), 1, timeouts[i % timeouts.len()] * 1_000, 0))
            .collect();
        let mut whole = Budget::of(&workflow(body.clone()));
        assert_eq!(whole.steps.len(), 40);
        let mut folding = Folding::slowest(3);
        for node in &body {
            folding.node(node);
        }
        let folded = folding.finish(&OnError::Fail);
        whole.keep_slowest(3);
        let ids: Vec<&str> = folded.steps.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["s1", "s3", "s6"]);
        assert_eq!(folded, whole);
    }
}
