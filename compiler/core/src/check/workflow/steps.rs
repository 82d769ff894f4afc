//! Checking a step: its call against the recipe, tool or kind it names, its
//! options (retry, backoff, timeout, fallback) and its idempotency key.

use super::*;

impl<'e, 'd> Checker<'e, 'd> {
    pub(super) fn step(&mut self, step: &Step) {
        let args = step.call.args();
        match &step.call {
            // Its syntax error is all there is to say about it.
            StepCall::Broken { .. } => return,
            // The recipe is borrowed from the environment, which outlives the
            // checker, so its inputs need no copy per step.
            StepCall::Recipe { recipe, .. } => match self.env.recipes.get(recipe.text.as_str()) {
                // A recipe whose inputs did not parse: its syntax error
                // is all there is to say of the call's arguments.
                Some(info) if info.decl.recovered && info.decl.input.is_none() => {}
                Some(info) => {
                    let decl = info
                        .decl
                        .input
                        .as_ref()
                        .map_or(info.decl.name.span, |i| i.span);
                    self.args(
                        args,
                        &info.input,
                        &format_args!("recipe `{}`", recipe.text),
                        Some((info.file, decl)),
                    );
                }
                // A handoff or a kb_write without its department or
                // collection reads as a call of a recipe of that name.
                None if matches!(recipe.text.as_str(), "handoff" | "kb_write") => {
                    let (noun, what, example) = match recipe.text.as_str() {
                        "handoff" => (
                            "department",
                            "the department it goes to",
                            "handoff \"support\" { message: \"...\" }",
                        ),
                        _ => (
                            "collection",
                            "the collection it writes to",
                            "kb_write \"incidents\" { title: \"...\", content: \"...\" }",
                        ),
                    };
                    self.push(
                        Diagnostic::new(
                            Code::UnknownRecipe,
                            self.file,
                            recipe.span,
                            format!("`{}` names {what} before its record", recipe.text),
                        )
                        .label(format!("no {noun} here"))
                        .hint(format!("write `{example}`")),
                    );
                    self.unchecked_args(args);
                }
                None => {
                    let names = self.env.recipes.keys().map(String::as_str);
                    let mut diagnostic = Diagnostic::new(
                        Code::UnknownRecipe,
                        self.file,
                        recipe.span,
                        format!("unknown recipe `{}`", recipe.text),
                    )
                    .label("no recipe by this name");
                    // A recipe's near miss first; else a step kind's
                    // (`aproval {`), which reads as a recipe's call.
                    let kinds = ["approval"].into_iter();
                    if let Some(best) = self
                        .suggest(&recipe.text, names.clone())
                        .or_else(|| self.suggest(&recipe.text, kinds))
                    {
                        diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                    }
                    diagnostic = if self.env.recipes.is_empty() {
                        diagnostic.hint("no recipe is declared or imported; declare one with `recipe name { ... }` or `import` a file")
                    } else {
                        self.listing(diagnostic, "the recipes in scope are", names)
                    };
                    self.push(diagnostic);
                    self.unchecked_args(args);
                }
            },
            StepCall::Approval { .. } => {
                self.args(args, &Fields::new(approval_params()), &"`approval`", None);
                self.approval_literals(args);
                if self
                    .containers
                    .iter()
                    .any(|c| matches!(c, Container::WorkflowHandler { .. }))
                {
                    self.push(
                        Diagnostic::new(
                            Code::ApprovalAfterFailure,
                            self.file,
                            step.id.span,
                            "an approval in the workflow's `on_error` handler is never asked: the run has failed, and a failed run does not wait",
                        )
                        .label("never asked")
                        .hint("tell people with a `handoff` here, or take the failure with the step's own `on_error fallback { ... }`, where the run goes on and can wait"),
                    );
                }
            }
            StepCall::KbWrite { collection, .. } => {
                self.template(collection);
                require_named(
                    collection,
                    (
                        Code::BadOption,
                        "a `kb_write` step's collection",
                        "name the collection the document goes to, e.g. `kb_write \"incidents\" { ... }`",
                    ),
                    self.file,
                    self.diagnostics,
                );
                self.args(args, &Fields::new(kb_write_params()), &"`kb_write`", None);
            }
            StepCall::Handoff { department, .. } => {
                self.template(department);
                require_named(
                    department,
                    (
                        Code::BadOption,
                        "a `handoff` step's department",
                        "name the department whose queue takes the work, e.g. `handoff \"billing\" { ... }`",
                    ),
                    self.file,
                    self.diagnostics,
                );
                self.args(args, &Fields::new(handoff_params()), &"`handoff`", None);
            }
            StepCall::Browser { server, tool, .. } => {
                let env = self.env;
                if let Some(info) = env.mcp_servers.get(server.text.as_str()) {
                    if self.tool_call(server, tool, args, info) {
                        self.options(step);
                        return;
                    }
                } else {
                    let names = self.env.mcp_servers.keys().map(String::as_str);
                    let mut diagnostic = Diagnostic::new(
                        Code::UnknownMcpServer,
                        self.file,
                        server.span,
                        format!("unknown MCP server `{}`", server.text),
                    )
                    .label("no `mcp` declaration by this name");
                    if let Some(best) = self.suggest(&server.text, names.clone()) {
                        diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                    }
                    diagnostic = if self.env.mcp_servers.is_empty() {
                        diagnostic.hint("declare it: `mcp browser { command \"npx\" args [\"-y\", \"@playwright/mcp\"] }`")
                    } else {
                        self.listing(diagnostic, "the MCP servers in scope are", names)
                    };
                    self.push(diagnostic);
                }
                self.unchecked_args(args);
            }
        }
        self.options(step);
    }

