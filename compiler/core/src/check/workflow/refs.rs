//! Checking references (`step.ID.path`, `loop_item`, `workflow_input`):
//! what each root names, whether the step has certainly run there (see the
//! parent module's doc), the type along the path, and the fixes offered.

use super::*;

impl<'e, 'd> Checker<'e, 'd> {
    pub(super) fn path(&mut self, path: &Path, optional_ok: bool) -> Ty {
        if let Some(ty) = self.destination_path(path, optional_ok) {
            return ty;
        }
        let segments = path.segments.as_slice();
        let root = path.root.text.as_str();
        match root {
            "workflow_input" => {
                let input = self.input.clone();
                self.walk(input, segments, optional_ok, &|| {
                    "the workflow input".into()
                })
            }
            "step" => self.step_ref(path, optional_ok),
            "loop_item" | "loop_index" => {
                let Some((id, item, _)) = self.loops.last().cloned() else {
                    self.push(
                        Diagnostic::new(Code::LoopItemOutsideLoop, self.file, path.root.span, format!("`{root}` is used outside a loop"))
                            .label("no enclosing `for`")
                            .hint("`loop_item` and `loop_index` exist only inside `for ... as id { ... }`; after a loop, read its results from `step.<loop id>`"),
                    );
                    return Ty::Any;
                };
                if root == "loop_index" {
                    self.walk(Ty::Int, segments, optional_ok, &|| "`loop_index`".into())
                } else {
                    self.walk(item, segments, optional_ok, &|| {
                        format!("an item of loop `{id}`")
                    })
                }
            }
            "loop" => self.loop_ref(path, optional_ok),
            "error" if self.error_in_scope => {
                self.walk(error_ty(), segments, optional_ok, &|| "the error".into())
            }
            "error" => {
                self.push(
                    Diagnostic::new(
                        Code::UnknownRoot,
                        self.file,
                        path.root.span,
                        "`error` is only in scope in a fallback block",
                    )
                    .label("no error here")
                    .hint(
                        "use it inside `on_error fallback { ... }`, where it describes the failure",
                    ),
                );
                Ty::Any
            }
            _ => {
                // The header's slip was reported once; its uses are read as meant.
                let named = self
                    .loops
                    .iter()
                    .rev()
                    .find(|(id, _, names_item)| *names_item && id == root);
                if let Some((id, item, _)) = named.cloned() {
                    return self.walk(item, segments, optional_ok, &|| {
                        format!("an item of loop `{id}`")
                    });
                }
                let mut diagnostic = Diagnostic::new(
                    Code::UnknownRoot,
                    self.file,
                    path.root.span,
                    format!("unknown reference `{root}`"),
                )
                .label("not a reference root");
                let written = path_text(path);
                let rest = &written[root.len()..];
                let innermost = self.loops.last().is_some_and(|(id, ..)| id == root);
                // What the name most likely stands for, as a valid reference.
                let meant = if innermost {
                    Some(("names the loop, not its item", "loop_item".to_string()))
                } else if self.loops.iter().any(|(id, ..)| id == root) {
                    Some((
                        "names an enclosing loop, not its item",
                        format!("loop.{root}.item"),
                    ))
                } else if self.steps.contains(root) {
                    Some(("is a step", format!("step.{root}")))
                } else if self.input.field(root).is_some() {
                    Some((
                        "is a field of the workflow's input",
                        format!("workflow_input.{root}"),
                    ))
                } else {
                    // The literals of other languages.
                    match root {
                        "True" | "TRUE" => Some(("is not a literal", "true".to_string())),
                        "False" | "FALSE" => Some(("is not a literal", "false".to_string())),
                        "None" | "nil" | "undefined" | "NULL" | "Null" => {
                            Some(("is not a literal", "null".to_string()))
                        }
                        _ => None,
                    }
                };
                if let Some((what, replacement)) = meant {
                    diagnostic = diagnostic
                        .hint(format!("`{root}` {what}: write `{replacement}{rest}`"))
                        .fix(replacement);
                } else if root == "input" {
                    diagnostic = diagnostic.hint("in a workflow, its input is `workflow_input`; `input` is for recipe prompts");
                } else if let Some(best) = did_you_mean(root, ROOTS.iter().copied()) {
                    diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                }
                if diagnostic.fix.is_none() {
                    diagnostic = diagnostic.hint(format!(
                        "references start with {}",
                        candidates_list(ROOTS.iter().copied())
                    ));
                }
                self.push(diagnostic);
                Ty::Any
            }
        }
    }

