//! The Anthropic messages provider: structured output through a forced tool
//! call whose input schema is the recipe's output schema. Error classes,
//! `Retry-After` and the repair request are the same as the OpenAI-compatible
//! provider's (`openai.rs`).

use serde_json::{Value, json};

use crate::error::{ErrorKind, StepError};
use crate::llm::{ProviderConfig, http_client};
use crate::openai::{
    Answer, SYSTEM_PROMPT, answer_with_repair, excerpt, schema_name, send_for_json,
};
use crate::services::{BoxFuture, Provider, RecipeCall};

pub struct AnthropicProvider {
    client: reqwest::Client,
    config: ProviderConfig,
}

impl AnthropicProvider {
    pub fn new(config: ProviderConfig) -> Result<AnthropicProvider, String> {
        Ok(AnthropicProvider {
            client: http_client(&config)?,
            config,
        })
    }

    async fn message(
        &self,
        call: &RecipeCall<'_>,
        conversation: &[Value],
    ) -> Result<Answer, StepError> {
        let model = self.config.model(call.model);
        let tool = schema_name(call.recipe);
        let body = json!({
            "model": model,
            "max_tokens": 4096,
            "system": SYSTEM_PROMPT,
            "messages": conversation,
            "tools": [{ "name": tool, "description": "Give the answer.", "input_schema": crate::openai::wire_schema(call.output_schema) }],
            "tool_choice": { "type": "tool", "name": tool },
        });
        // The API's root, up to `/v1` or not: `/v1/v1/messages` is what the
        // base URL of an OpenAI-compatible API gave, a 404.
        let base = self.config.base_url.trim_end_matches('/');
        let url = format!("{}/v1/messages", base.strip_suffix("/v1").unwrap_or(base));
        let mut request = self
            .client
            .post(&url)
            .header("anthropic-version", "2023-06-01");
        let key = self.config.api_key.as_deref();
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        let (reply, text) = send_for_json(request, &url, key, &body, call).await?;
        let blocks = reply["content"].as_array().map_or(&[][..], Vec::as_slice);
        // Text in several blocks is one text, as the API means it.
        let texts: Vec<&str> = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
        let said = (!texts.is_empty()).then(|| texts.concat());
        if reply["stop_reason"] == "refusal" {
            return Ok(Answer::Refused(said.unwrap_or_default()));
        }
        // The forced tool call carries the answer; a text block is the model
        // ignoring the tool, which the repair request then addresses. Of
        // several tool calls the one named as forced is the answer; a call
        // of another name is taken only when there is no such call (its
        // input is then checked against the output schema like any answer).
        let calls = || blocks.iter().filter(|b| b["type"] == "tool_use");
        let answer = calls()
            .find(|b| b["name"] == tool.as_str())
            .or_else(|| calls().next())
            .map(|b| b["input"].to_string())
            .or(said);
        match (answer, reply["stop_reason"] == "max_tokens") {
            (answer, true) => Ok(Answer::Stopped {
                text: answer.unwrap_or_default(),
                why: "the output limit cut it off (stop_reason `max_tokens`)",
            }),
            (Some(answer), false) => Ok(Answer::Text(answer)),
            (None, false) if blocks.is_empty() => Err(StepError::new(
                ErrorKind::Server,
                format!("the reply has no content: {}", excerpt(&text)),
            )),
            // Blocks, none of them text or a tool call (an audit: an image
            // alone was "no content").
            (None, false) => {
                let mut kinds: Vec<String> = blocks
                    .iter()
                    .map(|block| excerpt(block["type"].as_str().unwrap_or("no type")))
                    .collect();
                kinds.sort();
                kinds.dedup();
                Err(StepError::new(
                    ErrorKind::Server,
                    format!(
                        "the reply has no text and no call of the tool `{tool}`, only blocks of {}: {}",
                        kinds.join(", "),
                        excerpt(&text)
                    ),
                ))
            }
        }
    }
}

impl Provider for AnthropicProvider {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(answer_with_repair(call, move |conversation| {
            Box::pin(async move { self.message(call, &conversation).await })
        }))
    }

    fn check_models(&self, aliases: &[String]) -> Vec<String> {
        self.config.unknown_models(aliases)
    }
}