    /// The approval's settings decide how the runtime parks the run, before
    /// any value exists, so they are written as literals; and an approval with
    /// no approver could never be decided.
    pub(super) fn approval_literals(&mut self, args: &RecordLit) {
        for field in &args.fields {
            let literal = match (field.name.text.as_str(), &field.value.kind) {
                // A number has had its missing unit reported.
                ("expires", ExprKind::Duration(_) | ExprKind::Int(_)) => true,
                ("expires", _) => false,
                ("on_reject" | "on_expire", ExprKind::String(lit)) => lit.as_plain().is_some(),
                ("on_reject" | "on_expire", _) => false,
                ("approvers", ExprKind::List(items)) if items.is_empty() => {
                    self.push(
                        Diagnostic::new(
                            Code::BadOption,
                            self.file,
                            field.value.span,
                            "an approval needs at least one approver",
                        )
                        .label("no approver")
                        .hint("name a group or an email: `approvers: [\"billing-leads\"]`"),
                    );
                    true
                }
                ("approvers", ExprKind::List(items)) => {
                    // An approver nobody can be: no decision could ever
                    // name them.
                    for item in items {
                        if let ExprKind::String(lit) = &item.kind {
                            require_named(
                                lit,
                                (
                                    Code::BadOption,
                                    "an approver",
                                    "name a group or an email: `approvers: [\"billing-leads\"]`",
                                ),
                                self.file,
                                self.diagnostics,
                            );
                        }
                    }
                    true
                }
                _ => true,
            };
            // A value of the wrong type was reported as such already: one
            // mistake, one error.
            let reported = self
                .diagnostics
                .iter()
                .any(|d| d.primary.file == self.file && d.primary.span == field.value.span);
            if !literal && !reported {
                self.push(
                    Diagnostic::new(
                        Code::BadOption,
                        self.file,
                        field.value.span,
                        format!("`{}` is written as a literal", field.name.text),
                    )
                    .label("not a literal")
                    .hint(if field.name.text == "expires" {
                        "write a duration such as `48h`"
                    } else {
                        "write one of the variants as a string, such as `\"fail\"`"
                    }),
                );
            }
        }
    }