    pub(super) fn loop_ref(&mut self, path: &Path, optional_ok: bool) -> Ty {
        let Some(Segment::Field { name: id, .. }) = path.segments.first() else {
            self.push(
                Diagnostic::new(
                    Code::LoopItemOutsideLoop,
                    self.file,
                    path.span(),
                    "`loop` needs a loop id: `loop.<id>.item`",
                )
                .label("no loop id"),
            );
            return Ty::Any;
        };
        let Some((_, item, _)) = self
            .loops
            .iter()
            .rev()
            .find(|(l, ..)| *l == id.text)
            .cloned()
        else {
            let names = self.loops.iter().map(|(l, ..)| l.as_str());
            let mut diagnostic = Diagnostic::new(
                Code::LoopItemOutsideLoop,
                self.file,
                id.span,
                format!("no enclosing loop is named `{}`", id.text),
            )
            .label("not an enclosing loop");
            if self.loops.is_empty() {
                diagnostic = diagnostic.hint("`loop.<id>` refers to an enclosing `for ... as id` loop, and there is none here");
            } else {
                if let Some(best) = self.suggest(&id.text, names.clone()) {
                    diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                }
                diagnostic = self.listing(diagnostic, "the enclosing loops are", names);
            }
            self.push(diagnostic);
            return Ty::Any;
        };
        if path.segments.len() < 2 {
            self.push(
                Diagnostic::new(
                    Code::UnknownField,
                    self.file,
                    id.span,
                    format!("`loop.{}` needs `.item` or `.index`", id.text),
                )
                .label("the loop itself is not a value")
                .hint(format!(
                    "write `loop.{}.item` for its current item",
                    id.text
                )),
            );
            return Ty::Any;
        }
        let view = Ty::record(vec![("item".into(), item), ("index".into(), Ty::Int)]);
        self.walk(view, &path.segments[1..], optional_ok, &|| {
            format!("loop `{}`", id.text)
        })
    }

