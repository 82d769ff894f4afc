//! The codes of [`Incompatibility`](super::Incompatibility): why a run
//! cannot go on on another version, each documented where it is defined
//! (`flowc explain D002`).

/// What `flowc explain` prints about a code.
#[derive(Debug, Clone, Copy)]
pub struct CodeInfo {
    pub code: &'static str,
    pub name: &'static str,
    pub summary: &'static str,
    /// What to do about it, the `help:` line of a report.
    pub hint: &'static str,
    pub explanation: &'static str,
}

impl CodeInfo {
    /// A row of the table below; `explanation` is its doc comment.
    const fn from_table(
        explanation: &'static str,
        code: &'static str,
        name: &'static str,
        summary: &'static str,
        hint: &'static str,
    ) -> CodeInfo {
        CodeInfo {
            code,
            name,
            summary,
            hint,
            explanation,
        }
    }
}

// These codes have no severity, unlike the compiler's: every one means a
// run cannot move.
crate::code_table! {
    /// Why a run cannot go on on the other version. Codes are stable and
    /// never reused for another meaning.
    info = CodeInfo;
    /// The new version has no workflow of this name. A run belongs to its
    /// workflow by name, so a run of the old one has nothing to go on on.
    ///
    /// Renaming a workflow makes a new one: keep the old name, or leave its
    /// runs on the version they started on.
    WorkflowRemoved = ("D001", "workflow-removed", "the workflow is not in the new version",
        "keep the workflow's name, or leave its runs on the old version");

    /// A run waits or stopped at a step that the new version has no step
    /// at: the step was removed or renamed, or it moved into or out of a
    /// `parallel` branch, a loop or a fallback block, each of which is part
    /// of a step's execution path (`lookups/billing/invoices`,
    /// `articles[3]/review`). The runtime finds a pending decision by that
    /// path; on the new version a waiting gate would be passed over, never
    /// decided, and a failed step would not be run again.
    ///
    /// ```flow
    /// // old                               // new
    /// step review = approval { ... }       parallel checks {
    ///                                        branch legal { step review = approval { ... } }
    ///                                      }   // now checks/legal/review
    /// ```
    ResumePointRemoved = ("D002", "resume-point-removed",
        "where a run waits or stopped has no step in the new version",
        "keep the step at its path (same id, same enclosing loops, parallel branches and fallbacks), or leave these runs on the old version");

    /// At an execution path a run has a record of (a completed step, or the
    /// gate it waits at), the new version has a step of another kind: a
    /// gate that became a recipe step, a recipe step that became a browser
    /// action. The record would stand for a step that does something else:
    /// a pending approval would park a recipe step, a recipe's output would
    /// stand in for a tool's.
    StepKindChanged = ("D003", "step-kind-changed",
        "a step a run has a record of is of another kind in the new version",
        "give the new step another id, so that it runs as a step of its own");

    /// The new version reaches the place a run waits or stopped at, or a
    /// step before it, under other conditions than the old one: the step
    /// moved into or out of an `if` branch (which is not part of its path),
    /// a condition on the way to it changed, or the collection of a loop
    /// around it did. The replay decides conditions and iterations again,
    /// so it may not reach the place, and a gate's pending decision would
    /// never be asked for; before the place, it may take a branch the run
    /// did not, and run that branch's steps late, after the place was
    /// decided; a changed collection may give an iteration index to
    /// another item. A
    /// loop the run has begun (around the place, or before it) that takes
    /// fewer items than it did (a lower `max`, or one it did not have)
    /// fails the run when the replay takes its collection again.
    ///
    /// ```flow
    /// // old                               // new
    /// step review = approval { ... }       if step.score.value > 3 {
    ///                                        step review = approval { ... }
    ///                                      }
    /// ```
    ResumePointGuarded = ("D004", "resume-point-guarded",
        "the new version reaches the place under other conditions",
        "keep the conditions and loop collections around the step as they were, or leave these runs on the old version");

    /// A step that a run may have completed before the place it waits at
    /// has no step at its execution path in the new version (removed,
    /// renamed, or moved into another block). Its record would never be
    /// read again: what it produced is lost to the rest of the run, and
    /// what it did (a KB write, a handoff, a browser action) is done
    /// without the new version knowing.
    CompletedStepRemoved = ("D005", "completed-step-removed",
        "a step a run may have completed is not in the new version",
        "keep the step at its path, or leave these runs on the old version");

    /// The new version has a step before the place a run waits or stopped
    /// at that such a run has no record of: a step added before a gate, a
    /// step moved before it, a step added to a loop's body (earlier
    /// iterations completed without it), or to a parallel branch before
    /// steps that may have completed. The replay runs a step it has no
    /// record of when it reaches it, so this one would run on resume, late:
    /// after the gate was decided without it, after the steps it was meant
    /// to come before.
    ///
    /// ```flow
    /// // old                               // new
    /// step draft = write_reply { ... }     step draft = write_reply { ... }
    /// step review = approval { ... }       step check = policy_check { ... }   // new
    ///                                      step review = approval { ... }
    /// ```
    StepAddedBefore = ("D006", "step-added-before",
        "a step the new version runs before the place is not in a run's record",
        "add the step after the place, or leave these runs on the old version");

    /// A reference of the new version reads, from what a run recorded (a
    /// completed step's output, or the run's input), a value that the old
    /// version's type does not guarantee: the output type was narrowed (an
    /// enum lost a variant, a field became required or changed type, a
    /// field was added that old runs never recorded). Widening is fine: a
    /// new variant, a field made optional, an `int` read as `float`. Only
    /// what the new version reads is compared, with the assignability of
    /// docs/language.md §3.
    ///
    /// ```flow
    /// // old: recipe classify { output { category: "bug" | "billing" | "other" } }
    /// // new: recipe classify { output { category: "bug" | "billing" } }
    /// // runs recorded "other", which the new version's readers do not expect
    /// ```
    OutputIncompatible = ("D007", "output-incompatible",
        "the new version reads from a run's records a value the old types do not guarantee",
        "widen the new type to take the old values (an optional field, more enum variants), or leave these runs on the old version");

    /// A step before the place that a run may have recorded as failed,
    /// and gone on past (`on_error continue`, or a fallback), fails the
    /// run in the new version, which dropped its `on_error`: the replay
    /// takes the recorded failure as the step's outcome and fails the run
    /// there, after the place was decided, where the old version went on.
    ///
    /// ```flow
    /// // old                                         // new
    /// step lookup = crm { ... } on_error continue    step lookup = crm { ... }
    /// step review = approval { ... }                 step review = approval { ... }
    /// ```
    FailureNoLongerTaken = ("D008", "failure-no-longer-taken",
        "a step a run may have failed and gone on past fails the run in the new version",
        "keep the step's `on_error`, or leave these runs on the old version");
}
