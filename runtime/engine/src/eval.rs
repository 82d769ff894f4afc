//! Evaluating a plan's expressions, references and templates against a run's
//! values.
//!
//! Templates are rendered in one pass over their pre-split parts, so text that
//! a reference yields (an LLM's answer, say) is never read as a template again.

use std::borrow::Cow;
use std::sync::Arc;

use flow_plan::{BinaryOp, Expr, PathSegment, Ref, Root, Slot, Template, TemplatePart};
use serde_json::{Map, Value};

use crate::scope::{Output, Outputs, Scope, output_named, outputs_to_value};

/// Why an expression could not be evaluated. The checker rules most of these
/// out; what remains comes from `json` values whose shape is only known at run
/// time, and from indices past the end of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalError(pub String);

impl std::fmt::Display for EvalError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What an expression sees: the run's input, the step outputs in scope, the
/// loop items and indices of the enclosing loops, and the error in a fallback.
pub struct Env<'a> {
    pub input: &'a Value,
    pub input_fields: &'a [String],
    /// The workflow's slot table, which names the steps whose outputs a
    /// loop's iterations and a parallel's branches hold.
    pub slots: &'a [Slot],
    pub scope: &'a Scope,
    /// Item and index of each enclosing loop, outermost first.
    pub loops: &'a [(Arc<Value>, usize)],
    pub error: Option<&'a Value>,
    /// A recipe's input values, in its prompt.
    pub recipe_input: Option<(&'a [String], &'a Map<String, Value>)>,
    /// The run's output, in a destination delivered once it completed.
    pub output: Option<&'a Value>,
}

