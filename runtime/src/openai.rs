//! The OpenAI-compatible chat completions provider (OpenAI, Ollama, vLLM,
//! llama.cpp servers): structured output with the recipe's JSON Schema.
//!
//! Errors are classified for the interpreter's retry policy: 429 (with its
//! `Retry-After`), 5xx, timeouts and connection failures retry; other 4xx do
//! not. An answer that is not JSON, or does not fit the schema, is an
//! `invalid_output` error carrying the answer (`StepError::repairable`): the
//! interpreter makes one repair request as an attempt of its own (the
//! answer and its problem shown to the model); if that fails too, the step
//! fails at once with the raw text in its error. A refusal and an answer
//! cut short (the output limit, a content filter) are answers that do not
//! fit, and say so (`Answer`). A reply is read up to `MAX_REPLY_BYTES`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::error::{ErrorKind, StepError, with_causes};
use crate::fenced_body::{FencedBody, HoldLost};
use crate::llm::{ProviderConfig, http_client};
use crate::services::{BoxFuture, Provider, RecipeCall};
use crate::store::StoreError;

pub struct OpenAiProvider {
    client: reqwest::Client,
    config: ProviderConfig,
}

impl OpenAiProvider {
    pub fn new(config: ProviderConfig) -> Result<OpenAiProvider, String> {
        Ok(OpenAiProvider {
            client: http_client(&config)?,
            config,
        })
    }

    /// One chat completion; the content of the first choice.
    async fn chat(
        &self,
        call: &RecipeCall<'_>,
        conversation: &[Value],
    ) -> Result<Answer, StepError> {
        let (schema, strict) = strict_schema(&wire_schema(call.output_schema));
        let mut messages = vec![json!({ "role": "system", "content": SYSTEM_PROMPT })];
        messages.extend_from_slice(conversation);
        let body = json!({
            "model": self.config.model(call.model),
            "messages": messages,
            "response_format": {
                "type": "json_schema",
                "json_schema": { "name": schema_name(call.recipe), "schema": schema, "strict": strict },
            },
        });
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let mut request = self
            .client
            .post(&url)
            // The repair request has another body, so another key.
            .header(
                "Idempotency-Key",
                format!("{}:{}", call.call_id, conversation.len()),
            );
        let key = self.config.api_key.as_deref();
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let (reply, text) = send_for_json(request, &url, key, &body, call).await?;
        let choice = &reply["choices"][0];
        let content = answer_text(&choice["message"]);
        // Some servers send `"refusal": ""` beside every answer.
        if let Some(refusal) = choice["message"]["refusal"]
            .as_str()
            .filter(|refusal| !refusal.trim().is_empty())
        {
            return Ok(Answer::Refused(refusal.to_string()));
        }
        let stopped = match choice["finish_reason"].as_str() {
            Some("length") => Some("the output limit cut it off (finish_reason `length`)"),
            Some("content_filter") => {
                Some("the provider's content filter cut it off (finish_reason `content_filter`)")
            }
            _ => None,
        };
        match (content, stopped) {
            (content, Some(why)) => Ok(Answer::Stopped {
                text: content.unwrap_or_default(),
                why,
            }),
            (Some(content), None) => Ok(Answer::Text(content)),
            (None, None) => Err(StepError::new(
                ErrorKind::Server,
                format!("the reply has no message content: {}", excerpt(&text)),
            )),
        }
    }
}

/// An answer's text in the shapes OpenAI-compatible servers give it: a
/// string; a list of text parts, joined; a JSON value itself, where a
/// server parsed the structured output for the client; or, with no
/// content, the first tool call's arguments (servers that give structured
/// output through a tool). Read as a server error and retried, each of
/// these cost a whole completion again and failed the same way.
fn answer_text(message: &Value) -> Option<String> {
    let content = &message["content"];
    let text = match content {
        Value::String(text) if !text.is_empty() => Some(text.clone()),
        Value::Array(parts) if !parts.is_empty() && parts.iter().all(|p| p["text"].is_string()) => {
            Some(parts.iter().filter_map(|p| p["text"].as_str()).collect())
        }
        Value::Array(_) | Value::Object(_) => Some(content.to_string()),
        _ => None,
    };
    text.or_else(|| {
        message["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .map(str::to_string)
    })
    .or_else(|| content.as_str().map(str::to_string))
}

/// `text` with `key` hidden wherever it is written: as is, escaped in a
/// JSON string (`/` as `\/`, `"` as `\"`), or percent-encoded in a URL, as
/// a server echoing a request may write it. A key shorter than
/// [`KEY_HIDDEN_ANYWHERE`] is hidden only where it stands as a whole word:
/// hidden inside words too, `test` would mask every "test" of a message,
/// but shown, a short key (`sk-test`, a test suite's) was printed in the
/// error, the trace and the store.
fn without_key(mut text: String, key: &str) -> String {
    if key.is_empty() {
        return text;
    }
    let json = serde_json::to_string(key).unwrap_or_default();
    let json = json.trim_matches('"').to_string();
    let slashes = json.replace('/', "\\/");
    let (mut upper, mut lower) = (String::new(), String::new());
    for byte in key.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            upper.push(byte as char);
            lower.push(byte as char);
        } else {
            upper.push_str(&format!("%{byte:02X}"));
            lower.push_str(&format!("%{byte:02x}"));
        }
    }
    let anywhere = key.len() >= KEY_HIDDEN_ANYWHERE;
    for form in [key, &json, &slashes, &upper, &lower] {
        if !text.contains(form) {
            continue;
        }
        text = if anywhere {
            text.replace(form, "[the API key]")
        } else {
            replace_words(&text, form, "[the API key]")
        };
    }
    text
}

