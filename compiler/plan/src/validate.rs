//! [`Plan::validate`]: a plan from outside, held to what the compiler writes.
//!
//! `Plan::from_json` checks a plan's format version and hash, but anyone can
//! recompute a hash, so a deployed plan is data its author chose. The runtime
//! indexes with its slots, sleeps for its backoffs and walks its schemas for
//! every input; a plan with an `anyOf` of 20,000 branches once made each start
//! request cost seconds and hundreds of megabytes. This module refuses
//! everything lowering never produces: references out of range or out of
//! scope, schemas of shapes `Ty::json_schema` does not emit, numbers outside
//! the checker's bounds, and sizes past [`crate::limits`].
//!
//! The validator's own work is bounded too: one pass over the plan, linear in
//! its size (sets, never nested scans), recursion only after a depth check,
//! at most [`MAX_PROBLEMS`] problems of at most [`MAX_PROBLEM_CHARS`]
//! characters each, and nothing examined after the last of them.

use std::collections::HashSet;
use std::fmt;

use serde_json::{Map, Value};

use crate::limits::*;
use crate::{
    Action, ApprovalAction, BrowserAction, DURATION_PATTERN, DestinationTarget, Expr,
    FORMAT_VERSION, Field, HandoffAction, KbWriteAction, McpServer, McpTransport, Node, OnError,
    PathSegment, Plan, Recipe, Ref, Root, RunEvent, Slot, Step, StepKind, Template, TemplatePart,
    Workflow, cut,
};

/// One way a plan differs from what the compiler writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanProblem {
    /// Where, as a JSON Pointer into the plan's JSON (`/workflows/0/body/2/retry/attempts`).
    pub path: String,
    /// What is wrong there, in words, with any value it quotes cut short.
    pub message: String,
    /// The id of the innermost step, loop or parallel block the problem is
    /// in (or a condition's `if@LINE:COLUMN`), or of the step a slot of the
    /// slot table names: where a compiler that wrote the plan points its
    /// author. `None` outside the workflows' steps.
    pub step: Option<String>,
}

impl fmt::Display for PlanProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Why [`Plan::validate`] refused a plan: the first problems found, in
/// document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanProblems {
    /// At most [`MAX_PROBLEMS`].
    pub problems: Vec<PlanProblem>,
    /// Whether validation stopped at the limit: there may be more.
    pub stopped: bool,
}

impl fmt::Display for PlanProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the plan is not one flowc could have built ({} problem{}{})",
            self.problems.len(),
            if self.problems.len() == 1 { "" } else { "s" },
            if self.stopped {
                ", and validation stopped there"
            } else {
                ""
            }
        )?;
        for problem in &self.problems {
            write!(f, "\n  {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PlanProblems {}

impl Plan {
    /// Checks that this plan is one the compiler could have written: every
    /// index in range, every reference in scope, schemas of the shapes
    /// lowering emits, and numbers and sizes within [`crate::limits`].
    ///
    /// `from_json` does not call this, because the runtime also reads the
    /// plans it stored through `from_json`, and a plan stored before a bound
    /// existed must still resume its runs. Call it wherever a plan comes from
    /// outside: a deploy, `flow run PLAN.json`.
    pub fn validate(&self) -> Result<(), PlanProblems> {
        self.validate_with(Some(MAX_PLAN_BYTES), true)
    }

    /// [`Plan::validate`] of a plan a store kept, which may have been
    /// deployed before a check of what would fail every run at a step (an
    /// approval naming more approvers than one may, a message past its
    /// bound): such a plan is held to every bound of what it holds, and
    /// keeps its parked runs, which may never reach that step.
    pub fn validate_stored(&self) -> Result<(), PlanProblems> {
        self.validate_with(Some(MAX_PLAN_BYTES), false)
    }

    /// [`Plan::validate`] with a lower bound on the plan's JSON than
    /// [`MAX_PLAN_BYTES`]: flowd's for deploys (`[limits] plan_bytes`).
    pub fn validate_within(&self, most_bytes: u64) -> Result<(), PlanProblems> {
        self.validate_with(Some(most_bytes.min(MAX_PLAN_BYTES)), true)
    }

    /// [`Plan::validate`] but for the size of the plan's JSON, which is
    /// measured by serializing the whole plan once more (a fifth of a
    /// `flowc build`'s time): for the compiler, which has just written the
    /// plan, its JSON far under the bound for the sources the loader reads.
    pub fn validate_content(&self) -> Result<(), PlanProblems> {
        self.validate_with(None, true)
    }

    /// The plan validated, its JSON held to `most_bytes` when given, and
    /// what would fail every run at a step refused when `new`.
    fn validate_with(&self, most_bytes: Option<u64>, new: bool) -> Result<(), PlanProblems> {
        let mut validator = Validator::new(self.recipes.len(), self.mcp_servers.len());
        validator.new_plan = new;
        validator.plan(self);
        // The size is measured by serializing, which recurses as deeply as
        // the plan nests; the walk above has bounded the nesting first.
        if let Some(most) = most_bytes
            && validator.problems.is_empty()
        {
            validator.size(self, most);
        }
        validator.finish()
    }
}

/// [`Plan::validate_content`] of a plan that its maker hands in a piece at
/// a time and never holds whole: `flowc check` lowers a program node by
/// node for its budgets, and holds each node to the plan's limits as it
/// goes, so that the editor and `flowc check` report a program past one
/// (E212) without the memory of a whole plan.
///
/// Each piece is checked as [`Plan::validate`] checks it in a whole plan,
/// but for what only the whole shows: that each step claims the slot of
/// its own id and kind and no other step's (the slot table is not handed
/// in: a claim is held to the count of slots), and that names are unique
/// across pieces. The compiler gets those right by construction; what
/// this finds in its pieces is a program past a limit.
pub struct PlanInPieces {
    /// Problems so far, and the steps seen, across pieces.
    problems: Vec<PlanProblem>,
    stopped: bool,
    steps: usize,
    recipes: usize,
    servers: usize,
    /// The workflow being handed in: its index, input fields and slots.
    workflow: Option<(usize, usize, usize)>,
}

impl PlanInPieces {
    /// Starts with what the plan holds besides its workflows: its source
    /// path, recipes and MCP servers (in the plan's order), and how many
    /// workflows it holds.
    pub fn new(source: &str, recipes: &[Recipe], servers: &[McpServer], workflows: usize) -> Self {
        let mut pieces = PlanInPieces {
            problems: Vec::new(),
            stopped: false,
            steps: 0,
            recipes: recipes.len(),
            servers: servers.len(),
            workflow: None,
        };
        pieces.with(&[], |v| {
            if v.source_and_counts(source, workflows, recipes.len(), servers.len()) {
                v.recipes_and_servers(recipes, servers);
            } else {
                // As `validate` stops there: nothing else is looked at.
                v.stopped = true;
            }
        });
        pieces
    }

    /// Starts the `index`-th workflow: `header` is the workflow with
    /// neither slots nor body (nor a fallback body), which the nodes handed
    /// in next are of; `slots` is how many slots its whole table holds.
    /// Its name and what it is given are checked here; its body's nodes
    /// ([`Self::node`]), its fallback ([`Self::on_error`]) and what it
    /// gives ([`Self::workflow_end`]) follow, in the order `validate` walks
    /// them, so that both find the same problem first.
    pub fn workflow(&mut self, index: usize, header: &Workflow, slots: usize) {
        self.workflow = Some((index, header.input_fields.len(), slots));
        let at = [Seg::Key("workflows"), Seg::Index(index)];
        self.with(&at, |v| {
            v.at(Seg::Key("name"), |v| {
                v.name(&header.name, format_args!("a workflow name"))
            });
            v.workflow_inputs(header);
        });
    }

    /// Ends the workflow that [`Self::workflow`] started with `header`:
    /// its output and destinations.
    pub fn workflow_end(&mut self, header: &Workflow) {
        let Some((index, _, slots)) = self.workflow else {
            return;
        };
        let at = [Seg::Key("workflows"), Seg::Index(index)];
        self.with(&at, |v| v.workflow_outputs(header, slots));
    }

    /// The workflow's `on_error` policy, after its body's nodes: a
    /// fallback's body is checked.
    pub fn on_error(&mut self, policy: &OnError) {
        let Some((workflow, inputs, count)) = self.workflow else {
            return;
        };
        let OnError::Fallback(handler) = policy else {
            return;
        };
        let at = [
            Seg::Key("workflows"),
            Seg::Index(workflow),
            Seg::Key("on_error"),
            Seg::Key("body"),
        ];
        self.with(&at, |v| {
            let mut slots = Slots::counted(inputs, count);
            v.block(handler, &mut slots, Scope::FALLBACK);
        });
    }

    /// The `index`-th node of the workflow's body.
    pub fn node(&mut self, index: usize, node: &Node) {
        let Some((workflow, inputs, count)) = self.workflow else {
            return;
        };
        let at = [
            Seg::Key("workflows"),
            Seg::Index(workflow),
            Seg::Key("body"),
            Seg::Index(index),
        ];
        self.with(&at, |v| {
            let mut slots = Slots::counted(inputs, count);
            // As `block` walks a workflow's body: one block deep.
            v.node(node, &mut slots, Scope::BODY);
        });
    }

    /// What was found in all the pieces.
    pub fn finish(self) -> Result<(), PlanProblems> {
        if self.problems.is_empty() {
            return Ok(());
        }
        Err(PlanProblems {
            problems: self.problems,
            stopped: self.stopped,
        })
    }

    /// Runs `check` on a validator at `at`, which carries this plan's
    /// problems and count of steps in and out.
    fn with<'p>(&mut self, at: &[Seg<'p>], check: impl FnOnce(&mut Validator<'p>)) {
        if self.stopped {
            return;
        }
        let mut validator = Validator {
            path: at.to_vec(),
            problems: std::mem::take(&mut self.problems),
            steps: self.steps,
            ..Validator::new(self.recipes, self.servers)
        };
        check(&mut validator);
        self.problems = validator.problems;
        self.stopped = validator.stopped;
        self.steps = validator.steps;
    }
}

/// One segment of a JSON Pointer, kept unrendered until a problem needs it.
#[derive(Clone, Copy)]
enum Seg<'p> {
    Key(&'static str),
    Index(usize),
    /// An object key from the plan itself (a schema's property name).
    Name(&'p str),
}

/// Where a block or expression is: what its references may name.
#[derive(Clone, Copy)]
struct Scope {
    /// Loops around this point; `Root::LoopItem(level)` needs `level < loops`.
    loops: u32,
    /// Inside a fallback block, where `Root::Error` is in scope.
    error: bool,
    /// Blocks around this point, at most [`MAX_BLOCK_DEPTH`].
    blocks: usize,
}

impl Scope {
    /// Around a workflow's body (and its fallback's), before its block.
    const TOP: Scope = Scope {
        loops: 0,
        error: false,
        blocks: 0,
    };
    /// Around a node of a workflow's body: inside its one block.
    const BODY: Scope = Scope {
        blocks: 1,
        ..Scope::TOP
    };
    /// Around a workflow's fallback, before its block.
    const FALLBACK: Scope = Scope {
        error: true,
        ..Scope::TOP
    };
}

/// What the references of an expression may name.
#[derive(Clone, Copy)]
enum Refs {
    /// In a workflow: its input fields, its slots, and what `scope` allows.
    Workflow {
        inputs: usize,
        slots: usize,
        scope: Scope,
    },
    /// In a recipe's prompt: that recipe's inputs only.
    Prompt { inputs: usize },
    /// In a destination: the workflow's input fields, and its output when
    /// the destination is delivered on `completed` alone.
    Destination { inputs: usize, output: bool },
}

/// What the nodes of the workflow being walked may claim and name.
struct Slots<'p> {
    /// The workflow's slot table, and which slots a node has claimed, so
    /// that each belongs to exactly one; `None` for a plan checked in
    /// pieces ([`PlanInPieces`]), whose claims are held to `count` only.
    table: Option<(&'p [Slot], Vec<bool>)>,
    count: usize,
    /// The workflow's input fields.
    inputs: usize,
}

impl Slots<'_> {
    fn counted(inputs: usize, count: usize) -> Self {
        Slots {
            table: None,
            count,
            inputs,
        }
    }
}

struct Validator<'p> {
    /// How many recipes and MCP servers the plan holds, which steps index.
    recipes: usize,
    servers: usize,
    /// The pointer to the value being looked at.
    path: Vec<Seg<'p>>,
    /// The id of the innermost step, loop, parallel or condition around
    /// the value being looked at ([`PlanProblem::step`]).
    node_id: Option<&'p str>,
    problems: Vec<PlanProblem>,
    /// Set when a problem past [`MAX_PROBLEMS`] is found: nothing more is looked at.
    stopped: bool,
    /// Steps seen so far, across workflows.
    steps: usize,
    /// Whether the plan is new (built, deployed, given as a file) rather
    /// than one a store kept: a new one is also refused for what would
    /// fail every run at a step ([`Plan::validate_stored`]).
    new_plan: bool,
}

