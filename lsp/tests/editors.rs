//! The editor files under `editors/` are well formed: the VS Code extension's
//! JSON parses, what `package.json` points at exists and agrees, the grammar
//! includes only rules it defines, and it knows every keyword of the parser's
//! grammar (so that a keyword added to the language is not left unhighlighted).
//! The Neovim snippet is exercised for real by `tests/neovim.rs`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("lsp/ is in the repository")
        .to_path_buf()
}

fn json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{} is unreadable: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every `include` of a TextMate rule tree, collected recursively.
fn includes(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(include)) = map.get("include") {
                out.insert(include.clone());
            }
            map.values().for_each(|v| includes(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| includes(v, out)),
        _ => {}
    }
}

#[test]
fn the_vscode_extension_is_consistent() {
    let extension = repository().join("editors/vscode");
    let package = json(&extension.join("package.json"));
    assert_eq!(package["main"], "./extension.js");
    assert!(extension.join("extension.js").is_file());
    assert!(
        package["dependencies"]["vscode-languageclient"].is_string(),
        "the client library is a dependency"
    );

    let language = &package["contributes"]["languages"][0];
    assert_eq!(language["id"], "flow");
    assert_eq!(language["extensions"][0], ".flow");
    let configuration = json(
        &extension.join(
            language["configuration"]
                .as_str()
                .expect("a language configuration"),
        ),
    );
    assert_eq!(configuration["comments"]["lineComment"], "//");

    let contributed = &package["contributes"]["grammars"][0];
    assert_eq!(contributed["language"], "flow");
    let grammar = json(&extension.join(contributed["path"].as_str().expect("a grammar path")));
    assert_eq!(grammar["scopeName"], contributed["scopeName"]);

    let mut used = BTreeSet::new();
    includes(&grammar, &mut used);
    let repository = grammar["repository"].as_object().expect("a repository");
    for include in &used {
        let name = include
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("`{include}` is not a local rule"));
        assert!(repository.contains_key(name), "`{include}` is not defined");
    }
    // Every rule is reachable: an unused one is a rule someone forgot to include.
    for name in repository.keys() {
        assert!(
            used.contains(&format!("#{name}")),
            "`{name}` is never included"
        );
    }
}

#[test]
fn the_grammar_highlights_every_keyword_of_the_parser() {
    let pest = std::fs::read_to_string(repository().join("compiler/core/src/syntax/flow.pest"))
        .expect("the parser's grammar");
    let grammar =
        std::fs::read_to_string(repository().join("editors/vscode/syntaxes/flow.tmLanguage.json"))
            .expect("the TextMate grammar");
    // The alternatives of the grammar's `match` patterns, as words.
    let highlighted: BTreeSet<&str> = grammar
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    // The parser's literal words: `"step"`, `"kb_write"`, ... but for the
    // words of other languages that the slip productions read only to
    // report them (`elif`, `for x in`, `2s to 30s`): flow has no such
    // keyword, and highlighting one would tell the author it has.
    let language: String = pest
        .lines()
        .filter(|line| {
            let rule = line.split('=').next().unwrap_or_default().trim();
            !(rule.ends_with("_slip") || rule == "in_word" || line.trim_start().starts_with("//"))
        })
        .collect::<Vec<_>>()
        .join("\n");
    // Line by line: a quote character written as a literal (`"\""`) must
    // not shift every later string.
    let keywords: BTreeSet<&str> = language
        .lines()
        .flat_map(|line| line.split('"').skip(1).step_by(2))
        .filter(|word| word.len() > 1 && word.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect();
    assert!(keywords.contains("workflow") && keywords.contains("idempotency"));
    let missing: Vec<&&str> = keywords
        .iter()
        .filter(|k| !highlighted.contains(**k))
        .collect();
    assert!(
        missing.is_empty(),
        "keywords the TextMate grammar does not know: {missing:?}"
    );
}
