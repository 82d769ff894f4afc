//! The declarations in scope (types, recipes, MCP servers) across a root file
//! and its imports, with their types resolved.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::check::LoadedFile;
use crate::check::types::{AliasNames, Fields, SchemaPast, SchemaSizes, Ty};
use crate::codes::Code;
use crate::diagnostic::{Diagnostic, FileId, Span};
use crate::lock::LockedServer;
use crate::suggest::{Budget, did_you_mean_within, hint_listing};
use crate::syntax::ast::{
    Expr, ExprKind, FieldDecl, Item, McpServer, Recipe, StringLit, TemplatePart, TypeDecl,
    TypeExpr, TypeExprKind,
};

#[derive(Debug, Clone)]
pub struct RecipeInfo {
    pub file: FileId,
    pub decl: Recipe,
    /// Its inputs, shared with the types of its calls and prompt.
    pub input: Arc<Fields>,
    pub output: Ty,
}

#[derive(Debug, Clone)]
pub struct McpInfo {
    pub file: FileId,
    pub decl: McpServer,
    /// How the runtime reaches it: what the plan holds, and the server's
    /// identity in `flow.lock`.
    pub transport: flow_plan::McpTransport,
    /// What `flow.lock` recorded for the server as it is declared, when the
    /// caller gave a lock that has it: its tools, for the checker and for
    /// completion.
    pub locked: Option<LockedServer>,
}

#[derive(Debug, Default)]
pub struct Env {
    pub recipes: HashMap<String, RecipeInfo>,
    pub mcp_servers: HashMap<String, McpInfo>,
    pub types: HashMap<String, Ty>,
    /// The names of the records and enums of `types`, for messages.
    pub(crate) alias_names: AliasNames,
    /// What the declarations' and the tests' suggestions may still spend
    /// (each workflow's steps have a budget of their own).
    pub(crate) suggestions: Budget,
    /// The sizes of the types' schemas measured so far, shared by every
    /// type the check holds to the plan's bounds.
    pub(crate) schema_sizes: Mutex<SchemaSizes>,
    /// What the check's unions may still copy (see [`UNION_BYTES`]).
    pub(crate) union_variants: UnionVariants,
}

/// The memory that a check's unions may copy together, in the bytes of
/// the variants they copy from the enums they name (each variant's text
/// and its `String`): `type B = A | "x"` copies the variants of `A`, a few
/// bytes of source for as many variants as `A` has, and a thousand such
/// unions of an enum of 10,000 variants took seconds and hundreds of
/// megabytes. About a hundred unions of the widest enum a plan holds.
pub(crate) const UNION_BYTES: usize = 32 * 1024 * 1024;

#[derive(Debug)]
pub(crate) struct UnionVariants(Budget);

impl Default for UnionVariants {
    fn default() -> Self {
        UnionVariants(Budget::new(UNION_BYTES))
    }
}

impl Env {
    /// `ty` as its author wrote it: records and enums that a `type` alias
    /// names are shown by the alias's name (`list<Contact>`).
    pub fn show<'t>(&'t self, ty: &'t Ty) -> crate::check::types::Named<'t> {
        crate::check::types::Named {
            ty,
            aliases: &self.alias_names,
        }
    }
}

pub(crate) const BUILTIN_TYPES: &[&str] = &["string", "int", "float", "bool", "json"];

/// Every built-in type's name: `BUILTIN_TYPES`, written alone, and `list`,
/// written `list<T>`.
pub(crate) const BUILTIN_TYPE_NAMES: &[&str] = &["string", "int", "float", "bool", "json", "list"];

/// Whether `name` is a built-in type's, which no declaration may take
/// (`list` too: an alias of that name read as the alias where written
/// alone and as the built-in in `list<T>`, and mismatches then said
/// "found `list`").
pub(crate) fn names_builtin_type(name: &str) -> bool {
    BUILTIN_TYPE_NAMES.contains(&name)
}