    pub(super) fn options(&mut self, step: &Step) {
        let options = &step.options;
        if matches!(step.call, StepCall::Approval { .. }) {
            let idle = [
                options.retry.as_ref().map(|r| ("retry", r.attempts_span)),
                options.timeout.as_ref().map(|t| ("timeout", t.span)),
                options
                    .idempotency
                    .as_ref()
                    .map(|k| ("idempotency", k.span)),
            ];
            let mut idle: Vec<(&str, Span)> = idle.into_iter().flatten().collect();
            idle.sort_by_key(|(_, span)| span.start);
            // One diagnostic for all of them: one mistake, one report.
            if let (Some((_, first)), Some((_, last))) = (idle.first(), idle.last()) {
                let names: Vec<String> = idle.iter().map(|(name, _)| format!("`{name}`")).collect();
                let (names, verb) = match names.as_slice() {
                    [one] => (one.clone(), "does"),
                    [rest @ .., last] => (format!("{} and {last}", rest.join(", ")), "do"),
                    [] => unreachable!("a first and a last"),
                };
                self.push(
                    Diagnostic::new(
                        Code::OptionWithoutEffect,
                        self.file,
                        first.to(*last),
                        format!("{names} {verb} nothing on an approval"),
                    )
                    .label("ignored")
                    .hint("an approval waits for people and is decided once: it makes no attempt to retry or to time out")
                    .hint("`expires: 48h` in its record bounds the wait; `on_reject` and `on_expire` say what a rejection or an expiry does"),
                );
            }
        }
        if let Some(Retry {
            attempts: 1,
            backoff: Some((min, max)),
            ..
        }) = &options.retry
        {
            self.push(
                Diagnostic::new(
                    Code::OptionWithoutEffect,
                    self.file,
                    min.span.to(max.span),
                    "`backoff` does nothing with `retry 1`",
                )
                .label("no second attempt waits for it")
                .hint("`retry 1` runs the step once; write `retry 3` (or more) for the backoff to apply"),
            );
        }
        let mut attempts = DEFAULT_ATTEMPTS;
        if let Some(retry) = &options.retry {
            attempts = retry.attempts;
            if !(1..=MAX_ATTEMPTS).contains(&retry.attempts) {
                self.push(
                    Diagnostic::new(
                        Code::BadOption,
                        self.file,
                        retry.attempts_span,
                        format!("`retry` counts attempts, from 1 to {MAX_ATTEMPTS}"),
                    )
                    .label("out of range")
                    .hint("`retry 1` runs the step once, without retrying"),
                );
            }
            if let Some((min, max)) = &retry.backoff {
                let min_ms = self.duration(min, "a backoff");
                let max_ms = self.duration(max, "a backoff");
                if let (Some(min_ms), Some(max_ms)) = (min_ms, max_ms)
                    && min_ms > max_ms
                {
                    self.push(
                        Diagnostic::new(
                            Code::BadDuration,
                            self.file,
                            min.span.to(max.span),
                            "the backoff range goes backwards",
                        )
                        .label("the first delay is longer than the cap")
                        .hint("write the shortest delay first: `backoff 2s..30s`"),
                    );
                }
            }
        }
        if let Some(timeout) = &options.timeout
            && let Some(ms) = self.duration(timeout, "a step timeout")
            && ms > self.workflow_timeout_ms
        {
            self.push(
                Diagnostic::new(
                    Code::StepTimeoutExceedsWorkflow,
                    self.file,
                    timeout.span,
                    format!(
                        "step `{}` may run for {}, longer than its workflow's timeout of {}",
                        step.id.text,
                        flow_plan::written::duration(ms),
                        flow_plan::written::duration(self.workflow_timeout_ms)
                    ),
                )
                .label("the workflow deadline cuts this short")
                .hint("raise the workflow's `timeout` or lower the step's"),
            );
        }
        if let Some(key) = &options.idempotency {
            self.value(key, &Ty::String, &"an idempotency key");
            if let ExprKind::String(text) = &key.kind {
                require_named(
                    text,
                    (
                        Code::BadOption,
                        "an idempotency key",
                        "a key names this effect of this run, e.g. `idempotency \"{{workflow_input.id}}-refund\"`; every step keyed `\"\"` would share one effect",
                    ),
                    self.file,
                    self.diagnostics,
                );
            }
            let innermost_loop = self.containers.iter().rev().find_map(|c| match c {
                Container::LoopBody { id, span } => Some((id.clone(), *span)),
                _ => None,
            });
            if let Some((loop_id, body)) = innermost_loop
                && step.call.has_side_effects()
                && !self.differs_per_iteration(key, body)
            {
                self.push(
                    Diagnostic::new(
                        Code::SharedIdempotencyKey,
                        self.file,
                        key.span,
                        format!(
                            "every iteration of loop `{loop_id}` gives step `{}` the same idempotency key",
                            step.id.text
                        ),
                    )
                    .label("the same key in each iteration")
                    .hint("an effect whose key was used is taken as done, so only the first iteration's happens")
                    .hint("put what tells the iterations apart in the key: `{{loop_index}}` or a field of `loop_item`"),
                );
            }
        } else if step.call.has_side_effects() && attempts > 1 {
            let retried = if options.retry.is_some() {
                format!("retried up to {attempts} times")
            } else {
                format!("retried ({DEFAULT_ATTEMPTS} attempts by default)")
            };
            let diagnostic = Diagnostic::new(
                Code::RetriedSideEffect,
                self.file,
                step.id.span,
                format!(
                    "`{}` step `{}` is {retried} without an idempotency key",
                    step.call.kind_name(),
                    step.id.text
                ),
            )
            .label("may take effect more than once");
            let key = self.idempotency_key(&step.id.text);
            // The key of the fix where the input gives one; else a shape.
            let diagnostic = diagnostic.hint(match &key {
                Some(key) => format!("add `idempotency \"{key}\"` after the call (a key that names this effect of this run), or `retry 1` if duplicates are harmless"),
                None => "add `idempotency \"...\"` after the call, a template of what names this effect of this run (such as an id of the input), or `retry 1` if duplicates are harmless".to_string(),
            });
            let diagnostic = match key {
                Some(key) => diagnostic.fix_with(
                    "Add an idempotency key from the input",
                    vec![Edit::insert(
                        step_end(step),
                        format!(" idempotency \"{key}\""),
                    )],
                ),
                None => diagnostic,
            };
            self.push(diagnostic);
        }
        if let Some(ErrorPolicy::Fallback(block)) = options.on_error.as_deref() {
            let outer = self.error_in_scope;
            self.error_in_scope = true;
            self.containers.push(Container::Fallback {
                step: step.id.text.clone(),
                span: block.span,
            });
            self.block(&block.stmts);
            self.containers.pop();
            self.error_in_scope = outer;
        }
    }

