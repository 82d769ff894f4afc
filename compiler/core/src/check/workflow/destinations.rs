//! Checking a workflow's `deliver` destinations: what their templates may
//! read (the input, and the output on `completed` only).

use super::*;

impl<'e, 'd> Checker<'e, 'd> {
    /// A `deliver` setting: its events known and each given once, its
    /// names plain and not empty, its templates and content read against the
    /// workflow's input and `output`.
    pub(super) fn destination(&mut self, destination: &Destination, output: Ty) {
        let mut seen: Vec<&str> = Vec::new();
        for event in &destination.events {
            let text = event.text.as_str();
            let events = flow_plan::RunEvent::ALL.map(flow_plan::RunEvent::as_str);
            if flow_plan::RunEvent::parse(text).is_none() {
                let mut diagnostic = Diagnostic::new(
                    Code::BadDestination,
                    self.file,
                    event.span,
                    format!("unknown run event `{text}`"),
                )
                .label("not an event");
                if let Some(best) = did_you_mean(text, events) {
                    diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                } else {
                    diagnostic = diagnostic.hint(format!(
                        "a result is delivered on {}",
                        candidates_list(events)
                    ));
                }
                self.push(diagnostic);
            } else if seen.contains(&text) {
                self.push(
                    Diagnostic::new(
                        Code::BadDestination,
                        self.file,
                        event.span,
                        format!("the event `{text}` is named twice"),
                    )
                    .label("named again here")
                    .hint("name each event once; the destination gets one delivery per event"),
                );
            }
            seen.push(text);
        }
        let without_output: Vec<String> = destination
            .events
            .iter()
            .filter(|e| e.text != "completed")
            .map(|e| format!("`{}`", e.text))
            .collect();
        self.destination = Some(DestinationScope {
            output: without_output.is_empty().then_some(output),
            also_completed: destination.events.iter().any(|e| e.text == "completed"),
            without_output: shown_list(without_output.into_iter()),
        });
        let mut names: Vec<(&StringLit, &str)> = Vec::new();
        match &destination.target {
            DestinationTarget::Webhook { endpoint } => {
                names.push((endpoint, "a webhook endpoint's name"));
            }
            DestinationTarget::Email { to, subject, body } => {
                names.extend(to.iter().map(|to| (to, "an email recipient")));
                self.template(subject);
                self.template(body);
            }
            DestinationTarget::Kb {
                collection,
                title,
                content,
            } => {
                names.push((collection, "a destination's knowledge-base collection"));
                self.template(title);
                // A string is the document; any other value is written as
                // its JSON (language.md §2.1).
                self.value(content, &Ty::Json, &"a document's content");
            }
        }
        self.destination = None;
        for (name, what) in names {
            require_plain(name, what, self.file, self.diagnostics);
            require_named(
                name,
                (
                    Code::BadDestination,
                    what,
                    "name what the account calls it in flowd's configuration",
                ),
                self.file,
                self.diagnostics,
            );
        }
    }

    /// A reference in a destination: the workflow's input, or its `output`
    /// when the run completed; nothing a step wrote is kept for delivery.
    pub(super) fn destination_path(&mut self, path: &Path, optional_ok: bool) -> Option<Ty> {
        let scope = self.destination.as_ref()?;
        let root = path.root.text.as_str();
        let segments = path.segments.as_slice();
        match root {
            "workflow_input" => None,
            "output" => match scope.output.clone() {
                Some(output) => Some(self.walk(output, segments, optional_ok, &|| {
                    "the workflow's output".into()
                })),
                None => {
                    let label = match scope.also_completed {
                        true => format!(
                            "this destination is also delivered on {}",
                            scope.without_output
                        ),
                        false => {
                            format!("this destination is delivered on {}", scope.without_output)
                        }
                    };
                    self.push(
                        Diagnostic::new(
                            Code::BadDestination,
                            self.file,
                            path.root.span,
                            "`output` is only there when the run completed",
                        )
                        .label(label)
                        .hint("read `output` in a `deliver on completed` destination, and `workflow_input` in one for other events"),
                    );
                    Some(Ty::Any)
                }
            },
            _ => {
                let mut diagnostic = Diagnostic::new(
                    Code::BadDestination,
                    self.file,
                    path.root.span,
                    format!("a destination cannot read `{root}`"),
                )
                .label("not in a destination's scope");
                if let Some(best) = did_you_mean(root, ["output", "workflow_input"]) {
                    diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                } else {
                    diagnostic = diagnostic.hint(
                        "a destination reads `output` and `workflow_input`; put what it needs from a step in the workflow's `output`",
                    );
                }
                self.push(diagnostic);
                Some(Ty::Any)
            }
        }
    }
}