/// Keys at least this long are hidden wherever they appear, inside words
/// too, and in answers as in errors (real keys are long, and no word of a
/// message holds one by chance).
const KEY_HIDDEN_ANYWHERE: usize = 8;

/// `text` with each occurrence of `word` that no letter, digit, `-` or `_`
/// touches on either side replaced by `with`.
fn replace_words(text: &str, word: &str, with: &str) -> String {
    let in_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_');
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    for (at, _) in text.match_indices(word) {
        if at < rest {
            continue;
        }
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        if in_word(before) || in_word(after) {
            continue;
        }
        out.push_str(&text[rest..at]);
        out.push_str(with);
        rest = at + word.len();
    }
    out.push_str(&text[rest..]);
    out
}

/// What a model gave back for an answer.
pub(crate) enum Answer {
    /// Its text, read as the recipe's output.
    Text(String),
    /// A refusal, in the model's words: never read as the output.
    Refused(String),
    /// Text the model stopped giving early, and why in words for the error
    /// and the repair request (an output limit, a content filter). Never
    /// read as the output, though it may parse: text cut inside a string
    /// (`"summary": "The printer is on fi"` closed by a server's structured
    /// output) or filtered is not the answer the model meant.
    Stopped { text: String, why: &'static str },
}

impl Provider for OpenAiProvider {
    fn complete<'a>(&'a self, call: &'a RecipeCall<'a>) -> BoxFuture<'a, Result<Value, StepError>> {
        Box::pin(answer_with_repair(call, move |conversation| {
            Box::pin(async move { self.chat(call, &conversation).await })
        }))
    }

    fn check_models(&self, aliases: &[String]) -> Vec<String> {
        self.config.unknown_models(aliases)
    }
}

/// The schema in OpenAI's strict form, and whether strict mode can hold it.
/// Strict mode wants every property listed in `required` (an optional one is
/// already `anyOf` with null, so listing it keeps its meaning) and admits no
/// schema without a type; a `json` field (`{}`) therefore turns strict mode
/// off, and the answer is still validated against the schema afterwards.
fn strict_schema(schema: &Value) -> (Value, bool) {
    let Value::Object(map) = schema else {
        return (schema.clone(), true);
    };
    if map.is_empty() {
        return (schema.clone(), false);
    }
    let mut out = map.clone();
    let mut strict = true;
    let mut convert = |value: &Value| {
        let (value, ok) = strict_schema(value);
        strict &= ok;
        value
    };
    if let Some(Value::Object(properties)) = map.get("properties") {
        let converted: serde_json::Map<String, Value> = properties
            .iter()
            .map(|(name, property)| (name.clone(), convert(property)))
            .collect();
        let names = converted.keys().map(|k| Value::String(k.clone())).collect();
        out.insert("properties".into(), Value::Object(converted));
        out.insert("required".into(), Value::Array(names));
    }
    if let Some(items) = map.get("items") {
        out.insert("items".into(), convert(items));
    }
    if let Some(Value::Array(alternatives)) = map.get("anyOf") {
        out.insert(
            "anyOf".into(),
            Value::Array(alternatives.iter().map(&mut convert).collect()),
        );
    }
    (Value::Object(out), strict)
}

/// What every provider tells the model, besides the schema it enforces.
pub(crate) const SYSTEM_PROMPT: &str =
    "Answer with a single JSON value that matches the given JSON Schema.";

/// Asks for an answer: the prompt, or for a repair request (`call.repair`)
/// the prompt, the answer that did not fit and what was wrong with it. An
/// answer that is not JSON or does not fit the schema is an `invalid_output`
/// error; the first one carries the answer, so that the interpreter can ask
/// for the repair. `chat` takes the conversation (user and assistant
/// messages) and returns the model's text.
pub(crate) async fn answer_with_repair<'a, F>(
    call: &'a RecipeCall<'a>,
    chat: F,
) -> Result<Value, StepError>
where
    F: Fn(Vec<Value>) -> BoxFuture<'a, Result<Answer, StepError>>,
{
    let mut conversation = vec![json!({ "role": "user", "content": call.prompt })];
    if let Some(repair) = &call.repair {
        // An answer with no text (a refusal, an answer cut off before it
        // began) is still a turn: Anthropic's API refuses an empty
        // message, which turned the repair into a 400 that hid the cause.
        let answered = if repair.answer.trim().is_empty() {
            "(no answer)"
        } else {
            repair.answer.as_str()
        };
        conversation.push(json!({ "role": "assistant", "content": answered }));
        conversation.push(json!({
            "role": "user",
            "content": format!("That answer is not valid: {}. Answer again with JSON only, matching the schema.", repair.problem),
        }));
    }
    // A refusal or an answer cut short is an answer that does not fit, and
    // says so: the repair request tells the model why, as for any other.
    let (text, problem) = match chat(conversation).await? {
        Answer::Text(text) => match parse_and_check(&text, call.output_schema) {
            Ok(output) => return Ok(output),
            Err(problem) => (text, problem),
        },
        Answer::Stopped { text, why } => match parse_and_check(&text, call.output_schema) {
            Ok(_) => (text, why.to_string()),
            Err(problem) => (text, format!("{why}; {problem}")),
        },
        Answer::Refused(text) => (text, "it is a refusal, not an answer".to_string()),
    };
    Err(match call.repair {
        Some(_) => StepError::new(
            ErrorKind::InvalidOutput,
            format!(
                "the output is invalid after one repair ({problem}); raw text: {}",
                excerpt(&text)
            ),
        ),
        None => {
            let mut error = StepError::new(
                ErrorKind::InvalidOutput,
                format!(
                    "the output is invalid ({problem}); raw text: {}",
                    excerpt(&text)
                ),
            );
            error.repairable = Some(crate::services::Repair {
                // Sent back in the repair request: an answer of megabytes
                // (a model gone on and on) is not sent back whole.
                answer: flow_plan::cut(&text, REPAIR_ANSWER_CHARS),
                problem,
            });
            error
        }
    })
}