    /// Whether `expr` reads something that differs between the iterations
    /// of the loop whose statement spans `body`: a loop's item or index, or
    /// a step of the body (an `error` in a fallback too, to be safe).
    fn differs_per_iteration(&self, expr: &Expr, body: Span) -> bool {
        let path_differs = |path: &Path| match path.root.text.as_str() {
            "loop_item" | "loop_index" | "loop" | "error" => true,
            "step" => match path.segments.first() {
                Some(Segment::Field { name, .. }) => self
                    .steps
                    .get(&name.text)
                    .is_some_and(|(_, step)| body.contains(step.span.start)),
                _ => false,
            },
            _ => false,
        };
        let mut pending = vec![expr];
        while let Some(expr) = pending.pop() {
            let differs = match &expr.kind {
                ExprKind::Path(path) => path_differs(path),
                ExprKind::String(text) => text.template.parts.iter().any(|part| match part {
                    TemplatePart::Ref(path) => path_differs(path),
                    TemplatePart::Text(_) => false,
                }),
                ExprKind::List(items) => {
                    pending.extend(items);
                    false
                }
                ExprKind::Record(record) => {
                    pending.extend(record.fields.iter().map(|field| &field.value));
                    false
                }
                ExprKind::Not(inner) => {
                    pending.push(inner);
                    false
                }
                ExprKind::Binary(_, left, right) => {
                    pending.extend([&**left, &**right]);
                    false
                }
                // A part already reported is not held against the key.
                ExprKind::Error => true,
                _ => false,
            };
            if differs {
                return true;
            }
        }
        false
    }

