//! Knowledge-base context for recipes: which words of a prompt a search
//! uses, and how retrieved documents are given to the model.
//!
//! A recipe's `context kb "id", ...` names collections (or single documents
//! as `collection/title`); a workflow's `context` applies to every recipe of
//! it. Before the first step (preflight) the workflow's documents are
//! resolved once for the run; each recipe call adds its own ids' documents
//! ranked against its rendered prompt. Both are appended to the prompt.

use crate::services::KbDocument;

/// The most documents one call gets, and the most text of them.
pub const MOST_DOCUMENTS: usize = 5;
pub const MOST_CONTEXT_BYTES: usize = 16 * 1024;

/// The words of `text` a search ranks documents by: lowercase letters and
/// digits, three or more long, each once, at most 32 of them. Stores build
/// their own queries from these, so no search syntax reaches them.
pub fn search_terms(text: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
    {
        let word = word.to_lowercase();
        if !terms.contains(&word) {
            terms.push(word);
            if terms.len() == 32 {
                break;
            }
        }
    }
    terms
}

/// The search words of a run's input: those of its strings, at any depth.
/// The workflow's context is resolved before any prompt exists, so what the
/// run is about is what ranks it.
pub fn input_terms(input: &serde_json::Value) -> Vec<String> {
    fn strings<'v>(value: &'v serde_json::Value, out: &mut Vec<&'v str>) {
        match value {
            serde_json::Value::String(text) => out.push(text),
            serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
            serde_json::Value::Object(fields) => fields.values().for_each(|v| strings(v, out)),
            _ => {}
        }
    }
    let mut texts = Vec::new();
    strings(input, &mut texts);
    search_terms(&texts.join(" "))
}

/// `prompt` with the documents after it, each under its id and version, the
/// whole within `MOST_CONTEXT_BYTES` (a document that does not fit is cut at
/// a character boundary and says so).
pub fn with_context(prompt: String, documents: &[KbDocument]) -> String {
    if documents.is_empty() {
        return prompt;
    }
    let mut text = prompt;
    text.push_str("\n\nContext from the knowledge base:\n");
    let mut room = MOST_CONTEXT_BYTES;
    for document in documents {
        if room == 0 {
            break;
        }
        let header = format!(
            "\n--- {}/{} (version {})\n",
            document.collection, document.title, document.version
        );
        text.push_str(&header);
        if document.content.len() <= room {
            text.push_str(&document.content);
            room -= document.content.len();
        } else {
            let mut end = room;
            while !document.content.is_char_boundary(end) {
                end -= 1;
            }
            text.push_str(&document.content[..end]);
            text.push_str("\n[cut]");
            room = 0;
        }
        text.push('\n');
    }
    text
}

/// The documents of `first` then those of `then` not already in it.
pub fn merged(first: &[KbDocument], then: Vec<KbDocument>) -> Vec<KbDocument> {
    let mut all = first.to_vec();
    for document in then {
        if !all
            .iter()
            .any(|d| d.collection == document.collection && d.title == document.title)
        {
            all.push(document);
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_terms_are_plain_words_once() {
        assert_eq!(
            search_terms("Refund: the REFUND policy, \"quoted\" AND NEAR(x) -- ok"),
            ["refund", "the", "policy", "quoted", "and", "near"]
        );
    }

    #[test]
    fn input_terms_are_the_words_of_its_strings_at_any_depth() {
        let input = serde_json::json!({
            "subject": "Refund please",
            "ticket": { "tags": ["billing", 7], "urgent": true },
        });
        let mut terms = input_terms(&input);
        terms.sort();
        assert_eq!(terms, ["billing", "please", "refund"]);
    }

    #[test]
    fn context_is_cut_at_its_limit_on_a_character_boundary() {
        let big = KbDocument {
            collection: "c".into(),
            title: "t".into(),
            version: 1,
            content: "é".repeat(MOST_CONTEXT_BYTES),
        };
        let text = with_context("p".into(), &[big]);
        assert!(text.ends_with("[cut]\n"));
        assert!(text.len() < MOST_CONTEXT_BYTES + 200);
    }
}