/// The most of an answer that did not fit that its repair request sends
/// back: far past any answer that fits a recipe's output.
const REPAIR_ANSWER_CHARS: usize = 64 * 1024;

/// The schema a provider is sent for a recipe's output `schema`: as it is
/// when it is an object's, else inside one (`{"value": ...}`), since
/// OpenAI's strict structured output and Anthropic's tool input take an
/// object at the root and refuse the request (a 400, not retried) for a
/// recipe whose output is a `string` or a `list<...>`.
pub(crate) fn wire_schema(schema: &Value) -> std::borrow::Cow<'_, Value> {
    if schema.get("type").and_then(Value::as_str) == Some("object") {
        return std::borrow::Cow::Borrowed(schema);
    }
    std::borrow::Cow::Owned(json!({
        "type": "object",
        "properties": { WIRE_VALUE: schema },
        "required": [WIRE_VALUE],
        "additionalProperties": false,
    }))
}

/// The field of `wire_schema`'s object that holds a non-object answer.
const WIRE_VALUE: &str = "value";

fn parse_and_check(text: &str, schema: &Value) -> Result<Value, String> {
    let mut value: Value =
        serde_json::from_str(unfenced(text)).map_err(|e| format!("not JSON: {e}"))?;
    // A non-object answer comes in `wire_schema`'s object, looked into
    // first: a schema the object itself would fit (`json`'s `{}`) must not
    // take the wrapper for the answer. A model that was not held to the
    // schema may answer bare, which is taken too.
    if let Some(inner) = wire_value(schema, &value) {
        let mut inner = inner.clone();
        crate::schema::whole_floats_to_integers(schema, &mut inner);
        if crate::schema::validate(schema, &inner).is_empty() {
            return Ok(inner);
        }
    }
    crate::schema::whole_floats_to_integers(schema, &mut value);
    let mismatches = crate::schema::validate(schema, &value);
    if mismatches.is_empty() {
        Ok(value)
    } else {
        Err(mismatches.to_string())
    }
}

/// The answer inside `wire_schema`'s object, when `schema` is not an
/// object's and `value` is that object.
fn wire_value<'v>(schema: &Value, value: &'v Value) -> Option<&'v Value> {
    if schema.get("type").and_then(Value::as_str) == Some("object") {
        return None;
    }
    match value.as_object() {
        Some(fields) if fields.len() == 1 => fields.get(WIRE_VALUE),
        _ => None,
    }
}

/// `text` without the Markdown code fence that models without structured
/// output (Ollama's, llama.cpp's, a model ignoring the schema) put around
/// JSON: "```json", the JSON, "```". What is inside is still parsed and
/// checked against the schema; only the fence costs no repair request.
/// A reasoning model's thoughts before the answer (`<think>...</think>`,
/// as Ollama's DeepSeek-R1 and Qwen3 write them) are left out too.
fn unfenced(text: &str) -> &str {
    let mut text = text.trim();
    if let Some(thinking) = text.strip_prefix("<think>")
        && let Some((_, answer)) = thinking.split_once("</think>")
    {
        text = answer.trim();
    }
    let Some(opened) = text.strip_prefix("```") else {
        return text;
    };
    // The opening line may name the language (`json`, `JSON`), nothing more.
    let Some((language, rest)) = opened.split_once('\n') else {
        return text;
    };
    if !language.trim().chars().all(|c| c.is_ascii_alphanumeric()) {
        return text;
    }
    match rest.trim_end().strip_suffix("```") {
        Some(inside) => inside.trim(),
        None => text,
    }
}