    /// Validates a duration literal and gives its length.
    pub(super) fn duration(&mut self, duration: &DurationLit, what: &str) -> Option<u64> {
        // Each problem with its hint and, when the hint names one duration,
        // that duration as the fix.
        let problem = match (duration.unit(), duration.amount()) {
            (DurationUnit::Missing, amount) => Some((
                format!("{what} needs a unit"),
                format!(
                    "write `{}s` for seconds, or use `ms`, `m`, `h`, `d`",
                    amount.unwrap_or(0)
                ),
                amount.map(|amount| format!("{amount}s")),
            )),
            // The parser reported it, where the unit's text is.
            (DurationUnit::Unknown, _) => return None,
            _ => match duration.millis() {
                None => Some((
                    "the duration is too long".to_string(),
                    "use a larger unit or a shorter duration".to_string(),
                    None,
                )),
                Some(0) => Some((
                    format!("{what} cannot be zero"),
                    "give a positive duration".to_string(),
                    None,
                )),
                // The plan's bound (`Plan::validate`): a deadline or an
                // expiry is added to a clock, and nobody waits a year.
                Some(ms) if ms > flow_plan::limits::MAX_DURATION_MS => Some((
                    format!("{what} is longer than a year"),
                    "durations are at most 365 days (`365d`)".to_string(),
                    None,
                )),
                Some(_) => None,
            },
        };
        match problem {
            Some((message, hint, fix)) => {
                let mut diagnostic =
                    Diagnostic::new(Code::BadDuration, self.file, duration.span, message)
                        .label("invalid duration")
                        .hint(hint);
                if let Some(fix) = fix {
                    diagnostic = diagnostic.fix(fix);
                }
                self.push(diagnostic);
                None
            }
            None => duration.millis(),
        }
    }

    /// Checks a browser step against its server's tools in `flow.lock`:
    /// the tool exists, its arguments are the tool's and fit its schema.
    /// False when there is nothing to check against (no lock, or the lock
    /// does not have this server as declared), and the arguments are
    /// checked only as expressions.
    pub(super) fn tool_call(
        &mut self,
        server: &Name,
        tool: &Name,
        args: &RecordLit,
        info: &'e McpInfo,
    ) -> bool {
        if !self.locked {
            return false;
        }
        let Some(locked) = &info.locked else {
            if !self.unlocked_said.insert(info as *const McpInfo as usize) {
                return false;
            }
            self.push(
                Diagnostic::new(
                    Code::McpServerNotLocked,
                    self.file,
                    server.span,
                    format!(
                        "flow.lock has no tools for MCP server `{}` as it is declared",
                        server.text
                    ),
                )
                .label("its tools and their arguments are not checked, here or in its other steps")
                .secondary(info.file, info.decl.span, "declared here")
                .hint("run `flowc lock` on these files to record its tools"),
            );
            return false;
        };
        let by_name = self
            .locked_tools
            .entry(locked as *const LockedServer as usize)
            .or_insert_with(|| {
                let mut by_name = HashMap::with_capacity(locked.tools.len());
                for locked in &locked.tools {
                    by_name.entry(locked.name.as_str()).or_insert(locked);
                }
                by_name
            });
        let Some(&found) = by_name.get(tool.text.as_str()) else {
            let names = locked.tools.iter().map(|t| t.name.as_str());
            let mut diagnostic = Diagnostic::new(
                Code::UnknownMcpTool,
                self.file,
                tool.span,
                format!("MCP server `{}` has no tool `{}`", server.text, tool.text),
            )
            .label("no such tool in flow.lock");
            if let Some(best) = self.suggest(&tool.text, names.clone()) {
                diagnostic = diagnostic.hint(format!("did you mean `{best}`?"));
            }
            diagnostic = if locked.tools.is_empty() {
                diagnostic.hint("the server listed no tool when flow.lock was taken")
            } else {
                self.listing(diagnostic, "its tools are", names)
            };
            self.push(diagnostic.hint(
                "flow.lock records the tools the server listed; if it has changed, run `flowc lock` again",
            ));
            self.unchecked_args(args);
            return true;
        };
        let schema = &found.input_schema;
        let params = Arc::clone(
            self.tool_params
                .entry(schema as *const serde_json::Value as usize)
                .or_insert_with(|| Arc::new(Fields::new(crate::lock::tool_params(schema)))),
        );
        self.args_of(
            args,
            &params,
            crate::lock::takes_unlisted(schema),
            &format_args!("tool `{}.{}`", server.text, tool.text),
            None,
        );
        true
    }

