//! A direct parser for files without syntax errors: the fast path.
//!
//! pest parses this grammar at about 15 MB/s, a third of what a large file
//! needs to check in CI budgets (see docs/benchmarks.md). This recursive-descent
//! parser builds the same tree several times faster, but only for input that
//! is entirely well formed: at the first thing it does not expect, or anything
//! the tree builder would report (a keyword used as a name, a member given
//! twice, a malformed template), it gives up and `parse` runs the pest parser,
//! which owns recovery and every syntax diagnostic.
//!
//! Invariant: when `parse_fast` returns a tree, it is exactly the tree that the
//! pest path builds, spans included, and the pest path reports nothing. The
//! differential tests at the end of this file hold it to that on the examples,
//! the fixtures, and random mutations of both. The grammar in `flow.pest`
//! stays the definition of the language; this file follows it, and where pest
//! would accept something surprising (`stepx = ...` read as `step x = ...`,
//! since literals need no word boundary) this parser gives up instead.

use crate::diagnostic::{FileId, Span};
use crate::syntax::ast::*;
use crate::syntax::cursor::is_name_byte;
use crate::syntax::parse::{KEYWORDS, MAX_DEPTH, docs_text, duration_lit};
use crate::syntax::template::parse_string;
use crate::syntax::{exact, optional_marks};

/// Parses `source` if it is well formed; `None` sends it to the pest path.
pub(crate) fn parse_fast(source: &str, file: FileId) -> Option<SourceFile> {
    let mut parser = Fast {
        src: source,
        bytes: source.as_bytes(),
        pos: 0,
        token_end: 0,
        trailing_end: 0,
        depth: 0,
        file,
    };
    if source.starts_with('\u{FEFF}') {
        parser.pos = 3;
    }
    parser.trivia()?;
    let mut items = Vec::new();
    while parser.pos < parser.bytes.len() {
        items.push(parser.item()?);
    }
    Some(SourceFile { items })
}

struct Fast<'s> {
    src: &'s str,
    bytes: &'s [u8],
    /// The next token; trivia before it has been skipped.
    pos: usize,
    /// The end of the last token consumed.
    token_end: usize,
    /// The end of the last comment in the trivia after the last token, or the
    /// token's end: where pest's span of a rule ends when the rule's last part
    /// is an optional or a repetition that matched nothing (pest keeps the
    /// trivia it skipped before trying it, and `span_of` trims only spaces).
    trailing_end: usize,
    /// Brackets open at `pos`; deeper input is left to the pest path.
    depth: usize,
    file: FileId,
}

/// How deep the direct parser nests before it leaves a file to pest. Its
/// frames are large in debug builds, and real workflows nest a few levels;
/// pest, with its smaller frames, takes the rest up to `MAX_DEPTH`.
const FAST_MAX_DEPTH: usize = 32;

/// `None` is "give up": the pest path will parse the file.
type P<T> = Option<T>;

impl<'s> Fast<'s> {
    // ------------------------------------------------------------ lexing

    /// Skips whitespace and comments (not doc comments), recording where the
    /// last comment ends.
    fn trivia(&mut self) -> P<()> {
        self.trailing_end = self.token_end;
        loop {
            match self.bytes.get(self.pos) {
                Some(b' ' | b'\t' | b'\n' | b'\r') => self.pos += 1,
                // Vertical tab and form feed are whitespace to pest but not to
                // `span_of`'s trim; rare enough to leave to the pest path.
                Some(0x0B | 0x0C) => return None,
                Some(b'/') if self.bytes.get(self.pos + 1) == Some(&b'/') => {
                    if self.bytes.get(self.pos + 2) == Some(&b'/') {
                        return Some(());
                    }
                    let start = self.pos;
                    self.pos = self.src[start..]
                        .find('\n')
                        .map_or(self.bytes.len(), |n| start + n);
                    // `span_of` trims spaces, which takes in a comment's own
                    // trailing spaces too.
                    let text = self.src[start..self.pos].trim_end_matches([' ', '\t', '\r']);
                    self.trailing_end = start + text.len();
                }
                Some(b'/') if self.bytes.get(self.pos + 1) == Some(&b'*') => {
                    let end = self.src[self.pos + 2..].find("*/")?;
                    self.pos += 2 + end + 2;
                    self.trailing_end = self.pos;
                }
                _ => return Some(()),
            }
        }
    }

