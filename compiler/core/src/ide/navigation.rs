//! Go to definition, find references and rename.
//!
//! A [`Symbol`] names what the cursor is on independently of one analysis:
//! a step by its workflow and id, a declaration by its name and the path of
//! the file that declares it. That lets an editor collect the references of a
//! recipe from every file of a workspace that imports it, each checked on its
//! own, and merge them.

use crate::Checked;
use crate::check::{WorkflowInfo, normalize, resolve_import};
use crate::diagnostic::{FileId, Span};
use crate::ide::{fields, visit};
use crate::syntax::KEYWORDS;
use crate::syntax::ast::{ExpectKind, Item, MockTarget, Name, Segment, StepCall, TestDecl};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Symbol {
    /// A step, loop or parallel id of a workflow: one of the root file's, or
    /// one that a test of the root file runs. `file` declares the workflow.
    Step {
        workflow: String,
        id: String,
        file: String,
    },
    Recipe {
        name: String,
        file: String,
    },
    Type {
        name: String,
        file: String,
    },
    Mcp {
        name: String,
        file: String,
    },
    /// An imported file, by its normal path.
    Import {
        path: String,
    },
    /// A workflow, named where it is declared and by the tests that run
    /// it (`workflow NAME`). `file` declares it.
    Workflow {
        name: String,
        file: String,
    },
}

impl Symbol {
    pub fn name(&self) -> &str {
        match self {
            Symbol::Step { id: name, .. }
            | Symbol::Recipe { name, .. }
            | Symbol::Type { name, .. }
            | Symbol::Mcp { name, .. }
            | Symbol::Workflow { name, .. }
            | Symbol::Import { path: name } => name,
        }
    }
}

/// Why a rename was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenameError {
    /// Nothing renamable is at the cursor.
    NothingHere,
    /// The new name is not an identifier, or is a keyword.
    InvalidName(String),
    /// The new name already names something of the same kind in scope.
    InUse(String),
    /// The new name of a type is a built-in type's (`string`, `list`).
    Builtin(String),
    /// The new name is longer than a name may be: its length in bytes.
    TooLong(usize),
}

impl std::fmt::Display for RenameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenameError::NothingHere => write!(f, "there is nothing to rename here"),
            RenameError::InvalidName(name) => write!(f, "`{name}` is not a valid name"),
            RenameError::InUse(name) => write!(f, "`{name}` is already in use"),
            RenameError::Builtin(name) => write!(f, "`{name}` is a built-in type"),
            RenameError::TooLong(bytes) => write!(
                f,
                "a name of {bytes} bytes is too long: at most {}",
                flow_plan::limits::MAX_NAME_BYTES
            ),
        }
    }
}

/// The symbol at `offset` of file `file`, with the span of the name there.
pub fn symbol_at(checked: &Checked, file: FileId, offset: u32) -> Option<(Symbol, Span)> {
    if let Some((workflow, span)) = workflow_at(checked, file, offset) {
        let symbol = Symbol::Workflow {
            name: workflow.name.clone(),
            file: checked.file(workflow.file).path.clone(),
        };
        return Some((symbol, span));
    }
    let loaded = checked.files.get(file.0 as usize)?;
    let env = &checked.analysis.env;
    let declared_in = |id: FileId| checked.file(id).path.clone();
    let mut found = None;
    for item in &loaded.tree.items {
        if !item.span().contains(offset) {
            continue;
        }
        match item {
            Item::Import(import) if import.path.span.contains(offset) => {
                let path = normalize(&resolve_import(&loaded.path, &import.path.display_text()));
                return Some((Symbol::Import { path }, import.path.span));
            }
            Item::Recipe(recipe) if recipe.name.span.contains(offset) => {
                let name = recipe.name.text.to_string();
                return Some((
                    Symbol::Recipe {
                        name,
                        file: loaded.path.clone(),
                    },
                    recipe.name.span,
                ));
            }
            Item::Mcp(server) if server.name.span.contains(offset) => {
                let name = server.name.text.to_string();
                return Some((
                    Symbol::Mcp {
                        name,
                        file: loaded.path.clone(),
                    },
                    server.name.span,
                ));
            }
            Item::Type(decl) if decl.name.span.contains(offset) => {
                let name = decl.name.text.to_string();
                return Some((
                    Symbol::Type {
                        name,
                        file: loaded.path.clone(),
                    },
                    decl.name.span,
                ));
            }
            _ => {}
        }
        visit::type_names(item, &mut |name| {
            if name.span.contains(offset)
                && let Some(file) = type_file(checked, &name.text)
            {
                found = Some((
                    Symbol::Type {
                        name: name.text.to_string(),
                        file,
                    },
                    name.span,
                ));
            }
        });
        if let Item::Test(test) = item {
            if file == FileId(0) {
                found = found.or_else(|| test_symbol(checked, test, offset));
            }
            continue;
        }
        let Item::Workflow(workflow) = item else {
            continue;
        };
        let in_root = file == FileId(0);
        let info = checked
            .analysis
            .workflows
            .iter()
            .find(|w| w.name == workflow.name.text && in_root);
        let step_symbol = |id: &str| Symbol::Step {
            workflow: workflow.name.text.to_string(),
            id: id.to_string(),
            file: loaded.path.clone(),
        };
        if let Some(info) = info {
            if let Some(step) = info.steps.iter().find(|s| s.id_span.contains(offset)) {
                return Some((step_symbol(&step.id), step.id_span));
            }
            visit::paths(item, &mut |path| {
                if let ("step" | "loop", Some(Segment::Field { name, .. })) =
                    (path.root.text.as_str(), path.segments.first())
                    && name.span.contains(offset)
                    && info.step(&name.text).is_some()
                {
                    found = Some((step_symbol(&name.text), name.span));
                }
            });
        }
        visit::steps(item, &mut |step| match &step.call {
            StepCall::Recipe { recipe, .. } if recipe.span.contains(offset) => {
                if let Some(info) = env.recipes.get(recipe.text.as_str()) {
                    found = Some((
                        Symbol::Recipe {
                            name: recipe.text.to_string(),
                            file: declared_in(info.file),
                        },
                        recipe.span,
                    ));
                }
            }
            StepCall::Browser { server, .. } if server.span.contains(offset) => {
                if let Some(info) = env.mcp_servers.get(server.text.as_str()) {
                    found = Some((
                        Symbol::Mcp {
                            name: server.text.to_string(),
                            file: declared_in(info.file),
                        },
                        server.span,
                    ));
                }
            }
            _ => {}
        });
    }
    found
}