    pub(super) fn step_ref(&mut self, path: &Path, optional_ok: bool) -> Ty {
        let Some(Segment::Field { name: id, .. }) = path.segments.first() else {
            self.push(
                Diagnostic::new(
                    Code::UnknownStep,
                    self.file,
                    path.span(),
                    "`step` needs a step id: `step.<id>.field`",
                )
                .label("no step id"),
            );
            return Ty::Any;
        };
        if let Some(Segment::Field { optional: true, .. }) = path.segments.first() {
            self.push(
                Diagnostic::new(
                    Code::NeedlessOptional,
                    self.file,
                    id.span,
                    "`?.` right after `step` does nothing",
                )
                .label("the step id is not optional")
                .hint(format!(
                    "to read a step that may not have run, write `step.{}?.field`",
                    id.text
                )),
            );
        }
        let use_at = path.span().start;
        let Some((index, _)) = self.steps.get(&id.text) else {
            // An id the parser made up for a block whose own was missing
            // (`as@124`) names nothing the author wrote (an audit).
            let written = |s: &&StepInfo| !s.id.contains('@');
            // Walked only while the budget for suggestions pays for it.
            let ran = self
                .steps
                .iter()
                .filter(written)
                .filter(|s| not_run(s, &self.containers, use_at).is_none());
            // The step being written, or a loop around the use, is never
            // what a reference meant; nor one without output, which no
            // reference reads (an audit: the fix, preferred, gave E107).
            let read = |s: &StepInfo| s.output.is_some();
            let all = self
                .steps
                .iter()
                .filter(written)
                .filter(|s| !s.span.contains(use_at) && read(s))
                .map(|s| s.id.as_str());
            let mut diagnostic = Diagnostic::new(
                Code::UnknownStep,
                self.file,
                id.span,
                format!("unknown step `{}`", id.text),
            )
            .label("no step has this id");
            // A step that has run here first: the nearest id of all may be
            // one that could not be read here either (an audit: following
            // the hint gave E102).
            let ran_read = ran.clone().filter(|s| read(s)).map(|s| s.id.as_str());
            if let Some(best) = self.suggest(&id.text, ran_read) {
                diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
            } else if let Some(best) = self.suggest(&id.text, all) {
                diagnostic = diagnostic.hint(format!(
                    "the nearest id is `{best}`, a step that has not certainly run at this point"
                ));
            }
            // Each step is looked at, whether it has run or not.
            let listed = (self.suggestions.spend(self.steps.len()))
                .then(|| {
                    crate::suggest::candidates_list_within(
                        ran.map(|s| s.id.as_str()),
                        &self.suggestions,
                    )
                })
                .flatten();
            diagnostic = match listed {
                Some(list) if list.is_empty() => diagnostic.hint("no step has run at this point"),
                Some(list) => diagnostic.hint(format!("the steps that have run here are {list}")),
                None => diagnostic,
            };
            self.push(diagnostic);
            return Ty::Any;
        };
        let reason = not_run(&self.steps[index], &self.containers, use_at);
        // The common case, a step that has run and has an output, needs no
        // copy of the step's record.
        if reason.is_none()
            && let Some(output) = self.steps[index].output.clone()
        {
            return self.walk(output, &path.segments[1..], optional_ok, &|| {
                format!("the output of step `{}`", id.text)
            });
        }
        let step = self.steps[index].clone();
        let Some(output) = step.output.clone() else {
            self.push(
                Diagnostic::new(
                    Code::NoOutput,
                    self.file,
                    id.span,
                    format!("step `{}` is a `handoff`, which has no output", step.id),
                )
                .label("nothing to read")
                .secondary(self.file, step.id_span, "defined here"),
            );
            return Ty::Any;
        };
        let optional_access = matches!(
            path.segments.get(1),
            Some(Segment::Field { optional: true, .. })
        );
        let mut base = output;
        match reason {
            None => {}
            Some(NotRun::Later) => {
                let message = if step.span.contains(use_at) {
                    format!("step `{}` refers to itself", step.id)
                } else {
                    format!("step `{}` runs later", step.id)
                };
                self.push(
                    Diagnostic::new(Code::LaterStep, self.file, id.span, message)
                        .label("not run yet here")
                        .secondary(self.file, step.id_span, "defined here")
                        .hint("a step can use only the steps before it; move this use after the step, or the step before it"),
                );
                return Ty::Any;
            }
            Some(NotRun::Unfinished) => {
                let what = if step.kind == StepKind::Loop {
                    "loop"
                } else {
                    "parallel block"
                };
                self.push(
                    Diagnostic::new(Code::LaterStep, self.file, id.span, format!("the {what} `{}` has not finished here", step.id))
                        .label("used inside itself")
                        .secondary(self.file, step.id_span, format!("the {what} starts here"))
                        .hint(format!("its output exists after the {what}; inside it, use the steps of the current iteration or branch directly")),
                );
                return Ty::Any;
            }
            Some(reason) if (optional_access || optional_ok) && reason.absence_is_possible() => {
                base = base.optional();
            }
            Some(reason) => {
                // The reference as written, made optional, and read through
                // a loop's list of iteration outputs: hints in valid syntax.
                let rest = path_text(path);
                let rest = &rest[format!("step.{}", step.id).len().min(rest.len())..];
                let rest = rest.strip_prefix('?').unwrap_or(rest);
                let read = format!(
                    "step.{}?{}",
                    step.id,
                    if rest.is_empty() { ".field" } else { rest }
                );
                // A template has no `??`: an absent value is inserted as
                // empty text there.
                let optional = if self.in_template {
                    format!(
                        "write `{{{{{read}}}}}`: in a template an absent value is inserted as empty text"
                    )
                } else {
                    format!("write `{read}` and give a default with `??` where a value is needed")
                };
                // "May not have run" only where `?.` mends it; a step that
                // cannot be read here at all is said to be so.
                let (headline, label) = match &reason {
                    NotRun::OtherIfBranch(_) => ("never runs here", "never runs here"),
                    NotRun::OwnFallback => ("has no output in its own fallback", "failed here"),
                    reason if reason.absence_is_possible() => {
                        ("may not have run here", "may not have run")
                    }
                    _ => ("is out of reach here", "out of reach here"),
                };
                let mut diagnostic = Diagnostic::new(
                    Code::MaybeNotRun,
                    self.file,
                    id.span,
                    format!("step `{}` {headline}", step.id),
                )
                .label(label)
                .secondary(self.file, step.id_span, "defined here");
                let absence_is_possible = reason.absence_is_possible();
                diagnostic = match reason {
                    NotRun::Container(Container::IfBranch { span, .. }) => diagnostic
                        .secondary(self.file, span, "it runs only in a branch of this `if`")
                        .hint(optional.clone()),
                    NotRun::Container(Container::LoopBody { id: loop_id, span }) => {
                        // Through each loop nested in this one down to the
                        // step: an iteration holds a nested loop's list.
                        let mut through = format!("step.{loop_id}[0]");
                        let inner = step
                            .containers
                            .iter()
                            .skip_while(|c| !matches!(c, Container::LoopBody { id, .. } if *id == loop_id))
                            .skip(1);
                        for container in inner {
                            if let Container::LoopBody { id, .. } = container {
                                through.push_str(&format!(".{id}[0]"));
                            }
                        }
                        diagnostic
                            .secondary(self.file, span, format!("it runs once per item of loop `{loop_id}`"))
                            .hint(format!("after the loop, `step.{loop_id}` is the list of iteration outputs: `{through}.{}{rest}` reads the first", step.id))
                    }
                    NotRun::Container(Container::ParallelBranch { parallel, branch, span }) => {
                        // A `parallel` whose name is missing (an error of its own) is "the parallel".
                        let parallel = match parallel.as_str() {
                            "" => "the parallel".to_string(),
                            named => format!("`{named}`"),
                        };
                        diagnostic
                            .secondary(self.file, span, format!("it runs in branch `{branch}` of {parallel}, alongside this one"))
                            .hint(format!("sibling branches run concurrently; use it after {parallel} joins"))
                    }
                    NotRun::Container(Container::Fallback { step: failed, span }) => diagnostic
                        .secondary(self.file, span, format!("it runs only when step `{failed}` fails"))
                        .hint(optional.clone()),
                    NotRun::Container(Container::WorkflowHandler { span }) => diagnostic
                        .secondary(self.file, span, "it runs only when the workflow fails")
                        .hint("a step of the error handler can be read only inside the handler"),
                    NotRun::OwnFallback => diagnostic
                        .hint(format!("this is the fallback of `{}`, which runs because `{}` failed and has no output", step.id, step.id))
                        .hint("read `error.message` to see why it failed"),
                    NotRun::OtherIfBranch(span) => diagnostic
                        .secondary(self.file, span, "it runs in another branch of this `if`, never in this one"),
                    NotRun::MayFail => diagnostic
                        .hint(format!("`{}` has `on_error continue` or a fallback, so it may end without output", step.id))
                        .hint(optional.clone()),
                    NotRun::InHandler => diagnostic
                        .hint("the workflow's error handler runs after any failing step, so later steps may not have run")
                        .hint(optional.clone()),
                    NotRun::Later | NotRun::Unfinished => diagnostic,
                };
                if absence_is_possible {
                    diagnostic = self.optional_fixes(diagnostic, path, base, optional_ok);
                }
                self.push(diagnostic);
                return Ty::Any;
            }
        }
        self.walk(base, &path.segments[1..], optional_ok, &|| {
            format!("the output of step `{}`", id.text)
        })
    }

