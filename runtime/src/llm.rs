//! Choosing the model provider from the environment.
//!
//! * `FLOW_LLM_PROVIDER`: `openai` (the default: any OpenAI-compatible API)
//!   or `anthropic`.
//! * `FLOW_LLM_BASE_URL`: the API's address; for `openai` it is required and
//!   ends with `/v1`, for `anthropic` it defaults to `https://api.anthropic.com`.
//! * `FLOW_LLM_API_KEY` (or `OPENAI_API_KEY` / `ANTHROPIC_API_KEY`).
//! * `FLOW_LLM_MODEL`: the model behind the alias `default`;
//!   `FLOW_LLM_MODEL_<ALIAS>` for other aliases.
//!
//! Without a provider, drivers use the offline provider and say so.

use std::collections::HashMap;
use std::sync::Arc;

use crate::anthropic::AnthropicProvider;
use crate::openai::OpenAiProvider;
use crate::services::Provider;

/// Where a provider is and how to call it.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// For OpenAI-compatible APIs, up to and including `/v1` (e.g.
    /// `http://127.0.0.1:11434/v1` for Ollama); for Anthropic, the API root
    /// without `/v1` (`https://api.anthropic.com`).
    pub base_url: String,
    pub api_key: Option<String>,
    /// Model aliases (`model "default"` in recipes) to the provider's names.
    pub models: HashMap<String, String>,
}

impl ProviderConfig {
    /// The aliases of `aliases` this configuration does not map. With no
    /// aliases configured at all, every alias is passed on as a model name;
    /// once some are, a recipe naming another is a mistake to report before
    /// the run, not a 404 in the middle of it.
    pub(crate) fn unknown_models(&self, aliases: &[String]) -> Vec<String> {
        if self.models.is_empty() {
            return Vec::new();
        }
        let mut known: Vec<&str> = self.models.keys().map(String::as_str).collect();
        known.sort_unstable();
        aliases
            .iter()
            .filter(|alias| self.resolve(alias).is_none())
            // A concrete model id (`gpt-4o-mini`, `llama3.1`) is passed on as
            // it is; a plain word (`fast`, `smart`) is an alias to map.
            .filter(|alias| alias.chars().all(|c| c.is_ascii_alphabetic() || c == '_'))
            .map(|alias| {
                format!(
                    "model alias `{alias}` is not configured (the configured ones: {}); map it, e.g. FLOW_LLM_MODEL_{} for flow or [provider] models for flowd",
                    known.join(", "),
                    alias.to_ascii_uppercase()
                )
            })
            .collect()
    }

    /// The provider's name for a recipe's model alias.
    pub(crate) fn model(&self, alias: &str) -> String {
        self.resolve(alias).unwrap_or_else(|| alias.to_string())
    }

    /// The model an alias maps to, its case ignored (aliases from the
    /// environment are lowercased).
    fn resolve(&self, alias: &str) -> Option<String> {
        self.models.get(alias).cloned().or_else(|| {
            self.models
                .iter()
                .find(|(known, _)| known.eq_ignore_ascii_case(alias))
                .map(|(_, model)| model.clone())
        })
    }
}

/// The HTTP client of every provider, once its configuration holds up: a
/// base URL that cannot be called is a configuration error, said once, not a
/// connection failure that every step would retry.
pub(crate) fn http_client(config: &ProviderConfig) -> Result<reqwest::Client, String> {
    check_http_url(&config.base_url).map_err(|message| format!("the LLM base URL {message}"))?;
    if let Some(key) = &config.api_key {
        check_api_key(key).map_err(|message| format!("the LLM API key {message}"))?;
    }
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(10))
        // A provider's API does not redirect: one that does is a proxy or
        // a base URL gone wrong, and following it sent Anthropic's key
        // (`x-api-key`, which reqwest strips from no redirect) to the other
        // host, and a 301 or 302 turned the completion into a GET without
        // its prompt. The redirect is answered as the error it is, naming
        // where it points.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// `Err` says why `key` cannot go in an HTTP header, and where in it,