/// Collects and checks every declaration of every loaded file.
pub(crate) fn build(files: &[LoadedFile], diagnostics: &mut Vec<Diagnostic>) -> Env {
    let mut seen: HashMap<(&str, String), (FileId, Span)> = HashMap::new();
    let mut aliases: HashMap<String, (FileId, &TypeDecl)> = HashMap::new();
    let mut env = Env::default();
    let mut duplicate = |kind: &'static str,
                         name: &str,
                         file: FileId,
                         span: Span,
                         diagnostics: &mut Vec<Diagnostic>| {
        // A declaration with no name (a syntax error) clashes with none.
        if name.is_empty() {
            return false;
        }
        if let Some((first_file, first_span)) = seen.get(&(kind, name.to_string())) {
            diagnostics.push(
                Diagnostic::new(
                    Code::DuplicateDeclaration,
                    file,
                    span,
                    format!("{kind} `{name}` is declared twice"),
                )
                .label("declared again here")
                .secondary(*first_file, *first_span, "first declared here"),
            );
            true
        } else {
            seen.insert((kind, name.to_string()), (file, span));
            false
        }
    };
    // Imported files first, the root last (files are loaded root first,
    // then what each imports): a name the root declares again is the
    // root's mistake, reported where it is being edited, and an imported
    // type's own uses keep its file's declaration, not the root's.
    for (index, loaded) in files.iter().enumerate().rev() {
        let file = FileId(index as u32);
        for item in &loaded.tree.items {
            match item {
                Item::Type(decl) => {
                    if names_builtin_type(&decl.name.text) {
                        diagnostics.push(
                            Diagnostic::new(
                                Code::DuplicateDeclaration,
                                file,
                                decl.name.span,
                                format!("`{}` is a built-in type", decl.name.text),
                            )
                            .label("cannot be redeclared"),
                        );
                    } else if !duplicate("type", &decl.name.text, file, decl.name.span, diagnostics)
                    {
                        aliases.insert(decl.name.text.to_string(), (file, decl));
                    }
                }
                Item::Recipe(recipe) => {
                    duplicate(
                        "recipe",
                        &recipe.name.text,
                        file,
                        recipe.name.span,
                        diagnostics,
                    );
                }
                Item::Mcp(server)
                    if !duplicate(
                        "mcp server",
                        &server.name.text,
                        file,
                        server.name.span,
                        diagnostics,
                    ) =>
                {
                    check_mcp(server, file, diagnostics);
                    env.mcp_servers.insert(
                        server.name.text.to_string(),
                        McpInfo {
                            file,
                            decl: server.clone(),
                            transport: mcp_transport(server),
                            locked: None,
                        },
                    );
                }
                // Only the root file's workflows are checked and built; an
                // imported file contributes declarations, not workflows.
                Item::Workflow(workflow) if index == 0 => {
                    duplicate(
                        "workflow",
                        &workflow.name.text,
                        file,
                        workflow.name.span,
                        diagnostics,
                    );
                }
                _ => {}
            }
        }
    }

    // Aliases resolve in any order; a cycle is reported once, at each member.
    let mut resolver = Resolver {
        aliases: &aliases,
        resolved: HashMap::new(),
        refused: HashSet::new(),
        diagnostics,
        suggestions: &env.suggestions,
        schema_sizes: &env.schema_sizes,
        union_variants: &env.union_variants.0,
    };
    let mut names: Vec<&String> = aliases.keys().collect();
    names.sort();
    for name in names {
        let ty = resolver.alias(name);
        // In order of name, so that a part several aliases name is shown
        // by the first.
        env.alias_names.add(name, &ty);
        env.types.insert(name.clone(), ty);
    }
    let diagnostics = resolver.diagnostics;

    // In the order declarations were registered (imports first), so that
    // the recipe kept is the one E115 calls the first.
    for (index, loaded) in files.iter().enumerate().rev() {
        let file = FileId(index as u32);
        for item in &loaded.tree.items {
            let Item::Recipe(recipe) = item else { continue };
            if env.recipes.contains_key(recipe.name.text.as_str()) {
                continue;
            }
            let info = check_recipe(recipe, file, &env, diagnostics);
            env.recipes.insert(recipe.name.text.to_string(), info);
        }
    }
    env
}

/// Reports a member that a declaration lacks, unless part of its body did
/// not parse (`recovered`), where the member may be: its syntax error is
/// the one to fix.
pub(crate) fn missing_member(
    recovered: bool,
    diagnostics: &mut Vec<Diagnostic>,
    file: FileId,
    name_span: Span,
    what: &str,
    member: &str,
    example: &str,
) {
    if recovered {
        return;
    }
    diagnostics.push(
        Diagnostic::new(
            Code::Member,
            file,
            name_span,
            format!("{what} has no `{member}`"),
        )
        .label(format!("`{member}` is missing"))
        .hint(format!("add `{example}`")),
    );
}

/// Reports a string that must be plain text: it is used before any run exists
/// (a model alias, a knowledge-base id, a server command), so a `{{...}}`
/// reference in it could never be filled in.
pub(crate) fn require_plain(
    lit: &StringLit,
    what: &str,
    file: FileId,
    diagnostics: &mut Vec<Diagnostic>,
) {
    if lit.as_plain().is_none() {
        diagnostics.push(
            Diagnostic::new(
                Code::TypeMismatch,
                file,
                lit.span,
                format!("{what} is a plain string, without `{{{{...}}}}` references"),
            )
            .label("has a reference")
            .hint("it is read before the run starts, when no value exists yet"),
        );
    }
}

/// Reports a name written as an empty string (`""`, `" "`): a department,
/// a knowledge-base collection, a destination an account names. None names
/// anything, and the runtime would write under or deliver to nothing.
pub(crate) fn require_named(
    lit: &StringLit,
    (code, what, hint): (Code, &str, &str),
    file: FileId,
    diagnostics: &mut Vec<Diagnostic>,
) {
    if lit.display_text().trim().is_empty() {
        diagnostics.push(
            Diagnostic::new(code, file, lit.span, format!("{what} is empty"))
                .label("empty")
                .hint(hint.to_string()),
        );
    }
}