impl<'p> Validator<'p> {
    fn new(recipes: usize, servers: usize) -> Self {
        Validator {
            recipes,
            servers,
            path: Vec::new(),
            node_id: None,
            problems: Vec::new(),
            stopped: false,
            steps: 0,
            new_plan: true,
        }
    }

    fn finish(self) -> Result<(), PlanProblems> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            Err(PlanProblems {
                problems: self.problems,
                stopped: self.stopped,
            })
        }
    }

    // ------------------------------------------------------------ reporting

    /// Runs `check` with `seg` appended to the path.
    fn at<R>(&mut self, seg: Seg<'p>, check: impl FnOnce(&mut Self) -> R) -> R {
        self.path.push(seg);
        let result = check(self);
        self.path.pop();
        result
    }

    /// Records a problem at the current path; the message is built only when
    /// it is kept.
    fn problem(&mut self, message: impl FnOnce() -> String) {
        if self.stopped {
            return;
        }
        if self.problems.len() == MAX_PROBLEMS {
            self.stopped = true;
            return;
        }
        let path = self.pointer();
        let room = MAX_PROBLEM_CHARS.saturating_sub(path.chars().count() + 2);
        self.problems.push(PlanProblem {
            message: cut(&message(), room),
            path,
            step: self.node_id.map(str::to_string),
        });
    }

    /// Runs `check` inside the step, loop, parallel or condition of `id`.
    fn inside<R>(&mut self, id: &'p str, check: impl FnOnce(&mut Self) -> R) -> R {
        let outer = self.node_id.replace(id);
        let result = check(self);
        self.node_id = outer;
        result
    }

    /// [`Self::problem`] at `key` below the current path.
    fn problem_at(&mut self, key: &'static str, message: impl FnOnce() -> String) {
        self.at(Seg::Key(key), |v| v.problem(message));
    }

    /// The current path as a JSON Pointer; a deep one keeps its start and
    /// its end, which say which workflow and which value.
    fn pointer(&self) -> String {
        const MOST: usize = 120;
        let mut out = String::new();
        for seg in &self.path {
            out.push('/');
            match seg {
                Seg::Key(key) => out.push_str(key),
                Seg::Index(index) => out.push_str(&index.to_string()),
                Seg::Name(name) => {
                    for c in name.chars() {
                        match c {
                            '~' => out.push_str("~0"),
                            '/' => out.push_str("~1"),
                            c => out.push(c),
                        }
                    }
                }
            }
        }
        let count = out.chars().count();
        if count <= MOST {
            return out;
        }
        let head: String = out.chars().take(40).collect();
        let tail: String = out.chars().skip(count - (MOST - 41)).collect();
        format!("{head}…{tail}")
    }

    // ------------------------------------------------------------ the plan

    fn plan(&mut self, plan: &'p Plan) {
        if plan.format_version != FORMAT_VERSION {
            self.problem_at("format_version", || {
                format!(
                    "format version {} is not {FORMAT_VERSION}",
                    plan.format_version
                )
            });
        }
        if !is_hash(&plan.hash) {
            self.problem_at("hash", || {
                format!(
                    "{} is not `sha256:` and 64 hexadecimal digits",
                    quote(&plan.hash)
                )
            });
        }
        let counts = (
            plan.workflows.len(),
            plan.recipes.len(),
            plan.mcp_servers.len(),
        );
        if !self.source_and_counts(&plan.source, counts.0, counts.1, counts.2) {
            return;
        }
        self.at(Seg::Key("workflows"), |v| {
            let mut names = HashSet::new();
            for (index, workflow) in plan.workflows.iter().enumerate() {
                if v.stopped {
                    return;
                }
                v.at(Seg::Index(index), |v| {
                    v.unique_name("name", &workflow.name, &mut names, "workflow");
                    v.workflow(workflow);
                });
            }
        });
        self.recipes_and_servers(&plan.recipes, &plan.mcp_servers);
    }

    /// The source path, and how many workflows, recipes and servers there
    /// are; `false` when there are too many to look at each.
    fn source_and_counts(
        &mut self,
        source: &str,
        workflows: usize,
        recipes: usize,
        servers: usize,
    ) -> bool {
        self.at(Seg::Key("source"), |v| {
            v.text(source, MAX_SETTING_BYTES, "the source path")
        });
        let counts = [
            ("workflows", workflows, MAX_WORKFLOWS),
            ("recipes", recipes, MAX_RECIPES),
            ("mcp_servers", servers, MAX_MCP_SERVERS),
        ];
        let mut too_many = false;
        for (key, count, most) in counts {
            if count > most {
                too_many = true;
                self.problem_at(key, || {
                    format!("{count} {key}; a plan holds at most {most}")
                });
            }
        }
        !too_many
    }

    fn recipes_and_servers(&mut self, recipes: &'p [Recipe], servers: &'p [McpServer]) {
        self.at(Seg::Key("recipes"), |v| {
            let mut names = HashSet::new();
            for (index, recipe) in recipes.iter().enumerate() {
                if v.stopped {
                    return;
                }
                v.at(Seg::Index(index), |v| {
                    v.unique_name("name", &recipe.name, &mut names, "recipe");
                    v.recipe(recipe);
                });
            }
        });
        self.at(Seg::Key("mcp_servers"), |v| {
            let mut names = HashSet::new();
            for (index, server) in servers.iter().enumerate() {
                if v.stopped {
                    return;
                }
                v.at(Seg::Index(index), |v| {
                    v.unique_name("name", &server.name, &mut names, "MCP server");
                    v.server(server);
                });
            }
        });
    }

    /// The plan's compact JSON is at most `most` bytes.
    fn size(&mut self, plan: &Plan, most: u64) {
        if !json_fits(plan, most) {
            self.problem(|| crate::limits::past_plan_bytes(most));
        }
    }

    fn recipe(&mut self, recipe: &'p Recipe) {
        self.at(Seg::Key("model"), |v| {
            v.text(&recipe.model, MAX_NAME_BYTES, "a model alias")
        });
        self.field_names("input_fields", &recipe.input_fields);
        self.at(Seg::Key("input_schema"), |v| {
            v.record_schema(&recipe.input_schema, &recipe.input_fields)
        });
        self.at(Seg::Key("output_schema"), |v| {
            v.schema_root(&recipe.output_schema)
        });
        let refs = Refs::Prompt {
            inputs: recipe.input_fields.len(),
        };
        self.at(Seg::Key("prompt"), |v| v.template(&recipe.prompt, refs));
        self.context(&recipe.context);
    }

    fn server(&mut self, server: &'p McpServer) {
        self.at(Seg::Key("transport"), |v| match &server.transport {
            McpTransport::Stdio { command, args, env } => {
                v.at(Seg::Key("command"), |v| {
                    v.text(command, MAX_SETTING_BYTES, "a command")
                });
                for (key, count) in [("args", args.len()), ("env", env.len())] {
                    if count > MAX_MCP_ARGS {
                        v.problem_at(key, || {
                            format!("{count} entries; a server has at most {MAX_MCP_ARGS}")
                        });
                        return;
                    }
                }
                v.at(Seg::Key("args"), |v| {
                    for (index, arg) in args.iter().enumerate() {
                        v.at(Seg::Index(index), |v| {
                            v.text(arg, MAX_SETTING_BYTES, "an argument")
                        });
                    }
                });
                v.at(Seg::Key("env"), |v| {
                    for (index, (name, value)) in env.iter().enumerate() {
                        v.at(Seg::Index(index), |v| {
                            v.at(Seg::Index(0), |v| {
                                v.name(name, format_args!("an environment variable's name"))
                            });
                            v.at(Seg::Index(1), |v| {
                                v.text(value, MAX_SETTING_BYTES, "an environment value")
                            });
                        });
                    }
                });
            }
            McpTransport::Http { url } => {
                v.at(Seg::Key("url"), |v| v.text(url, MAX_SETTING_BYTES, "a URL"));
            }
        });
    }

    fn context(&mut self, ids: &'p [String]) {
        self.at(Seg::Key("context"), |v| {
            if ids.len() > MAX_CONTEXT_IDS {
                v.problem(|| {
                    format!(
                        "{} knowledge-base ids; a context lists at most {MAX_CONTEXT_IDS}",
                        ids.len()
                    )
                });
                return;
            }
            for (index, id) in ids.iter().enumerate() {
                v.at(Seg::Index(index), |v| {
                    v.text(id, MAX_KB_ID_BYTES, "a knowledge-base id")
                });
            }
        });
    }

    // ------------------------------------------------------------ workflows

    fn workflow(&mut self, workflow: &'p Workflow) {
        self.workflow_inputs(workflow);
        if workflow.slots.len() > MAX_STEPS {
            self.problem_at("slots", || {
                format!(
                    "{} slots; a plan holds at most {MAX_STEPS} steps",
                    workflow.slots.len()
                )
            });
            return;
        }
        self.at(Seg::Key("slots"), |v| {
            let mut ids = HashSet::new();
            for (index, slot) in workflow.slots.iter().enumerate() {
                // Unique only: each id is held to what a name is where a
                // node claims its slot (`claim`), and a slot no node
                // claims is a problem of its own, so that a plan walked
                // whole and one walked in pieces report an id alike.
                v.at(Seg::Index(index), |v| {
                    v.inside(&slot.id, |v| {
                        v.at(Seg::Key("id"), |v| {
                            if !ids.insert(slot.id.as_str()) {
                                v.problem(|| {
                                    format!("the step id {} is used twice", quote(&slot.id))
                                });
                            }
                        })
                    })
                });
            }
        });
        let mut slots = Slots {
            table: Some((&workflow.slots, vec![false; workflow.slots.len()])),
            count: workflow.slots.len(),
            inputs: workflow.input_fields.len(),
        };
        self.at(Seg::Key("body"), |v| {
            v.block(&workflow.body, &mut slots, Scope::TOP)
        });
        if let OnError::Fallback(handler) = &workflow.on_error {
            self.at(Seg::Key("on_error"), |v| {
                v.at(Seg::Key("body"), |v| {
                    v.block(handler, &mut slots, Scope::FALLBACK)
                })
            });
        }
        self.workflow_outputs(workflow, workflow.slots.len());
        if self.stopped {
            return;
        }
        let Some((_, claimed)) = &slots.table else {
            return;
        };
        self.at(Seg::Key("slots"), |v| {
            for (index, claimed) in claimed.iter().enumerate() {
                if !claimed {
                    v.at(Seg::Index(index), |v| {
                        v.problem(|| {
                            format!(
                                "slot {index} ({}) belongs to no step of the workflow",
                                quote(&workflow.slots[index].id)
                            )
                        })
                    });
                }
            }
        });
    }

    /// What a workflow is given: its input fields and their schema, its
    /// timeout, context and department.
    fn workflow_inputs(&mut self, workflow: &'p Workflow) {
        self.field_names("input_fields", &workflow.input_fields);
        self.at(Seg::Key("input_schema"), |v| {
            v.record_schema(&workflow.input_schema, &workflow.input_fields)
        });
        self.at(Seg::Key("timeout_ms"), |v| {
            v.duration(workflow.timeout_ms, "a workflow's timeout")
        });
        self.context(&workflow.context);
        if let Some(department) = &workflow.department {
            self.at(Seg::Key("department"), |v| {
                if department.is_empty() {
                    v.problem(|| "a department's name is empty".to_string());
                }
                v.text(department, MAX_NAME_BYTES, "a department's name");
            });
        }
    }

    /// What a workflow gives: its output (which reads any of its `slots`)
    /// and its destinations.
    fn workflow_outputs(&mut self, workflow: &'p Workflow, slots: usize) {
        let refs = Refs::Workflow {
            inputs: workflow.input_fields.len(),
            slots,
            scope: Scope::TOP,
        };
        self.at(Seg::Key("output"), |v| v.fields(&workflow.output, refs, 0));
        self.destinations(workflow);
    }

    /// A workflow's destinations: events known and each once, names within
    /// bounds, references to the input and (on `completed` only) the output.
    fn destinations(&mut self, workflow: &'p Workflow) {
        let destinations = &workflow.destinations;
        if destinations.len() > MAX_DESTINATIONS {
            self.problem_at("destinations", || {
                format!(
                    "{} destinations; a workflow has at most {MAX_DESTINATIONS}",
                    destinations.len()
                )
            });
            return;
        }
        self.at(Seg::Key("destinations"), |v| {
            for (index, destination) in destinations.iter().enumerate() {
                v.at(Seg::Index(index), |v| {
                    let events = &destination.events;
                    let unique: HashSet<_> = events.iter().collect();
                    if events.is_empty() || unique.len() != events.len() {
                        v.problem_at("events", || {
                            "a destination names each of its events once, and at least one"
                                .to_string()
                        });
                    }
                    let refs = Refs::Destination {
                        inputs: workflow.input_fields.len(),
                        output: events.iter().all(|e| *e == RunEvent::Completed),
                    };
                    v.at(Seg::Key("target"), |v| {
                        v.destination(&destination.target, refs)
                    });
                });
            }
        });
    }

    fn destination(&mut self, target: &'p DestinationTarget, refs: Refs) {
        let name = |v: &mut Self, key: &'static str, name: &str, what: &str| {
            v.at(Seg::Key(key), |v| {
                if name.trim().is_empty() {
                    v.problem(|| format!("{what} is empty"));
                }
                v.text(name, MAX_NAME_BYTES, what);
            });
        };
        match target {
            DestinationTarget::Webhook { endpoint } => {
                name(self, "endpoint", endpoint, "a webhook endpoint's name");
            }
            DestinationTarget::Email { to, subject, body } => {
                if to.is_empty() || to.len() > MAX_RECIPIENTS {
                    self.problem_at("to", || {
                        format!(
                            "{} recipients; an email destination has 1 to {MAX_RECIPIENTS}",
                            to.len()
                        )
                    });
                } else {
                    self.at(Seg::Key("to"), |v| {
                        for (index, recipient) in to.iter().enumerate() {
                            v.at(Seg::Index(index), |v| {
                                if recipient.trim().is_empty() {
                                    v.problem(|| "an email recipient is empty".to_string());
                                }
                                v.text(recipient, MAX_NAME_BYTES, "an email recipient");
                            });
                        }
                    });
                }
                self.at(Seg::Key("subject"), |v| v.template(subject, refs));
                self.at(Seg::Key("body"), |v| v.template(body, refs));
            }
            DestinationTarget::Kb {
                collection,
                title,
                content,
            } => {
                self.at(Seg::Key("collection"), |v| {
                    if collection.trim().is_empty() {
                        v.problem(|| "a knowledge-base collection is empty".to_string());
                    }
                    v.text(collection, MAX_KB_ID_BYTES, "a knowledge-base collection");
                });
                self.at(Seg::Key("title"), |v| v.template(title, refs));
                self.at(Seg::Key("content"), |v| v.expr(content, refs, 0));
            }
        }
    }

    fn block(&mut self, nodes: &'p [Node], slots: &mut Slots<'p>, scope: Scope) {
        if scope.blocks >= MAX_BLOCK_DEPTH {
            self.problem(|| format!("blocks nest more than {MAX_BLOCK_DEPTH} levels deep"));
            return;
        }
        let inner = Scope {
            blocks: scope.blocks + 1,
            ..scope
        };
        for (index, node) in nodes.iter().enumerate() {
            if self.stopped {
                return;
            }
            self.at(Seg::Index(index), |v| v.node(node, slots, inner));
        }
    }

    fn node(&mut self, node: &'p Node, slots: &mut Slots<'p>, scope: Scope) {
        let id: &'p str = match node {
            Node::Step(step) => &step.id,
            Node::Condition { id, .. } | Node::Loop { id, .. } | Node::Parallel { id, .. } => id,
        };
        self.inside(id, |v| v.node_inside(node, slots, scope));
    }

    fn node_inside(&mut self, node: &'p Node, slots: &mut Slots<'p>, scope: Scope) {
        let refs = Refs::Workflow {
            inputs: slots.inputs,
            slots: slots.count,
            scope,
        };
        match node {
            Node::Step(step) => self.step(step, slots, scope, refs),
            Node::Condition {
                id,
                branches,
                otherwise,
            } => {
                if !is_condition_id(id) {
                    self.problem_at("id", || {
                        format!("{} is not a condition's id (`if@LINE:COLUMN`)", quote(id))
                    });
                }
                if branches.is_empty() {
                    self.problem_at("branches", || "a condition has no branch".to_string());
                }
                self.at(Seg::Key("branches"), |v| {
                    for (index, branch) in branches.iter().enumerate() {
                        v.at(Seg::Index(index), |v| {
                            v.at(Seg::Key("condition"), |v| {
                                v.expr(&branch.condition, refs, 0)
                            });
                            v.at(Seg::Key("body"), |v| v.block(&branch.body, slots, scope));
                        });
                    }
                });
                if let Some(body) = otherwise {
                    self.at(Seg::Key("otherwise"), |v| v.block(body, slots, scope));
                }
            }
            Node::Loop {
                slot,
                id,
                collection,
                concurrency,
                max_items,
                level,
                body,
            } => {
                self.claim(*slot, id, StepKind::Loop, slots);
                if let Some(max) = max_items
                    && !(1..=MAX_LOOP_ITEMS).contains(max)
                {
                    self.problem_at("max_items", || {
                        format!("max_items {max} is not from 1 to {MAX_LOOP_ITEMS}")
                    });
                }
                // The collection is evaluated outside the loop it feeds.
                self.at(Seg::Key("collection"), |v| v.expr(collection, refs, 0));
                if !(1..=MAX_CONCURRENCY).contains(concurrency) {
                    self.problem_at("concurrency", || {
                        format!("concurrency {concurrency} is not from 1 to {MAX_CONCURRENCY}")
                    });
                }
                if *level != scope.loops {
                    self.problem_at("level", || {
                        format!(
                            "a loop inside {} loop(s) has level {level}, not {}",
                            scope.loops, scope.loops
                        )
                    });
                }
                let inner = Scope {
                    loops: scope.loops.saturating_add(1),
                    ..scope
                };
                self.at(Seg::Key("body"), |v| v.block(body, slots, inner));
            }
            Node::Parallel { slot, id, branches } => {
                self.claim(*slot, id, StepKind::Parallel, slots);
                self.at(Seg::Key("branches"), |v| {
                    let mut names = HashSet::new();
                    for (index, branch) in branches.iter().enumerate() {
                        v.at(Seg::Index(index), |v| {
                            v.unique_name("name", &branch.name, &mut names, "branch");
                            v.at(Seg::Key("body"), |v| v.block(&branch.body, slots, scope));
                        });
                    }
                });
            }
        }
    }

    /// A step, loop or parallel block claims its slot: in range, of its id
    /// and kind, and no other node's.
    fn claim(&mut self, slot: u32, id: &'p str, kind: StepKind, slots: &mut Slots<'p>) {
        self.at(Seg::Key("id"), |v| v.name(id, format_args!("a step id")));
        self.steps += 1;
        if self.steps > MAX_STEPS {
            self.problem(|| format!("the plan has more than {MAX_STEPS} steps"));
            // Nothing after this is worth looking at.
            self.stopped = true;
            return;
        }
        let count = slots.count;
        if slot as usize >= count {
            self.problem_at("slot", || {
                format!("slot {slot} is past the end of the workflow's {count} slots")
            });
            return;
        }
        let Some((table, claimed)) = &mut slots.table else {
            return;
        };
        let entry = &table[slot as usize];
        if entry.id != id {
            self.problem_at("slot", || {
                format!(
                    "slot {slot} is step {}'s, not {}'s",
                    quote(&entry.id),
                    quote(id)
                )
            });
        } else if entry.kind != kind {
            self.problem_at("slot", || {
                format!(
                    "slot {slot} is for a step of kind `{}`, and this one is of kind `{}`",
                    entry.kind.name(),
                    kind.name()
                )
            });
        }
        let claimed = &mut claimed[slot as usize];
        if *claimed {
            self.problem_at("slot", || {
                format!("slot {slot} belongs to another step already")
            });
        }
        *claimed = true;
    }

    fn step(&mut self, step: &'p Step, slots: &mut Slots<'p>, scope: Scope, refs: Refs) {
        let kind = match &step.action {
            Action::Recipe { .. } => StepKind::Recipe,
            Action::Approval(_) => StepKind::Approval,
            Action::KbWrite(_) => StepKind::KbWrite,
            Action::Handoff(_) => StepKind::Handoff,
            Action::Browser(_) => StepKind::Browser,
        };
        self.claim(step.slot, &step.id, kind, slots);
        self.at(Seg::Key("action"), |v| v.action(&step.action, refs));

        let retry = step.retry;
        self.at(Seg::Key("retry"), |v| {
            if !(1..=MAX_ATTEMPTS).contains(&retry.attempts) {
                v.problem_at("attempts", || {
                    format!(
                        "{} attempts; a retry makes from 1 to {MAX_ATTEMPTS}",
                        retry.attempts
                    )
                });
            }
            v.at(Seg::Key("backoff_min_ms"), |v| {
                v.duration(retry.backoff_min_ms, "a backoff")
            });
            v.at(Seg::Key("backoff_max_ms"), |v| {
                v.duration(retry.backoff_max_ms, "a backoff");
                if retry.backoff_max_ms < retry.backoff_min_ms {
                    v.problem(|| {
                        format!(
                            "the backoff goes backwards, from {} ms to {} ms",
                            retry.backoff_min_ms, retry.backoff_max_ms
                        )
                    });
                }
            });
        });
        // A step's timeout may be longer than its workflow's: the checker
        // warns of it (W301), and a step left at the default timeout in a
        // workflow of a shorter one has it without a word; the workflow's
        // deadline comes first.
        self.at(Seg::Key("timeout_ms"), |v| {
            v.duration(step.timeout_ms, "a step's timeout")
        });
        if let OnError::Fallback(body) = &step.on_error {
            let scope = Scope {
                error: true,
                ..scope
            };
            self.at(Seg::Key("on_error"), |v| {
                v.at(Seg::Key("body"), |v| v.block(body, slots, scope))
            });
        }
        if let Some(key) = &step.idempotency_key {
            self.at(Seg::Key("idempotency_key"), |v| v.expr(key, refs, 0));
        }
    }

    fn action(&mut self, action: &'p Action, refs: Refs) {
        match action {
            Action::Recipe { recipe, args } => {
                if *recipe as usize >= self.recipes {
                    let count = self.recipes;
                    self.problem_at("recipe", || {
                        format!("recipe {recipe} is past the end of the plan's {count} recipes")
                    });
                }
                self.at(Seg::Key("args"), |v| v.fields(args, refs, 0));
            }
            Action::Approval(approval) => {
                let ApprovalAction {
                    approvers,
                    message,
                    expires_ms,
                    ..
                } = &**approval;
                self.at(Seg::Key("approvers"), |v| {
                    v.expr(approvers, refs, 0);
                    // A run would fail at the gate, whatever its input.
                    if let Expr::List(items) = approvers
                        && v.new_plan
                        && items.len() > MAX_APPROVERS
                    {
                        let count = items.len();
                        v.problem(|| {
                            format!("an approval names {count} approvers; it may name at most {MAX_APPROVERS} (name an approver group instead)")
                        });
                    }
                });
                self.at(Seg::Key("message"), |v| {
                    v.expr(message, refs, 0);
                    v.message(message, "an approval's message");
                });
                if let Some(expires) = expires_ms {
                    self.at(Seg::Key("expires_ms"), |v| {
                        v.duration(*expires, "an approval's expiry")
                    });
                }
            }
            Action::KbWrite(write) => {
                let KbWriteAction {
                    collection,
                    title,
                    content,
                    metadata,
                } = &**write;
                self.at(Seg::Key("collection"), |v| v.template(collection, refs));
                self.at(Seg::Key("title"), |v| v.expr(title, refs, 0));
                self.at(Seg::Key("content"), |v| v.expr(content, refs, 0));
                if let Some(metadata) = metadata {
                    self.at(Seg::Key("metadata"), |v| v.expr(metadata, refs, 0));
                }
            }
            Action::Handoff(handoff) => {
                let HandoffAction {
                    department,
                    message,
                    subject,
                } = &**handoff;
                self.at(Seg::Key("department"), |v| v.template(department, refs));
                self.at(Seg::Key("message"), |v| {
                    v.expr(message, refs, 0);
                    v.message(message, "a handoff's message");
                });
                if let Some(subject) = subject {
                    self.at(Seg::Key("subject"), |v| {
                        v.expr(subject, refs, 0);
                        v.message(subject, "a handoff's subject");
                    });
                }
            }
            Action::Browser(browser) => {
                let BrowserAction { server, tool, args } = &**browser;
                if *server as usize >= self.servers {
                    let count = self.servers;
                    self.problem_at("server", || {
                        format!("MCP server {server} is past the end of the plan's {count} servers")
                    });
                }
                self.at(Seg::Key("tool"), |v| {
                    if tool.len() > MAX_NAME_BYTES {
                        v.problem(|| too_long("a tool name", tool, MAX_NAME_BYTES));
                    } else if !is_tool_name(tool) {
                        v.problem(|| {
                            format!(
                                "{} is not a tool name (letters, digits, `_` and inner `-`)",
                                quote(tool)
                            )
                        });
                    }
                });
                self.at(Seg::Key("args"), |v| v.fields(args, refs, 0));
            }
        }
    }

    // ------------------------------------------------------------ expressions

    /// Named values: a record's fields, a call's arguments, an output.
    fn fields(&mut self, fields: &'p [Field], refs: Refs, depth: usize) {
        let mut names = HashSet::new();
        for (index, field) in fields.iter().enumerate() {
            if self.stopped {
                return;
            }
            self.at(Seg::Index(index), |v| {
                v.unique_name("name", &field.name, &mut names, "field");
                v.at(Seg::Key("value"), |v| v.expr(&field.value, refs, depth));
            });
        }
    }

    /// An expression `depth` levels inside another; the bound is checked
    /// before anything inside it is.
    fn expr(&mut self, expr: &'p Expr, refs: Refs, depth: usize) {
        if depth >= MAX_EXPR_DEPTH {
            self.problem(|| format!("an expression nests more than {MAX_EXPR_DEPTH} levels deep"));
            return;
        }
        let inner = depth + 1;
        self.at(Seg::Key("value"), |v| match expr {
            Expr::Literal(value) => v.literal(value),
            Expr::Duration(_) => {}
            Expr::Template(template) => v.template(template, refs),
            Expr::Ref(reference) => v.reference(reference, refs),
            Expr::List(items) => {
                for (index, item) in items.iter().enumerate() {
                    if v.stopped {
                        return;
                    }
                    v.at(Seg::Index(index), |v| v.expr(item, refs, inner));
                }
            }
            Expr::Record(fields) => v.fields(fields, refs, inner),
            Expr::Not(operand) => v.expr(operand, refs, inner),
            Expr::Binary { left, right, .. } => {
                v.at(Seg::Key("left"), |v| v.expr(left, refs, inner));
                v.at(Seg::Key("right"), |v| v.expr(right, refs, inner));
            }
        });
    }

    /// Lowering writes literals for null, booleans, numbers and strings; lists
    /// and records are expressions of their own.
    fn literal(&mut self, value: &'p Value) {
        match value {
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
            Value::String(text) => self.text(text, MAX_TEXT_BYTES, "a string"),
            Value::Array(_) | Value::Object(_) => self.problem(|| {
                format!(
                    "a literal is null, a boolean, a number or a string, not {}",
                    describe_value(value)
                )
            }),
        }
    }

    fn template(&mut self, template: &'p Template, refs: Refs) {
        self.at(Seg::Key("parts"), |v| {
            if template.parts.len() > MAX_TEMPLATE_PARTS {
                v.problem(|| {
                    format!(
                        "{} parts; a template has at most {MAX_TEMPLATE_PARTS}",
                        template.parts.len()
                    )
                });
                return;
            }
            let mut text_bytes = 0;
            for (index, part) in template.parts.iter().enumerate() {
                if v.stopped {
                    return;
                }
                v.at(Seg::Index(index), |v| match part {
                    TemplatePart::Text(text) => {
                        text_bytes += text.len();
                        if text_bytes > MAX_TEXT_BYTES {
                            v.problem(|| {
                                format!(
                                    "the template's text is over {MAX_TEXT_BYTES} bytes by here"
                                )
                            });
                        }
                    }
                    TemplatePart::Ref(reference) => {
                        v.at(Seg::Key("ref"), |v| v.reference(reference, refs))
                    }
                });
                if text_bytes > MAX_TEXT_BYTES {
                    return;
                }
            }
        });
    }

    fn reference(&mut self, reference: &'p Ref, refs: Refs) {
        self.at(Seg::Key("root"), |v| v.root(reference, refs));
        if reference.path.len() > MAX_PATH_SEGMENTS {
            self.problem_at("path", || {
                format!(
                    "a path of {} segments; a reference has at most {MAX_PATH_SEGMENTS}",
                    reference.path.len()
                )
            });
            return;
        }
        self.at(Seg::Key("path"), |v| {
            for (index, segment) in reference.path.iter().enumerate() {
                if let PathSegment::Field(name) = segment {
                    v.at(Seg::Index(index), |v| {
                        v.at(Seg::Key("field"), |v| {
                            v.name(name, format_args!("a field name"))
                        })
                    });
                }
            }
        });
    }

    /// Whether a reference's root exists where it is: the index into the
    /// input fields, slots or loops around it, `error` in a fallback only,
    /// and recipe inputs in a recipe's prompt only.
    fn root(&mut self, reference: &'p Ref, refs: Refs) {
        let root = reference.root;
        let (inputs, slots, scope) = match refs {
            Refs::Workflow {
                inputs,
                slots,
                scope,
            } => (inputs, slots, scope),
            Refs::Destination { inputs, output } => {
                match root {
                    Root::Input => {}
                    Root::InputField(index) if (index as usize) < inputs => {}
                    Root::InputField(index) => self.problem_at("index", || {
                        format!(
                            "input field {index} is past the end of the workflow's {inputs} fields"
                        )
                    }),
                    Root::Output if output => {}
                    Root::Output => self.problem(|| {
                        "the output in a destination delivered on other events than `completed`"
                            .to_string()
                    }),
                    _ => self.problem(|| {
                        format!(
                            "a destination reads the workflow's input and output only, not {}",
                            root_name(root)
                        )
                    }),
                }
                return;
            }
            Refs::Prompt { inputs } => {
                match root {
                    Root::RecipeInput(index) if (index as usize) < inputs => {}
                    Root::RecipeInput(index) => self.problem_at("index", || {
                        format!(
                            "recipe input {index} is past the end of the recipe's {inputs} inputs"
                        )
                    }),
                    _ => self.problem(|| {
                        format!(
                            "a recipe's prompt refers to its own inputs only, not to {}",
                            root_name(root)
                        )
                    }),
                }
                return;
            }
        };
        match root {
            Root::Input => {}
            Root::InputField(index) if (index as usize) < inputs => {}
            Root::InputField(index) => self.problem_at("index", || {
                format!("input field {index} is past the end of the workflow's {inputs} fields")
            }),
            Root::Step(slot) if (slot as usize) < slots => {}
            Root::Step(slot) => self.problem_at("index", || {
                format!("slot {slot} is past the end of the workflow's {slots} slots")
            }),
            Root::LoopItem(level) | Root::LoopIndex(level) if level >= scope.loops => self
                .problem_at("index", || {
                    format!(
                        "{} of loop level {level} where {} loop(s) enclose it",
                        root_name(root),
                        scope.loops
                    )
                }),
            Root::LoopItem(_) => {}
            Root::LoopIndex(_) => {
                if !reference.path.is_empty() {
                    self.problem(|| "a loop index is a number, with no path into it".to_string());
                }
            }
            Root::Error if scope.error => {}
            Root::Error => {
                self.problem(|| "`error` outside a fallback block, where it is not in scope".into())
            }
            Root::RecipeInput(_) => {
                self.problem(|| "a recipe input outside a recipe's prompt".to_string())
            }
            Root::Output => {
                self.problem(|| "the workflow's output outside a destination".to_string())
            }
        }
    }

    // ------------------------------------------------------------ schemas

    /// A workflow's or recipe's input schema: a closed record whose
    /// properties are exactly the input fields.
    fn record_schema(&mut self, schema: &'p Value, fields: &'p [String]) {
        let before = self.problems.len();
        self.schema_root(schema);
        if self.problems.len() > before || self.stopped {
            return;
        }
        let properties = match schema.get("properties") {
            Some(Value::Object(properties))
                if schema.get("type") == Some(&Value::from("object")) =>
            {
                properties
            }
            _ => {
                self.problem(|| "an input schema is a record (`\"type\": \"object\"`)".to_string());
                return;
            }
        };
        let declared: HashSet<&str> = fields.iter().map(String::as_str).collect();
        let extra = properties
            .keys()
            .find(|name| !declared.contains(name.as_str()));
        let missing = fields.iter().find(|name| !properties.contains_key(*name));
        if let Some(name) = extra.or(missing) {
            self.problem_at("properties", || {
                format!(
                    "the properties are not the input fields: {} is in one and not the other",
                    quote(name)
                )
            });
        }
    }

    fn schema_root(&mut self, schema: &'p Value) {
        let mut nodes = 0;
        self.schema(schema, 0, &mut nodes);
        if nodes > MAX_SCHEMA_NODES {
            self.problem(|| {
                format!("the schema has over {MAX_SCHEMA_NODES} values; a schema has at most that")
            });
        }
    }

    /// One schema of a shape that `Ty::json_schema` emits: `{}`, a scalar
    /// `type`, a string `enum` or the duration `pattern`, an `array` with
    /// `items`, a closed `object`, or an optional (`anyOf` of a schema and
    /// null); each but `{}` perhaps with a `description` (a field's doc). `depth` is checked before anything inside is looked at, and the
    /// walk stops once `nodes` passes [`MAX_SCHEMA_NODES`].
    fn schema(&mut self, schema: &'p Value, depth: usize, nodes: &mut usize) {
        *nodes += 1;
        if *nodes > MAX_SCHEMA_NODES || self.stopped {
            return;
        }
        let Value::Object(map) = schema else {
            self.problem(|| format!("a schema is a JSON object, not {}", describe_value(schema)));
            return;
        };
        if map.is_empty() {
            return;
        }
        if let Some(description) = map.get("description") {
            match description {
                Value::String(text) if text.len() > MAX_DESCRIPTION_BYTES => {
                    self.problem_at("description", || {
                        too_long("a description", text, MAX_DESCRIPTION_BYTES)
                    });
                }
                Value::String(_) => {}
                other => self.problem_at("description", || {
                    format!("a description is text, not {}", describe_value(other))
                }),
            }
        }
        let nested = |v: &mut Self| {
            if depth + 1 >= MAX_SCHEMA_DEPTH {
                v.problem(|| format!("the schema nests more than {MAX_SCHEMA_DEPTH} levels deep"));
                false
            } else {
                true
            }
        };
        if let Some(branches) = map.get("anyOf") {
            if !self.keywords(map, &["anyOf"]) {
                return;
            }
            self.at(Seg::Key("anyOf"), |v| {
                let inner = match branches {
                    Value::Array(branches) if branches.len() == 2 && is_null_type(&branches[1]) => {
                        &branches[0]
                    }
                    Value::Array(branches) => {
                        v.problem(|| {
                            format!(
                                "`anyOf` has {} branches; a plan's `anyOf` is an optional, [a schema, {{\"type\": \"null\"}}]",
                                branches.len()
                            )
                        });
                        return;
                    }
                    other => {
                        v.problem(|| format!("`anyOf` is a list, not {}", describe_value(other)));
                        return;
                    }
                };
                *nodes += 1;
                if inner.get("anyOf").is_some() || is_null_type(inner) {
                    v.at(Seg::Index(0), |v| {
                        v.problem(|| "an optional of an optional or of null".to_string())
                    });
                    return;
                }
                if nested(v) {
                    v.at(Seg::Index(0), |v| v.schema(inner, depth + 1, nodes));
                }
            });
            return;
        }
        let Some(Value::String(ty)) = map.get("type") else {
            self.problem(|| {
                "a schema has a `type`, or is `{}` or an optional (`anyOf`)".to_string()
            });
            return;
        };
        match ty.as_str() {
            "integer" | "number" | "boolean" | "null" => {
                self.keywords(map, &["type"]);
            }
            "string" if map.contains_key("pattern") => {
                if self.keywords(map, &["type", "pattern"])
                    && map.get("pattern") != Some(&Value::from(DURATION_PATTERN))
                {
                    self.problem_at("pattern", || {
                        format!("the only pattern a plan holds is {DURATION_PATTERN:?}")
                    });
                }
            }
            "string" if map.contains_key("enum") => {
                if self.keywords(map, &["type", "enum"]) {
                    self.at(Seg::Key("enum"), |v| v.variants(&map["enum"], nodes));
                }
            }
            "string" => {
                self.keywords(map, &["type"]);
            }
            "array" => {
                if self.keywords(map, &["type", "items"]) && nested(self) {
                    self.at(Seg::Key("items"), |v| {
                        v.schema(&map["items"], depth + 1, nodes)
                    });
                }
            }
            "object" => {
                if self.keywords(
                    map,
                    &["type", "properties", "required", "additionalProperties"],
                ) {
                    self.object(map, depth, nodes, nested);
                }
            }
            _ => self.problem_at("type", || {
                format!("{} is not a type a plan holds", quote(ty))
            }),
        }
    }

    /// Whether `map` has exactly the keywords `wanted`, and perhaps a
    /// `description` (checked by `schema`); a problem if not.
    fn keywords(&mut self, map: &'p Map<String, Value>, wanted: &[&str]) -> bool {
        if let Some(extra) = map
            .keys()
            .find(|key| !wanted.contains(&key.as_str()) && *key != "description")
        {
            self.problem(|| {
                format!(
                    "{} does not belong beside {}",
                    quote(extra),
                    wanted.join(", ")
                )
            });
            return false;
        }
        if let Some(missing) = wanted.iter().find(|key| !map.contains_key(**key)) {
            self.problem(|| format!("{} lacks {missing}", wanted[0]));
            return false;
        }
        true
    }

    /// A string enum: 1 to [`MAX_ENUM_VARIANTS`] distinct short strings.
    fn variants(&mut self, variants: &'p Value, nodes: &mut usize) {
        let Value::Array(variants) = variants else {
            self.problem(|| format!("`enum` is a list, not {}", describe_value(variants)));
            return;
        };
        if variants.is_empty() || variants.len() > MAX_ENUM_VARIANTS {
            self.problem(|| {
                format!(
                    "`enum` has {} variants; an enum has from 1 to {MAX_ENUM_VARIANTS}",
                    variants.len()
                )
            });
            return;
        }
        let mut seen = HashSet::new();
        for (index, variant) in variants.iter().enumerate() {
            *nodes += 1;
            if *nodes > MAX_SCHEMA_NODES || self.stopped {
                return;
            }
            self.at(Seg::Index(index), |v| match variant {
                Value::String(text) if text.len() > MAX_VARIANT_BYTES => {
                    v.problem(|| too_long("a variant", text, MAX_VARIANT_BYTES))
                }
                Value::String(text) if !seen.insert(text.as_str()) => {
                    v.problem(|| format!("the variant {} is listed twice", quote(text)))
                }
                Value::String(_) => {}
                other => {
                    v.problem(|| format!("a variant is a string, not {}", describe_value(other)))
                }
            });
        }
    }

    /// A closed record: `properties` named as fields are, `required` a list
    /// of distinct property names, `additionalProperties: false`.
    fn object(
        &mut self,
        map: &'p Map<String, Value>,
        depth: usize,
        nodes: &mut usize,
        nested: impl Fn(&mut Self) -> bool,
    ) {
        if map["additionalProperties"] != Value::Bool(false) {
            self.problem_at("additionalProperties", || {
                "a record is closed: `additionalProperties` is false".to_string()
            });
        }
        let Value::Object(properties) = &map["properties"] else {
            self.problem_at("properties", || "`properties` is an object".to_string());
            return;
        };
        if !properties.is_empty() && !nested(self) {
            return;
        }
        self.at(Seg::Key("properties"), |v| {
            for (name, property) in properties {
                if *nodes > MAX_SCHEMA_NODES || v.stopped {
                    return;
                }
                v.at(Seg::Name(name), |v| {
                    v.name(name, format_args!("a field name"));
                    v.schema(property, depth + 1, nodes);
                });
            }
        });
        let Value::Array(required) = &map["required"] else {
            self.problem_at("required", || "`required` is a list".to_string());
            return;
        };
        self.at(Seg::Key("required"), |v| {
            let mut seen = HashSet::new();
            for (index, name) in required.iter().enumerate() {
                *nodes += 1;
                if *nodes > MAX_SCHEMA_NODES || v.stopped {
                    return;
                }
                v.at(Seg::Index(index), |v| match name {
                    Value::String(name) if !properties.contains_key(name) => {
                        v.problem(|| format!("{} is required but is not a property", quote(name)))
                    }
                    Value::String(name) if !seen.insert(name.as_str()) => {
                        v.problem(|| format!("{} is required twice", quote(name)))
                    }
                    Value::String(_) => {}
                    other => v.problem(|| {
                        format!("a required name is a string, not {}", describe_value(other))
                    }),
                });
            }
        });
    }

    // ------------------------------------------------------------ names and text

    /// A name as the language writes one: a letter or `_`, then letters,
    /// digits and `_`.
    /// `what` is formatted only for a problem: most names have none, and a
    /// phrase built for each was most of the time of validating a big plan.
    fn name(&mut self, name: &str, what: fmt::Arguments<'_>) {
        if name.len() > MAX_NAME_BYTES {
            self.problem(|| too_long(&what.to_string(), name, MAX_NAME_BYTES));
        } else if !is_ident(name) {
            self.problem(|| {
                format!(
                    "{} is not {what}: a letter or `_`, then letters, digits and `_`",
                    quote(name)
                )
            });
        }
    }

    /// [`Self::name`] at `key`, and not one of `seen`.
    fn unique_name(
        &mut self,
        key: &'static str,
        name: &'p str,
        seen: &mut HashSet<&'p str>,
        what: &str,
    ) {
        self.at(Seg::Key(key), |v| {
            v.name(name, format_args!("a {what} name"));
            if !seen.insert(name) {
                v.problem(|| format!("the {what} name {} is used twice", quote(name)));
            }
        });
    }

    /// A list of distinct field names (a workflow's or recipe's inputs).
    fn field_names(&mut self, key: &'static str, names: &'p [String]) {
        self.at(Seg::Key(key), |v| {
            let mut seen = HashSet::new();
            for (index, name) in names.iter().enumerate() {
                if v.stopped {
                    return;
                }
                v.at(Seg::Index(index), |v| {
                    v.name(name, format_args!("a field name"));
                    if !seen.insert(name.as_str()) {
                        v.problem(|| format!("the field {} is listed twice", quote(name)));
                    }
                });
            }
        });
    }

    fn text(&mut self, text: &str, most: usize, what: &str) {
        if text.len() > most {
            self.problem(|| too_long(what, text, most));
        }
    }

    /// A message to people (`what`) whose text alone, before any value
    /// is put in, is past [`MAX_MESSAGE_BYTES`]: every run would fail as
    /// it rendered it, whatever its input.
    fn message(&mut self, message: &Expr, what: &str) {
        if !self.new_plan {
            return;
        }
        let least = match message {
            Expr::Literal(Value::String(text)) => text.len(),
            Expr::Template(template) => template
                .parts
                .iter()
                .map(|part| match part {
                    TemplatePart::Text(text) => text.len(),
                    TemplatePart::Ref(_) => 0,
                })
                .sum(),
            _ => 0,
        };
        if least > MAX_MESSAGE_BYTES {
            self.problem(|| {
                format!("{what} is {least} bytes or more; a message to people has at most {MAX_MESSAGE_BYTES} (put the details in a KB document and refer to it)")
            });
        }
    }

    fn duration(&mut self, ms: u64, what: &str) {
        if !(1..=MAX_DURATION_MS).contains(&ms) {
            self.problem(|| {
                format!(
                    "{what} of {ms} ms; durations are from 1 ms to 365 days ({MAX_DURATION_MS} ms)"
                )
            });
        }
    }
}