/// Sends a provider request with `body` as its JSON: the reply as JSON and
/// as text (for messages), or the error class the retry policy needs
/// (status, `Retry-After`, transport failure, a body that is not JSON). In
/// a run whose hold can be lost, the body goes out only while the hold is
/// live (`FencedBody`). A body refused because the hold ran out unrenewed
/// (this process stalled after the attempt's `admit`) was not sent: the
/// hold is asked again (`Journal::admit` renews it) and the request sent
/// anew, so that a slow moment costs no attempt of the step's budget; a
/// hold the store took away is the journal's lost lease.
///
/// Errors name the URL with any password in it masked, and never hold
/// `key`, the request's API key, should the server quote it back.
pub(crate) async fn send_for_json(
    request: reqwest::RequestBuilder,
    url: &str,
    key: Option<&str>,
    body: &Value,
    call: &RecipeCall<'_>,
) -> Result<(Value, String), StepError> {
    /// Renewals after a refused body before the call gives up: each one
    /// makes the hold live for most of a lease, so a second refusal means
    /// the process keeps stalling for that long.
    const RENEWALS: usize = 2;
    let url = &crate::mcp::masked_url(url);
    let request = request.header(reqwest::header::CONTENT_TYPE, "application/json");
    let body = body.to_string();
    let hold = call.journal.and_then(|journal| journal.hold());
    let say = |stage: String| {
        if let Some(progress) = call.progress {
            progress.say(stage);
        }
    };
    let unanswered = format!("{url} had sent no reply, not even its headers");
    say(unanswered.clone());
    let mut renewals = 0;
    let response = loop {
        // A request without its body yet can be copied, unless it holds
        // an error (a header value it could not take), which is said.
        let Some(attempt) = request.try_clone() else {
            let why = request
                .build()
                .err()
                .map_or_else(|| "it could not be copied".to_string(), |e| with_causes(&e));
            return Err(StepError::new(
                ErrorKind::Client,
                format!("the request to {url} could not be made: {why}"),
            ));
        };
        let attempt = match &hold {
            Some(hold) => attempt.body(reqwest::Body::wrap(FencedBody::new(
                body.clone().into_bytes(),
                Arc::clone(hold),
            ))),
            None => attempt.body(body.clone()),
        };
        match attempt.send().await {
            Ok(response) => break response,
            Err(error) if refused_by_fence(&error) => {
                let journal = call.journal.filter(|_| renewals < RENEWALS);
                match journal {
                    Some(journal) if !hold.as_ref().is_some_and(|hold| hold.is_lost()) => {
                        renewals += 1;
                        // Not the model's wait: a timeout here says so.
                        say(format!(
                            "the request to {url} was not sent yet: the run's hold on its journal was being renewed after this process had stalled"
                        ));
                        journal.admit().await?;
                        say(unanswered.clone());
                    }
                    _ => return Err(StoreError::LeaseLost.into()),
                }
            }
            Err(error) => return Err(transport_error(url, error)),
        }
    };
    let status = response.status();
    say(format!(
        "{url} answered {status}, but the rest of its reply had not arrived"
    ));
    if status.is_redirection() {
        return Err(redirect_error(url, status, response.headers()));
    }
    let wait = retry_after(response.headers());
    // An error's status says what it is and whether it is retried, even
    // when its body cannot be read: a 401 whose body was cut off or too
    // long was retried as a server's failure, and a 429's wait was lost.
    let mut text = match reply_text(response, url).await {
        Ok(text) => text,
        Err(unread) if !status.is_success() => format!("(its body not read: {})", unread.message),
        Err(unread) => return Err(unread),
    };
    // A short key is hidden in an error's text only: in an answer, a
    // placeholder key (`none`, `1`) would change the answer itself.
    if let Some(key) = key.filter(|key| !status.is_success() || key.len() >= KEY_HIDDEN_ANYWHERE) {
        text = without_key(text, key);
    }
    if !status.is_success() {
        let mut error = status_error(url, status, wait, &text);
        error.message.push_str(match (status.as_u16(), key) {
            (401 | 403, None) => " (no API key is set: FLOW_LLM_API_KEY or the provider's own, OPENAI_API_KEY or ANTHROPIC_API_KEY; flowd's [provider] api_key)",
            (401, Some(_)) => " (the provider refused the API key)",
            // A provider's 404 for a model it does not serve names it.
            (404, _) if text.contains("model") => " (check the model's name: FLOW_LLM_MODEL, or flowd's [provider] models)",
            (404, _) => " (check the provider's base URL: an OpenAI-compatible API's ends in `/v1`, Anthropic's does not)",
            _ => "",
        });
        return Err(error);
    }
    let reply = reply_json(url, &text)?;
    if let Some(mut error) = error_in_reply(url, &reply, &text) {
        error.retry_after = wait;
        return Err(error);
    }
    Ok((reply, text))
}