fn check_mcp(server: &McpServer, file: FileId, diagnostics: &mut Vec<Diagnostic>) {
    for (lit, what) in [
        (&server.command, "an MCP server's `command`"),
        (&server.url, "an MCP server's `url`"),
    ] {
        if let Some(lit) = lit {
            require_plain(lit, what, file, diagnostics);
        }
    }
    if let Some(command) = &server.command {
        require_named(
            command,
            (
                Code::BadOption,
                "an MCP server's `command`",
                "name the program that serves MCP on its stdin and stdout, e.g. `command \"npx\" args [\"-y\", \"@playwright/mcp\"]`",
            ),
            file,
            diagnostics,
        );
    }
    // Anything but an HTTP URL with a host fails only when a run's
    // preflight reaches for the server.
    if let Some(url) = &server.url
        && let Some(text) = url.as_plain()
    {
        let lower = text.trim().to_ascii_lowercase();
        let host = ["http://", "https://"]
            .into_iter()
            .find_map(|scheme| lower.strip_prefix(scheme));
        if host.is_none_or(|rest| rest.is_empty() || rest.starts_with(['/', '?', '#'])) {
            diagnostics.push(
                Diagnostic::new(
                    Code::BadOption,
                    file,
                    url.span,
                    "an MCP server's `url` is an `http://` or `https://` address with a host",
                )
                .label(match host {
                    Some(_) => "no host",
                    None if text.trim().is_empty() => "empty",
                    None => "not HTTP",
                })
                .hint("the server's streamable HTTP endpoint, e.g. `url \"http://127.0.0.1:8931/mcp\"`; a server started as a process takes `command` instead"),
            );
        }
    }
    match (&server.command, &server.url) {
        (None, None) => missing_member(
            server.recovered,
            diagnostics,
            file,
            server.name.span,
            &format!("MCP server `{}`", server.name.text),
            "command",
            "command \"npx\" args [\"-y\", \"@playwright/mcp\"]` or `url \"http://127.0.0.1:8931/mcp\"",
        ),
        (Some(_), Some(url)) => diagnostics.push(
            Diagnostic::new(
                Code::Member,
                file,
                url.span,
                "an MCP server has either a `command` or a `url`, not both",
            )
            .label("second transport")
            .secondary(file, server.name.span, "in this server"),
        ),
        _ => {}
    }
    // Arguments and environment values are passed to a process as they are,
    // before any run exists, so they cannot hold references.
    let values = server.args.iter().chain(
        server
            .env
            .iter()
            .flat_map(|env| env.fields.iter().map(|f| &f.value)),
    );
    for value in values {
        use crate::syntax::ast::ExprKind;
        // Each hint for what was written: a number was told to leave out
        // `{{...}}` references it did not have (an audit).
        let hint = match &value.kind {
            ExprKind::String(lit) if lit.as_plain().is_some() => continue,
            ExprKind::String(_) => {
                "write a string literal without `{{...}}` references: they are read before any run exists".to_string()
            }
            ExprKind::Int(number) => format!("quote it: `\"{number}\"`"),
            ExprKind::Float(number) => format!("quote it: `\"{number}\"`"),
            ExprKind::Bool(truth) => format!("quote it: `\"{truth}\"`"),
            _ => "write a string literal, such as `\"value\"`".to_string(),
        };
        diagnostics.push(
            Diagnostic::new(
                Code::TypeMismatch,
                file,
                value.span,
                "MCP server arguments and environment values are plain strings",
            )
            .label("not a plain string")
            .hint(hint),
        );
    }
    // The operating system ends a program's name, each argument and each
    // variable at U+0000: the server would never start. A URL holds no
    // control character at all.
    let process_texts = server.command.iter().chain(
        server
            .args
            .iter()
            .chain(
                server
                    .env
                    .iter()
                    .flat_map(|env| env.fields.iter().map(|f| &f.value)),
            )
            .filter_map(|value| match &value.kind {
                crate::syntax::ast::ExprKind::String(lit) => Some(lit),
                _ => None,
            }),
    );
    let with_nul = process_texts
        .filter(|lit| lit.as_plain().is_some_and(|text| text.contains('\0')))
        .map(|lit| {
            (
                lit,
                "an MCP server's command, arguments and environment cannot hold U+0000",
                "holds U+0000",
                "a program's name, each argument and each variable end at it: the server would never start",
            )
        });
    let url_with_control = server
        .url
        .iter()
        .filter(|lit| {
            lit.as_plain()
                .is_some_and(|text| text.contains(char::is_control))
        })
        .map(|lit| {
            (
                lit,
                "an MCP server's `url` cannot hold a control character",
                "holds a control character",
                "write it percent-encoded, as `%0A` for a line break",
            )
        });
    for (lit, message, label, hint) in with_nul.chain(url_with_control) {
        diagnostics.push(
            Diagnostic::new(Code::BadOption, file, lit.span, message)
                .label(label)
                .hint(hint),
        );
    }
    if server.url.is_some() && !server.args.is_empty() {
        diagnostics.push(
            Diagnostic::new(
                Code::Member,
                file,
                server.args[0].span,
                "`args` go with `command`, not with `url`",
            )
            .label("arguments for a URL server"),
        );
    }
}