/// Whether `plan`'s compact JSON is at most `most` bytes; serializing stops
/// as soon as it is past.
fn json_fits(plan: &Plan, most: u64) -> bool {
    struct Counting {
        written: u64,
        most: u64,
    }
    impl std::io::Write for Counting {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.written += bytes.len() as u64;
            if self.written > self.most {
                return Err(std::io::Error::other("past the bound"));
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    // serde_json writes a token at a time; a buffer makes that a copy, not a
    // call, and the count stays exact at each flush.
    let mut writer = std::io::BufWriter::with_capacity(64 * 1024, Counting { written: 0, most });
    serde_json::to_writer(&mut writer, plan).is_ok() && std::io::Write::flush(&mut writer).is_ok()
}

/// Whether `name` is an identifier of the grammar (a field, a step id):
/// what may follow a `.` in a path.
pub fn is_ident(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The grammar's `tool_name`: a field name, then `-` and name characters.
fn is_tool_name(name: &str) -> bool {
    let mut parts = name.split('-');
    parts.next().is_some_and(is_ident)
        && parts.all(|part| {
            !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

/// `if@LINE:COLUMN`, as lowering names a condition.
fn is_condition_id(id: &str) -> bool {
    let number = |text: &str| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    id.strip_prefix("if@")
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(line, column)| number(line) && number(column))
}

fn is_hash(hash: &str) -> bool {
    hash.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// `{"type": "null"}` exactly: the second branch of an optional.
fn is_null_type(schema: &Value) -> bool {
    schema
        .as_object()
        .is_some_and(|map| map.len() == 1 && map.get("type") == Some(&Value::from("null")))
}

fn root_name(root: Root) -> &'static str {
    match root {
        Root::Input | Root::InputField(_) => "the workflow input",
        Root::Step(_) => "a step",
        Root::LoopItem(_) => "a loop item",
        Root::LoopIndex(_) => "a loop index",
        Root::Error => "`error`",
        Root::RecipeInput(_) => "a recipe input",
        Root::Output => "the workflow's output",
    }
}

/// A JSON value in a few words, never its content.
pub fn describe_value(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn too_long(what: &str, text: &str, most: usize) -> String {
    format!(
        "{what} of {} bytes ({}); at most {most}",
        text.len(),
        quote(text)
    )
}

/// A value quoted for a message: escaped as Rust writes strings (so control
/// characters cannot reach a terminal), and cut short.
fn quote(text: &str) -> String {
    const SHOWN: usize = 40;
    let mut chars = text.chars();
    let shown: String = chars.by_ref().take(SHOWN).collect();
    if chars.next().is_some() {
        format!("{shown:?}…")
    } else {
        format!("{shown:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn retry() -> Value {
        json!({ "attempts": 3, "backoff_min_ms": 2000, "backoff_max_ms": 30000 })
    }

    fn reference(root: &str, index: Option<u32>, path: &[&str]) -> Value {
        let mut root = json!({ "root": root });
        if let Some(index) = index {
            root["index"] = json!(index);
        }
        let path: Vec<Value> = path.iter().map(|f| json!({ "field": f })).collect();
        json!({ "expr": "ref", "value": { "root": root, "path": path } })
    }

    /// A valid plan that uses every kind of node, step, reference root and
    /// schema shape, as JSON, so that each case below is a small patch of it.
    fn base() -> Value {
        json!({
            "format_version": 1,
            "hash": format!("sha256:{}", "0".repeat(64)),
            "source": "base.flow",
            "workflows": [workflow()],
            "recipes": [recipe()],
            "mcp_servers": [{
                "name": "browser",
                "transport": { "kind": "stdio", "command": "npx", "args": ["@playwright/mcp"], "env": [["DISPLAY", ":0"]] },
            }],
        })
    }

    fn workflow() -> Value {
        let priority =
            json!({ "anyOf": [{ "type": "string", "enum": ["low", "high"] }, { "type": "null" }] });
        let ticket = json!({
            "type": "object",
            "properties": { "subject": { "type": "string" }, "priority": priority },
            "required": ["subject"],
            "additionalProperties": false,
        });
        json!({
            "name": "triage",
            "input_fields": ["ticket", "tags"],
            "input_schema": {
                "type": "object",
                "properties": {
                    "ticket": ticket,
                    "tags": { "type": "array", "items": { "type": "string" } },
                },
                "required": ["ticket", "tags"],
                "additionalProperties": false,
            },
            "timeout_ms": 300_000,
            "durability": "full",
            "context": ["policies"],
            "department": "support",
            "on_error": { "kind": "fallback", "body": [notify()] },
            "slots": [
                { "id": "classify", "kind": "recipe" },
                { "id": "each", "kind": "loop" },
                { "id": "look", "kind": "browser" },
                { "id": "both", "kind": "parallel" },
                { "id": "gate", "kind": "approval" },
                { "id": "note", "kind": "kb_write" },
                { "id": "notify", "kind": "handoff" },
            ],
            "body": [classify(), each(), condition()],
            "output": [{ "name": "category", "value": reference("step", Some(0), &["category"]) }],
        })
    }

    fn notify() -> Value {
        json!({
            "node": "step", "slot": 6, "id": "notify",
            "action": {
                "kind": "handoff",
                "department": { "parts": [{ "text": "support" }] },
                "message": reference("error", None, &["message"]),
                "subject": null,
            },
            "retry": retry(), "timeout_ms": 60_000,
        })
    }

    fn classify() -> Value {
        let subject = json!({ "ref": { "root": { "root": "input_field", "index": 0 }, "path": [{ "field": "subject" }] } });
        json!({
            "node": "step", "slot": 0, "id": "classify",
            "action": { "kind": "recipe", "recipe": 0, "args": [{
                "name": "text",
                "value": { "expr": "template", "value": { "parts": [{ "text": "Subject: " }, subject] } },
            }]},
            "retry": retry(), "timeout_ms": 60_000,
        })
    }

    fn each() -> Value {
        let look = json!({
            "node": "step", "slot": 2, "id": "look",
            "action": { "kind": "browser", "server": 0, "tool": "browser_navigate-v2", "args": [
                { "name": "url", "value": reference("loop_item", Some(0), &[]) },
                { "name": "n", "value": reference("loop_index", Some(0), &[]) },
            ]},
            "retry": retry(), "timeout_ms": 60_000,
        });
        json!({
            "node": "loop", "slot": 1, "id": "each",
            "collection": reference("input_field", Some(1), &[]),
            "concurrency": 4, "level": 0,
            "body": [look],
        })
    }

    fn condition() -> Value {
        let gate = json!({
            "node": "step", "slot": 4, "id": "gate",
            "action": {
                "kind": "approval",
                "approvers": { "expr": "list", "value": [{ "expr": "literal", "value": "leads" }] },
                "message": { "expr": "literal", "value": "ok?" },
                "expires_ms": 86_400_000,
                "on_reject": "fail", "on_expire": "reject",
            },
            "retry": retry(), "timeout_ms": 60_000,
        });
        let metadata = json!({ "expr": "record", "value": [
            { "name": "at", "value": { "expr": "duration", "value": 5000 } },
        ]});
        let note = json!({
            "node": "step", "slot": 5, "id": "note",
            "action": {
                "kind": "kb_write",
                "collection": { "parts": [{ "text": "notes" }] },
                "title": { "expr": "literal", "value": "t" },
                "content": { "expr": "not", "value": { "expr": "literal", "value": true } },
                "metadata": metadata,
            },
            "retry": retry(), "timeout_ms": 60_000,
            "on_error": { "kind": "fallback", "body": [] },
            "idempotency_key": reference("input", None, &[]),
        });
        let both = json!({
            "node": "parallel", "slot": 3, "id": "both",
            "branches": [{ "name": "a", "body": [gate] }, { "name": "b", "body": [note] }],
        });
        let condition = json!({ "expr": "binary", "value": {
            "op": "eq",
            "left": reference("step", Some(0), &["category"]),
            "right": { "expr": "literal", "value": "bug" },
        }});
        json!({
            "node": "condition", "id": "if@12:3",
            "branches": [{ "condition": condition, "body": [both] }],
            "otherwise": [],
        })
    }

    fn recipe() -> Value {
        let output = json!({
            "type": "object",
            "properties": {
                "category": { "type": "string", "enum": ["bug", "billing"] },
                "wait": { "type": "string", "pattern": DURATION_PATTERN },
                "score": { "type": "integer" },
                "notes": {},
            },
            "required": ["category", "wait", "score", "notes"],
            "additionalProperties": false,
        });
        json!({
            "name": "classify",
            "model": "default",
            "input_fields": ["text"],
            "input_schema": {
                "type": "object",
                "properties": { "text": { "type": "string" } },
                "required": ["text"],
                "additionalProperties": false,
            },
            "output_schema": output,
            "prompt": { "parts": [
                { "text": "Classify " },
                { "ref": { "root": { "root": "recipe_input", "index": 0 } } },
            ]},
            "context": [],
        })
    }

    /// Sets the value at a JSON Pointer, adding an object key or appending to
    /// a list when the last segment is new.
    fn patch(json: &mut Value, pointer: &str, value: Value) {
        let (parent, last) = pointer.rsplit_once('/').expect("a pointer");
        match json.pointer_mut(parent).expect("the parent exists") {
            Value::Object(map) => {
                map.insert(last.replace("~1", "/").replace("~0", "~"), value);
            }
            Value::Array(items) => {
                let index: usize = last.parse().expect("an index");
                if index == items.len() {
                    items.push(value);
                } else {
                    items[index] = value;
                }
            }
            other => panic!("cannot patch into {other}"),
        }
    }

    fn problems_of(json: &Value) -> PlanProblems {
        let plan: Plan =
            serde_json::from_value(json.clone()).expect("the patch keeps a plan's shape");
        plan.validate().expect_err("the patched plan is refused")
    }

    /// `plan` handed to [`PlanInPieces`] as the checker hands it a plan.
    fn in_pieces(plan: &Plan) -> Result<(), PlanProblems> {
        let mut pieces = PlanInPieces::new(
            &plan.source,
            &plan.recipes,
            &plan.mcp_servers,
            plan.workflows.len(),
        );
        for (index, workflow) in plan.workflows.iter().enumerate() {
            let header = Workflow {
                slots: Vec::new(),
                body: Vec::new(),
                on_error: OnError::Fail,
                ..workflow.clone()
            };
            pieces.workflow(index, &header, workflow.slots.len());
            for (index, node) in workflow.body.iter().enumerate() {
                pieces.node(index, node);
            }
            pieces.on_error(&workflow.on_error);
            pieces.workflow_end(&header);
        }
        pieces.finish()
    }

    /// A plan checked in pieces finds each limit where the whole plan's
    /// validation does, in the same words, step and order, so that
    /// `flowc check` and `flowc build` report E212 alike.
    #[test]
    fn a_plan_in_pieces_finds_the_limits_the_whole_plan_does() {
        let w = "/workflows/0";
        let long = "s".repeat(MAX_NAME_BYTES + 1);
        let text = json!({ "expr": "literal", "value": "x".repeat(MAX_TEXT_BYTES + 1) });
        // (what, the patches, the step the first problem is in)
        type Case<'a> = (&'a str, Vec<(String, Value)>, Option<&'a str>);
        let cases: Vec<Case> = vec![
            (
                "a step id in a loop",
                vec![
                    (format!("{w}/slots/2/id"), json!(long)),
                    (format!("{w}/body/1/body/0/id"), json!(long)),
                ],
                Some(long.as_str()),
            ),
            (
                "a string in a parallel's branch in a condition",
                vec![(
                    format!("{w}/body/2/branches/0/body/0/branches/0/body/0/action/message"),
                    text.clone(),
                )],
                Some("gate"),
            ),
            (
                "a condition's own expression",
                vec![(
                    format!("{w}/body/2/branches/0/condition/value/right"),
                    text.clone(),
                )],
                Some("if@12:3"),
            ),
            (
                "a string in the fallback",
                vec![(format!("{w}/on_error/body/0/action/message"), text.clone())],
                Some("notify"),
            ),
            (
                "a department",
                vec![(format!("{w}/department"), json!(long))],
                None,
            ),
            (
                "a recipe's model",
                vec![("/recipes/0/model".to_string(), json!(long))],
                None,
            ),
            (
                "a server's argument",
                vec![(
                    "/mcp_servers/0/transport/args/0".to_string(),
                    json!("a".repeat(MAX_SETTING_BYTES + 1)),
                )],
                None,
            ),
            (
                "the output, the fallback, a loop's step and the first node at once",
                vec![
                    (format!("{w}/output/0/value"), text.clone()),
                    (format!("{w}/on_error/body/0/action/message"), text.clone()),
                    (format!("{w}/slots/2/id"), json!(long)),
                    (format!("{w}/body/1/body/0/id"), json!(long)),
                    (format!("{w}/body/0/action/args/0/value"), text.clone()),
                ],
                Some("classify"),
            ),
        ];
        let whole: Plan = serde_json::from_value(base()).unwrap();
        assert_eq!(in_pieces(&whole), Ok(()));
        for (name, patches, step) in cases {
            let mut json = base();
            for (pointer, value) in patches {
                patch(&mut json, &pointer, value);
            }
            let plan: Plan = serde_json::from_value(json).unwrap();
            let whole = plan.validate_content().expect_err(name);
            let pieces = in_pieces(&plan).expect_err(name);
            assert_eq!(pieces.problems[0].step.as_deref(), step, "{name}");
            assert_eq!(pieces, whole, "{name}");
        }
    }

    /// An approval in a workflow's handler is never asked (E213): named
    /// for a deploy to refuse, while a stored plan that has one still loads
    /// (a version deployed before the check keeps its runs).
    #[test]
    fn a_gate_in_the_handler_is_named_and_still_valid() {
        let mut json = base();
        let w = "/workflows/0";
        patch(&mut json, &format!("{w}/slots/6/kind"), json!("approval"));
        patch(
            &mut json,
            &format!("{w}/on_error/body/0/action"),
            json!({
                "kind": "approval",
                "approvers": { "expr": "list", "value": [{ "expr": "literal", "value": "ops" }] },
                "message": { "expr": "literal", "value": "retry?" },
                "on_reject": "fail", "on_expire": "reject",
            }),
        );
        let plan: Plan = serde_json::from_value(json).unwrap();
        assert_eq!(plan.gates_never_asked(), ["triage/notify"]);
        assert_eq!(plan.validate(), Ok(()));
        let base: Plan = serde_json::from_value(base()).unwrap();
        assert!(base.gates_never_asked().is_empty());
    }

    /// What would fail every run at a step is refused in a new plan, and
    /// kept in a stored one, whose parked runs may never reach the step
    /// (the review of the check: flowd read such a plan as damaged).
    #[test]
    fn a_stored_plan_keeps_a_step_that_would_fail_every_run() {
        let mut json = base();
        let gate = "/workflows/0/body/2/branches/0/body/0/branches/0/body/0";
        let approvers: Vec<Value> = (0..=MAX_APPROVERS)
            .map(|n| json!({ "expr": "literal", "value": format!("a{n}") }))
            .collect();
        patch(
            &mut json,
            &format!("{gate}/action/approvers"),
            json!({ "expr": "list", "value": approvers }),
        );
        let plan: Plan = serde_json::from_value(json).unwrap();
        assert!(plan.validate().is_err());
        assert_eq!(plan.validate_stored(), Ok(()));
    }

    #[test]
    fn the_base_plan_is_valid() {
        let plan: Plan = serde_json::from_value(base()).unwrap();
        assert_eq!(plan.validate(), Ok(()));
        let sealed = plan.seal();
        assert_eq!(sealed.validate(), Ok(()));
    }

    /// A refusal: its name, the patches (JSON Pointer, new value) that make
    /// the base plan wrong, where the problem is and what it says.
    type Case = (&'static str, Vec<(String, Value)>, String, &'static str);

    #[test]
    fn each_kind_of_plan_the_compiler_never_writes_is_refused() {
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        let w = "/workflows/0";
        let step0 = "/workflows/0/body/0";
        let look = "/workflows/0/body/1/body/0";
        let gate = "/workflows/0/body/2/branches/0/body/0/branches/0/body/0";
        let out = "/workflows/0/output/0/value";
        let ticket = "/workflows/0/input_schema/properties/ticket";
        let priority = "/workflows/0/input_schema/properties/ticket/properties/priority";
        let output_schema = "/recipes/0/output_schema";
        let string = json!({ "type": "string" });
        let null_type = json!({ "type": "null" });
        let approvers: Vec<Value> = (0..=MAX_APPROVERS)
            .map(|n| json!({ "expr": "literal", "value": format!("a{n}") }))
            .collect();
        let message = "m".repeat(MAX_MESSAGE_BYTES + 1);
        let cases: Vec<Case> = vec![
            // What every run would refuse as it reached the step (an audit:
            // `flowc check` passed them).
            (
                "an approval naming more approvers than it may",
                vec![(
                    format!("{gate}/action/approvers"),
                    json!({ "expr": "list", "value": approvers }),
                )],
                format!("{gate}/action/approvers"),
                "names 101 approvers; it may name at most 100",
            ),
            (
                "an approval's message past the bytes of a message to people",
                vec![(
                    format!("{gate}/action/message"),
                    json!({ "expr": "literal", "value": message }),
                )],
                format!("{gate}/action/message"),
                "an approval's message is 65537 bytes or more",
            ),
            (
                "a handoff's subject whose text alone is past them",
                vec![(
                    format!("{w}/on_error/body/0/action/subject"),
                    json!({ "expr": "template", "value": { "parts": [
                        { "text": message },
                        { "ref": { "root": { "root": "error" }, "path": [{ "field": "message" }] } },
                    ] } }),
                )],
                format!("{w}/on_error/body/0/action/subject"),
                "a handoff's subject is 65537 bytes or more",
            ),
            // Destinations.
            (
                "a destination's event named twice",
                vec![(
                    format!("{w}/destinations"),
                    json!([{ "events": ["failed", "failed"], "target": { "kind": "webhook", "endpoint": "crm" } }]),
                )],
                format!("{w}/destinations/0/events"),
                "names each of its events once",
            ),
            (
                "a destination's empty endpoint",
                vec![(
                    format!("{w}/destinations"),
                    json!([{ "events": ["completed"], "target": { "kind": "webhook", "endpoint": " " } }]),
                )],
                format!("{w}/destinations/0/target/endpoint"),
                "a webhook endpoint's name is empty",
            ),
            (
                "the output in a destination on failure",
                vec![(
                    format!("{w}/destinations"),
                    json!([{ "events": ["failed"], "target": { "kind": "kb", "collection": "c",
                        "title": { "parts": [] }, "content": { "expr": "ref", "value": { "root": { "root": "output" } } } } }]),
                )],
                format!("{w}/destinations/0/target/content/value/root"),
                "other events than `completed`",
            ),
            (
                "a step in a destination",
                vec![(
                    format!("{w}/destinations"),
                    json!([{ "events": ["completed"], "target": { "kind": "email", "to": ["a"],
                        "subject": { "parts": [{ "ref": { "root": { "root": "step", "index": 0 } } }] },
                        "body": { "parts": [] } } }]),
                )],
                format!("{w}/destinations/0/target/subject/parts/0/ref/root"),
                "input and output only, not a step",
            ),
            (
                "the output outside a destination",
                vec![(
                    out.to_string(),
                    json!({ "expr": "ref", "value": { "root": { "root": "output" } } }),
                )],
                format!("{out}/value/root"),
                "the workflow's output outside a destination",
            ),
            // Indices and references.
            (
                "a recipe index past the end",
                vec![(format!("{step0}/action/recipe"), json!(5))],
                format!("{step0}/action/recipe"),
                "recipe 5 is past the end of the plan's 1 recipes",
            ),
            (
                "an MCP server index past the end",
                vec![(format!("{look}/action/server"), json!(3))],
                format!("{look}/action/server"),
                "MCP server 3 is past the end",
            ),
            (
                "a slot past the end",
                vec![(format!("{step0}/slot"), json!(99))],
                format!("{step0}/slot"),
                "slot 99 is past the end of the workflow's 7 slots",
            ),
            (
                "a slot of another step",
                vec![(format!("{step0}/slot"), json!(2))],
                format!("{step0}/slot"),
                "slot 2 is step \"look\"'s, not \"classify\"'s",
            ),
            (
                "a slot of another kind",
                vec![(format!("{w}/slots/0/kind"), json!("approval"))],
                format!("{step0}/slot"),
                "kind `approval`, and this one is of kind `recipe`",
            ),
            (
                "a slot no step claims",
                vec![(
                    format!("{w}/slots/7"),
                    json!({ "id": "spare", "kind": "recipe" }),
                )],
                format!("{w}/slots/7"),
                "slot 7 (\"spare\") belongs to no step",
            ),
            (
                "two slots of one id",
                vec![(format!("{w}/slots/1/id"), json!("classify"))],
                format!("{w}/slots/1/id"),
                "the step id \"classify\" is used twice",
            ),
            (
                "an input field past the end",
                vec![(
                    format!("{step0}/action/args/0/value/value/parts/1/ref/root/index"),
                    json!(7),
                )],
                format!("{step0}/action/args/0/value/value/parts/1/ref/root/index"),
                "input field 7 is past the end of the workflow's 2 fields",
            ),
            (
                "a step reference past the slots",
                vec![(format!("{out}/value/root/index"), json!(40))],
                format!("{out}/value/root/index"),
                "slot 40 is past the end",
            ),
            (
                "a loop item outside any loop",
                vec![(out.to_string(), reference("loop_item", Some(0), &[]))],
                format!("{out}/value/root/index"),
                "a loop item of loop level 0 where 0 loop(s) enclose it",
            ),
            (
                "a loop index of a level too deep",
                vec![(
                    format!("{look}/action/args/1/value"),
                    reference("loop_index", Some(1), &[]),
                )],
                format!("{look}/action/args/1/value/value/root/index"),
                "a loop index of loop level 1 where 1 loop(s)",
            ),
            (
                "a path into a loop index",
                vec![(
                    format!("{look}/action/args/1/value"),
                    reference("loop_index", Some(0), &["x"]),
                )],
                format!("{look}/action/args/1/value/value/root"),
                "a loop index is a number",
            ),
            (
                "error outside a fallback",
                vec![(out.to_string(), reference("error", None, &[]))],
                format!("{out}/value/root"),
                "`error` outside a fallback block",
            ),
            (
                "a recipe input in a workflow",
                vec![(out.to_string(), reference("recipe_input", Some(0), &[]))],
                format!("{out}/value/root"),
                "a recipe input outside a recipe's prompt",
            ),
            (
                "a step in a recipe's prompt",
                vec![(
                    "/recipes/0/prompt/parts/1/ref/root".into(),
                    json!({ "root": "step", "index": 0 }),
                )],
                "/recipes/0/prompt/parts/1/ref/root".into(),
                "refers to its own inputs only, not to a step",
            ),
            (
                "a recipe input past the end",
                vec![("/recipes/0/prompt/parts/1/ref/root/index".into(), json!(3))],
                "/recipes/0/prompt/parts/1/ref/root/index".into(),
                "recipe input 3 is past the end of the recipe's 1 inputs",
            ),
            (
                "a loop of the wrong level",
                vec![(format!("{w}/body/1/level"), json!(2))],
                format!("{w}/body/1/level"),
                "a loop inside 0 loop(s) has level 2, not 0",
            ),
            // Numbers.
            (
                "concurrency 0",
                vec![(format!("{w}/body/1/concurrency"), json!(0))],
                format!("{w}/body/1/concurrency"),
                "concurrency 0 is not from 1 to 1000",
            ),
            (
                "concurrency 1001",
                vec![(format!("{w}/body/1/concurrency"), json!(1001))],
                format!("{w}/body/1/concurrency"),
                "concurrency 1001 is not from 1 to 1000",
            ),
            (
                "500 attempts",
                vec![(format!("{step0}/retry/attempts"), json!(500))],
                format!("{step0}/retry/attempts"),
                "500 attempts; a retry makes from 1 to 100",
            ),
            (
                "0 attempts",
                vec![(format!("{step0}/retry/attempts"), json!(0))],
                format!("{step0}/retry/attempts"),
                "0 attempts",
            ),
            (
                "a zero backoff",
                vec![(format!("{step0}/retry/backoff_min_ms"), json!(0))],
                format!("{step0}/retry/backoff_min_ms"),
                "a backoff of 0 ms; durations are from 1 ms to 365 days",
            ),
            (
                "a backoff that goes backwards",
                vec![(format!("{step0}/retry/backoff_min_ms"), json!(40_000))],
                format!("{step0}/retry/backoff_max_ms"),
                "the backoff goes backwards, from 40000 ms to 30000 ms",
            ),
            (
                "a workflow timeout over a year",
                vec![(format!("{w}/timeout_ms"), json!(MAX_DURATION_MS + 1))],
                format!("{w}/timeout_ms"),
                "a workflow's timeout of 31536000001 ms",
            ),
            (
                "an approval that expires at once",
                vec![(format!("{gate}/action/expires_ms"), json!(0))],
                format!("{gate}/action/expires_ms"),
                "an approval's expiry of 0 ms",
            ),
            // Schemas.
            (
                "an anyOf of three branches",
                vec![(
                    format!("{priority}/anyOf"),
                    json!([string, string, null_type]),
                )],
                format!("{priority}/anyOf"),
                "`anyOf` has 3 branches; a plan's `anyOf` is an optional",
            ),
            (
                "an anyOf whose second branch is not null",
                vec![(format!("{priority}/anyOf/1"), string.clone())],
                format!("{priority}/anyOf"),
                "`anyOf` has 2 branches",
            ),
            (
                "an optional of an optional",
                vec![(
                    format!("{priority}/anyOf/0"),
                    json!({ "anyOf": [string, null] }),
                )],
                format!("{priority}/anyOf/0"),
                "an optional of an optional or of null",
            ),
            (
                "anyOf beside another keyword",
                vec![(format!("{priority}/type"), json!("string"))],
                priority.to_string(),
                "does not belong beside anyOf",
            ),
            (
                "a description that is not text",
                vec![(format!("{ticket}/properties/subject/description"), json!(3))],
                format!("{ticket}/properties/subject/description"),
                "a description is text, not",
            ),
            (
                "a description past its bound",
                vec![(
                    format!("{priority}/description"),
                    json!("x".repeat(MAX_DESCRIPTION_BYTES + 1)),
                )],
                format!("{priority}/description"),
                "a description of 4097 bytes",
            ),
            (
                "an unknown keyword",
                vec![(format!("{ticket}/properties/subject/minLength"), json!(3))],
                format!("{ticket}/properties/subject"),
                "\"minLength\" does not belong beside type",
            ),
            (
                "a pattern other than the duration's",
                vec![(
                    format!("{output_schema}/properties/wait/pattern"),
                    json!(".*"),
                )],
                format!("{output_schema}/properties/wait/pattern"),
                "the only pattern a plan holds",
            ),
            (
                "an empty enum",
                vec![(
                    format!("{output_schema}/properties/category/enum"),
                    json!([]),
                )],
                format!("{output_schema}/properties/category/enum"),
                "`enum` has 0 variants; an enum has from 1 to 10000",
            ),
            (
                "a variant listed twice",
                vec![(
                    format!("{output_schema}/properties/category/enum/1"),
                    json!("bug"),
                )],
                format!("{output_schema}/properties/category/enum/1"),
                "the variant \"bug\" is listed twice",
            ),
            (
                "a variant that is not a string",
                vec![(
                    format!("{output_schema}/properties/category/enum/1"),
                    json!(7),
                )],
                format!("{output_schema}/properties/category/enum/1"),
                "a variant is a string, not a number",
            ),
            (
                "an open record",
                vec![(format!("{ticket}/additionalProperties"), json!(true))],
                format!("{ticket}/additionalProperties"),
                "a record is closed",
            ),
            (
                "a required field that is no property",
                vec![(format!("{ticket}/required/0"), json!("body"))],
                format!("{ticket}/required/0"),
                "\"body\" is required but is not a property",
            ),
            (
                "a type a plan never holds",
                vec![(
                    format!("{ticket}/properties/subject/type"),
                    json!("decimal"),
                )],
                format!("{ticket}/properties/subject/type"),
                "\"decimal\" is not a type a plan holds",
            ),
            (
                "a boolean schema",
                vec![(format!("{ticket}/properties/subject"), json!(true))],
                format!("{ticket}/properties/subject"),
                "a schema is a JSON object, not a boolean",
            ),
            (
                "a schema without a type",
                vec![(
                    format!("{ticket}/properties/subject"),
                    json!({ "items": {} }),
                )],
                format!("{ticket}/properties/subject"),
                "a schema has a `type`",
            ),
            (
                "an input schema that is not a record",
                vec![(format!("{w}/input_schema"), json!({}))],
                format!("{w}/input_schema"),
                "an input schema is a record",
            ),
            (
                "input fields that are not the properties",
                vec![(format!("{w}/input_fields/1"), json!("other"))],
                format!("{w}/input_schema/properties"),
                "the properties are not the input fields",
            ),
            (
                "a property named with a space",
                vec![
                    (format!("{output_schema}/properties/a b"), json!({})),
                    (format!("{output_schema}/required/4"), json!("a b")),
                ],
                format!("{output_schema}/properties/a b"),
                "\"a b\" is not a field name",
            ),
            // Names and sizes.
            (
                "a workflow name with a slash",
                vec![(format!("{w}/name"), json!("a/b"))],
                format!("{w}/name"),
                "\"a/b\" is not a workflow name",
            ),
            (
                "two workflows of one name",
                vec![("/workflows/1".into(), base()["workflows"][0].clone())],
                "/workflows/1/name".into(),
                "the workflow name \"triage\" is used twice",
            ),
            (
                "a name over 256 bytes",
                vec![
                    ("/recipes/0/name".into(), json!(long)),
                    (format!("{step0}/action/recipe"), json!(0)),
                ],
                "/recipes/0/name".into(),
                "a recipe name of 257 bytes",
            ),
            (
                "a field given twice",
                vec![(
                    format!("{w}/output/1"),
                    base()["workflows"][0]["output"][0].clone(),
                )],
                format!("{w}/output/1/name"),
                "the field name \"category\" is used twice",
            ),
            (
                "a literal list",
                vec![(format!("{gate}/action/message/value"), json!([1, 2]))],
                format!("{gate}/action/message/value"),
                "a literal is null, a boolean, a number or a string, not a list",
            ),
            (
                "a string literal over a mebibyte",
                vec![(
                    format!("{gate}/action/message/value"),
                    json!("x".repeat(MAX_TEXT_BYTES + 1)),
                )],
                format!("{gate}/action/message/value"),
                "a string of 1048577 bytes",
            ),
            (
                "a condition id of another form",
                vec![(format!("{w}/body/2/id"), json!("cond"))],
                format!("{w}/body/2/id"),
                "\"cond\" is not a condition's id",
            ),
            (
                "a condition without branches",
                vec![
                    (format!("{w}/body/2/branches"), json!([])),
                    (
                        format!("{w}/slots"),
                        json!([
                            { "id": "classify", "kind": "recipe" }, { "id": "each", "kind": "loop" }, { "id": "look", "kind": "browser" }, { "id": "notify", "kind": "handoff" },
                        ]),
                    ),
                    (format!("{w}/on_error/body/0/slot"), json!(3)),
                ],
                format!("{w}/body/2/branches"),
                "a condition has no branch",
            ),
            (
                "two parallel branches of one name",
                vec![(
                    format!("{w}/body/2/branches/0/body/0/branches/1/name"),
                    json!("a"),
                )],
                format!("{w}/body/2/branches/0/body/0/branches/1/name"),
                "the branch name \"a\" is used twice",
            ),
            (
                "a tool name with a space",
                vec![(format!("{look}/action/tool"), json!("go to"))],
                format!("{look}/action/tool"),
                "\"go to\" is not a tool name",
            ),
            (
                "an environment variable named with a dash",
                vec![("/mcp_servers/0/transport/env/0/0".into(), json!("MY-VAR"))],
                "/mcp_servers/0/transport/env/0/0".into(),
                "\"MY-VAR\" is not an environment variable's name",
            ),
            (
                "an empty department",
                vec![(format!("{w}/department"), json!(""))],
                format!("{w}/department"),
                "a department's name is empty",
            ),
            (
                "a hash of another form",
                vec![("/hash".into(), json!("md5:abc"))],
                "/hash".into(),
                "\"md5:abc\" is not `sha256:` and 64 hexadecimal digits",
            ),
            (
                "another format version",
                vec![("/format_version".into(), json!(2))],
                "/format_version".into(),
                "format version 2 is not 1",
            ),
            (
                "a template of too many parts",
                vec![(
                    "/recipes/0/prompt/parts".into(),
                    json!(vec![json!({ "text": "x" }); MAX_TEMPLATE_PARTS + 1]),
                )],
                "/recipes/0/prompt/parts".into(),
                "10001 parts; a template has at most 10000",
            ),
        ];
        let mut failures = Vec::new();
        for (name, patches, path, message) in cases {
            let mut json = base();
            for (pointer, value) in patches {
                patch(&mut json, &pointer, value);
            }
            let found = problems_of(&json);
            if !found
                .problems
                .iter()
                .any(|p| p.path == path && p.message.contains(message))
            {
                failures.push(format!("{name}: wanted {path}: {message}\n  found {found}"));
            }
            // Every problem points at a value that is in the plan.
            for problem in &found.problems {
                if json.pointer(&problem.path).is_none() {
                    failures.push(format!("{name}: {} is not in the plan", problem.path));
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// The plan of issue 21: an input schema with an `anyOf` of 20,000
    /// branches made each start request cost seconds and hundreds of MB.
    #[test]
    fn an_anyof_of_20000_branches_is_refused_in_one_short_problem() {
        let mut json = base();
        let branches: Vec<Value> = (0..20_000)
            .map(|i| json!({ "type": "string", "enum": [format!("v{i}")] }))
            .collect();
        patch(
            &mut json,
            "/workflows/0/input_schema/properties/tags/items",
            json!({ "anyOf": branches }),
        );
        let found = problems_of(&json);
        assert_eq!(found.problems.len(), 1, "{found}");
        assert!(!found.stopped);
        assert_eq!(
            found.problems[0].to_string(),
            "/workflows/0/input_schema/properties/tags/items/anyOf: `anyOf` has 20000 branches; a plan's `anyOf` is an optional, [a schema, {\"type\": \"null\"}]"
        );
    }

    #[test]
    fn problems_stop_at_100_and_say_that_validation_stopped() {
        let mut json = base();
        let args: Vec<Value> = (0..500)
            .map(|i| json!({ "name": format!("a{i}"), "value": reference("step", Some(1000 + i), &[]) }))
            .collect();
        patch(&mut json, "/workflows/0/body/0/action/args", json!(args));
        let found = problems_of(&json);
        assert_eq!(found.problems.len(), MAX_PROBLEMS);
        assert!(found.stopped);
        assert!(found.to_string().starts_with("the plan is not one flowc could have built (100 problems, and validation stopped there)\n  /workflows/0/body/0/action/args/0/value/value/root/index: slot 1000 is past the end"), "{found}");
    }

    #[test]
    fn every_problem_is_at_most_300_characters_whatever_it_quotes() {
        let mut json = base();
        let huge = "\u{1b}[31m".repeat(200_000);
        patch(&mut json, "/workflows/0/name", json!(huge));
        patch(
            &mut json,
            "/workflows/0/input_schema/properties/ticket/properties/priority/anyOf/0/enum/0",
            json!(huge),
        );
        // A deep path: a property nested 100 levels, with long names.
        let mut schema = json!({ "type": "decimal" });
        for level in 0..100 {
            schema = json!({ "type": "object", "properties": { format!("field_{level}_{}", "n".repeat(200)): schema }, "required": [], "additionalProperties": false });
        }
        patch(&mut json, "/recipes/0/output_schema", schema);
        let found = problems_of(&json);
        assert_eq!(found.problems.len(), 3, "{found}");
        for problem in &found.problems {
            let text = problem.to_string();
            assert!(
                text.chars().count() <= MAX_PROBLEM_CHARS,
                "{} characters: {text}",
                text.chars().count()
            );
            assert!(
                !text.contains('\u{1b}'),
                "control characters reach the message: {text:?}"
            );
        }
        assert!(
            found.problems[2].path.contains('…'),
            "{}",
            found.problems[2].path
        );
        assert!(
            found.problems[2]
                .message
                .contains("is not a type a plan holds")
        );
    }

    /// Plans built in memory are not bounded by `from_json`'s depth scan;
    /// the validator checks depth before it recurses.
    #[test]
    fn deep_expressions_blocks_and_schemas_are_refused_before_recursing() {
        let mut plan: Plan = serde_json::from_value(base()).unwrap();
        let mut expr = Expr::Literal(Value::Bool(true));
        for _ in 0..2_000 {
            expr = Expr::Not(Box::new(expr));
        }
        plan.workflows[0].output[0].value = expr;
        let found = plan.validate().unwrap_err();
        assert_eq!(found.problems.len(), 1, "{found}");
        assert!(
            found.problems[0]
                .message
                .contains("an expression nests more than 256 levels deep")
        );
        assert!(
            found.problems[0]
                .path
                .starts_with("/workflows/0/output/0/value/value/value")
        );

        let mut plan: Plan = serde_json::from_value(base()).unwrap();
        let mut body = Vec::new();
        for _ in 0..1_000 {
            body = vec![Node::Condition {
                id: "if@1:1".into(),
                branches: vec![crate::ConditionBranch {
                    condition: Expr::Literal(Value::Bool(true)),
                    body,
                }],
                otherwise: None,
            }];
        }
        plan.workflows[0].body.extend(body);
        let found = plan.validate().unwrap_err();
        assert_eq!(found.problems.len(), 1, "{found}");
        assert!(
            found.problems[0]
                .message
                .contains("blocks nest more than 128 levels deep")
        );

        let mut json = base();
        let mut schema = json!({ "type": "string" });
        for _ in 0..1_000 {
            schema = json!({ "type": "array", "items": schema });
        }
        patch(&mut json, "/recipes/0/output_schema", schema);
        let found = problems_of(&json);
        assert_eq!(found.problems.len(), 1, "{found}");
        assert!(
            found.problems[0]
                .message
                .contains("the schema nests more than 128 levels deep")
        );
    }

    #[test]
    fn a_schema_of_too_many_values_is_refused_once() {
        let mut json = base();
        let properties: Map<String, Value> = (0..MAX_SCHEMA_NODES)
            .map(|i| (format!("f{i}"), json!({})))
            .collect();
        patch(
            &mut json,
            "/recipes/0/output_schema",
            json!({ "type": "object", "properties": properties, "required": [], "additionalProperties": false }),
        );
        let found = problems_of(&json);
        assert_eq!(found.problems.len(), 1, "{found}");
        assert_eq!(
            found.problems[0].to_string(),
            "/recipes/0/output_schema: the schema has over 100000 values; a schema has at most that"
        );
    }

    #[test]
    fn the_size_of_a_plan_is_measured_without_writing_it_out() {
        let plan: Plan = serde_json::from_value(base()).unwrap();
        let size = serde_json::to_string(&plan).unwrap().len() as u64;
        assert!(json_fits(&plan, size));
        assert!(!json_fits(&plan, size - 1));
    }

    #[test]
    fn names_tool_names_condition_ids_and_hashes() {
        for good in ["a", "_", "snake_case_2", "A1"] {
            assert!(is_ident(good), "{good}");
        }
        for bad in ["", "1a", "a-b", "a b", "é", "a.b"] {
            assert!(!is_ident(bad), "{bad}");
        }
        for good in ["get-sum", "browser_navigate", "a-1-b"] {
            assert!(is_tool_name(good), "{good}");
        }
        for bad in ["-a", "a-", "a--b", "a b", ""] {
            assert!(!is_tool_name(bad), "{bad}");
        }
        assert!(is_condition_id("if@10:3"));
        for bad in ["if@10", "if@:3", "if@1:2:3", "else@1:2"] {
            assert!(!is_condition_id(bad), "{bad}");
        }
        assert!(is_hash(&format!("sha256:{}", "ab".repeat(32))));
        assert!(!is_hash(&format!("sha256:{}", "AB".repeat(32))));
    }
}