/// A step or recipe a test names (`mock step.classify`, `mock recipe
/// draft`, `decide step.refund`, `expect ran step.escalate`): a step of
/// the workflow the test runs, which may be an imported file's.
fn test_symbol(checked: &Checked, test: &TestDecl, offset: u32) -> Option<(Symbol, Span)> {
    let env = &checked.analysis.env;
    for mock in &test.mocks {
        match &mock.target {
            MockTarget::Recipe(name) if name.span.contains(offset) => {
                let info = env.recipes.get(name.text.as_str())?;
                let file = checked.file(info.file).path.clone();
                return Some((
                    Symbol::Recipe {
                        name: name.text.to_string(),
                        file,
                    },
                    name.span,
                ));
            }
            _ => {}
        }
    }
    let name = test_step_names(test)
        .into_iter()
        .find(|name| name.span.contains(offset))?;
    let workflow = checked
        .analysis
        .test_workflow(&test.workflow.as_ref()?.text)?;
    workflow.step(&name.text)?;
    Some((
        Symbol::Step {
            workflow: workflow.name.clone(),
            id: name.text.to_string(),
            file: checked.file(workflow.file).path.clone(),
        },
        name.span,
    ))
}

/// The workflow `name` that file `file` declares, when it is the root
/// file's or one that the root file's tests run: another file's workflow
/// of the same name is another workflow.
fn step_workflow<'c>(checked: &'c Checked, name: &str, file: &str) -> Option<&'c WorkflowInfo> {
    let info = checked.analysis.test_workflow(name)?;
    (normalize(&checked.file(info.file).path) == normalize(file)).then_some(info)
}

/// Every step name a test writes: its step mocks, decisions and
/// expectations about steps.
fn test_step_names(test: &TestDecl) -> Vec<&Name> {
    let mut names: Vec<&Name> = Vec::new();
    for mock in &test.mocks {
        if let MockTarget::Step(name) = &mock.target {
            names.push(name);
        }
    }
    names.extend(test.decisions.iter().map(|decide| &decide.step));
    for expect in &test.expects {
        if let ExpectKind::Ran { step, .. } | ExpectKind::Attempts { step, .. } = &expect.kind {
            names.push(step);
        }
    }
    names
}

/// The path of the file declaring type `name`, when one of the loaded files does.
fn type_file(checked: &Checked, name: &str) -> Option<String> {
    checked.files.iter().find_map(|file| {
        file.tree.items.iter().find_map(|item| match item {
            Item::Type(decl) if decl.name.text == name => Some(file.path.clone()),
            _ => None,
        })
    })
}

fn file_id(checked: &Checked, path: &str) -> Option<FileId> {
    let path = normalize(path);
    checked
        .files
        .iter()
        .position(|file| normalize(&file.path) == path)
        .map(|index| FileId(index as u32))
}