    /// The fixes of a reference to a step that may not have run: read it
    /// with `?.`, and where a value is needed (a bare reference, not the
    /// left side of `??`), give a default of the type read. A template
    /// renders an absent value as empty text, so `?.` is its whole fix.
    pub(super) fn optional_fixes(
        &mut self,
        diagnostic: Diagnostic,
        path: &Path,
        output: Ty,
        optional_ok: bool,
    ) -> Diagnostic {
        let (
            Some(Segment::Field { name: id, .. }),
            Some(Segment::Field {
                optional: false, ..
            }),
        ) = (path.segments.first(), path.segments.get(1))
        else {
            return diagnostic;
        };
        let mark = Edit::insert(id.span.end, "?");
        if self.in_template || optional_ok {
            return diagnostic.fix_with(
                format!("Read `step.{}` only if it ran (`?.`)", id.text),
                vec![mark],
            );
        }
        // The type read, for the default: walked as the fix will read it,
        // its diagnostics (if any) left to the reference as it is now.
        let kept = self.diagnostics.len();
        let read = self.walk(output.optional(), &path.segments[1..], true, &String::new);
        self.diagnostics.truncate(kept);
        let Some(default) = read.required().placeholder() else {
            return diagnostic;
        };
        diagnostic.fix_with(
            format!("Read `step.{}` only if it ran, else `{default}`", id.text),
            vec![
                Edit::insert(path.span().start, "("),
                mark,
                Edit::insert(path.span().end, format!(" ?? {default})")),
            ],
        )
    }

