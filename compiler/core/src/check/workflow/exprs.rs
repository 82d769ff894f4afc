//! Checking expressions and values against the types they must have:
//! operators, literals against enums, templates.

use super::*;

impl<'e, 'd> Checker<'e, 'd> {
    pub(super) fn expect_bool(&mut self, expr: &Expr, ty: &Ty) {
        match ty {
            Ty::Bool | Ty::Any | Ty::Json => {}
            Ty::Optional(inner) if **inner == Ty::Bool => self.push(
                Diagnostic::new(
                    Code::NonBoolCondition,
                    self.file,
                    expr.span,
                    "the condition is `bool?`, which may be absent",
                )
                .label("may be absent")
                .hint("give it a default: `(...) ?? false`")
                // `??` binds loosest, so the whole condition is its left side.
                .fix_with(
                    "Treat an absent value as `false`",
                    vec![Edit::insert(expr.span.end, " ?? false")],
                ),
            ),
            other => self.push(
                Diagnostic::new(
                    Code::NonBoolCondition,
                    self.file,
                    expr.span,
                    format!("the condition is `{}`, not `bool`", self.env.show(other)),
                )
                .label("not a boolean")
                .hint("compare it: `== \"value\"`, `>= 4`, `!= null`"),
            ),
        }
    }

    // ------------------------------------------------------------ arguments and values

    /// Checks an expression against an expected type, looking inside literals so
    /// that the error lands on the exact element or field. `what` names the
    /// value in messages only, so it is formatted when there is one: a
    /// `format!` per argument of every step was a fifth of the checker's
    /// allocations.
    pub(super) fn value(&mut self, expr: &Expr, expected: &Ty, what: &dyn std::fmt::Display) {
        match (&expr.kind, expected.required()) {
            (_, Ty::Any | Ty::Json) => {
                let outer = std::mem::replace(&mut self.into_json, true);
                self.expr(expr, false);
                self.into_json = outer;
            }
            (ExprKind::String(lit), Ty::Enum(variants)) if lit.as_plain().is_some() => {
                let text = lit.as_plain().unwrap_or_default();
                if !variants.contains(text) {
                    self.not_a_variant(
                        expr.span,
                        text,
                        variants,
                        &format!("{what} must be one of"),
                    );
                }
            }
            (ExprKind::Record(record), Ty::Record(fields)) => {
                self.fields_of_record(record, fields, &format_args!("the record for {what}"));
            }
            (ExprKind::List(items), Ty::List(item_ty)) => {
                for item in items {
                    self.value(item, item_ty, &format_args!("an element of {what}"));
                }
            }
            (ExprKind::Null, _) if expected.is_optional() => {}
            // A bare number where a duration goes is a duration without its
            // unit, said as for `timeout 90`.
            (ExprKind::Int(amount), Ty::Duration) => {
                self.duration(
                    &DurationLit::new(
                        u64::try_from(*amount).ok(),
                        DurationUnit::Missing,
                        expr.span,
                    ),
                    &what.to_string(),
                );
            }
            _ => {
                let ty = self.expr(expr, false);
                if !ty.assignable_to(expected) {
                    let mut diagnostic = Diagnostic::new(
                        Code::TypeMismatch,
                        self.file,
                        expr.span,
                        format!(
                            "{what} expects `{}`, found `{}`",
                            self.env.show(expected),
                            self.env.show(&ty)
                        ),
                    )
                    .label(format!("this is `{}`", self.env.show(&ty)));
                    if ty.is_optional() && ty.required().assignable_to(expected) {
                        diagnostic = diagnostic
                            .hint("the value may be absent: give a default with `?? ...`");
                    } else if matches!(expected.required(), Ty::Enum(_)) && ty == Ty::String {
                        diagnostic = diagnostic.hint("only a string literal, or a value of an enum type with these variants, fits an enum");
                    }
                    // The alias's expansion helps to see what differs.
                    let named = self.env.show(expected.required()).to_string();
                    let expansion = expected.required().to_string();
                    if named != expansion {
                        diagnostic = diagnostic.hint(format!("`{named}` is `{expansion}`"));
                    }
                    self.push(diagnostic);
                }
            }
        }
    }

    pub(super) fn not_a_variant(
        &mut self,
        span: Span,
        text: &str,
        variants: &[String],
        prefix: &str,
    ) {
        let mut diagnostic = Diagnostic::new(
            Code::NotAVariant,
            self.file,
            span,
            format!(
                "\"{text}\" is not a variant: {prefix} {}",
                shown_list(variants.iter().map(|v| format!("\"{v}\"")))
            ),
        )
        .label("not a variant");
        if let Some(best) = self.suggest(text, variants.iter().map(String::as_str)) {
            diagnostic = diagnostic
                .hint(format!("did you mean \"{best}\"?"))
                .fix(format!("\"{best}\""));
        }
        self.push(diagnostic);
    }

