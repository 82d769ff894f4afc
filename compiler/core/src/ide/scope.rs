//! What is in scope at an offset of the root file: the workflow around it, the
//! constructs that enclose it, and the types of the reference roots there.

use crate::Checked;
use crate::check::{Container, LoopInfo, StepInfo, Ty, WorkflowInfo, not_run};
use crate::syntax::ast::{ErrorPolicy, Stmt};

/// The scope at one offset inside a workflow of the root file.
pub(crate) struct Scope<'c> {
    pub(crate) workflow: &'c WorkflowInfo,
    /// The constructs around the offset, outermost first, built exactly as the
    /// checker builds them so that [`not_run`] compares like with like.
    pub(crate) containers: Vec<Container>,
    pub(crate) offset: u32,
}

/// One step of a reference path after its root.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seg {
    Field(String),
    Index,
}

impl<'c> Scope<'c> {
    pub(crate) fn at(checked: &'c Checked, offset: u32) -> Option<Scope<'c>> {
        let root = checked.files.first()?;
        // The checker checks the root file's workflows in order, one info each.
        let (decl, workflow) = root
            .tree
            .workflows()
            .zip(&checked.analysis.workflows)
            .find(|(decl, _)| decl.span.contains(offset))?;
        let mut containers = Vec::new();
        containers_in(&decl.body, offset, &mut containers);
        if containers.is_empty()
            && let Some(ErrorPolicy::Fallback(block)) = &decl.on_error
            && block.span.contains(offset)
        {
            containers.push(Container::WorkflowHandler { span: block.span });
            containers_in(&block.stmts, offset, &mut containers);
        }
        Some(Scope {
            workflow,
            containers,
            offset,
        })
    }

    /// The steps that have certainly run here and have an output to read.
    pub(crate) fn ran_steps(&self) -> impl Iterator<Item = &'c StepInfo> + '_ {
        self.workflow.steps.iter().filter(|step| {
            step.output.is_some() && not_run(step, &self.containers, self.offset).is_none()
        })
    }

    /// The enclosing loops, outermost first.
    pub(crate) fn loops(&self) -> Vec<&'c LoopInfo> {
        self.containers
            .iter()
            .filter_map(|container| match container {
                Container::LoopBody { span, .. } => {
                    self.workflow.loops.iter().find(|info| info.span == *span)
                }
                _ => None,
            })
            .collect()
    }

    pub(crate) fn error_in_scope(&self) -> bool {
        self.containers.iter().any(|container| {
            matches!(
                container,
                Container::Fallback { .. } | Container::WorkflowHandler { .. }
            )
        })
    }

    /// The reference roots usable here.
    pub(crate) fn roots(&self) -> Vec<(&'static str, &'static str)> {
        let mut roots = vec![
            ("workflow_input", "the workflow's input"),
            ("step", "the outputs of the steps that have run"),
        ];
        if !self.loops().is_empty() {
            roots.push(("loop_item", "the current item of the innermost loop"));
            roots.push(("loop_index", "the index of the current item (from 0)"));
            roots.push(("loop", "an enclosing loop by id: `loop.<id>.item`"));
        }
        if self.error_in_scope() {
            roots.push(("error", "the failure being handled"));
        }
        roots
    }

    /// The type of the value that `root` followed by `segments` names, as far
    /// as it can be known; `None` when the path does not resolve.
    pub(crate) fn resolve(&self, root: &str, segments: &[Seg]) -> Option<Ty> {
        let (start, rest) = match root {
            "workflow_input" => (Ty::Record(self.workflow.input.clone()), segments),
            "step" => {
                let Seg::Field(id) = segments.first()? else {
                    return None;
                };
                let (_, step) = self.workflow.step(id)?;
                (step.output.clone()?, &segments[1..])
            }
            "loop_item" => (self.loops().last()?.item.clone(), segments),
            "loop_index" => (Ty::Int, segments),
            "loop" => {
                let Seg::Field(id) = segments.first()? else {
                    return None;
                };
                let info = self.loops().into_iter().rev().find(|l| l.id == *id)?;
                let view = Ty::record(vec![
                    ("item".into(), info.item.clone()),
                    ("index".into(), Ty::Int),
                ]);
                (view, &segments[1..])
            }
            "error" => (crate::check::error_ty(), segments),
            _ => return None,
        };
        walk(start, rest)
    }
}

/// Follows `segments` through `ty`, looking through optional values (the
/// checker reports a missing `?.`; here only the shape matters).
pub(crate) fn walk(mut ty: Ty, segments: &[Seg]) -> Option<Ty> {
    for segment in segments {
        let current = ty.required().clone();
        ty = match (segment, current) {
            (_, Ty::Any) => return Some(Ty::Any),
            (_, Ty::Json) => return Some(Ty::Json),
            (Seg::Field(name), record @ Ty::Record(_)) => record.field(name)?.clone(),
            (Seg::Index, Ty::List(item)) => (*item).clone(),
            _ => return None,
        };
    }
    Some(ty)
}

/// Pushes the containers of `offset` within `stmts`, mirroring the checker's
/// first pass (`check/workflow.rs`), innermost last.
fn containers_in(stmts: &[Stmt], offset: u32, out: &mut Vec<Container>) {
    for stmt in stmts {
        match stmt {
            Stmt::Step(step) => {
                if let Some(ErrorPolicy::Fallback(block)) = step.options.on_error.as_deref()
                    && block.span.contains(offset)
                {
                    out.push(Container::Fallback {
                        step: step.id.text.clone(),
                        span: block.span,
                    });
                    return containers_in(&block.stmts, offset, out);
                }
            }
            Stmt::If(stmt) => {
                let blocks = stmt.branches.iter().map(|(_, b)| b).chain(&stmt.else_block);
                for (branch, block) in blocks.enumerate() {
                    if block.span.contains(offset) {
                        out.push(Container::IfBranch {
                            span: stmt.span,
                            branch,
                        });
                        return containers_in(&block.stmts, offset, out);
                    }
                }
            }
            Stmt::For(stmt) => {
                if stmt.body.span.contains(offset) {
                    out.push(Container::LoopBody {
                        id: stmt.id.text.clone(),
                        span: stmt.span,
                    });
                    return containers_in(&stmt.body.stmts, offset, out);
                }
            }
            Stmt::Parallel(stmt) => {
                for branch in &stmt.branches {
                    if branch.body.span.contains(offset) {
                        out.push(Container::ParallelBranch {
                            parallel: stmt.id.text.clone(),
                            branch: branch.name.text.clone(),
                            span: stmt.span,
                        });
                        return containers_in(&branch.body.stmts, offset, out);
                    }
                }
            }
        }
    }
}