    /// Consumes a token of `len` bytes at `pos`, then the trivia after it.
    fn advance(&mut self, len: usize) -> P<Span> {
        let span = Span::new(self.pos, self.pos + len);
        self.pos += len;
        self.token_end = self.pos;
        self.trivia()?;
        Some(span)
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn at(&self, text: &str) -> bool {
        self.src[self.pos..].starts_with(text)
    }

    /// Consumes punctuation `text` or gives up. Brackets count nesting.
    fn punct(&mut self, text: &str) -> P<Span> {
        if !self.at(text) {
            return None;
        }
        match text {
            "{" | "(" | "[" | "<" => {
                self.depth += 1;
                if self.depth > FAST_MAX_DEPTH {
                    return None;
                }
            }
            "}" | ")" | "]" | ">" => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
        self.advance(text.len())
    }

    fn eat(&mut self, text: &str) -> P<bool> {
        if self.at(text) {
            self.advance(text.len())?;
            Some(true)
        } else {
            Some(false)
        }
    }

    /// The word (`[A-Za-z_][A-Za-z0-9_]*`) at `pos`, without consuming it.
    fn word(&self) -> &'s str {
        let bytes = self.bytes;
        if !bytes
            .get(self.pos)
            .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
        {
            return "";
        }
        let end = bytes[self.pos..]
            .iter()
            .position(|b| !is_name_byte(*b))
            .map_or(bytes.len(), |n| self.pos + n);
        &self.src[self.pos..end]
    }

    /// Which of `keywords` the word at `pos` is. A word that merely starts
    /// with one (`stepx`) gives up: pest would read the keyword and go on.
    fn keyword(&self, keywords: &[&'static str]) -> P<Option<&'static str>> {
        let word = self.word();
        for keyword in keywords {
            if word == *keyword {
                return Some(Some(keyword));
            }
            if word.starts_with(keyword) {
                return None;
            }
        }
        Some(None)
    }

    fn expect_keyword(&mut self, keyword: &'static str) -> P<Span> {
        if self.keyword(&[keyword])? == Some(keyword) {
            self.advance(keyword.len())
        } else {
            None
        }
    }

    fn name(&mut self) -> P<Name> {
        let word = self.word();
        if word.is_empty() {
            return None;
        }
        let span = self.advance(word.len())?;
        Some(Name {
            text: word.into(),
            span,
        })
    }

    /// An MCP tool's name: a name, with hyphens between name characters
    /// (`get-sum`), as the grammar's `tool_name`.
    fn tool_name(&mut self) -> P<Name> {
        let word = self.word();
        if word.is_empty() {
            return None;
        }
        let bytes = self.bytes;
        let mut end = self.pos + word.len();
        while bytes.get(end) == Some(&b'-') && bytes.get(end + 1).is_some_and(|b| is_name_byte(*b))
        {
            end += 1;
            while bytes.get(end).is_some_and(|b| is_name_byte(*b)) {
                end += 1;
            }
        }
        let text = self.src[self.pos..end].into();
        let span = self.advance(end - self.pos)?;
        Some(Name { text, span })
    }

    /// A name a declaration introduces: keywords are left to the pest path,
    /// whose tree builder reports them.
    fn declared(&mut self) -> P<Name> {
        let name = self.name()?;
        (!KEYWORDS.contains(&name.text.as_str())).then_some(name)
    }

    fn docs(&mut self) -> P<Vec<String>> {
        let mut docs = Vec::new();
        while self.at("///") {
            let end = self.src[self.pos..]
                .find('\n')
                .map_or(self.bytes.len(), |n| self.pos + n);
            docs.push(docs_text(&self.src[self.pos..end]));
            self.advance(end - self.pos)?;
        }
        Some(docs)
    }

    fn string(&mut self) -> P<StringLit> {
        let start = self.pos;
        let end = if self.at("\"\"\"") {
            start + 3 + self.src[start + 3..].find("\"\"\"")? + 3
        } else if self.peek() == Some(b'"') {
            let mut i = start + 1;
            loop {
                match *self.bytes.get(i)? {
                    b'"' => break i + 1,
                    b'\\' => {
                        let next = self.src[i + 1..].chars().next()?;
                        if next == '\n' {
                            return None;
                        }
                        i += 1 + next.len_utf8();
                    }
                    b'\t' | b'\r' => i += 1,
                    byte if byte < 0x20 => return None,
                    _ => i += 1,
                }
            }
        } else {
            return None;
        };
        let mut problems = Vec::new();
        let lit = parse_string(&self.src[start..end], start, self.file, &mut problems);
        if !problems.is_empty() {
            return None;
        }
        self.advance(end - start)?;
        Some(lit)
    }

    /// Digits with an optional sign, as `int` reads them; then what follows
    /// decides between an int, a float and a duration.
    fn number(&mut self) -> P<Expr> {
        let start = self.pos;
        let bytes = self.bytes;
        let mut i = start;
        if bytes.get(i) == Some(&b'-') {
            i += 1;
        }
        let digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        i += digits;
        let signed = bytes[start] == b'-';
        match bytes.get(i) {
            Some(b) if b.is_ascii_alphabetic() && !signed => {
                let letters = bytes[i..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphabetic())
                    .count();
                let end = i + letters;
                if bytes
                    .get(end)
                    .is_some_and(|b| *b == b'_' || b.is_ascii_digit())
                {
                    return None;
                }
                let text = &self.src[start..end];
                let span = self.advance(end - start)?;
                let duration = duration_lit(text, span);
                // A unit flow does not know is the pest path's to report.
                if duration.unit() == DurationUnit::Unknown {
                    return None;
                }
                Some(Expr {
                    kind: ExprKind::Duration(duration),
                    span,
                })
            }
            Some(b'.') if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let fraction = bytes[i + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_digit())
                    .count();
                let end = i + 1 + fraction;
                if bytes.get(end).copied().is_some_and(is_name_byte) {
                    return None;
                }
                // One too large for a float is the pest path's to report.
                let value = self.src[start..end]
                    .parse::<f64>()
                    .ok()
                    .filter(|value| value.is_finite())?;
                let span = self.advance(end - start)?;
                Some(Expr {
                    kind: ExprKind::Float(value),
                    span,
                })
            }
            Some(b) if is_name_byte(*b) => None,
            _ => {
                let value: i64 = self.src[start..i].parse().ok()?;
                let span = self.advance(i - start)?;
                Some(Expr {
                    kind: ExprKind::Int(value),
                    span,
                })
            }
        }
    }

    fn int(&mut self) -> P<(i64, Span)> {
        match self.number()? {
            Expr {
                kind: ExprKind::Int(value),
                span,
            } => Some((value, span)),
            _ => None,
        }
    }

    /// `duration_value`: a duration, or a bare int (which the checker reports).
    fn duration_value(&mut self) -> P<DurationLit> {
        let start = self.pos;
        match self.number()? {
            Expr {
                kind: ExprKind::Duration(duration),
                ..
            } => Some(duration),
            Expr {
                kind: ExprKind::Int(_),
                span,
            } => Some(duration_lit(&self.src[start..span.end as usize], span)),
            _ => None,
        }
    }

    // ------------------------------------------------------------ items

    fn item(&mut self) -> P<Item> {
        let docs = self.docs()?;
        let start = self.pos;
        let keyword = self.keyword(&["import", "type", "recipe", "mcp", "workflow"])??;
        self.advance(keyword.len())?;
        Some(match keyword {
            "import" => {
                let path = self.string()?;
                Item::Import(Import {
                    span: Span::new(start, self.token_end),
                    path,
                })
            }
            "type" => {
                let name = self.declared()?;
                self.punct("=")?;
                let (ty, end) = self.type_expr()?;
                Item::Type(TypeDecl {
                    docs,
                    name,
                    ty,
                    span: Span::new(start, end),
                })
            }
            "recipe" => Item::Recipe(self.recipe(start, docs)?),
            "mcp" => Item::Mcp(self.mcp(start, docs)?),
            _ => Item::Workflow(self.workflow(start, docs)?),
        })
    }

    fn recipe(&mut self, start: usize, docs: Vec<String>) -> P<Recipe> {
        let name = self.declared()?;
        self.punct("{")?;
        let mut recipe = Recipe::named(docs, name);
        while !self.at("}") {
            self.docs()?;
            let member = self.keyword(&["model", "input", "output", "prompt", "context"])??;
            self.advance(member.len())?;
            match member {
                "model" => once(&mut recipe.model, self.string()?)?,
                "input" => {
                    let input = self.record_type()?;
                    once(&mut recipe.input, input)?;
                }
                "output" => {
                    let (ty, _) = self.type_expr()?;
                    once(&mut recipe.output, ty)?;
                }
                "prompt" => once(&mut recipe.prompt, self.string()?)?,
                _ => {
                    let context = self.context()?;
                    recipe.context.extend(context);
                }
            }
        }
        self.punct("}")?;
        recipe.span = Span::new(start, self.token_end);
        Some(recipe)
    }

    /// After `context`: `kb "id", "id"...`.
    fn context(&mut self) -> P<Vec<StringLit>> {
        self.expect_keyword("kb")?;
        let mut ids = vec![self.string()?];
        while self.eat(",")? {
            ids.push(self.string()?);
        }
        Some(ids)
    }

    fn mcp(&mut self, start: usize, docs: Vec<String>) -> P<McpServer> {
        let name = self.declared()?;
        self.punct("{")?;
        let mut server = McpServer::named(docs, name);
        let mut args_seen = None;
        while !self.at("}") {
            let member = self.keyword(&["command", "args", "url", "env"])??;
            self.advance(member.len())?;
            match member {
                "command" => once(&mut server.command, self.string()?)?,
                "url" => once(&mut server.url, self.string()?)?,
                "args" => {
                    once(&mut args_seen, ())?;
                    let (items, _) = self.list()?;
                    server.args = items;
                }
                _ => {
                    let env = self.record_lit()?;
                    once(&mut server.env, env)?;
                }
            }
        }
        self.punct("}")?;
        server.span = Span::new(start, self.token_end);
        Some(server)
    }

    fn workflow(&mut self, start: usize, docs: Vec<String>) -> P<Workflow> {
        let name = self.declared()?;
        self.punct("{")?;
        let mut workflow = Workflow {
            docs,
            name,
            input: None,
            timeout: None,
            context: Vec::new(),
            department: None,
            durability: None,
            on_error: None,
            destinations: Vec::new(),
            body: Vec::new(),
            output: None,
            span: Span::default(),
        };
        // Settings, each possibly after doc comments; a doc comment before a
        // statement belongs to the statement, so look past the docs first.
        loop {
            let mark = self.pos;
            let (saved_end, saved_trailing) = (self.token_end, self.trailing_end);
            self.docs()?;
            let setting_start = self.pos;
            let setting = self.keyword(super::WORKFLOW_SETTINGS)?;
            let Some(setting) = setting else {
                self.pos = mark;
                self.token_end = saved_end;
                self.trailing_end = saved_trailing;
                break;
            };
            self.advance(setting.len())?;
            match setting {
                "input" => {
                    let input = self.record_type()?;
                    once(&mut workflow.input, input)?;
                }
                "timeout" => {
                    let timeout = self.duration_value()?;
                    once(&mut workflow.timeout, timeout)?;
                }
                "context" => {
                    let context = self.context()?;
                    workflow.context.extend(context);
                }
                "department" => {
                    let department = self.string()?;
                    once(&mut workflow.department, department)?;
                }
                "durability" => {
                    let mode = self.name()?;
                    once(&mut workflow.durability, mode)?;
                }
                "deliver" => {
                    let destination = self.destination(setting_start)?;
                    workflow.destinations.push(destination);
                }
                _ => {
                    let policy = self.error_policy()?;
                    once(&mut workflow.on_error, policy)?;
                }
            }
        }
        workflow.body = self.statements()?;
        if self.keyword(&["output"])? == Some("output") {
            self.advance(6)?;
            workflow.output = Some(self.record_lit()?);
        }
        self.punct("}")?;
        workflow.span = Span::new(start, self.token_end);
        Some(workflow)
    }

    /// The rest of `deliver on EVENTS to TARGET`, `deliver` read.
    fn destination(&mut self, start: usize) -> P<Destination> {
        self.expect_keyword("on")?;
        let mut events = vec![self.name()?];
        while self.eat(",")? {
            events.push(self.name()?);
        }
        self.expect_keyword("to")?;
        let kind = self.keyword(&["webhook", "email", "kb"])?;
        self.advance(kind?.len())?;
        let (target, end) = match kind? {
            "webhook" => {
                let endpoint = self.string()?;
                (DestinationTarget::Webhook { endpoint }, self.token_end)
            }
            "email" => {
                self.punct("[")?;
                let mut to = vec![self.string()?];
                while self.eat(",")? {
                    if self.at("]") {
                        break;
                    }
                    to.push(self.string()?);
                }
                self.punct("]")?;
                self.expect_keyword("subject")?;
                let subject = self.string()?;
                self.expect_keyword("body")?;
                let body = self.string()?;
                (
                    DestinationTarget::Email { to, subject, body },
                    self.token_end,
                )
            }
            _ => {
                let collection = self.string()?;
                self.expect_keyword("title")?;
                let title = self.string()?;
                self.expect_keyword("content")?;
                let (content, end) = self.expr()?;
                let target = DestinationTarget::Kb {
                    collection,
                    title,
                    content,
                };
                (target, end)
            }
        };
        Some(Destination {
            events,
            target,
            span: Span::new(start, end),
        })
    }

    // ------------------------------------------------------------ statements

    /// Statements up to (not including) the closing `}` or `output`.
    fn statements(&mut self) -> P<Vec<Stmt>> {
        let mut stmts = Vec::new();
        loop {
            let docs = self.docs()?;
            match self.keyword(&["step", "if", "for", "parallel", "output"])? {
                Some("step") => stmts.push(Stmt::Step(Box::new(self.step(docs)?))),
                Some("if") => stmts.push(Stmt::If(Box::new(self.if_stmt()?))),
                Some("for") => stmts.push(Stmt::For(Box::new(self.for_stmt()?))),
                Some("parallel") => stmts.push(Stmt::Parallel(Box::new(self.parallel()?))),
                _ if docs.is_empty() && (self.at("}") || self.word() == "output") => {
                    return Some(exact(stmts));
                }
                _ => return None,
            }
        }
    }

    fn block(&mut self) -> P<Block> {
        let start = self.pos;
        self.punct("{")?;
        let stmts = self.statements()?;
        self.punct("}")?;
        Some(Block {
            stmts,
            span: Span::new(start, self.token_end),
        })
    }

    fn step(&mut self, docs: Vec<String>) -> P<Step> {
        let start = self.pos;
        self.advance(4)?;
        let id = self.declared()?;
        self.punct("=")?;
        let call = self.step_call()?;
        // Without options, pest's span takes in the trivia before the first
        // option it tried.
        let mut end = self.trailing_end;
        let mut options = StepOptions::default();
        while let Some(option) = self.keyword(&["retry", "timeout", "on_error", "idempotency"])? {
            self.advance(option.len())?;
            match option {
                "retry" => {
                    let (attempts, attempts_span) = self.int()?;
                    let mut retry_end = self.trailing_end;
                    let backoff = if self.keyword(&["backoff"])?.is_some() {
                        self.advance(7)?;
                        let min = self.duration_value()?;
                        self.punct("..")?;
                        let max = self.duration_value()?;
                        retry_end = self.token_end;
                        Some((min, max))
                    } else {
                        None
                    };
                    end = retry_end;
                    once(
                        &mut options.retry,
                        Retry {
                            attempts,
                            attempts_span,
                            backoff,
                        },
                    )?;
                }
                "timeout" => {
                    let timeout = self.duration_value()?;
                    end = self.token_end;
                    once(&mut options.timeout, timeout)?;
                }
                "on_error" => {
                    let policy = self.error_policy()?;
                    end = self.token_end;
                    once(&mut options.on_error, Box::new(policy))?;
                }
                _ => {
                    let (key, key_end) = self.expr()?;
                    end = key_end;
                    once(&mut options.idempotency, Box::new(key))?;
                }
            }
        }
        Some(Step {
            docs: docs.into(),
            id,
            call,
            options,
            span: Span::new(start, end),
        })
    }

    fn step_call(&mut self) -> P<StepCall> {
        let start = self.pos;
        match self.word() {
            "approval" => {
                self.advance(8)?;
                Some(StepCall::Approval {
                    keyword: Span::new(start, start + 8),
                    args: self.record_lit()?,
                })
            }
            "kb_write" => {
                self.advance(8)?;
                let collection = self.string()?;
                Some(StepCall::KbWrite {
                    collection: Box::new(collection),
                    args: self.record_lit()?,
                })
            }
            "handoff" => {
                self.advance(7)?;
                let department = self.string()?;
                Some(StepCall::Handoff {
                    department: Box::new(department),
                    args: self.record_lit()?,
                })
            }
            // pest tries the literals above as prefixes of a longer name.
            word if ["approval", "kb_write", "handoff"]
                .iter()
                .any(|k| word.starts_with(k)) =>
            {
                None
            }
            _ => {
                let first = self.name()?;
                if self.at(".") {
                    self.advance(1)?;
                    let tool = self.tool_name()?;
                    Some(StepCall::Browser {
                        server: Box::new(first),
                        tool: Box::new(tool),
                        args: self.record_lit()?,
                    })
                } else {
                    Some(StepCall::Recipe {
                        recipe: first,
                        args: self.record_lit()?,
                    })
                }
            }
        }
    }

    fn error_policy(&mut self) -> P<ErrorPolicy> {
        match self.keyword(&["fallback", "fail", "continue"])?? {
            "fallback" => {
                self.advance(8)?;
                Some(ErrorPolicy::Fallback(Box::new(self.block()?)))
            }
            "fail" => Some(ErrorPolicy::Fail(self.advance(4)?)),
            _ => Some(ErrorPolicy::Continue(self.advance(8)?)),
        }
    }

    fn if_stmt(&mut self) -> P<IfStmt> {
        let start = self.pos;
        self.advance(2)?;
        let (condition, _) = self.expr()?;
        let block = self.block()?;
        let mut branches = vec![(condition, block)];
        let mut else_block = None;
        let mut end = self.trailing_end;
        while self.keyword(&["else"])? == Some("else") {
            self.advance(4)?;
            if self.keyword(&["if"])? == Some("if") {
                self.advance(2)?;
                let (condition, _) = self.expr()?;
                let block = self.block()?;
                branches.push((condition, block));
                end = self.trailing_end;
            } else {
                else_block = Some(self.block()?);
                end = self.token_end;
                break;
            }
        }
        Some(IfStmt {
            branches,
            else_block,
            span: Span::new(start, end),
        })
    }

    fn for_stmt(&mut self) -> P<ForStmt> {
        let start = self.pos;
        self.advance(3)?;
        let (collection, _) = self.expr()?;
        self.expect_keyword("as")?;
        let id = self.declared()?;
        let concurrency = if self.keyword(&["concurrency"])?.is_some() {
            self.advance(11)?;
            Some(self.int()?)
        } else {
            None
        };
        let max_items = if self.keyword(&["max"])?.is_some() {
            self.advance(3)?;
            Some(self.int()?)
        } else {
            None
        };
        let body = self.block()?;
        Some(ForStmt {
            collection,
            id,
            concurrency,
            max_items,
            body,
            span: Span::new(start, self.token_end),
            names_item: false,
        })
    }

    fn parallel(&mut self) -> P<ParallelStmt> {
        let start = self.pos;
        self.advance(8)?;
        let id = self.declared()?;
        self.punct("{")?;
        let mut branches = Vec::new();
        while !self.at("}") {
            let branch_start = self.pos;
            self.expect_keyword("branch")?;
            let name = self.declared()?;
            let body = self.block()?;
            branches.push(Branch {
                name,
                body,
                span: Span::new(branch_start, self.token_end),
            });
        }
        self.punct("}")?;
        Some(ParallelStmt {
            id,
            branches,
            recovered: false,
            broken: Vec::new(),
            span: Span::new(start, self.token_end),
        })
    }

    // ------------------------------------------------------------ types

    /// A type and where pest's `type_expr` span ends.
    fn type_expr(&mut self) -> P<(TypeExpr, usize)> {
        let start = self.pos;
        if self.at("|") {
            self.advance(1)?;
        }
        let (first, first_end) = self.type_postfix()?;
        if !self.at("|") {
            return Some((first, first_end.max(self.trailing_end)));
        }
        let mut alternatives = vec![first];
        let mut end = first_end;
        while self.at("|") {
            self.advance(1)?;
            let (alternative, alternative_end) = self.type_postfix()?;
            alternatives.push(alternative);
            end = alternative_end;
        }
        let span = Span::new(start, end);
        Some((
            TypeExpr {
                kind: TypeExprKind::Union(alternatives),
                span,
            },
            end,
        ))
    }

    fn type_postfix(&mut self) -> P<(TypeExpr, usize)> {
        let start = self.pos;
        let ty = self.type_atom()?;
        if !self.at("?") {
            return Some((ty, self.trailing_end));
        }
        self.advance(1)?;
        let first = self.token_end;
        while self.at("?") {
            self.advance(1)?;
        }
        Some((
            optional_marks(ty, start, first, self.token_end),
            self.token_end,
        ))
    }

    fn type_atom(&mut self) -> P<TypeExpr> {
        let start = self.pos;
        let kind = match self.peek()? {
            b'{' => TypeExprKind::Record(self.record_type()?.fields),
            b'"' => TypeExprKind::Literal(self.string()?.display_text()),
            b'(' => {
                self.punct("(")?;
                let (inner, _) = self.type_expr()?;
                self.punct(")")?;
                return Some(inner);
            }
            _ if self.word() == "list" => {
                self.advance(4)?;
                self.punct("<")?;
                let (item, _) = self.type_expr()?;
                self.punct(">")?;
                TypeExprKind::List(Box::new(item))
            }
            _ => TypeExprKind::Named(self.name()?),
        };
        Some(TypeExpr {
            kind,
            span: Span::new(start, self.token_end),
        })
    }

    fn record_type(&mut self) -> P<RecordTypeDecl> {
        let start = self.pos;
        self.punct("{")?;
        let mut fields = Vec::new();
        while !self.at("}") {
            let docs = self.docs()?;
            let name = self.name()?;
            self.punct(":")?;
            // A field's type starts on its line, as the grammar says.
            if self.bytes[self.token_end..self.pos].contains(&b'\n') {
                return None;
            }
            let (ty, _) = self.type_expr()?;
            fields.push(FieldDecl { docs, name, ty });
            self.eat(",")?;
        }
        self.punct("}")?;
        Some(RecordTypeDecl {
            fields,
            span: Span::new(start, self.token_end),
        })
    }

    // ------------------------------------------------------------ expressions

    /// An expression and where pest's `expr` span ends: after the trivia that
    /// follows it when it has no operator (see `trailing_end`).
    fn expr(&mut self) -> P<(Expr, usize)> {
        let mut operands: Vec<Expr> = Vec::new();
        let mut operators: Vec<BinaryOp> = Vec::new();
        let mut chain = 0;
        let mut end;
        loop {
            let mut nots = Vec::new();
            while self.at("!") {
                nots.push(self.advance(1)?);
            }
            if nots.len() > MAX_DEPTH {
                return None;
            }
            let mut operand = self.primary()?;
            while let Some(not) = nots.pop() {
                operand = Expr {
                    span: not.to(operand.span),
                    kind: ExprKind::Not(Box::new(operand)),
                };
            }
            operands.push(operand);
            end = self.token_end;
            let op = match self.bytes.get(self.pos..self.pos + 2) {
                Some(b"??") => Some((BinaryOp::Coalesce, 2)),
                Some(b"||") => Some((BinaryOp::Or, 2)),
                Some(b"&&") => Some((BinaryOp::And, 2)),
                Some(b"==") => Some((BinaryOp::Eq, 2)),
                Some(b"!=") => Some((BinaryOp::Ne, 2)),
                Some(b"<=") => Some((BinaryOp::Le, 2)),
                Some(b">=") => Some((BinaryOp::Ge, 2)),
                _ => match self.peek() {
                    Some(b'<') => Some((BinaryOp::Lt, 1)),
                    Some(b'>') => Some((BinaryOp::Gt, 1)),
                    _ => None,
                },
            };
            let Some((op, len)) = op else { break };
            // The tree is as deep as the chain is long, whatever the stack
            // of pending operators holds; the pest path reports long chains.
            chain += 1;
            if chain > MAX_DEPTH {
                return None;
            }
            self.advance(len)?;
            while operators
                .last()
                .is_some_and(|top| top.precedence() >= op.precedence())
            {
                reduce(&mut operands, &mut operators);
            }
            operators.push(op);
        }
        let end = if operators.is_empty() {
            self.trailing_end
        } else {
            end
        };
        while !operators.is_empty() {
            reduce(&mut operands, &mut operators);
        }
        Some((operands.pop()?, end))
    }

    fn primary(&mut self) -> P<Expr> {
        let start = self.pos;
        let byte = self.peek()?;
        if byte.is_ascii_digit() || byte == b'-' {
            return self.number();
        }
        let kind = match byte {
            b'"' => ExprKind::String(self.string()?),
            b'[' => ExprKind::List(self.list()?.0),
            b'{' => ExprKind::Record(self.record_lit()?),
            b'(' => {
                self.punct("(")?;
                let (mut inner, _) = self.expr()?;
                self.punct(")")?;
                inner.span = Span::new(start, self.token_end);
                return Some(inner);
            }
            _ => match self.word() {
                "true" => {
                    self.advance(4)?;
                    ExprKind::Bool(true)
                }
                "false" => {
                    self.advance(5)?;
                    ExprKind::Bool(false)
                }
                "null" => {
                    self.advance(4)?;
                    ExprKind::Null
                }
                "" => return None,
                _ => ExprKind::Path(self.path()?),
            },
        };
        Some(Expr {
            kind,
            span: Span::new(start, self.token_end),
        })
    }

    /// A path is one token: its parts are adjacent, without trivia.
    fn path(&mut self) -> P<Path> {
        let start = self.pos;
        let bytes = self.bytes;
        let name_end = |from: usize| -> Option<usize> {
            let first = *bytes.get(from)?;
            if !(first.is_ascii_alphabetic() || first == b'_') {
                return None;
            }
            Some(
                bytes[from..]
                    .iter()
                    .position(|b| !is_name_byte(*b))
                    .map_or(bytes.len(), |n| from + n),
            )
        };
        let root_end = name_end(start)?;
        let root = Name {
            text: self.src[start..root_end].into(),
            span: Span::new(start, root_end),
        };
        let mut segments = Vec::new();
        let mut i = root_end;
        loop {
            let (optional, after) = match bytes.get(i) {
                Some(b'.') => (false, i + 1),
                Some(b'?') if bytes.get(i + 1) == Some(&b'.') => (true, i + 2),
                Some(b'[') => {
                    let digits = bytes[i + 1..]
                        .iter()
                        .take_while(|b| b.is_ascii_digit())
                        .count();
                    if digits == 0 || bytes.get(i + 1 + digits) != Some(&b']') {
                        // A sign or trivia inside the brackets: the pest path.
                        return None;
                    }
                    let index = self.src[i + 1..i + 1 + digits].parse().ok()?;
                    segments.push(Segment::Index {
                        index,
                        span: Span::new(i, i + digits + 2),
                    });
                    i += digits + 2;
                    continue;
                }
                _ => break,
            };
            // `a.` followed by no name ends the path before the dot, for pest.
            let Some(end) = name_end(after) else { break };
            segments.push(Segment::Field {
                name: Name {
                    text: self.src[after..end].into(),
                    span: Span::new(after, end),
                },
                optional,
            });
            i = end;
        }
        self.advance(i - start)?;
        Some(Path {
            root,
            segments: exact(segments),
        })
    }

    fn list(&mut self) -> P<(Vec<Expr>, Span)> {
        let start = self.pos;
        self.punct("[")?;
        let mut items = Vec::new();
        if !self.at("]") {
            items.push(self.expr()?.0);
            while self.at(",") {
                self.advance(1)?;
                if self.at("]") {
                    break;
                }
                items.push(self.expr()?.0);
            }
        }
        self.punct("]")?;
        Some((items, Span::new(start, self.token_end)))
    }

    fn record_lit(&mut self) -> P<RecordLit> {
        let start = self.pos;
        self.punct("{")?;
        let mut fields = Vec::new();
        while !self.at("}") {
            let name = self.name()?;
            self.punct(":")?;
            let (value, _) = self.expr()?;
            fields.push(RecordField { name, value });
            self.eat(",")?;
        }
        self.punct("}")?;
        Some(RecordLit {
            fields: exact(fields),
            span: Span::new(start, self.token_end),
        })
    }
}

/// Sets a member given once; a second one is left to the pest path to report.
fn once<T>(slot: &mut Option<T>, value: T) -> P<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

fn reduce(operands: &mut Vec<Expr>, operators: &mut Vec<BinaryOp>) {
    crate::syntax::parse::reduce(operands, operators);
}

#[cfg(test)]
mod tests {
    //! Differential tests: wherever the fast path returns a tree, it must be
    //! the pest path's tree, and the pest path must report nothing.

    use proptest::prelude::*;

    use super::*;
    use crate::syntax::parse::parse_with_pest;

    fn agree(source: &str) -> bool {
        // `parse` refuses input nested too deep before either parser runs.
        if crate::syntax::parse::too_deep_at(source).is_some() {
            return false;
        }
        let Some(fast) = parse_fast(source, FileId(0)) else {
            return false;
        };
        let (pest, problems) = parse_with_pest(source, FileId(0));
        assert!(
            problems.is_empty(),
            "the fast path accepted what pest reports: {problems:#?}\n{source}"
        );
        assert_eq!(fast, pest, "the trees differ for:\n{source}");
        true
    }

    fn corpus() -> Vec<String> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut sources = Vec::new();
        for dir in ["../../examples", "../../examples/recipes"] {
            for entry in std::fs::read_dir(root.join(dir)).expect("examples exist") {
                let path = entry.expect("readable").path();
                if path.extension().is_some_and(|e| e == "flow") {
                    sources.push(std::fs::read_to_string(path).expect("readable"));
                }
            }
        }
        let fixtures = root.join("tests/diagnostics");
        for entry in std::fs::read_dir(fixtures).expect("fixtures exist") {
            let path = entry.expect("readable").path();
            if path.extension().is_some_and(|e| e == "flow") {
                let text = std::fs::read_to_string(path).expect("readable");
                // Each `--- case ---` and `// file:` section is a file.
                let mut current = String::new();
                for line in text.lines() {
                    if line.starts_with("--- ") || line.starts_with("// file: ") {
                        sources.push(std::mem::take(&mut current));
                    } else {
                        current.push_str(line);
                        current.push('\n');
                    }
                }
                sources.push(current);
            }
        }
        sources.sort();
        sources
    }

    #[test]
    fn the_examples_take_the_fast_path_and_agree() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for dir in ["../../examples", "../../examples/recipes"] {
            for entry in std::fs::read_dir(root.join(dir)).expect("examples exist") {
                let path = entry.expect("readable").path();
                // Tests take the pest path: the fast parser knows none.
                let tests = path.to_string_lossy().ends_with(".test.flow");
                if path.extension().is_some_and(|e| e == "flow") && !tests {
                    let source = std::fs::read_to_string(&path).expect("readable");
                    assert!(agree(&source), "{} left the fast path", path.display());
                }
            }
        }
    }