fn check_recipe(
    recipe: &Recipe,
    file: FileId,
    env: &Env,
    diagnostics: &mut Vec<Diagnostic>,
) -> RecipeInfo {
    let what = format!("recipe `{}`", recipe.name.text);
    if let Some(model) = &recipe.model {
        require_plain(model, "a model alias", file, diagnostics);
        require_named(
            model,
            (
                Code::BadOption,
                "a recipe's model alias",
                "name the model the runtime's configuration resolves, e.g. `model \"default\"`",
            ),
            file,
            diagnostics,
        );
    }
    for context in &recipe.context {
        require_plain(context, "a knowledge-base id", file, diagnostics);
    }
    if recipe.model.is_none() {
        missing_member(
            recipe.recovered,
            diagnostics,
            file,
            recipe.name.span,
            &what,
            "model",
            "model \"default\"",
        );
    }
    if recipe.prompt.is_none() {
        missing_member(
            recipe.recovered,
            diagnostics,
            file,
            recipe.name.span,
            &what,
            "prompt",
            "prompt \"\"\"...\"\"\"",
        );
    }
    if recipe.output.is_none() {
        missing_member(
            recipe.recovered,
            diagnostics,
            file,
            recipe.name.span,
            &what,
            "output",
            "output { answer: string }",
        );
    }
    let input = match &recipe.input {
        Some(decl) => {
            let fields = resolve_fields(&decl.fields, file, env, diagnostics);
            fields_within_schema_bounds(
                fields,
                &what,
                decl.fields.iter().any(|field| names_an_alias(&field.ty)),
                file,
                recipe.name.span,
                &env.schema_sizes,
                diagnostics,
            )
        }
        None => Vec::new(),
    };
    let output = match &recipe.output {
        Some(ty) => {
            let resolved = resolve(ty, file, env, diagnostics);
            let what = || format!("the output of {what}");
            within_schema_bounds(
                resolved,
                what,
                names_an_alias(ty),
                file,
                ty.span,
                &env.schema_sizes,
                diagnostics,
            )
            .unwrap_or(Ty::Any)
        }
        None => Ty::Any,
    };
    let input = Arc::new(Fields::new(input));
    if let Some(prompt) = &recipe.prompt {
        check_prompt(prompt, &input, recipe, file, &env.suggestions, diagnostics);
    }
    RecipeInfo {
        file,
        decl: recipe.clone(),
        input,
        output,
    }
}

/// A prompt sees only the recipe's `input`.
fn check_prompt(
    prompt: &StringLit,
    input: &Fields,
    recipe: &Recipe,
    file: FileId,
    suggestions: &Budget,
    diagnostics: &mut Vec<Diagnostic>,
) {
    for part in &prompt.template.parts {
        let TemplatePart::Ref(path) = part else {
            continue;
        };
        if path.root.text != "input" {
            let mut diagnostic = Diagnostic::new(
                Code::UnknownRoot,
                file,
                path.root.span,
                format!("a recipe prompt cannot use `{}`", path.root.text),
            )
            .label("not available in a prompt")
            .hint("a prompt sees only its recipe's inputs, as `{{input.field}}`; pass other values as inputs");
            if path.root.text == "workflow_input"
                || path.root.text == "step"
                || path.root.text == "loop_item"
            {
                diagnostic = diagnostic.hint(
                    "declare an input for the value and pass it in the step that calls the recipe",
                );
            }
            diagnostics.push(diagnostic);
            continue;
        }
        let mut segments = path.segments.iter();
        let Some(crate::syntax::ast::Segment::Field { name, .. }) = segments.next() else {
            diagnostics.push(
                Diagnostic::new(
                    Code::PromptUnknownInput,
                    file,
                    path.span(),
                    "`input` needs a field: `{{input.field}}`",
                )
                .label("no field"),
            );
            continue;
        };
        let Some(mut ty) = input.ty(&name.text).cloned() else {
            let names = input.iter().map(|(n, _)| n.as_str());
            let mut diagnostic = Diagnostic::new(
                Code::PromptUnknownInput,
                file,
                name.span,
                format!("recipe `{}` has no input `{}`", recipe.name.text, name.text),
            )
            .label("not a declared input");
            if let Some(best) = did_you_mean_within(&name.text, names.clone(), suggestions) {
                diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
            }
            diagnostic = if input.is_empty() {
                diagnostic.hint("the recipe declares no inputs; add `input { ... }`")
            } else {
                hint_listing(diagnostic, "the inputs are", names, suggestions)
            };
            if let Some(decl) = &recipe.input {
                diagnostic = diagnostic.secondary(file, decl.span, "inputs declared here");
            }
            diagnostics.push(diagnostic);
            continue;
        };
        // Deeper fields of an input are checked like any other path.
        for segment in segments {
            match segment {
                crate::syntax::ast::Segment::Field { name, .. } => {
                    let inner = ty.required().clone();
                    match inner {
                        Ty::Json | Ty::Any => break,
                        Ty::Record(ref fields) => match fields.ty(&name.text) {
                            Some(field) => ty = field.clone(),
                            None => {
                                diagnostics.push(
                                    Diagnostic::new(
                                        Code::UnknownField,
                                        file,
                                        name.span,
                                        format!("no field `{}` in `{inner}`", name.text),
                                    )
                                    .label("unknown field"),
                                );
                                break;
                            }
                        },
                        other => {
                            diagnostics.push(
                                Diagnostic::new(
                                    Code::UnknownField,
                                    file,
                                    name.span,
                                    format!("`{other}` has no fields"),
                                )
                                .label("unknown field"),
                            );
                            break;
                        }
                    }
                }
                crate::syntax::ast::Segment::Index { span, .. } => match ty.required().clone() {
                    Ty::List(item) => ty = Ty::clone(&item),
                    Ty::Json | Ty::Any => break,
                    other => {
                        diagnostics.push(
                            Diagnostic::new(
                                Code::NotAList,
                                file,
                                *span,
                                format!("cannot index `{other}`"),
                            )
                            .label("not a list"),
                        );
                        break;
                    }
                },
            }
        }
    }
}