/// The error a provider put in a reply of status 200, as proxies and some
/// servers do (`{"error": {...}}`; Anthropic's `{"type": "error", ...}`,
/// which a streamed reply ends with): classified as its status would be,
/// from its code or its type. Read as an answer without content, it was
/// retried as a server's failure whatever it said (an audit).
fn error_in_reply(url: &str, reply: &Value, text: &str) -> Option<StepError> {
    let error = reply.get("error").filter(|error| !error.is_null())?;
    if reply.get("choices").is_some() || reply.get("content").is_some() {
        return None;
    }
    let kind_word = error["type"].as_str().or_else(|| error["code"].as_str());
    let status = [&error["code"], &error["status"]]
        .into_iter()
        .find_map(|code| {
            code.as_u64()
                .or_else(|| code.as_str().and_then(|code| code.parse().ok()))
        })
        .filter(|code| (400..600).contains(code))
        .map(|code| code as u16)
        .or_else(|| {
            Some(match kind_word? {
                "invalid_request_error" => 400,
                "authentication_error" | "invalid_api_key" => 401,
                "permission_error" => 403,
                "not_found_error" | "model_not_found" => 404,
                "request_too_large" => 413,
                "rate_limit_error" | "rate_limit_exceeded" | "insufficient_quota" => 429,
                "overloaded_error" => 529,
                _ => return None,
            })
        });
    let kind = status.map_or(ErrorKind::Server, ErrorKind::of_status);
    let said = match (status, kind_word) {
        (Some(status), Some(word)) => format!(" ({word}, as a {status})"),
        (Some(status), None) => format!(" (as a {status})"),
        (None, Some(word)) => format!(" ({word})"),
        (None, None) => String::new(),
    };
    Some(StepError::new(
        kind,
        format!(
            "{url} answered 200 OK with an error{said}: {}",
            excerpt(text)
        ),
    ))
}

/// A provider's redirect, refused (the client follows none): where it
/// points, for the base URL to be set to it if it is right.
fn redirect_error(
    url: &str,
    status: reqwest::StatusCode,
    headers: &reqwest::header::HeaderMap,
) -> StepError {
    let to = headers
        .get(reqwest::header::LOCATION)
        .and_then(|to| to.to_str().ok())
        .map_or_else(
            || "no `Location`".to_string(),
            |to| format!("`{}`", excerpt(&crate::mcp::masked_url(to))),
        );
    StepError::new(
        ErrorKind::Client,
        format!(
            "{url} answered {status}, a redirect to {to}, which is not followed (a provider's API does not redirect; the key would go with it): check the provider's base URL"
        ),
    )
}

/// The most of a provider's reply that is read. An answer is a few
/// kilobytes; a reply that kept coming (a broken proxy, a server sending
/// without end) grew the process's memory, every other run's with it,
/// until the step's timeout.
pub(crate) const MAX_REPLY_BYTES: usize = 16 << 20;

/// A reply's body as text, read no further than [`MAX_REPLY_BYTES`]; past
/// them, a server error (retried as one).
async fn reply_text(mut response: reqwest::Response, url: &str) -> Result<String, StepError> {
    let too_long = || {
        StepError::new(
            ErrorKind::Server,
            format!(
                "{url} answered with more than {} MiB: no model's answer is that long, so it was not read further",
                MAX_REPLY_BYTES >> 20
            ),
        )
    };
    if response
        .content_length()
        .is_some_and(|length| length > MAX_REPLY_BYTES as u64)
    {
        return Err(too_long());
    }
    // The client asks for no compression (it reads none); a body
    // compressed anyway read as "not JSON", with its binary quoted. An
    // error's status still says what it is (and whether it is retried).
    if let Some(encoding) = response
        .headers()
        .get(reqwest::header::CONTENT_ENCODING)
        .filter(|encoding| !encoding.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        let encoding = excerpt(&String::from_utf8_lossy(encoding.as_bytes()));
        if !response.status().is_success() {
            return Ok(format!("(a body compressed with `{encoding}`, not read)"));
        }
        return Err(StepError::new(
            ErrorKind::Client,
            format!(
                "{url} answered compressed (`Content-Encoding: {encoding}`), though flow asks for no compression and reads none: set the provider, or a proxy before it, not to compress its replies"
            ),
        ));
    }
    let answered = response.status();
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| transport_error(url, error))?
    {
        if body.len() + chunk.len() > MAX_REPLY_BYTES {
            return Err(too_long());
        }
        body.extend_from_slice(&chunk);
    }
    match String::from_utf8(body) {
        Ok(text) => Ok(text),
        // JSON is UTF-8: an answer that is not was damaged on its way,
        // and read with U+FFFD in place of its bytes it became a step's
        // output that nobody sent (an audit). An error's body is only
        // quoted, as `Response::text` reads it.
        Err(error) if answered.is_success() => Err(StepError::new(
            ErrorKind::Server,
            format!(
                "{url} answered {answered} with a body that is not UTF-8 (at byte {}), as JSON always is",
                error.utf8_error().valid_up_to()
            ),
        )),
        Err(error) => Ok(String::from_utf8_lossy(error.as_bytes()).into_owned()),
    }
}

/// Whether `error` is a body that `FencedBody` refused (nothing of it sent).
fn refused_by_fence(error: &reqwest::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if error.is::<HoldLost>() {
            return true;
        }
        cause = error.source();
    }
    false
}

fn reply_json(url: &str, text: &str) -> Result<Value, StepError> {
    // A byte-order mark is no part of JSON, but some servers send one.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    serde_json::from_str(text).map_err(|e| {
        StepError::new(
            ErrorKind::Server,
            format!(
                "{url} answered with what is not JSON ({e}): {}",
                excerpt(text)
            ),
        )
    })
}