    #[test]
    fn every_fixture_agrees_where_the_fast_path_accepts_it() {
        let accepted = corpus().iter().filter(|source| agree(source)).count();
        // The fixtures are mostly mistakes; the clean ones must still be accepted.
        assert!(
            accepted >= 20,
            "only {accepted} fixtures took the fast path"
        );
    }

    /// Spans where pest keeps the trivia skipped before an optional part that
    /// did not match, comments included.
    #[test]
    fn trailing_trivia_spans_agree() {
        let cases = [
            "workflow w {\n  step a = r {} // note   \n  step b = r {} /* x */\n}\n",
            "workflow w {\n  if true { } // after\n  if true { } else if false { } /* c */ \n}\n",
            "workflow w {\n  step a = r {} retry 3 // three\n  step b = r {} retry 2 backoff 1s..2s\n}\n",
            "type A = string // comment\ntype B = int? /* c */\ntype C = \"a\" | \"b\" // x\ntype D = (\"a\" | \"b\")?\n",
            "workflow w {\n  step a = r {} idempotency \"k\" // key\n  step b = r {} idempotency step.a.x ?? \"k\" // key\n}\n",
            "\u{FEFF}workflow w {\r\n\tstep a = r { x: 1, y: -2, z: 1.5, d: 5m, l: [1, 2,], n: null, t: true }\r\n}\r\n",
            "/// doc\nrecipe r {\n  /// m\n  model \"m\"\n  input { /// f\n a: string, b: list<int?>? }\n  output { y: \"x\" | \"z\" }\n  prompt \"\"\"\n    {{input.a}}\n  \"\"\"\n  context kb \"a\", \"b\"\n}\n",
            "mcp b { command \"npx\" args [\"a\", \"b\"] env { K: \"v\" } }\nmcp c { url \"http://127.0.0.1:1/mcp\" }\n",
            "workflow w {\n  input { a: string }\n  /// t\n  timeout 5m\n  context kb \"k\"\n  durability approval\n  on_error fallback { step h = handoff \"d\" { message: \"{{error.message}}\" } }\n  /// s\n  step a = approval { approvers: [\"x\"], message: \"m\" }\n  for [1, 2] as each concurrency 2 { step b = browser.go { i: loop_item, j: loop.each.index } }\n  parallel p { branch x { step c = kb_write \"n\" { title: \"t\", content: \"c\" } } }\n  output { o: step.a?.approved ?? false, p: !(1 < 2) && step.p.x.c.id == \"i\" }\n}\n",
        ];
        for case in cases {
            assert!(agree(case), "left the fast path:\n{case}");
        }
    }