/// Where the symbol at `offset` is declared: a step, recipe, type, server
/// or import, a field that a reference reads (`workflow_input.FIELD`, a
/// step output's field, `{{input.x}}` in a prompt, a loop item's field),
/// or the loop whose item `loop_item` is.
pub fn definition(checked: &Checked, file: FileId, offset: u32) -> Option<(FileId, Span)> {
    if file == FileId(0)
        && let Some(found) = path_definition(checked, offset)
    {
        return Some(found);
    }
    let (symbol, _) = symbol_at(checked, file, offset)?;
    match &symbol {
        Symbol::Import { path } => Some((file_id(checked, path)?, Span::default())),
        _ => declaration(checked, &symbol),
    }
}

/// The workflow whose name is at `offset` of the root file, where it is
/// declared or where a test names it (`workflow NAME`), with the span of
/// the name there. (An audit: a test's workflow had no hover or
/// definition.)
fn workflow_at(checked: &Checked, file: FileId, offset: u32) -> Option<(&WorkflowInfo, Span)> {
    if file != FileId(0) {
        return None;
    }
    checked.files.first()?.tree.items.iter().find_map(|item| {
        let name = match item {
            Item::Test(test) => test.workflow.as_ref()?,
            Item::Workflow(workflow) => &workflow.name,
            _ => return None,
        };
        if !name.span.contains(offset) {
            return None;
        }
        Some((checked.analysis.test_workflow(&name.text)?, name.span))
    })
}

/// The declaration of the field, or the loop of `loop_item`, at `offset`
/// of a reference path in the root file.
fn path_definition(checked: &Checked, offset: u32) -> Option<(FileId, Span)> {
    let path = fields::path_at(checked, offset)?;
    if path.root.span.contains(offset) {
        return match path.root.text.as_str() {
            "loop_item" => Some((FileId(0), fields::loop_of_item(checked, offset)?)),
            _ => None,
        };
    }
    let index = path
        .segments
        .iter()
        .position(|segment| segment.span().contains(offset))?;
    let field = fields::declared_field(checked, &path, index)?;
    Some((field.file, field.decl.name.span))
}

fn declaration(checked: &Checked, symbol: &Symbol) -> Option<(FileId, Span)> {
    let env = &checked.analysis.env;
    match symbol {
        Symbol::Step { workflow, id, file } => {
            let info = step_workflow(checked, workflow, file)?;
            Some((info.file, info.step(id)?.1.id_span))
        }
        Symbol::Recipe { name, file } => {
            let info = env.recipes.get(name)?;
            (normalize(&checked.file(info.file).path) == normalize(file))
                .then_some((info.file, info.decl.name.span))
        }
        Symbol::Mcp { name, file } => {
            let info = env.mcp_servers.get(name)?;
            (normalize(&checked.file(info.file).path) == normalize(file))
                .then_some((info.file, info.decl.name.span))
        }
        Symbol::Type { name, file } => {
            let id = file_id(checked, file)?;
            checked
                .file(id)
                .tree
                .items
                .iter()
                .find_map(|item| match item {
                    Item::Type(decl) if decl.name.text == *name => Some((id, decl.name.span)),
                    _ => None,
                })
        }
        Symbol::Import { path } => Some((file_id(checked, path)?, Span::default())),
        Symbol::Workflow { name, file } => {
            let info = step_workflow(checked, name, file)?;
            checked
                .file(info.file)
                .tree
                .items
                .iter()
                .find_map(|item| match item {
                    Item::Workflow(decl) if decl.name.text == *name => {
                        Some((info.file, decl.name.span))
                    }
                    _ => None,
                })
        }
    }
}