/// The error for a non-success HTTP status, classified for retries.
pub(crate) fn status_error(
    url: &str,
    status: reqwest::StatusCode,
    retry_after: Option<Duration>,
    text: &str,
) -> StepError {
    let kind = ErrorKind::of_status(status.as_u16());
    // Anthropic's 529 has no name in the HTTP registry, and showed as
    // "529 <unknown status code>".
    let status_said = match (status.as_u16(), status.canonical_reason()) {
        (529, _) => "529 Overloaded".to_string(),
        (code, Some(reason)) => format!("{code} {reason}"),
        (code, None) => code.to_string(),
    };
    let mut error = StepError::new(
        kind,
        format!("{url} answered {status_said}: {}", excerpt(text)),
    );
    error.retry_after = retry_after;
    error
}

/// The wait a provider's reply asks for before the next try:
/// `retry-after-ms` (OpenAI's and Azure's, to the millisecond) if it has
/// one, else `Retry-After` as delay-seconds or an HTTP-date in any of its
/// forms (a date already past asks for no wait). Seconds with a fraction
/// (`1.5`) are not HTTP's but some servers send them, and meaning them is
/// better than retrying before the provider asked. Anything else is
/// ignored, and the backoff decides.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let header = |name: &str| Some(headers.get(name)?.to_str().ok()?.trim());
    let seconds = |text: &str| {
        let seconds: f64 = text.parse().ok()?;
        // `parse` takes `inf` and `NaN` too. A wait longer than a
        // `Duration` holds is the longest one (held to the backoff's MAX
        // like any long wait), not none: dropped, it was retried at MIN.
        (seconds.is_finite() && seconds >= 0.0)
            .then(|| Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
    };
    if let Some(wait) = header("retry-after-ms").and_then(|ms| seconds(ms).map(|d| d / 1000)) {
        return Some(wait);
    }
    let value = header("retry-after")?;
    if let Some(wait) = seconds(value) {
        return Some(wait);
    }
    let at = crate::time::http_date_secs(value)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

/// A request that got no whole answer, saying why (reqwest's own words,
/// "error sending request", say only that it failed).
pub(crate) fn transport_error(url: &str, error: reqwest::Error) -> StepError {
    let refused = tls_refused(&error);
    let kind = if error.is_timeout() {
        ErrorKind::Timeout
    } else if refused.is_some() {
        // Retrying would meet the same server: three attempts and their
        // backoff spent on an error that cannot change.
        ErrorKind::Client
    } else {
        ErrorKind::Connection
    };
    // Connected, then cut off before any answer.
    let cut_off = !error.is_connect();
    // An answer begun, its status read, then cut off: the server spoke
    // HTTP (an audit: the TLS hint below came after a `200 OK`).
    let answering = error.is_body() || error.is_decode();
    // reqwest names the URL itself, password and all, in some errors.
    let why = with_causes(&error.without_url());
    let mut error = if answering {
        StepError::new(
            kind,
            format!("{url}: the answer was cut off as it was read: {why}"),
        )
    } else {
        StepError::new(kind, format!("{url}: {why}"))
    };
    error.message.push_str(match refused {
        Some(TlsRefused::Certificate) => {
            " (the server's certificate was refused, which another attempt would not change; an authority of your own is trusted through SSL_CERT_FILE)"
        }
        Some(TlsRefused::NotTls) => {
            " (the server answered without TLS: if it serves plain HTTP, its base URL starts with `http://`)"
        }
        // A server that speaks TLS cuts a plain request off (an audit:
        // three attempts of "connection reset" and no word why).
        None if kind == ErrorKind::Connection
            && url.starts_with("http://")
            && cut_off
            && !answering =>
        {
            " (if the server speaks TLS, as most hosted APIs do, its base URL starts with `https://`)"
        }
        None => "",
    });
    error
}

/// Why a TLS handshake failed for good.
enum TlsRefused {
    /// The server's certificate was refused (signed by an authority not
    /// trusted, expired, for another name, or none shown).
    Certificate,
    /// What came back was no TLS at all: an `https://` URL of a server
    /// that speaks plain HTTP.
    NotTls,
}

/// Whether the TLS handshake failed in a way another attempt would meet
/// again, and which.
fn tls_refused(error: &reqwest::Error) -> Option<TlsRefused> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(mut inner) = cause {
        // An `io::Error`'s `source` skips the error it wraps, which is
        // where the TLS library's error sits (in an `io::Error` of its
        // own, inside the connector's).
        while let Some(wrapped) = inner
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            inner = wrapped;
        }
        match inner.downcast_ref::<rustls::Error>() {
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented) => {
                return Some(TlsRefused::Certificate);
            }
            Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) => {
                return Some(TlsRefused::NotTls);
            }
            _ => {}
        }
        cause = inner.source();
    }
    None
}