    // ------------------------------------------------------------ expressions

    pub(super) fn template(&mut self, lit: &StringLit) {
        self.in_template = true;
        for part in &lit.template.parts {
            if let TemplatePart::Ref(path) = part {
                self.path(path, false);
            }
        }
        self.in_template = false;
    }

    /// The type of an expression. `optional_ok`: the expression is the left
    /// side of `??`, where absent values and steps that may not have run are fine.
    pub(super) fn expr(&mut self, expr: &Expr, optional_ok: bool) -> Ty {
        match &expr.kind {
            ExprKind::Null => Ty::Null,
            ExprKind::Bool(_) => Ty::Bool,
            ExprKind::Int(_) => Ty::Int,
            ExprKind::Float(_) => Ty::Float,
            ExprKind::Duration(duration) => {
                self.duration(duration, "a duration");
                Ty::Duration
            }
            ExprKind::String(lit) => {
                self.template(lit);
                Ty::String
            }
            ExprKind::List(items) => self.list_literal(items),
            ExprKind::Record(record) => {
                let mut fields: Vec<(String, Ty)> = Vec::new();
                // A set, not a scan of `fields`: a record of 100,000 fields
                // was quadratic.
                let mut seen: HashSet<&str> = HashSet::new();
                for field in &record.fields {
                    let ty = self.expr(&field.value, false);
                    if !seen.insert(field.name.text.as_str()) {
                        self.push(
                            Diagnostic::new(
                                Code::DuplicateId,
                                self.file,
                                field.name.span,
                                format!("`{}` is given twice", field.name.text),
                            )
                            .label("given again here"),
                        );
                    } else {
                        fields.push((field.name.text.to_string(), ty));
                    }
                }
                Ty::record(fields)
            }
            ExprKind::Path(path) => self.path(path, optional_ok),
            ExprKind::Not(inner) => {
                let ty = self.expr(inner, false);
                if !matches!(ty, Ty::Bool | Ty::Any | Ty::Json) {
                    let mut diagnostic = Diagnostic::new(
                        Code::TypeMismatch,
                        self.file,
                        inner.span,
                        format!("`!` needs a `bool`, found `{}`", self.env.show(&ty)),
                    )
                    .label("not a boolean");
                    // `!x ?? true` reads as `(!x) ?? true`: the default
                    // goes inside.
                    if ty == Ty::Bool.optional() {
                        diagnostic = diagnostic
                            .hint("give the absent value a default first: `!(x ?? false)`");
                    }
                    self.push(diagnostic);
                    // No type for an expression in error: what reads it
                    // (a `??` after it) is not judged on a guess.
                    return Ty::Any;
                }
                Ty::Bool
            }
            ExprKind::Binary(op, left, right) => self.binary(*op, left, right, expr.span),
            ExprKind::Error => Ty::Any,
        }
    }

    /// A list literal's type: its elements' narrowest common type
    /// ([`Ty::join`]), `json` for `[]`. Elements with none are an error,
    /// but where `json` goes.
    fn list_literal(&mut self, items: &[Expr]) -> Ty {
        let mut element: Option<Ty> = None;
        let mut mixed = false;
        for item in items {
            let ty = self.expr(item, false);
            let Some(before) = &element else {
                element = Some(ty);
                continue;
            };
            if mixed {
                continue;
            }
            match before.join(&ty) {
                Some(joined) => element = Some(joined),
                None if self.into_json => element = Some(Ty::Json),
                None => {
                    self.push(
                        Diagnostic::new(
                            Code::TypeMismatch,
                            self.file,
                            item.span,
                            format!(
                                "the elements of a list have one type: this is `{}`, those before it `{}`",
                                self.env.show(&ty),
                                self.env.show(before)
                            ),
                        )
                        .label(format!("`{}` among `{}`", self.env.show(&ty), self.env.show(before)))
                        .hint("a list of mixed values goes only where `list<json>` or `json` is expected"),
                    );
                    mixed = true;
                    element = Some(Ty::Any);
                }
            }
        }
        Ty::list(element.unwrap_or(Ty::Json))
    }