/// without showing it: most often the line break a key file or a secret
/// ended with, which made every request fail before it was sent.
pub fn check_api_key(key: &str) -> Result<(), String> {
    let Some((at, found)) = key
        .char_indices()
        .find(|&(_, c)| !(c == '\t' || (' '..='~').contains(&c)))
    else {
        return Ok(());
    };
    let what = match found {
        '\n' | '\r' => "a line break",
        c if c.is_control() => "a control character",
        _ => "a character outside ASCII",
    };
    let place = if at + found.len_utf8() == key.len() {
        "at its end".to_string()
    } else {
        format!("at character {}", key[..at].chars().count() + 1)
    };
    Err(format!(
        "holds {what} {place}, which an HTTP header cannot carry: remove it (a key read from a file often ends with a line break)"
    ))
}

/// `Err` says why `text` is not an http(s) URL with a host, naming it.
pub fn check_http_url(text: &str) -> Result<(), String> {
    match reqwest::Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => Ok(()),
        Ok(_) => Err(format!("`{text}` is not an http(s) address with a host")),
        Err(error) => Err(format!("`{text}` is not a URL: {error}")),
    }
}

/// A configured provider and its kind (`openai`, `anthropic`).
pub type Configured = (&'static str, Arc<dyn Provider>);

/// The configured provider and its kind, or `None` when none is
/// configured. An unknown provider name is an error.
pub fn provider_from_env() -> Result<Option<Configured>, String> {
    let kind = std::env::var("FLOW_LLM_PROVIDER").unwrap_or_else(|_| "openai".to_string());
    let base_url = std::env::var("FLOW_LLM_BASE_URL").ok();
    let models = models_from_env();
    match kind.as_str() {
        "openai" => {
            let Some(base_url) = base_url else {
                return Ok(None);
            };
            let api_key =
                key_from_env("FLOW_LLM_API_KEY").or_else(|| key_from_env("OPENAI_API_KEY"));
            let provider = OpenAiProvider::new(ProviderConfig {
                base_url,
                api_key,
                models,
            })?;
            Ok(Some(("openai", Arc::new(provider))))
        }
        "anthropic" => {
            let api_key =
                key_from_env("FLOW_LLM_API_KEY").or_else(|| key_from_env("ANTHROPIC_API_KEY"));
            let base_url = base_url.unwrap_or_else(|| "https://api.anthropic.com".to_string());
            let provider = AnthropicProvider::new(ProviderConfig {
                base_url,
                api_key,
                models,
            })?;
            Ok(Some(("anthropic", Arc::new(provider))))
        }
        other => Err(format!(
            "FLOW_LLM_PROVIDER is `{other}`; the providers are `openai` and `anthropic`"
        )),
    }
}

/// The key in variable `name`, if it holds one: an empty variable
/// (`FLOW_LLM_API_KEY=`) is no key, and hides no other. Taken as a key, it
/// sent `Authorization: Bearer` with nothing after it, hid
/// `OPENAI_API_KEY`, and a 401 blamed a key nobody set.
fn key_from_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|key| !key.is_empty())
}

fn models_from_env() -> HashMap<String, String> {
    let mut models = HashMap::new();
    for (name, value) in std::env::vars() {
        if name == "FLOW_LLM_MODEL" {
            models.insert("default".to_string(), value);
        } else if let Some(alias) = name.strip_prefix("FLOW_LLM_MODEL_") {
            models.insert(alias.to_ascii_lowercase(), value);
        }
    }
    models
}

#[cfg(test)]
mod alias_tests {
    use super::ProviderConfig;

    /// Regression: aliases from the environment are lowercased, so `Smart`
    /// in a recipe was reported unmapped; and a concrete model id failed
    /// preflight as soon as any alias was configured.
    #[test]
    fn aliases_match_without_case_and_model_ids_pass_through() {
        let config = ProviderConfig {
            base_url: "http://127.0.0.1:1/v1".into(),
            api_key: None,
            models: [("smart".to_string(), "big-model".to_string())].into(),
        };
        let asked = |alias: &str| config.unknown_models(&[alias.to_string()]);
        assert!(asked("Smart").is_empty());
        assert_eq!(config.model("SMART"), "big-model");
        assert!(asked("gpt-4o-mini").is_empty(), "an id is passed on");
        assert!(asked("llama3.1").is_empty());
        let unmapped = asked("fast");
        assert_eq!(unmapped.len(), 1);
        assert!(
            unmapped[0].contains("model alias `fast` is not configured"),
            "{unmapped:?}"
        );
    }
}