/// Schema and tool names allow `[a-zA-Z0-9_-]` only.
pub(crate) fn schema_name(recipe: &str) -> String {
    recipe
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The start of a server's text, on one line and inert: its control
/// characters escaped (`\n`, `\u{1b}`), so that an HTML page or a
/// terminal's escape sequences in an error print as text in a terminal,
/// a trace or a log.
pub(crate) fn excerpt(text: &str) -> String {
    flow_plan::inert(&flow_plan::cut(text, 501)).into_owned()
}

#[cfg(test)]
mod tests {
    /// Regression: `Retry-After: 1.5` and `retry-after-ms` were ignored, and
    /// the step retried after its backoff, before the provider asked.
    #[test]
    fn every_form_of_a_wait_a_provider_asks_for_is_understood() {
        use std::time::Duration;
        let wait = |headers: &[(&'static str, &str)]| {
            let mut map = reqwest::header::HeaderMap::new();
            for (name, value) in headers {
                map.insert(*name, value.parse().unwrap());
            }
            super::retry_after(&map)
        };
        assert_eq!(wait(&[("retry-after", "3")]), Some(Duration::from_secs(3)));
        assert_eq!(
            wait(&[("retry-after", " 1.5 ")]),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            wait(&[("retry-after-ms", "250"), ("retry-after", "1")]),
            Some(Duration::from_millis(250)),
            "the finer of the two is taken"
        );
        assert_eq!(
            wait(&[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")]),
            Some(Duration::ZERO),
            "a date past asks for no wait"
        );
        assert_eq!(
            wait(&[("retry-after", "Sunday, 06-Nov-94 08:49:37 GMT")]),
            Some(Duration::ZERO)
        );
        assert!(
            wait(&[("retry-after", "Fri Jan  1 00:00:00 2100")])
                .is_some_and(|wait| wait > Duration::from_secs(86_400 * 365))
        );
        // Regression (an audit): a wait longer than a `Duration` holds was
        // dropped, and the step retried at the backoff's MIN.
        for endless in ["99999999999999999999", "1e30"] {
            assert_eq!(
                wait(&[("retry-after", endless)]),
                Some(Duration::MAX),
                "{endless}"
            );
        }
        for ignored in ["-1", "NaN", "inf", "1e400", "soon", ""] {
            assert_eq!(wait(&[("retry-after", ignored)]), None, "{ignored:?}");
        }
        assert_eq!(
            wait(&[("retry-after-ms", "NaN"), ("retry-after", "2")]),
            Some(Duration::from_secs(2))
        );
    }

    /// Regression: a server that echoed the key inside a JSON string
    /// (`sk-A\/B\"C`) or a URL (`sk-A%2FB`) had it shown in the error, the
    /// trace and the store; only the key as is was hidden.
    #[test]
    fn the_key_is_hidden_in_each_form_a_server_echoes_it() {
        let key = "sk-A/B\"C+D";
        let echoed =
            r#"{"error":"bad key sk-A\/B\"C+D, sk-A/B\"C+D, sk-A%2FB%22C%2BD, sk-A%2fB%22C%2bD"}"#;
        let hidden = super::without_key(echoed.to_string(), key);
        assert!(!hidden.contains("sk-A"), "{hidden}");
        assert_eq!(hidden.matches("[the API key]").count(), 4, "{hidden}");
    }

    /// Regression (an audit): a key shorter than 8 characters (`sk-test`)
    /// was not hidden at all, and a 401 that quoted it had it shown by
    /// `flow run --json`, `flow show` and the store. A short key is hidden
    /// where it stands as a word, and left inside other words.
    #[test]
    fn a_short_key_is_hidden_where_it_stands_as_a_word() {
        let hidden = super::without_key(
            r#"{"error":"key sk-test refused", "key": "sk-test", "test": "sk-tests"}"#.to_string(),
            "sk-test",
        );
        assert_eq!(
            hidden,
            r#"{"error":"key [the API key] refused", "key": "[the API key]", "test": "sk-tests"}"#
        );
        let hidden = super::without_key("a test of test".to_string(), "test");
        assert_eq!(hidden, "a [the API key] of [the API key]");
        assert_eq!(super::without_key("contest".to_string(), "test"), "contest");
    }

    /// Regression (an audit): an error in a reply of status 200 was read
    /// as an answer without content and retried as a server's failure
    /// whatever it said. It is classified as its code or type says.
    #[test]
    fn an_error_in_a_reply_of_200_is_classified_as_its_status() {
        let kind = |reply: Value| {
            super::error_in_reply("u", &reply, &reply.to_string()).map(|error| error.kind)
        };
        let anthropic =
            |ty: &str| json!({ "type": "error", "error": { "type": ty, "message": "m" } });
        assert_eq!(kind(anthropic("overloaded_error")), Some(ErrorKind::Server));
        assert_eq!(
            kind(anthropic("rate_limit_error")),
            Some(ErrorKind::RateLimited)
        );
        assert_eq!(
            kind(anthropic("invalid_request_error")),
            Some(ErrorKind::Client)
        );
        assert_eq!(kind(anthropic("something_new")), Some(ErrorKind::Server));
        assert_eq!(
            kind(json!({ "error": { "message": "m", "code": 502 } })),
            Some(ErrorKind::Server)
        );
        assert_eq!(
            kind(json!({ "error": { "message": "m", "code": "401" } })),
            Some(ErrorKind::Client)
        );
        assert_eq!(
            kind(json!({ "error": "went wrong" })),
            Some(ErrorKind::Server)
        );
        assert_eq!(kind(json!({ "choices": [], "error": null })), None);
        assert_eq!(
            kind(json!({ "choices": [{}], "error": { "code": 500 } })),
            None
        );
        let said = super::error_in_reply("u", &anthropic("overloaded_error"), "t").unwrap();
        assert_eq!(
            said.message,
            "u answered 200 OK with an error (overloaded_error, as a 529): t"
        );
    }

    use super::*;

    /// A server's text in an error is inert: a terminal's escape sequences
    /// (clear the screen, retitle the window, print a fake "completed") and
    /// an HTML page's lines print as text, on one line.
    #[test]
    fn an_excerpt_escapes_control_characters() {
        let shown = excerpt("\u{1b}[2J\u{1b}]0;pwned\u{7}<html>\n<body>\r\n\tbad</body>");
        assert_eq!(
            shown,
            "\\u{1b}[2J\\u{1b}]0;pwned\\u{7}<html>\\n<body>\\r\\n\\tbad</body>"
        );
        let long = "é".repeat(600);
        assert_eq!(excerpt(&long).chars().count(), 501, "cut at 500 and marked");
    }

    #[test]
    fn a_fenced_answer_is_read_inside_its_fence() {
        let cases = [
            ("```json\n{\"a\": 1}\n```", "{\"a\": 1}"),
            ("  ```\n[1, 2]\n```  \n", "[1, 2]"),
            ("```JSON\r\n{}\r\n```", "{}"),
            // Not a fence around the whole answer: left as it is.
            ("{\"a\": \"```\"}", "{\"a\": \"```\"}"),
            ("```json {\"a\": 1}```", "```json {\"a\": 1}```"),
            ("```json\n{\"a\": 1}", "```json\n{\"a\": 1}"),
            (
                "Here it is: ```json\n{}\n```",
                "Here it is: ```json\n{}\n```",
            ),
            // A reasoning model's thoughts first, fenced or not after them.
            (
                "<think>\nHmm, {\"a\": 2}?\n</think>\n\n{\"a\": 1}",
                "{\"a\": 1}",
            ),
            ("<think>x</think>```json\n{}\n```", "{}"),
            ("<think>never closed {}", "<think>never closed {}"),
        ];
        for (text, inside) in cases {
            assert_eq!(unfenced(text), inside, "{text:?}");
        }
    }

    /// Regression: a recipe with `output string` or `output list<...>` was
    /// sent a schema with a string or an array at the root, which OpenAI's
    /// strict mode and Anthropic's tool input refuse (a 400, never
    /// retried). Such a schema goes inside an object, whose `value` is the
    /// answer; a bare answer (a model not held to the schema) is taken too.
    #[test]
    fn an_output_that_is_not_an_object_is_asked_for_inside_one() {
        let record = json!({ "type": "object", "properties": { "a": { "type": "string" } } });
        assert_eq!(*wire_schema(&record), record);
        let list = json!({ "type": "array", "items": { "type": "string" } });
        let wire = wire_schema(&list);
        assert_eq!(wire["type"], "object");
        assert_eq!(wire["properties"]["value"], list);
        assert_eq!(wire["required"], json!(["value"]));
        assert!(strict_schema(&wire).1, "strict mode holds it");
        assert_eq!(
            parse_and_check(r#"{"value": ["a", "b"]}"#, &list),
            Ok(json!(["a", "b"]))
        );
        assert_eq!(parse_and_check(r#"["a"]"#, &list), Ok(json!(["a"])));
        assert!(parse_and_check(r#"{"value": 3}"#, &list).is_err());
        let text = json!({ "type": "string" });
        assert_eq!(
            parse_and_check(r#"{"value": "hi"}"#, &text),
            Ok(json!("hi"))
        );
        // `output json`: the answer inside, not the wrapper, which `{}` fits.
        let any = json!({});
        assert_eq!(wire_schema(&any)["type"], "object");
        assert_eq!(parse_and_check(r#"{"value": [1]}"#, &any), Ok(json!([1])));
        // A whole float is an integer where the recipe asks for one, bare
        // or in the wrapper (an audit: `3.0` failed the step).
        let ints = json!({ "type": "array", "items": { "type": "integer" } });
        assert_eq!(
            parse_and_check(r#"{"value": [3.0]}"#, &ints),
            Ok(json!([3]))
        );
        assert_eq!(parse_and_check("[3.0, 4]", &ints), Ok(json!([3, 4])));
        assert!(parse_and_check("[3.5]", &ints).is_err());
    }

    #[test]
    fn strict_schemas_require_every_property_and_refuse_untyped_parts() {
        let schema = json!({
            "type": "object",
            "properties": {
                "a": { "type": "string" },
                "b": { "anyOf": [{ "type": "object", "properties": { "c": { "type": "integer" } }, "required": [], "additionalProperties": false }, { "type": "null" }] },
            },
            "required": ["a"],
            "additionalProperties": false,
        });
        let (strict, ok) = strict_schema(&schema);
        assert!(ok);
        assert_eq!(strict["required"], json!(["a", "b"]));
        assert_eq!(
            strict["properties"]["b"]["anyOf"][0]["required"],
            json!(["c"])
        );
        let loose = json!({ "type": "object", "properties": { "j": {} }, "required": ["j"] });
        assert!(
            !strict_schema(&loose).1,
            "a json field turns strict mode off"
        );
    }
}