impl Env<'_> {
    pub fn eval(&self, expr: &Expr) -> Result<Value, EvalError> {
        Ok(match expr {
            Expr::Literal(value) => value.clone(),
            Expr::Duration(ms) => Value::from(*ms),
            Expr::Template(template) => Value::String(self.render(template)?),
            Expr::Ref(reference) => self.resolve(reference)?,
            Expr::List(items) => Value::Array(
                items
                    .iter()
                    .map(|item| self.eval(item))
                    .collect::<Result<_, _>>()?,
            ),
            Expr::Record(fields) => {
                let mut map = Map::with_capacity(fields.len());
                for field in fields {
                    map.insert(field.name.clone(), self.eval(&field.value)?);
                }
                Value::Object(map)
            }
            Expr::Not(inner) => Value::Bool(!truthy(&self.eval(inner)?)?),
            Expr::Binary { op, left, right } => self.binary(*op, left, right)?,
        })
    }

    fn binary(&self, op: BinaryOp, left: &Expr, right: &Expr) -> Result<Value, EvalError> {
        // `??`, `&&` and `||` evaluate their right side only when needed.
        match op {
            BinaryOp::Coalesce => {
                let value = self.eval(left)?;
                return if value.is_null() {
                    self.eval(right)
                } else {
                    Ok(value)
                };
            }
            BinaryOp::And => {
                return Ok(Value::Bool(
                    truthy(&self.eval(left)?)? && truthy(&self.eval(right)?)?,
                ));
            }
            BinaryOp::Or => {
                return Ok(Value::Bool(
                    truthy(&self.eval(left)?)? || truthy(&self.eval(right)?)?,
                ));
            }
            _ => {}
        }
        let (a, b) = (self.eval(left)?, self.eval(right)?);
        Ok(Value::Bool(match op {
            BinaryOp::Eq => same(&a, &b),
            BinaryOp::Ne => !same(&a, &b),
            _ => {
                let (Some(x), Some(y)) = (a.as_f64(), b.as_f64()) else {
                    return Err(EvalError(format!(
                        "cannot compare {} with {} as numbers",
                        describe(&a),
                        describe(&b)
                    )));
                };
                match op {
                    BinaryOp::Lt => x < y,
                    BinaryOp::Le => x <= y,
                    BinaryOp::Gt => x > y,
                    _ => x >= y,
                }
            }
        }))
    }

    /// Renders a template: text as it is, references as text (strings as they
    /// are, other values as compact JSON, absent optional values as nothing).
    /// A reference is read where it lies, not copied out first: a prompt
    /// quoting a long input costs one copy of its text, into the prompt.
    pub fn render(&self, template: &Template) -> Result<String, EvalError> {
        use std::fmt::Write;
        let mut out = String::new();
        for part in &template.parts {
            match part {
                TemplatePart::Text(text) => out.push_str(text),
                TemplatePart::Ref(reference) => {
                    self.with_resolved(reference, |value| match &*value {
                        Value::String(text) => out.push_str(text),
                        Value::Null => {}
                        // Writing to a `String` cannot fail.
                        other => {
                            let _ = write!(out, "{other}");
                        }
                    })?
                }
            }
        }
        Ok(out)
    }

    pub fn resolve(&self, reference: &Ref) -> Result<Value, EvalError> {
        self.with_resolved(reference, |value| value.into_owned())
    }

    /// Finds what `reference` names and hands it to `use_it`: by reference
    /// where it lies, owned where it had to be built (a whole loop's
    /// output), so that a caller that wants it owned copies it at most
    /// once; an absent optional value is null.
    fn with_resolved<R>(
        &self,
        reference: &Ref,
        use_it: impl FnOnce(Cow<'_, Value>) -> R,
    ) -> Result<R, EvalError> {
        let absent = |what: String| {
            if reference.optional {
                Ok(&NULL)
            } else {
                Err(EvalError(what))
            }
        };
        // What the root is read from when the environment does not hold it
        // by reference: a loop index.
        let index: Value;
        let root: &Value = match reference.root {
            Root::Input => self.input,
            Root::InputField(field) => {
                let name = self.input_fields.get(field as usize).ok_or_else(|| {
                    EvalError(format!(
                        "the plan names input field {field}, which it does not declare"
                    ))
                })?;
                // An optional field left out is absent: null.
                self.input.get(name).unwrap_or(&NULL)
            }
            Root::Step(slot) => match self.scope.get(slot) {
                Some(output) => {
                    return walk_output(&output, &reference.path, reference.optional, self.slots)
                        .map(use_it);
                }
                None => absent(format!("step slot {slot} has no output here"))?,
            },
            Root::LoopItem(level) => match self.loops.get(level as usize) {
                Some((item, _)) => item,
                None => return Err(EvalError(format!("no loop at level {level}"))),
            },
            Root::LoopIndex(level) => match self.loops.get(level as usize) {
                Some((_, at)) => {
                    index = Value::from(*at);
                    &index
                }
                None => return Err(EvalError(format!("no loop at level {level}"))),
            },
            Root::Error => match self.error {
                Some(error) => error,
                None => absent("no error is in scope".to_string())?,
            },
            Root::Output => match self.output {
                Some(output) => output,
                None => absent("the run has no output".to_string())?,
            },
            Root::RecipeInput(field) => {
                let Some((fields, values)) = self.recipe_input else {
                    return Err(EvalError("a recipe input outside a prompt".to_string()));
                };
                let name = fields.get(field as usize).map(String::as_str).unwrap_or("");
                // An optional input not given is absent: null.
                values.get(name).unwrap_or(&NULL)
            }
        };
        walk(root, &reference.path, reference.optional).map(|value| use_it(Cow::Borrowed(value)))
    }
}

/// What an absent optional value reads as.
static NULL: Value = Value::Null;