    pub(super) fn binary(&mut self, op: BinaryOp, left: &Expr, right: &Expr, span: Span) -> Ty {
        match op {
            BinaryOp::Coalesce => {
                let left_ty = self.expr(left, true);
                let right_ty = self.expr(right, false);
                if !left_ty.is_optional() && !left_ty.is_unchecked() {
                    self.push(
                        Diagnostic::new(
                            Code::NeedlessOptional,
                            self.file,
                            left.span,
                            format!("this is `{left_ty}`, never absent, so `??` never applies"),
                        )
                        .label("always present")
                        .hint("remove `?? ...`"),
                    );
                    return left_ty;
                }
                let inner = left_ty.required().clone();
                // A literal default for an enum value stays an enum, and must be
                // one of its variants.
                if let (Ty::Enum(variants), ExprKind::String(lit)) = (&inner, &right.kind)
                    && let Some(text) = lit.as_plain()
                {
                    if !variants.contains(text) {
                        self.not_a_variant(
                            right.span,
                            text,
                            variants,
                            "the default must be one of",
                        );
                    }
                    return inner;
                }
                if matches!(left_ty, Ty::Null) || right_ty.assignable_to(&inner) {
                    return if matches!(left_ty, Ty::Null) {
                        right_ty
                    } else {
                        inner_or(inner, &right_ty)
                    };
                }
                if inner.assignable_to(right_ty.required()) {
                    return right_ty;
                }
                let mut diagnostic = Diagnostic::new(
                    Code::TypeMismatch,
                    self.file,
                    right.span,
                    format!("the default is `{right_ty}` but the value is `{inner}`"),
                )
                .label("default of another type");
                // `a ?? 0 > 0` is `a ?? (0 > 0)`: `??` binds loosest.
                if let ExprKind::Binary(op, ..) = &right.kind
                    && !matches!(op, BinaryOp::Coalesce)
                {
                    diagnostic = diagnostic.hint(format!(
                        "`??` binds loosest, so the default is all that follows it; to compare the value with its default, write `(VALUE ?? DEFAULT) {} ...`",
                        op.symbol()
                    ));
                }
                self.push(diagnostic);
                Ty::Any
            }
            BinaryOp::And | BinaryOp::Or => {
                let mut typed = true;
                for side in [left, right] {
                    let ty = self.expr(side, false);
                    if !matches!(ty, Ty::Bool | Ty::Any | Ty::Json) {
                        let mut diagnostic = Diagnostic::new(
                            Code::TypeMismatch,
                            self.file,
                            side.span,
                            format!(
                                "`{}` needs `bool` operands, found `{}`",
                                op.symbol(),
                                self.env.show(&ty)
                            ),
                        )
                        .label("not a boolean");
                        // `a || b?.n ?? 0 > 1` is `(a || b?.n) ?? (0 > 1)`.
                        if matches!(ty, Ty::Optional(_)) {
                            diagnostic = diagnostic.hint(
                                "give the optional value a default, in parentheses: `(VALUE ?? false)`; `??` binds loosest, so `a || b ?? c` is `(a || b) ?? c`",
                            );
                        }
                        self.push(diagnostic);
                        typed = false;
                    }
                }
                // An expression with an error has no type, so that nothing
                // said of its type follows (an audit: W303 on the `??`
                // around it, whose advice was wrong).
                if typed { Ty::Bool } else { Ty::Any }
            }
            BinaryOp::Eq | BinaryOp::Ne => {
                let left_ty = self.expr(left, false);
                let right_ty = self.expr(right, false);
                // An enum compared with a literal that is not a variant is never equal.
                for (lit, other) in [(left, &right_ty), (right, &left_ty)] {
                    if let (ExprKind::String(text), Ty::Enum(variants)) =
                        (&lit.kind, other.required())
                        && let Some(text) = text.as_plain()
                    {
                        if !variants.contains(text) {
                            self.not_a_variant(
                                lit.span,
                                text,
                                variants,
                                "the compared value is one of",
                            );
                        }
                        return Ty::Bool;
                    }
                }
                // Two enums can be equal when they share a variant.
                let overlapping_enums = match (left_ty.required(), right_ty.required()) {
                    (Ty::Enum(a), Ty::Enum(b)) => a.overlap(b),
                    _ => false,
                };
                let comparable = overlapping_enums
                    || left_ty.assignable_to(&right_ty)
                    || right_ty.assignable_to(&left_ty)
                    || (left_ty.is_numeric() && right_ty.is_numeric())
                    || matches!(left_ty, Ty::Null)
                    || matches!(right_ty, Ty::Null);
                if !comparable {
                    self.push(
                        Diagnostic::new(
                            Code::TypeMismatch,
                            self.file,
                            span,
                            format!("cannot compare `{left_ty}` with `{right_ty}`"),
                        )
                        .label("never equal"),
                    );
                }
                Ty::Bool
            }
            BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => {
                for side in [left, right] {
                    let ty = self.expr(side, false);
                    if !ty.is_numeric() {
                        let mut diagnostic = Diagnostic::new(
                            Code::TypeMismatch,
                            self.file,
                            side.span,
                            format!(
                                "`{}` compares numbers, found `{}`",
                                op.symbol(),
                                self.env.show(&ty)
                            ),
                        )
                        .label("not a number");
                        if ty.is_optional() && ty.required().is_numeric() {
                            diagnostic = diagnostic
                                .hint("the value may be absent: give a default with `?? 0`");
                        }
                        self.push(diagnostic);
                    }
                }
                Ty::Bool
            }
        }
    }

    // ------------------------------------------------------------ references
}