/// Every occurrence of `symbol` in the files of `checked`, its declaration
/// first when `checked` holds it, then in file and source order.
pub fn references(checked: &Checked, symbol: &Symbol) -> Vec<(FileId, Span)> {
    let mut found = Vec::new();
    let Some(declared) = declaration(checked, symbol) else {
        return found;
    };
    if !matches!(symbol, Symbol::Import { .. }) {
        found.push(declared);
    }
    for (index, loaded) in checked.files.iter().enumerate() {
        let file = FileId(index as u32);
        for item in &loaded.tree.items {
            match symbol {
                Symbol::Step { workflow, id, .. } => {
                    // The root file's tests of the workflow name its steps too.
                    if let Item::Test(test) = item
                        && file == FileId(0)
                        && test.workflow.as_ref().is_some_and(|w| w.text == *workflow)
                    {
                        found.extend(
                            test_step_names(test)
                                .into_iter()
                                .filter(|name| name.text == *id)
                                .map(|name| (file, name.span)),
                        );
                        continue;
                    }
                    // The workflow may be an imported file's, which a test runs.
                    let Item::Workflow(decl) = item else { continue };
                    if file != declared.0 || decl.name.text != *workflow {
                        continue;
                    }
                    visit::paths(item, &mut |path| {
                        if let ("step" | "loop", Some(Segment::Field { name, .. })) =
                            (path.root.text.as_str(), path.segments.first())
                            && name.text == *id
                        {
                            found.push((file, name.span));
                        }
                    });
                }
                Symbol::Recipe { name, .. } => {
                    // The root file's tests mock it (`mock recipe NAME`).
                    if let Item::Test(test) = item
                        && file == FileId(0)
                    {
                        found.extend(test.mocks.iter().filter_map(|mock| match &mock.target {
                            MockTarget::Recipe(mocked) if mocked.text == *name => {
                                Some((file, mocked.span))
                            }
                            _ => None,
                        }));
                    }
                    visit::steps(item, &mut |step| {
                        if let StepCall::Recipe { recipe, .. } = &step.call
                            && recipe.text == *name
                        {
                            found.push((file, recipe.span));
                        }
                    });
                }
                Symbol::Mcp { name, .. } => visit::steps(item, &mut |step| {
                    if let StepCall::Browser { server, .. } = &step.call
                        && server.text == *name
                    {
                        found.push((file, server.span));
                    }
                }),
                Symbol::Type { name, .. } => visit::type_names(item, &mut |used| {
                    if used.text == *name {
                        found.push((file, used.span));
                    }
                }),
                // The root file's tests that run it name it.
                Symbol::Workflow { name, .. } => {
                    if let Item::Test(test) = item
                        && file == FileId(0)
                        && let Some(named) = &test.workflow
                        && named.text == *name
                    {
                        found.push((file, named.span));
                    }
                }
                Symbol::Import { path } => {
                    if let Item::Import(import) = item
                        && normalize(&resolve_import(&loaded.path, &import.path.display_text()))
                            == *path
                    {
                        found.push((file, import.path.span));
                    }
                }
            }
        }
    }
    found.sort();
    found.dedup();
    // The declaration goes first, as editors list it.
    if let Some(at) = found.iter().position(|f| *f == declared) {
        found.remove(at);
        found.insert(0, declared);
    }
    found
}

/// The spans to replace with `new_name` to rename the symbol at `offset`.
pub fn rename(
    checked: &Checked,
    file: FileId,
    offset: u32,
    new_name: &str,
) -> Result<(Symbol, Vec<(FileId, Span)>), RenameError> {
    let (symbol, _) = symbol_at(checked, file, offset).ok_or(RenameError::NothingHere)?;
    if matches!(symbol, Symbol::Import { .. }) {
        return Err(RenameError::NothingHere);
    }
    check_new_name(checked, &symbol, new_name)?;
    Ok((symbol.clone(), references(checked, &symbol)))
}

/// Refuses a name that is not an identifier, is a keyword, or already names
/// something of the same kind: a rename must not change what any reference means.
pub fn check_new_name(
    checked: &Checked,
    symbol: &Symbol,
    new_name: &str,
) -> Result<(), RenameError> {
    let valid = new_name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && new_name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !KEYWORDS.contains(&new_name);
    if !valid {
        return Err(RenameError::InvalidName(new_name.to_string()));
    }
    // A name the checker refuses (E212) is no better a rename (an audit:
    // 300 bytes renamed every reference, and the project no longer checked).
    if new_name.len() > flow_plan::limits::MAX_NAME_BYTES {
        return Err(RenameError::TooLong(new_name.len()));
    }
    if new_name == symbol.name() {
        return Ok(());
    }
    if matches!(symbol, Symbol::Type { .. }) && crate::check::names_builtin_type(new_name) {
        return Err(RenameError::Builtin(new_name.to_string()));
    }
    let env = &checked.analysis.env;
    let taken = match symbol {
        Symbol::Step { workflow, file, .. } => step_workflow(checked, workflow, file)
            .is_some_and(|workflow| workflow.step(new_name).is_some()),
        Symbol::Recipe { .. } => env.recipes.contains_key(new_name),
        Symbol::Mcp { .. } => env.mcp_servers.contains_key(new_name),
        Symbol::Type { .. } => env.types.contains_key(new_name),
        // A workflow of any file this one loads: a test naming it would
        // then run the other.
        Symbol::Workflow { .. } => checked.files.iter().any(|file| {
            file.tree
                .items
                .iter()
                .any(|item| matches!(item, Item::Workflow(decl) if decl.name.text == new_name))
        }),
        Symbol::Import { .. } => false,
    };
    if taken {
        return Err(RenameError::InUse(new_name.to_string()));
    }
    Ok(())
}