    /// Follows `segments` through `ty`, reporting the first step that fails.
    pub(super) fn walk(
        &mut self,
        ty: Ty,
        segments: &[Segment],
        optional_ok: bool,
        what: &dyn Fn() -> String,
    ) -> Ty {
        let mut ty = ty;
        let mut absent = false;
        // What the value at the current segment is, for messages; built only
        // when a message needs it, since references are checked by the thousand.
        let mut previous: Option<&Segment> = None;
        let describe = |previous: Option<&Segment>| match previous {
            None => what(),
            Some(Segment::Field { name, .. }) => format!("`{}`", name.text),
            Some(Segment::Index { index, .. }) => format!("element [{index}]"),
        };
        for segment in segments {
            let optional_segment = matches!(segment, Segment::Field { optional: true, .. });
            let current = match ty {
                Ty::Optional(inner) => {
                    if !(optional_segment || optional_ok) {
                        // `?.` reads a field; no form indexes a list that
                        // may be absent.
                        let hint = if matches!(segment, Segment::Index { .. }) {
                            "a list that may be absent cannot be indexed: declare it without `?`, or pass the whole list on"
                        } else {
                            "use `?.` to read it only when present, and `?? default` for a fallback"
                        };
                        self.push(
                            Diagnostic::new(
                                Code::OptionalAccess,
                                self.file,
                                segment.span(),
                                format!("{} may be absent", describe(previous)),
                            )
                            .label("read from a value that may be absent")
                            .hint(hint),
                        );
                        return Ty::Any;
                    }
                    absent = true;
                    std::sync::Arc::unwrap_or_clone(inner)
                }
                Ty::Null => {
                    absent = true;
                    Ty::Any
                }
                Ty::Any => return Ty::Any,
                Ty::Json => return Ty::Json,
                other => {
                    // An element may be past the list's end: `?.` after an
                    // index reads it only when there is one (the runtime
                    // gives nothing then), and makes the value optional.
                    if optional_segment && matches!(previous, Some(Segment::Index { .. })) {
                        absent = true;
                    } else if optional_segment {
                        self.push(
                            Diagnostic::new(
                                Code::NeedlessOptional,
                                self.file,
                                segment.span(),
                                format!("{} is always present", describe(previous)),
                            )
                            .label("`?.` is not needed here")
                            .hint("write `.` instead of `?.`"),
                        );
                    }
                    other
                }
            };
            ty = match (segment, current) {
                (_, Ty::Any) => return Ty::Any,
                (_, Ty::Json) => return Ty::Json,
                (Segment::Field { name, .. }, Ty::Record(fields)) => match fields.ty(&name.text) {
                    Some(field) => field.clone(),
                    None => {
                        let names = fields.iter().map(|(n, _)| n.as_str());
                        let mut diagnostic = Diagnostic::new(
                            Code::UnknownField,
                            self.file,
                            name.span,
                            format!("{} has no field `{}`", describe(previous), name.text),
                        )
                        .label("unknown field");
                        if let Some(best) = self.suggest(&name.text, names.clone()) {
                            diagnostic =
                                diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                        }
                        diagnostic = if fields.is_empty() {
                            diagnostic.hint(format!("{} has no fields", describe(previous)))
                        } else {
                            self.listing(diagnostic, "the fields are", names)
                        };
                        self.push(diagnostic);
                        return Ty::Any;
                    }
                },
                (Segment::Field { name, .. }, other) => {
                    self.push(
                        Diagnostic::new(
                            Code::UnknownField,
                            self.file,
                            name.span,
                            format!(
                                "{} is `{}`, which has no fields",
                                describe(previous),
                                self.env.show(&other)
                            ),
                        )
                        .label("no fields here"),
                    );
                    return Ty::Any;
                }
                (Segment::Index { .. }, Ty::List(item)) => {
                    // On the left of `??` an element past the list's end
                    // is absent (the runtime reads it so), and the default
                    // applies: W303 said it never would.
                    absent |= optional_ok;
                    std::sync::Arc::unwrap_or_clone(item)
                }
                (Segment::Index { span, .. }, other) => {
                    self.push(
                        Diagnostic::new(
                            Code::NotAList,
                            self.file,
                            *span,
                            format!(
                                "{} is `{}`, not a list",
                                describe(previous),
                                self.env.show(&other)
                            ),
                        )
                        .label("cannot index this"),
                    );
                    return Ty::Any;
                }
            };
            previous = Some(segment);
        }
        if absent { ty.optional() } else { ty }
    }
}