/// Follows a path into a step's output, into the outputs a loop or a
/// parallel shares with its iterations or branches as far as they go, then
/// into a value as `walk` does: the same answer, and the same error, as if
/// the output had been one value. Only a path that stops short of a value
/// (a whole iteration, branch, loop or parallel) builds one.
fn walk_output<'o>(
    output: &'o Output,
    path: &[PathSegment],
    optional: bool,
    slots: &[Slot],
) -> Result<Cow<'o, Value>, EvalError> {
    let mut at = Shared::Output(output);
    for (depth, segment) in path.iter().enumerate() {
        let next = match (at, segment) {
            (Shared::Output(Output::Value(value)), _) => {
                return walk(value, &path[depth..], optional).map(Cow::Borrowed);
            }
            (Shared::Output(Output::Iterations(iterations)), PathSegment::Index(index)) => {
                usize::try_from(*index)
                    .ok()
                    .and_then(|index| iterations.get(index))
                    .map(Shared::Outputs)
            }
            (Shared::Output(Output::Branches(branches)), PathSegment::Field(name)) => branches
                .iter()
                .find(|(branch, _)| branch == name)
                .map(|(_, outputs)| Shared::Outputs(outputs)),
            (Shared::Outputs(outputs), PathSegment::Field(name)) => {
                output_named(outputs, name, slots).map(Shared::Output)
            }
            _ => None,
        };
        match next {
            Some(next) => at = next,
            // What `walk` answers: a field an object (the branches, or what
            // an iteration set) leaves out is null; a missing element, or
            // a field of a list, is an error unless optional.
            None if matches!(
                (at, segment),
                (
                    Shared::Output(Output::Branches(_)) | Shared::Outputs(_),
                    PathSegment::Field(_)
                )
            ) =>
            {
                return walk(&NULL, &path[depth + 1..], optional).map(Cow::Borrowed);
            }
            None if optional => return Ok(Cow::Borrowed(&NULL)),
            None => return Err(missing(segment, &at.describe())),
        }
    }
    Ok(match at {
        Shared::Output(Output::Value(value)) => Cow::Borrowed(&**value),
        at => Cow::Owned(at.to_value(slots)),
    })
}

/// Where `walk_output` is: at a step's output, or at what one iteration or
/// branch set.
#[derive(Clone, Copy)]
enum Shared<'o> {
    Output(&'o Output),
    Outputs(&'o Outputs),
}

impl Shared<'_> {
    fn to_value(self, slots: &[Slot]) -> Value {
        match self {
            Shared::Output(output) => output.to_value(slots),
            Shared::Outputs(outputs) => outputs_to_value(outputs, slots),
        }
    }

    /// As `describe` describes the value this stands for: a loop's output
    /// is a list of its iterations, the rest objects. (A plain value is
    /// walked by `walk`, never described here.)
    fn describe(self) -> String {
        match self {
            Shared::Output(Output::Iterations(iterations)) => a_list_of(iterations.len()),
            Shared::Output(Output::Value(value)) => describe(value),
            Shared::Output(Output::Branches(_)) | Shared::Outputs(_) => AN_OBJECT.to_string(),
        }
    }
}

/// Follows a path into a value. A field an object leaves out is absent,
/// which is null (the checker lets a path read past a field only where it
/// is present, or with `?.`): an answer that leaves out an optional field
/// reads as one that gives it `null`. A missing index, or a field of what
/// is not an object, is an error unless the reference is optional; then
/// it is null.
fn walk<'v>(
    value: &'v Value,
    path: &[PathSegment],
    optional: bool,
) -> Result<&'v Value, EvalError> {
    let mut current = value;
    for segment in path {
        let next = match (segment, current) {
            (PathSegment::Field(name), Value::Object(map)) => Some(map.get(name).unwrap_or(&NULL)),
            (PathSegment::Index(index), Value::Array(items)) => {
                usize::try_from(*index).ok().and_then(|i| items.get(i))
            }
            (_, Value::Null) if optional => return Ok(&NULL),
            _ => None,
        };
        match next {
            Some(value) => current = value,
            None if optional => return Ok(&NULL),
            None => return Err(missing(segment, &describe(current))),
        }
    }
    Ok(current)
}

/// That `segment` names nothing in what `described` describes.
fn missing(segment: &PathSegment, described: &str) -> EvalError {
    EvalError(match segment {
        // Only a `json` value's path reaches here unchecked (an audit: the
        // docs had a field of null read as null).
        PathSegment::Field(name) => {
            format!(
                "no field `{name}` in {described} (`?.{name}` reads it as null where it may be absent)"
            )
        }
        PathSegment::Index(index) => format!("no element [{index}] in {described}"),
    })
}

/// A condition's or a boolean operand's value: a boolean, or an error
/// saying what it was instead.
pub(crate) fn truthy(value: &Value) -> Result<bool, EvalError> {
    value
        .as_bool()
        .ok_or_else(|| EvalError(format!("expected a boolean, found {}", describe(value))))
}