    /// Regression: the operator limit counted pending operators, which stay
    /// at one in a left-associative chain, so a chain of 100,000 passed.
    #[test]
    fn limits_agree_with_the_pest_path() {
        for n in [MAX_DEPTH, MAX_DEPTH + 1, 1_000] {
            let chain = format!("workflow w {{ if true{} {{ }} }}", " && true".repeat(n));
            let accepted = agree(&chain);
            assert_eq!(accepted, n <= MAX_DEPTH, "a chain of {n} operators");
            let nots = format!("workflow w {{ output {{ x: {}true }} }}", "!".repeat(n));
            assert_eq!(agree(&nots), n <= MAX_DEPTH, "{n} negations");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: std::env::var("FLOW_FAST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(512), ..ProptestConfig::default() })]

        #[test]
        fn mutations_never_make_the_paths_disagree(
            which in 0usize..1000,
            edits in proptest::collection::vec((0.0f64..1.0, any::<u8>(), 0u8..3), 1..4),
        ) {
            static CORPUS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
            let corpus = CORPUS.get_or_init(corpus);
            let mut bytes = corpus[which % corpus.len()].as_bytes().to_vec();
            for (position, byte, kind) in edits {
                let at = ((bytes.len() as f64) * position) as usize;
                // Mostly bytes of the language, sometimes any byte.
                let byte = if byte < 200 { b" \n{}()[]<>=!?|&.,:\"/*-_a1"[usize::from(byte) % 25] } else { byte };
                match kind {
                    0 if at < bytes.len() => bytes[at] = byte,
                    1 => bytes.insert(at.min(bytes.len()), byte),
                    _ if at < bytes.len() => { bytes.remove(at); }
                    _ => {}
                }
            }
            if let Ok(source) = String::from_utf8(bytes) {
                agree(&source);
            }
        }
    }
}
