//! A workflow's destinations (`deliver on EVENTS to TARGET`) made concrete
//! for one run: which apply to an event, their stable ids, and what each
//! delivers, rendered from the run's input and output. flowd's deliverer
//! and `flow run` both deliver what this renders, so a destination reads
//! the same wherever it is delivered.

use flow_plan::{DestinationTarget, RunEvent, Workflow};
use serde_json::Value;

use crate::eval::{Env, EvalError};
use crate::scope::Scope;

/// What one destination delivers for one run.
#[derive(Debug, Clone, PartialEq)]
pub enum Rendered {
    /// The run record, posted to the account's endpoint of this name.
    Webhook { endpoint: String },
    /// An email: the subject, the body as text, and the same body as HTML
    /// (escaped from the text, so no run data is ever read as markup).
    Email {
        to: Vec<String>,
        subject: String,
        text: String,
        html: String,
    },
    /// A new version of the document `title` in `collection`.
    Kb {
        collection: String,
        title: String,
        content: String,
    },
}

/// The destinations of `workflow` delivered on `event`, with their index in
/// the plan (part of their delivery ids).
pub fn on_event(
    workflow: &Workflow,
    event: RunEvent,
) -> impl Iterator<Item = (usize, &DestinationTarget)> {
    workflow
        .destinations
        .iter()
        .enumerate()
        .filter(move |(_, destination)| destination.events.contains(&event))
        .map(|(index, destination)| (index, &destination.target))
}

/// The id of the delivery of destination `index` of run `run_id` on
/// `event`, its `occurrence` (a run parks at each approval, and a redriven
/// run may fail again: each is a delivery of its own; `flow` counts them,
/// flowd tags the event's row in its outbox): the same on every attempt and
/// in every process, so that a receiver takes a delivery made twice (after
/// a crash) once.
pub fn delivery_id(run_id: &str, index: usize, event: RunEvent, occurrence: &str) -> String {
    format!("dlv_{run_id}_{index}_{}_{occurrence}", event.as_str())
}

/// Renders `target` for a run of `workflow` with `input` and, when it
/// completed, `output`.
pub fn render(
    workflow: &Workflow,
    target: &DestinationTarget,
    input: &Value,
    output: Option<&Value>,
) -> Result<Rendered, EvalError> {
    let scope = Scope::root(0);
    let env = Env {
        input,
        input_fields: &workflow.input_fields,
        slots: &workflow.slots,
        scope: &scope,
        loops: &[],
        error: None,
        recipe_input: None,
        output,
    };
    Ok(match target {
        DestinationTarget::Webhook { endpoint } => Rendered::Webhook {
            endpoint: endpoint.clone(),
        },
        DestinationTarget::Email { to, subject, body } => {
            let text = env.render(body)?;
            Rendered::Email {
                to: to.clone(),
                // A header is one line: a line break from run data would
                // end it.
                subject: one_line(&env.render(subject)?),
                html: html_of(&text),
                text,
            }
        }
        DestinationTarget::Kb {
            collection,
            title,
            content,
        } => Rendered::Kb {
            collection: collection.clone(),
            title: env.render(title)?,
            content: match env.eval(content)? {
                Value::String(text) => text,
                other => other.to_string(),
            },
        },
    })
}

fn one_line(text: &str) -> String {
    text.split(['\r', '\n'])
        .filter(|line| !line.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The HTML part of an email whose text is `text`: every character that
/// HTML gives a meaning escaped, blank lines as paragraphs, line breaks as
/// `<br>`.
pub fn html_of(text: &str) -> String {
    let mut html = String::from("<!DOCTYPE html>\n<html><body>\n");
    for paragraph in text.split("\n\n").filter(|p| !p.trim().is_empty()) {
        html.push_str("<p>");
        for (index, line) in paragraph.lines().enumerate() {
            if index > 0 {
                html.push_str("<br>\n");
            }
            escape_into(line, &mut html);
        }
        html.push_str("</p>\n");
    }
    html.push_str("</body></html>\n");
    html
}

fn escape_into(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flow_plan::{Destination, Expr, PathSegment, Ref, Root, Template, TemplatePart};
    use serde_json::json;

    fn reference(root: Root, field: &str) -> Ref {
        Ref {
            root,
            path: vec![PathSegment::Field(field.into())],
            optional: false,
        }
    }

    fn workflow(destinations: Vec<Destination>) -> Workflow {
        serde_json::from_value(json!({
            "name": "w", "input_fields": ["ticket"], "input_schema": {},
            "timeout_ms": 1000, "durability": "full", "context": [],
            "on_error": { "kind": "fail" }, "slots": [], "body": [], "output": [],
        }))
        .map(|mut w: Workflow| {
            w.destinations = destinations;
            w
        })
        .expect("a workflow")
    }

    #[test]
    fn an_email_renders_its_templates_and_escapes_its_html() {
        let target = DestinationTarget::Email {
            to: vec!["leads".into()],
            subject: Template {
                parts: vec![
                    TemplatePart::Text("Refund ".into()),
                    TemplatePart::Ref(reference(Root::InputField(0), "id")),
                ],
            },
            body: Template {
                parts: vec![TemplatePart::Ref(reference(Root::Output, "reply"))],
            },
        };
        let workflow = workflow(vec![Destination {
            events: vec![RunEvent::Completed],
            target: target.clone(),
        }]);
        let input = json!({ "ticket": { "id": "T-1\nBcc: x@y" } });
        let output = json!({ "reply": "<script>alert(1)</script> & done\n\nthanks" });
        let rendered = render(&workflow, &target, &input, Some(&output)).unwrap();
        let Rendered::Email {
            subject,
            text,
            html,
            ..
        } = rendered
        else {
            panic!("an email renders as one");
        };
        assert_eq!(subject, "Refund T-1 Bcc: x@y");
        assert_eq!(text, "<script>alert(1)</script> & done\n\nthanks");
        assert!(
            html.contains("<p>&lt;script&gt;alert(1)&lt;/script&gt; &amp; done</p>\n<p>thanks</p>")
        );
        assert!(!html.contains("<script>"));
        assert_eq!(on_event(&workflow, RunEvent::Completed).count(), 1);
        assert_eq!(on_event(&workflow, RunEvent::Failed).count(), 0);
    }

    #[test]
    fn a_kb_destination_writes_a_value_that_is_not_text_as_json() {
        let target = DestinationTarget::Kb {
            collection: "summaries".into(),
            title: Template {
                parts: vec![TemplatePart::Text("t".into())],
            },
            content: Expr::Ref(reference(Root::Output, "n")),
        };
        let workflow = workflow(Vec::new());
        let rendered = render(
            &workflow,
            &target,
            &json!({}),
            Some(&json!({ "n": { "a": 1 } })),
        );
        assert_eq!(
            rendered,
            Ok(Rendered::Kb {
                collection: "summaries".into(),
                title: "t".into(),
                content: r#"{"a":1}"#.into(),
            })
        );
        let failed = render(&workflow, &target, &json!({}), None);
        assert!(failed.is_err(), "no output, no content: {failed:?}");
    }
}