/// Equality as the language means it (`==`, and a test's `expect`): `1`
/// and `1.0` are the same number, in a list or a record too (serde_json's
/// own tells an integer from a float: `[1] == [1.0]` was false), and a
/// record's absent field is its `null`, as an absent value equals only
/// `null`.
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        // Whole numbers as such (an f64 tells 2^53 + 1 from 2^53 no more).
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(xs), Value::Array(ys)) => {
            xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| same(x, y))
        }
        (Value::Object(xs), Value::Object(ys)) => {
            xs.iter()
                .all(|(key, x)| same(x, ys.get(key).unwrap_or(&Value::Null)))
                && ys
                    .iter()
                    .all(|(key, y)| xs.contains_key(key) || y.is_null())
        }
        _ => a == b,
    }
}

/// A short description of a value for messages.
pub fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() > 40 => "a string".to_string(),
        Value::String(s) => format!("the string {s:?}"),
        Value::Array(items) => a_list_of(items.len()),
        Value::Object(_) => AN_OBJECT.to_string(),
    }
}

fn a_list_of(len: usize) -> String {
    format!("a list of {len}")
}

const AN_OBJECT: &str = "an object";

#[cfg(test)]
mod tests {
    use super::*;
    use flow_plan::Field;
    use serde_json::json;

    fn reference(root: Root, path: &[&str], optional: bool) -> Ref {
        Ref {
            root,
            path: path
                .iter()
                .map(|p| match p.parse::<i64>() {
                    Ok(i) => PathSegment::Index(i),
                    Err(_) => PathSegment::Field(p.to_string()),
                })
                .collect(),
            optional,
        }
    }

    /// Regression: `==` compared lists and records as serde_json does, so
    /// that `[1] == [1.0]` was false though `1 == 1.0` is true.
    #[test]
    fn equality_compares_numbers_as_numbers_at_any_depth() {
        assert!(same(&json!([1, { "n": 2 }]), &json!([1.0, { "n": 2.0 }])));
        assert!(!same(
            &json!(9_007_199_254_740_993_i64),
            &json!(9_007_199_254_740_992_i64)
        ));
        assert!(!same(&json!([u64::MAX]), &json!([u64::MAX - 1])));
        assert!(same(&json!({ "a": 1 }), &json!({ "a": 1, "b": null })));
        assert!(same(&json!({ "a": 1, "b": null }), &json!({ "a": 1 })));
        assert!(!same(&json!({ "a": 1 }), &json!({ "a": 1, "b": 0 })));
        assert!(!same(&json!({ "a": 1, "b": 0 }), &json!({ "a": 1 })));
        assert!(!same(&json!([1, 2]), &json!([1])));
        assert!(!same(&json!("1"), &json!(1)));
    }

    #[test]
    fn references_templates_and_operators() {
        let input = json!({ "name": "Ada", "tags": ["a", "b"] });
        let fields = vec!["name".to_string(), "tags".to_string()];
        let scope = Scope::root(2);
        scope.set(0, json!({ "score": 4, "summary": "ok" }));
        let env = Env {
            input: &input,
            input_fields: &fields,
            slots: &[],
            scope: &scope,
            loops: &[],
            error: None,
            recipe_input: None,
            output: None,
        };
        let template = Template {
            parts: vec![
                TemplatePart::Text("Hi ".into()),
                TemplatePart::Ref(reference(Root::InputField(0), &[], false)),
                TemplatePart::Text(": ".into()),
                TemplatePart::Ref(reference(Root::Step(0), &["score"], false)),
                TemplatePart::Ref(reference(Root::Step(1), &["x"], true)),
            ],
        };
        assert_eq!(env.render(&template), Ok("Hi Ada: 4".to_string()));
        let second_tag = Expr::Ref(reference(Root::InputField(1), &["1"], false));
        assert_eq!(env.eval(&second_tag), Ok(json!("b")));
        let urgent = Expr::Binary {
            op: BinaryOp::Ge,
            left: Box::new(Expr::Ref(reference(Root::Step(0), &["score"], false))),
            right: Box::new(Expr::Literal(json!(4.0))),
        };
        assert_eq!(env.eval(&urgent), Ok(json!(true)));
        let defaulted = Expr::Binary {
            op: BinaryOp::Coalesce,
            left: Box::new(Expr::Ref(reference(Root::Step(1), &["approved"], true))),
            right: Box::new(Expr::Literal(json!(false))),
        };
        assert_eq!(env.eval(&defaulted), Ok(json!(false)));
        let record = Expr::Record(vec![Field {
            name: "n".into(),
            value: Expr::Literal(json!(1)),
        }]);
        assert_eq!(env.eval(&record), Ok(json!({ "n": 1 })));
        // A field the output leaves out is absent, null; a field of a
        // number is an error.
        let missing = Expr::Ref(reference(Root::Step(0), &["nope"], false));
        assert_eq!(env.eval(&missing), Ok(Value::Null));
        let past = Expr::Ref(reference(Root::Step(0), &["score", "x"], false));
        assert!(env.eval(&past).is_err());
    }

