//! The tree of a `test` block, from its pest pairs.
//!
//! A test's statements reuse the language's paths, strings and expressions;
//! what is particular to tests is checked here only as far as the syntax
//! goes (a step named as `step.ID`, a failure that exists), and the rest is
//! the checker's.

use pest::iterators::Pair;

use super::{Context, Parser, Rule, children, first_child, name, span_of};
use crate::codes::Code;
use crate::diagnostic::Diagnostic;
use crate::syntax::ast::*;

/// The most times a mock may say one failure repeats: more is a loop no
/// retry policy runs (the plan's attempts are bounded far below it).
const MAX_TIMES: i64 = 1_000;

impl Parser<'_> {
    pub(super) fn test_decl(&mut self, pair: Pair<'_, Rule>, docs: Vec<String>) -> TestDecl {
        let span = span_of(&pair);
        let mut inner = pair.into_inner();
        let title = inner.next().expect("the grammar gives a test a name");
        let title = if title.as_rule() == Rule::test_name_slip {
            // Reported, and read as the string meant, so that the test's
            // body is checked rather than skipped.
            let written = title.as_str();
            self.slip(
                span_of(&title),
                "a test's name is a string",
                "not in quotes",
                format!("write `test \"{written}\"`"),
                format!("\"{written}\""),
            );
            StringLit {
                template: Template {
                    parts: vec![TemplatePart::Text(written.into())],
                },
                span: span_of(&title),
            }
        } else {
            self.string(title)
        };
        let mut test = TestDecl {
            docs,
            name: title,
            workflow: None,
            input: None,
            mocks: Vec::new(),
            decisions: Vec::new(),
            expects: Vec::new(),
            recovered: false,
            span,
        };
        for member in inner {
            // Left open: `unclosed_at_end` reports its `{`.
            if member.as_rule() == Rule::cut_off {
                continue;
            }
            if member.as_rule() == Rule::bad_member {
                self.recover(&member, Context::TestMember);
                test.recovered = true;
                continue;
            }
            let member = first_child(member);
            let member_span = span_of(&member);
            match member.as_rule() {
                Rule::test_workflow => {
                    let workflow = name(first_child(member));
                    self.once(&mut test.workflow, workflow, member_span, "workflow");
                }
                Rule::test_input => {
                    let input = self.record_lit(first_child(member));
                    self.once(&mut test.input, input, member_span, "input");
                }
                Rule::mock_stmt => {
                    if let Some(mock) = self.mock(member) {
                        test.mocks.push(mock);
                    }
                }
                Rule::decide_stmt => {
                    if let Some(decide) = self.decide(member) {
                        test.decisions.push(decide);
                    }
                }
                Rule::expect_stmt => {
                    if let Some(expect) = self.expect(member) {
                        test.expects.push(expect);
                    }
                }
                _ => {}
            }
        }
        test
    }

    fn mock(&mut self, pair: Pair<'_, Rule>) -> Option<Mock> {
        let span = span_of(&pair);
        let mut inner = children(pair);
        let target = inner.next()?;
        let target = match target.as_rule() {
            Rule::mock_recipe => MockTarget::Recipe(name(children(target).nth(1)?)),
            _ => MockTarget::Step(self.step_name(target)?),
        };
        let mut answers = Vec::new();
        for part in inner {
            let part = match part.as_rule() {
                Rule::mock_then => {
                    let mut then = children(part);
                    let word = then.next()?;
                    match then.next() {
                        Some(answer) => answer,
                        None => {
                            self.nothing_after(&word, "the next call's answer");
                            continue;
                        }
                    }
                }
                _ => part,
            };
            answers.push(match part.as_rule() {
                Rule::mock_fails => self.mock_fails(part)?,
                _ => MockAnswer::Value(self.expr(part)),
            });
        }
        Some(Mock {
            target,
            answers,
            span,
        })
    }

    fn mock_fails(&mut self, pair: Pair<'_, Rule>) -> Option<MockAnswer> {
        let span = span_of(&pair);
        let mut inner = children(pair);
        let word = inner.next()?;
        let Some(what) = inner.next() else {
            self.nothing_after(&word, "how the call fails");
            return None;
        };
        let what_span = span_of(&what);
        let failure = match what.as_rule() {
            Rule::int => {
                match what.as_str().parse::<u16>() {
                    Ok(status) if (400..600).contains(&status) => Failure::Status(status),
                    _ => {
                        self.problems.push(
                        Diagnostic::new(
                            Code::Syntax,
                            self.file,
                            what_span,
                            format!("`{}` is not an HTTP error status", what.as_str()),
                        )
                        .label("expected 400 to 599")
                        .hint("a provider fails with a 4xx or 5xx status: 429 is retried, 400 is not"),
                    );
                        return None;
                    }
                }
            }
            _ => {
                let word = what.as_str();
                match Failure::WORDS.iter().find(|(w, _)| *w == word) {
                    Some((_, failure)) => *failure,
                    None => {
                        let words: Vec<&str> = Failure::WORDS.iter().map(|(w, _)| *w).collect();
                        let mut diagnostic = Diagnostic::new(
                            Code::Syntax,
                            self.file,
                            what_span,
                            format!("`{word}` is not a way a call fails"),
                        )
                        .label("unknown failure")
                        .hint(format!(
                            "a call fails with an HTTP status (`fails 429`) or {}",
                            words
                                .iter()
                                .map(|w| format!("`{w}`"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                        if let Some(meant) =
                            crate::suggest::did_you_mean(word, words.iter().copied())
                        {
                            diagnostic = diagnostic.fix(meant.to_string());
                        }
                        self.problems.push(diagnostic);
                        return None;
                    }
                }
            }
        };
        let times = match inner.next() {
            None => 1,
            Some(times) => self.mock_times(times),
        };
        Some(MockAnswer::Fails {
            failure,
            times,
            span,
        })
    }

    /// A mock's `then` or `fails` with nothing after it on its line: one
    /// error, where the next line's first word was read as what it lacked
    /// and then reported again with the rest of its line.
    fn nothing_after(&mut self, word: &Pair<'_, Rule>, lacked: &str) {
        let written = word.as_str();
        self.problems.push(
            Diagnostic::new(
                Code::Syntax,
                self.file,
                span_of(word),
                format!("nothing after `{written}`, which needs {lacked}"),
            )
            .label(format!("needs {lacked}"))
            .hint(match written {
                "then" => {
                    "write the next answer on the same line: `then { ... }`, or `then fails 503`"
                }
                _ => "write a status or a word on the same line: `fails 429`, `fails timeout`",
            }),
        );
    }

    fn mock_times(&mut self, pair: Pair<'_, Rule>) -> u32 {
        let mut word = first_child(pair.clone());
        if word.as_rule() == Rule::times_slip {
            word = first_child(word);
            let meant = match word.as_rule() {
                Rule::thrice_slip => "3 times".to_string(),
                _ => format!("{} times", word.as_str()),
            };
            self.problems.push(
                Diagnostic::new(
                    Code::Syntax,
                    self.file,
                    span_of(&word),
                    format!(
                        "a failure's repeats are `once`, `twice` or `N times`: write `{meant}`"
                    ),
                )
                .label("not `once`, `twice` or `N times`")
                .fix(meant),
            );
            if word.as_rule() == Rule::thrice_slip {
                return 3;
            }
        }
        match word.as_rule() {
            Rule::kw_once => 1,
            Rule::kw_twice => 2,
            _ => {
                let count = self.int(word.clone(), 1);
                if !(1..=MAX_TIMES).contains(&count) {
                    self.problems.push(
                        Diagnostic::new(
                            Code::Syntax,
                            self.file,
                            span_of(&word),
                            format!("a failure repeats 1 to {MAX_TIMES} times"),
                        )
                        .label("out of range"),
                    );
                    return 1;
                }
                count as u32
            }
        }
    }

    fn decide(&mut self, pair: Pair<'_, Rule>) -> Option<Decide> {
        let span = span_of(&pair);
        let mut inner = children(pair);
        let step = self.step_name(inner.next()?)?;
        let mut decisions = Vec::new();
        for how in inner {
            match how.as_rule() {
                Rule::decide_by => {
                    let mut parts = children(how);
                    let approved = parts.next()?.as_str() == "approve";
                    let by = self.string(parts.nth(1)?);
                    let comment = parts.nth(1).map(|comment| self.string(comment));
                    decisions.push(Decision::Decided {
                        approved,
                        by,
                        comment,
                    });
                }
                Rule::kw_expire => decisions.push(Decision::Expire),
                Rule::kw_wait => decisions.push(Decision::Wait),
                _ => {}
            }
        }
        Some(Decide {
            step,
            decisions,
            span,
        })
    }

    fn expect(&mut self, pair: Pair<'_, Rule>) -> Option<Expect> {
        let span = span_of(&pair);
        let what = first_child(pair);
        let kind = match what.as_rule() {
            Rule::expect_status => {
                let mut parts = children(what).skip(1).peekable();
                if let Some(slip) = parts.next_if(|p| p.as_rule() == Rule::status_slip) {
                    self.problems.push(
                        Diagnostic::new(
                            Code::BadExpectation,
                            self.file,
                            span_of(&slip),
                            format!(
                                "a status is written after `status`, without `{}`",
                                slip.as_str()
                            ),
                        )
                        .label("not needed")
                        .hint("write `expect status completed` (or `failed`, `parked`)")
                        .fix(""),
                    );
                }
                let status = parts.next()?;
                if status.as_rule() == Rule::string {
                    // `expect status "completed"`: the word, quoted.
                    let word = self.string(status.clone()).display_text();
                    self.problems.push(
                        Diagnostic::new(
                            Code::BadExpectation,
                            self.file,
                            span_of(&status),
                            "a status is a word, not a string",
                        )
                        .label("in quotes")
                        .hint(format!("write `expect status {word}`"))
                        .fix(word.clone()),
                    );
                    ExpectKind::Status(Name {
                        text: word.into(),
                        span: span_of(&status),
                    })
                } else {
                    ExpectKind::Status(name(status))
                }
            }
            Rule::expect_ran => {
                let mut parts: Vec<_> = children(what).collect();
                if let [slip] = parts.as_slice()
                    && slip.as_rule() == Rule::ran_after_slip
                {
                    let slip = slip.clone();
                    let inner: Vec<_> = children(slip.clone()).collect();
                    let not = inner.iter().any(|p| p.as_rule() == Rule::kw_not);
                    let path = inner.first()?.as_str();
                    let meant = format!("{}ran {path}", if not { "not " } else { "" });
                    self.problems.push(
                        Diagnostic::new(
                            Code::BadExpectation,
                            self.file,
                            span_of(&slip),
                            format!("write `expect {meant}`: `ran` comes before the step"),
                        )
                        .label("in the order of a sentence")
                        .fix(meant),
                    );
                    // As meant: `not`, `ran`, then the step.
                    parts = inner;
                    parts.sort_by_key(|part| match part.as_rule() {
                        Rule::kw_not => 0,
                        Rule::kw_ran => 1,
                        _ => 2,
                    });
                }
                let ran = parts.first()?.as_rule() != Rule::kw_not;
                let path = parts.iter().find(|p| p.as_rule() == Rule::path)?;
                let with = parts
                    .iter()
                    .find(|p| p.as_rule() == Rule::record_lit)
                    .map(|record| self.record_lit(record.clone()));
                ExpectKind::Ran {
                    step: self.step_name(path.clone())?,
                    ran,
                    with,
                }
            }
            Rule::expect_attempts => {
                let mut parts = children(what).skip(1);
                let step = self.step_name(parts.next()?)?;
                let mut count = parts.next()?;
                if count.as_rule() == Rule::attempts_slip {
                    self.problems.push(
                        Diagnostic::new(
                            Code::BadExpectation,
                            self.file,
                            span_of(&count),
                            format!("attempts are compared with `==`, not `{}`", count.as_str()),
                        )
                        .label("not `==`")
                        .hint("`expect attempts step.ID == N` holds when the step's runs made N attempts in all")
                        .fix("=="),
                    );
                    count = parts.next()?;
                }
                if count.as_rule() == Rule::float {
                    self.problems.push(
                        Diagnostic::new(
                            Code::BadExpectation,
                            self.file,
                            span_of(&count),
                            format!(
                                "attempts are counted in whole numbers, not `{}`",
                                count.as_str()
                            ),
                        )
                        .label("not a whole number"),
                    );
                    return None;
                }
                ExpectKind::Attempts {
                    step,
                    count_span: span_of(&count),
                    // 1, not 0: a count too large to read (E001) drew a
                    // second error, that no attempt was made (an audit).
                    count: self.int(count, 1),
                }
            }
            _ => {
                let expr = self.expr(what);
                match expr.kind {
                    ExprKind::Binary(op, left, right)
                        if op != BinaryOp::Coalesce
                            && op != BinaryOp::And
                            && op != BinaryOp::Or
                            && matches!(&left.kind, ExprKind::Path(path) if path.root.text == "output") =>
                    {
                        let ExprKind::Path(path) = left.kind else {
                            unreachable!("matched as a path above")
                        };
                        ExpectKind::Output {
                            path,
                            op,
                            value: *right,
                        }
                    }
                    kind => ExpectKind::Other(Expr {
                        kind,
                        span: expr.span,
                    }),
                }
            }
        };
        Some(Expect { kind, span })
    }

    /// The id of a step named as `step.ID`; anything else is reported.
    fn step_name(&mut self, pair: Pair<'_, Rule>) -> Option<Name> {
        let path = self.path(pair);
        match path.segments.as_slice() {
            [
                Segment::Field {
                    name,
                    optional: false,
                },
            ] if path.root.text == "step" => Some(name.clone()),
            _ => {
                self.problems.push(
                    Diagnostic::new(
                        Code::Syntax,
                        self.file,
                        path.span(),
                        format!("`{}` does not name a step", path_text(&path)),
                    )
                    .label("expected `step.ID`")
                    .hint("a test names a step by its id, as `step.classify`, wherever the step is (in a loop, a branch, a fallback)"),
                );
                None
            }
        }
    }
}