pub(crate) fn resolve_fields(
    fields: &[FieldDecl],
    file: FileId,
    env: &Env,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<(String, Ty)> {
    record_fields(fields, file, diagnostics, &mut |ty, diagnostics| {
        resolve(ty, file, env, diagnostics)
    })
}

/// `fields`, each `any` where the record of them is past a bound of plans
/// (see [`within_schema_bounds`]): the input of `what`.
pub(crate) fn fields_within_schema_bounds(
    fields: Vec<(String, Ty)>,
    what: &str,
    names_alias: bool,
    file: FileId,
    span: Span,
    sizes: &Mutex<SchemaSizes>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<(String, Ty)> {
    let record = Ty::record(fields.clone());
    let what = || format!("the input of {what}");
    match within_schema_bounds(record, what, names_alias, file, span, sizes, diagnostics) {
        Some(_) => fields,
        None => fields
            .into_iter()
            .map(|(name, _)| (name, Ty::Any))
            .collect(),
    }
}

/// Resolves the fields of a record type with `resolve_one`, reporting a field
/// declared twice.
fn record_fields(
    fields: &[FieldDecl],
    file: FileId,
    diagnostics: &mut Vec<Diagnostic>,
    resolve_one: &mut dyn FnMut(&TypeExpr, &mut Vec<Diagnostic>) -> Ty,
) -> Vec<(String, Ty)> {
    let mut resolved: Vec<(String, Ty)> = Vec::with_capacity(fields.len());
    // A set, not a scan of `resolved`: a record of 50,000 fields took
    // minutes to check.
    let mut seen: HashSet<&str> = HashSet::with_capacity(fields.len());
    for field in fields {
        let ty = resolve_one(&field.ty, diagnostics);
        if !seen.insert(field.name.text.as_str()) {
            diagnostics.push(
                Diagnostic::new(
                    Code::DuplicateId,
                    file,
                    field.name.span,
                    format!("field `{}` is declared twice", field.name.text),
                )
                .label("declared again here"),
            );
        } else {
            resolved.push((field.name.text.to_string(), ty));
        }
    }
    resolved
}

/// Resolves a type expression once every alias is known.
pub(crate) fn resolve(
    ty: &TypeExpr,
    file: FileId,
    env: &Env,
    diagnostics: &mut Vec<Diagnostic>,
) -> Ty {
    resolve_with(
        ty,
        file,
        diagnostics,
        &mut |name| env.types.get(name).cloned(),
        &InScope {
            names: &|| env.types.keys().map(String::as_str).collect(),
            budget: &env.suggestions,
            union_variants: &env.union_variants.0,
        },
    )
}

/// The type names an unknown type's diagnostic suggests from and lists.
/// They are collected for each unknown type, while `budget` pays for it:
/// thousands of misspelt types among thousands of aliases took minutes.
struct InScope<'n> {
    names: &'n dyn Fn() -> Vec<&'n str>,
    budget: &'n Budget,
    /// What unions may still copy.
    union_variants: &'n Budget,
}

fn resolve_with(
    ty: &TypeExpr,
    file: FileId,
    diagnostics: &mut Vec<Diagnostic>,
    lookup: &mut dyn FnMut(&str) -> Option<Ty>,
    scope: &InScope<'_>,
) -> Ty {
    match &ty.kind {
        TypeExprKind::Named(name) => match name.text.as_str() {
            "string" => Ty::String,
            "int" => Ty::Int,
            "float" => Ty::Float,
            "bool" => Ty::Bool,
            "json" => Ty::Json,
            other => match lookup(other) {
                Some(ty) => ty,
                None => {
                    // Listing the names costs their number: not done once
                    // the budget is spent.
                    let known = if scope.budget.left() > 0 {
                        (scope.names)()
                    } else {
                        Vec::new()
                    };
                    let candidates = BUILTIN_TYPES.iter().copied().chain(known);
                    let mut diagnostic = Diagnostic::new(
                        Code::UnknownType,
                        file,
                        name.span,
                        format!("unknown type `{other}`"),
                    )
                    .label("not a type");
                    // Other languages' names for flow's types.
                    let foreign = match other {
                        "str" | "String" | "text" => Some("string"),
                        "integer" | "Integer" | "i32" | "i64" | "long" => Some("int"),
                        "double" | "Double" | "f64" | "decimal" => Some("float"),
                        "boolean" | "Boolean" | "Bool" => Some("bool"),
                        "object" | "Object" | "dict" | "map" | "any" | "Any" => Some("json"),
                        _ => None,
                    };
                    if matches!(other, "number" | "Number") {
                        diagnostic = diagnostic
                            .hint("flow has `int` for whole numbers and `float` for the others");
                    } else if let Some(meant) = foreign {
                        diagnostic = diagnostic
                            .hint(format!("flow calls it `{meant}`"))
                            .fix(meant);
                    } else if let Some(best) =
                        did_you_mean_within(other, candidates.clone(), scope.budget)
                    {
                        diagnostic = diagnostic.hint(format!("did you mean `{best}`?")).fix(best);
                    }
                    diagnostic = hint_listing(
                        diagnostic,
                        "the types in scope are",
                        candidates,
                        scope.budget,
                    );
                    diagnostics.push(diagnostic);
                    Ty::Any
                }
            },
        },
        TypeExprKind::List(item) => Ty::list(resolve_with(item, file, diagnostics, lookup, scope)),
        TypeExprKind::Record(fields) => Ty::record(record_fields(
            fields,
            file,
            diagnostics,
            &mut |ty, diagnostics| resolve_with(ty, file, diagnostics, lookup, scope),
        )),
        TypeExprKind::Literal(text) if text.len() > flow_plan::limits::MAX_VARIANT_BYTES => {
            diagnostics.push(
                Diagnostic::new(
                    Code::PastPlanLimit,
                    file,
                    ty.span,
                    format!(
                        "a variant of {} bytes; an enum's variants have at most {}",
                        text.len(),
                        flow_plan::limits::MAX_VARIANT_BYTES
                    ),
                )
                .label("past a limit of plans")
                .hint("variants are labels, such as `\"billing\"`; use `string` for text"),
            );
            Ty::Any
        }
        TypeExprKind::Literal(text) => Ty::enumeration(vec![text.clone()]),
        TypeExprKind::Optional(inner) => {
            if let TypeExprKind::Optional(_) = inner.kind {
                // Marks in a row (`string??`) start where the type does;
                // `(string?)?` has a `)` between, which the fix would take.
                let in_a_row = inner.span.start == ty.span.start;
                let mark = match in_a_row {
                    true => Span::new(inner.span.end as usize, ty.span.end as usize),
                    false => Span::new(ty.span.end as usize - 1, ty.span.end as usize),
                };
                let diagnostic = Diagnostic::new(
                    Code::NeedlessOptional,
                    file,
                    mark,
                    "the type is optional already: a second `?` adds nothing",
                )
                .label("already optional")
                .hint("one `?` is enough: remove the rest");
                diagnostics.push(match in_a_row {
                    true => diagnostic.fix(""),
                    false => diagnostic,
                });
            }
            resolve_with(inner, file, diagnostics, lookup, scope).optional()
        }
        TypeExprKind::Union(alternatives) => {
            let resolved: Vec<Ty> = alternatives
                .iter()
                .map(|alternative| resolve_with(alternative, file, diagnostics, lookup, scope))
                .collect();
            union(
                ty,
                &resolved,
                alternatives,
                file,
                scope.union_variants,
                diagnostics,
            )
        }
    }
}

/// The enum of a union's `alternatives`, each variant once in the order
/// written, or `any` with an error.
fn union(
    ty: &TypeExpr,
    resolved: &[Ty],
    alternatives: &[TypeExpr],
    file: FileId,
    budget: &Budget,
    diagnostics: &mut Vec<Diagnostic>,
) -> Ty {
    use flow_plan::limits::MAX_ENUM_VARIANTS;
    let mut parts: Vec<&[String]> = Vec::with_capacity(resolved.len());
    let mut optional = false;
    // The variants copied from the enums that other types name: those
    // written here are paid for in source.
    let mut copied = 0usize;
    // The literals written here, to tell one written twice.
    let mut written: HashMap<&str, Span> = HashMap::new();
    for (ty, alternative) in resolved.iter().zip(alternatives) {
        optional |= ty.is_optional();
        if let TypeExprKind::Literal(text) = &alternative.kind {
            if let Some(first) = written.get(text.as_str()) {
                diagnostics.push(
                    Diagnostic::new(
                        Code::RepeatedVariant,
                        file,
                        alternative.span,
                        format!("the union writes \"{text}\" twice"),
                    )
                    .label("written before")
                    .secondary(file, *first, "first here")
                    .hint("the enum holds it once: was another variant meant?"),
                );
            } else {
                written.insert(text, alternative.span);
            }
        }
        match ty.required() {
            Ty::Enum(variants) => {
                if !matches!(alternative.kind, TypeExprKind::Literal(_)) {
                    copied = copied.saturating_add(variants.copy_bytes() as usize);
                }
                parts.push(variants);
            }
            Ty::Any => {}
            other => {
                diagnostics.push(
                    Diagnostic::new(Code::BadUnion, file, alternative.span, format!("`{other}` cannot be part of a union"))
                        .label("not a string literal")
                        .hint("unions are enums of string literals: `\"low\" | \"high\"`; use `json` for values of several shapes"),
                );
                return Ty::Any;
            }
        }
    }
    let past = |message: String| {
        Diagnostic::new(Code::PastPlanLimit, file, ty.span, message).label("past a limit of plans")
    };
    if !budget.spend(copied) {
        diagnostics.push(past(format!(
            "the program's unions copy more than {} MiB of variants together: this one copies {copied} bytes",
            UNION_BYTES / (1024 * 1024)
        )).hint("a union copies the variants of each enum it names; name the union once, as an alias, and use that alias"));
        return Ty::Any;
    }
    // A set beside the list, not a scan of it: a union of 200,000
    // literals took minutes.
    let mut seen: HashSet<&str> = HashSet::new();
    let mut variants: Vec<String> = Vec::new();
    for variant in parts.iter().flat_map(|part| part.iter()) {
        if seen.insert(variant) {
            if variants.len() == MAX_ENUM_VARIANTS {
                diagnostics.push(past(format!(
                    "this union has more than {MAX_ENUM_VARIANTS} variants; an enum of a plan has at most that"
                )));
                return Ty::Any;
            }
            variants.push(variant.clone());
        }
    }
    let ty = Ty::enumeration(variants);
    if optional { ty.optional() } else { ty }
}

struct Resolver<'a, 'd> {
    aliases: &'a HashMap<String, (FileId, &'a TypeDecl)>,
    resolved: HashMap<String, Ty>,
    /// Aliases past a bound of plans, and those that name one: each is
    /// `any`, and only the first is reported.
    refused: HashSet<String>,
    diagnostics: &'d mut Vec<Diagnostic>,
    suggestions: &'a Budget,
    schema_sizes: &'a Mutex<SchemaSizes>,
    union_variants: &'a Budget,
}