    /// Regression: a loop's and a parallel's outputs are read where their
    /// iterations and branches left them, not from one copied value; every
    /// reference must still read what it read from that value, errors and
    /// optional nulls included.
    #[test]
    fn block_outputs_read_as_the_value_they_stand_for() {
        use crate::scope::Output;
        use flow_plan::StepKind;
        let slot = |id: &str, kind| Slot {
            id: id.to_string(),
            kind,
        };
        let slots = vec![
            slot("each", StepKind::Loop),
            slot("a", StepKind::Recipe),
            slot("inner", StepKind::Loop),
            slot("b", StepKind::Recipe),
            slot("fork", StepKind::Parallel),
            slot("c", StepKind::Recipe),
        ];
        let value = |n: i64| Output::from(json!({ "score": n, "tags": ["x", n] }));
        let inner = |n: i64| {
            Output::Iterations(Arc::new(vec![vec![(3, value(n))], vec![(3, value(n + 1))]]))
        };
        let fork = Output::Branches(Arc::new(vec![
            ("left".to_string(), vec![(5, value(7))]),
            (
                "right".to_string(),
                vec![(2, inner(8)), (5, Output::from(Value::Null))],
            ),
        ]));
        let each = Output::Iterations(Arc::new(vec![
            vec![(1, value(1)), (2, inner(2))],
            vec![(1, value(3)), (4, fork.clone())],
            vec![],
        ]));
        let paths = [
            "",
            "0",
            "1",
            "2",
            "3",
            "-1",
            "0/a",
            "0/a/score",
            "0/a/tags/1",
            "0/a/nope",
            "0/inner",
            "0/inner/1/b/score",
            "0/inner/2/b",
            "0/inner/b",
            "1/fork",
            "1/fork/left",
            "1/fork/left/c/score",
            "1/fork/right/inner/0/b/tags/0",
            "1/fork/right/c/score",
            "1/fork/middle",
            "1/fork/0",
            "2/a",
            "a",
            "0/0",
        ];
        for path in paths {
            for optional in [false, true] {
                let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
                let reference = reference(Root::Step(0), &segments, optional);
                let whole = each.to_value(&slots);
                let expected = walk(&whole, &reference.path, optional).cloned();
                let read = walk_output(&each, &reference.path, optional, &slots)
                    .map(|value| value.into_owned());
                assert_eq!(read, expected, "`{path}`, optional: {optional}");
            }
        }
        assert_eq!(
            each.to_value(&slots)[1]["fork"]["right"]["inner"][1]["b"]["score"],
            json!(9)
        );
    }

    /// Text that a step returned is inserted as it is, never read as a template.
    #[test]
    fn rendered_text_is_never_evaluated_again() {
        let input = json!({});
        let scope = Scope::root(1);
        scope.set(0, json!({ "text": "{{workflow_input.secret}}" }));
        let env = Env {
            input: &input,
            input_fields: &[],
            slots: &[],
            scope: &scope,
            loops: &[],
            error: None,
            recipe_input: None,
            output: None,
        };
        let template = Template {
            parts: vec![TemplatePart::Ref(reference(
                Root::Step(0),
                &["text"],
                false,
            ))],
        };
        assert_eq!(
            env.render(&template),
            Ok("{{workflow_input.secret}}".to_string())
        );
    }
}