    pub(super) fn unchecked_args(&mut self, args: &RecordLit) {
        for field in &args.fields {
            self.expr(&field.value, false);
        }
    }

    /// Checks a record literal against declared parameters.
    pub(super) fn args(
        &mut self,
        args: &RecordLit,
        params: &Fields,
        callee: &dyn std::fmt::Display,
        decl: Option<(FileId, Span)>,
    ) {
        self.args_of(args, params, false, callee, decl);
    }

    /// [`Checker::args`] for a record literal given where a record type
    /// goes: its messages say "field", not "input".
    pub(super) fn fields_of_record(
        &mut self,
        record: &RecordLit,
        fields: &Fields,
        what: &dyn std::fmt::Display,
    ) {
        let noun = std::mem::replace(&mut self.noun, "field");
        self.args_of(record, fields, false, what, None);
        self.noun = noun;
    }

    /// [`Checker::args`] where `open` says whether arguments other than
    /// `params` are taken (as `json`), as a tool's schema may: all but a
    /// near miss of a parameter not given (`mesage` for `message`), which
    /// is a misspelling, reported as such.
    pub(super) fn args_of(
        &mut self,
        args: &RecordLit,
        params: &Fields,
        open: bool,
        callee: &dyn std::fmt::Display,
        decl: Option<(FileId, Span)>,
    ) {
        // The names given, for an open callee's near misses: made once.
        let mut given: Option<HashSet<&str>> = None;
        // Sets, and the callee's inputs found through the index they keep:
        // a call of 30,000 arguments compared each with each input took 4 s
        // to check, and an index made for each call of a recipe of 30,000
        // inputs as long.
        let mut seen: HashSet<&str> = HashSet::new();
        // A misspelt argument is reported once, as unknown with a suggestion,
        // not a second time as the missing input it was meant to be.
        let mut suggested: HashSet<&str> = HashSet::new();
        // The required inputs given: when they are all, none is missing,
        // which is known without a walk over the inputs.
        let mut required_given = 0;
        for field in &args.fields {
            let name = field.name.text.as_str();
            if seen.contains(name) {
                self.push(
                    Diagnostic::new(
                        Code::DuplicateId,
                        self.file,
                        field.name.span,
                        format!("`{name}` is given twice"),
                    )
                    .label("given again here"),
                );
                continue;
            }
            seen.insert(name);
            match params.get(name) {
                Some((_, ty)) => {
                    required_given += usize::from(!ty.is_optional());
                    self.value(&field.value, ty, &format_args!("`{name}`"))
                }
                None if open && {
                    let given = given.get_or_insert_with(|| {
                        args.fields.iter().map(|f| f.name.text.as_str()).collect()
                    });
                    let not_given = params
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .filter(|n| !given.contains(n));
                    self.suggest(name, not_given).is_none()
                } =>
                {
                    self.expr(&field.value, false);
                }
                None => {
                    let names = params.iter().map(|(n, _)| n.as_str());
                    let mut diagnostic = Diagnostic::new(
                        Code::UnknownArgument,
                        self.file,
                        field.name.span,
                        format!("{callee} has no {} `{name}`", self.noun),
                    )
                    .label(format!("unknown {}", self.noun));
                    if let Some(best) =
                        self.suggest(name, names.clone().filter(|n| !seen.contains(n)))
                    {
                        diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                        suggested.insert(best);
                    }
                    diagnostic = if params.is_empty() {
                        diagnostic.hint(format!("{callee} takes no {}s", self.noun))
                    } else {
                        self.listing(diagnostic, &format!("the {}s are", self.noun), names)
                    };
                    // A step option written as a field, as YAML would.
                    if ["retry", "timeout", "on_error", "idempotency", "backoff"].contains(&name) {
                        diagnostic = diagnostic.hint(format!(
                            "`{name}` is a step option: it comes after the record, as in `step x = recipe {{ ... }} {name} ...`, without `:`"
                        ));
                    }
                    if let Some((file, span)) = decl {
                        diagnostic = diagnostic.secondary(
                            file,
                            span,
                            format!("{}s declared here", self.noun),
                        );
                    }
                    self.push(diagnostic);
                    self.expr(&field.value, false);
                }
            }
        }
        if required_given == params.required() {
            return;
        }
        let missing: Vec<&(String, Ty)> = params
            .iter()
            .filter(|(name, ty)| {
                !ty.is_optional()
                    && !seen.contains(name.as_str())
                    && !suggested.contains(name.as_str())
            })
            .collect();
        if !missing.is_empty() {
            let list = shown_list(missing.iter().map(|(n, t)| format!("`{n}: {t}`")));
            let message = if missing.len() == 1 {
                format!("{callee} needs the {} {list}", self.noun)
            } else {
                format!("{callee} needs the {}s {list}", self.noun)
            };
            let mut diagnostic =
                Diagnostic::new(Code::MissingArgument, self.file, args.span, message)
                    .label("missing here");
            // An approval's approvers have no placeholder that mends: `[]`
            // is E209, and a made-up name would deploy. The hint says whom.
            let fill = (!missing.iter().any(|(name, _)| name == "approvers"))
                .then(|| fill_fields(args, &missing))
                .flatten();
            if let Some(fill) = fill {
                let title = if missing.len() == 1 {
                    format!("Add the {} `{}`", self.noun, missing[0].0)
                } else {
                    format!("Add the missing {}s", self.noun)
                };
                diagnostic = diagnostic.fix_with(title, vec![fill]);
            }
            if let Some((file, span)) = decl {
                diagnostic =
                    diagnostic.secondary(file, span, format!("{}s declared here", self.noun));
            }
            self.push(diagnostic);
        }
    }

    /// An idempotency key for step `id` made of the workflow's input: its
    /// id-like field (or first field a template can render), the step's id,
    /// and the index of each enclosing loop, so that each run, step and
    /// iteration has its own key and a repeated attempt has the same one.
    pub(super) fn idempotency_key(&self, id: &str) -> Option<String> {
        let Ty::Record(fields) = &self.input else {
            return None;
        };
        let scalar = |ty: &Ty| matches!(ty, Ty::String | Ty::Int | Ty::Enum(_));
        let field =
            fields
                .iter()
                .filter(|(_, ty)| scalar(ty))
                .min_by_key(|(name, _)| match name.as_str() {
                    "id" => 0,
                    name if name.ends_with("_id") || name.ends_with("Id") => 1,
                    name if name.contains("key") => 2,
                    _ => 3,
                })?;
        let mut key = format!("{{{{workflow_input.{}}}}}-{id}", field.0);
        for (loop_id, ..) in &self.loops {
            key.push_str(&format!("-{{{{loop.{loop_id}.index}}}}"));
        }
        Some(key)
    }
}