impl Resolver<'_, '_> {
    /// The type the alias `name` stands for, the aliases it names resolved
    /// first. The walk keeps its own stack, not the thread's: a chain of
    /// thousands of aliases, each naming the next, overflowed the thread's
    /// stack as recursion.
    fn alias(&mut self, name: &str) -> Ty {
        let aliases = self.aliases;
        // The aliases being resolved, from `name` down: a cycle returns to one.
        let mut visiting: Vec<&str> = Vec::new();
        let mut visiting_set: HashSet<&str> = HashSet::new();
        // (alias, whether what it names is resolved and it is next)
        let mut stack: Vec<(&str, bool)> = match aliases.get_key_value(name) {
            Some((name, _)) => vec![(name.as_str(), false)],
            None => return Ty::Any,
        };
        while let Some((name, named_resolved)) = stack.pop() {
            let (file, decl) = aliases[name];
            if named_resolved {
                visiting.pop();
                visiting_set.remove(name);
                let ty = self.resolve(name, file, decl);
                self.resolved.entry(name.to_string()).or_insert(ty);
                continue;
            }
            if self.resolved.contains_key(name) {
                continue;
            }
            if visiting_set.contains(name) {
                self.diagnostics.push(
                    Diagnostic::new(
                        Code::UnknownType,
                        file,
                        decl.name.span,
                        format!("type `{name}` refers to itself"),
                    )
                    .label("recursive type")
                    .hint(format!("cycle: {} -> {name}", visiting.join(" -> ")))
                    .hint("recursive types are not supported; use `json` for the recursive part"),
                );
                self.resolved.insert(name.to_string(), Ty::Any);
                continue;
            }
            visiting.push(name);
            visiting_set.insert(name);
            stack.push((name, true));
            let mut named = Vec::new();
            collect_names(&decl.ty, &mut named);
            // Pushed last first, so that they are resolved in the order written.
            for dependency in named.iter().rev() {
                if let Some((dependency, _)) = aliases.get_key_value(dependency.as_str())
                    && !self.resolved.contains_key(dependency)
                {
                    stack.push((dependency.as_str(), false));
                }
            }
        }
        self.resolved.get(name).cloned().unwrap_or(Ty::Any)
    }

    /// The type of the alias `name`, every alias it names resolved.
    fn resolve(&mut self, name: &str, file: FileId, decl: &TypeDecl) -> Ty {
        let aliases = self.aliases;
        let resolved = &self.resolved;
        let ty = resolve_with(
            &decl.ty,
            file,
            self.diagnostics,
            &mut |n| resolved.get(n).cloned(),
            &InScope {
                names: &|| aliases.keys().map(String::as_str).collect(),
                budget: self.suggestions,
                union_variants: self.union_variants,
            },
        );
        // An alias found in a cycle is `any` already, and reported: what it
        // names is resolved for its own diagnostics only.
        if self.resolved.contains_key(name) {
            return Ty::Any;
        }
        let mut named = Vec::new();
        collect_names(&decl.ty, &mut named);
        if named.iter().any(|n| self.refused.contains(n)) {
            self.refused.insert(name.to_string());
            return Ty::Any;
        }
        let what = || format!("type `{name}`");
        within_schema_bounds(
            ty,
            what,
            names_an_alias(&decl.ty),
            file,
            decl.name.span,
            self.schema_sizes,
            self.diagnostics,
        )
        .unwrap_or_else(|| {
            self.refused.insert(name.to_string());
            Ty::Any
        })
    }
}

/// `ty`, or `None` with an error (E212) at `span` where its JSON Schema
/// would be past a bound of plans (see [`Ty::schema_size`]): a type nested
/// through aliases past what any plan holds, or sharing an alias's parts
/// so often that its schema, written out, would not fit in memory. The
/// checker goes on with `any` in its place. `names_alias`: whether the
/// type as written names an alias, whose parts its schema repeats.
pub(crate) fn within_schema_bounds(
    ty: Ty,
    what: impl FnOnce() -> String,
    names_alias: bool,
    file: FileId,
    span: Span,
    sizes: &Mutex<SchemaSizes>,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<Ty> {
    use flow_plan::limits::{MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES};
    let measured = ty.schema_size_within(&mut sizes.lock().unwrap_or_else(|p| p.into_inner()));
    let past = match measured {
        Ok(_) => return Some(ty),
        Err(SchemaPast::Depth) => format!("would nest more than {MAX_SCHEMA_DEPTH} levels deep"),
        Err(SchemaPast::Values) => format!("would hold more than {MAX_SCHEMA_NODES} values"),
    };
    diagnostics.push(
        Diagnostic::new(
            Code::PastPlanLimit,
            file,
            span,
            format!("{} is too big for a plan: its JSON Schema {past}", what()),
        )
        .label("past a limit of plans")
        .hint(if names_alias {
            "each alias a type names is written out in full wherever it is used; use `json` for a part that need not be checked"
        } else {
            "use `json` for a part that need not be checked"
        }),
    );
    None
}

/// Whether `ty` names a type alias (a name other than a built-in type's).
pub(crate) fn names_an_alias(ty: &TypeExpr) -> bool {
    match &ty.kind {
        TypeExprKind::Named(name) => !BUILTIN_TYPES.contains(&name.text.as_str()),
        TypeExprKind::List(inner) | TypeExprKind::Optional(inner) => names_an_alias(inner),
        TypeExprKind::Record(fields) => fields.iter().any(|f| names_an_alias(&f.ty)),
        TypeExprKind::Union(alternatives) => alternatives.iter().any(names_an_alias),
        TypeExprKind::Literal(_) => false,
    }
}

fn collect_names(ty: &TypeExpr, names: &mut Vec<String>) {
    match &ty.kind {
        TypeExprKind::Named(name) => names.push(name.text.to_string()),
        TypeExprKind::List(inner) | TypeExprKind::Optional(inner) => collect_names(inner, names),
        TypeExprKind::Record(fields) => fields.iter().for_each(|f| collect_names(&f.ty, names)),
        TypeExprKind::Union(alternatives) => {
            alternatives.iter().for_each(|a| collect_names(a, names))
        }
        TypeExprKind::Literal(_) => {}
    }
}

/// How the runtime reaches a declared MCP server: what the plan holds, and
/// the server's identity in `flow.lock`.
fn mcp_transport(decl: &McpServer) -> flow_plan::McpTransport {
    match (&decl.command, &decl.url) {
        (_, Some(url)) => flow_plan::McpTransport::Http {
            url: url.display_text(),
        },
        (command, None) => flow_plan::McpTransport::Stdio {
            command: command
                .as_ref()
                .map(StringLit::display_text)
                .unwrap_or_default(),
            args: decl.args.iter().map(literal_text).collect(),
            env: decl
                .env
                .iter()
                .flat_map(|record| &record.fields)
                .map(|field| (field.name.text.to_string(), literal_text(&field.value)))
                .collect(),
        },
    }
}

/// The text of a string literal where the checker demands one (MCP arguments).
fn literal_text(expr: &Expr) -> String {
    match &expr.kind {
        ExprKind::String(lit) => lit.display_text(),
        _ => String::new(),
    }
}
