//! `flow.lock`: the tools of the MCP servers that `.flow` files declare, as
//! `flowc lock` found them (names and input schemas), so that `flowc check`
//! can check browser steps' tool names and arguments offline.
//!
//! The compiler reads no file: `flowc` parses the lock beside the sources and
//! passes it to [`crate::check_with_tools`]. A server is found in the lock by
//! its identity (command, arguments and environment, or URL), the same
//! identity under which the runtime pools its connections, so a lock taken
//! for one declaration says nothing about a changed one.

use std::collections::HashSet;

use flow_plan::McpTransport;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::check::Ty;

/// The format version `flowc lock` writes and `flowc check` reads.
pub const LOCK_VERSION: u32 = 1;

/// The file name, beside the sources it is for.
pub const LOCK_FILE: &str = "flow.lock";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolLock {
    pub version: u32,
    pub servers: Vec<LockedServer>,
}

/// One server as a `.flow` file declares it, and the tools it listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockedServer {
    /// The name a file gave it, for people reading the lock.
    pub name: String,
    pub transport: McpTransport,
    pub tools: Vec<LockedTool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockedTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its arguments.
    pub input_schema: Value,
}

impl ToolLock {
    /// Reads a lock; refuses another format version.
    pub fn from_json(text: &str) -> Result<ToolLock, String> {
        let lock: ToolLock =
            serde_json::from_str(text).map_err(|e| format!("not JSON of a lock ({e})"))?;
        if lock.version != LOCK_VERSION {
            return Err(format!(
                "format version {} is not the version this flowc reads ({LOCK_VERSION}); run `flowc lock` again",
                lock.version
            ));
        }
        Ok(lock)
    }

    /// The lock as `flowc lock` writes it: servers and tools sorted, so that
    /// a lock taken again without change is the same file.
    pub fn to_json(&self) -> String {
        let mut sorted = self.clone();
        sorted.servers.sort_by(|a, b| {
            (a.name.as_str(), transport_key(&a.transport))
                .cmp(&(b.name.as_str(), transport_key(&b.transport)))
        });
        for server in &mut sorted.servers {
            server.tools.sort_by(|a, b| a.name.cmp(&b.name));
        }
        let mut text = serde_json::to_string_pretty(&sorted).unwrap_or_default();
        text.push('\n');
        text
    }

    /// The tools of the server declared with `transport`, if the lock has it.
    pub fn server(&self, transport: &McpTransport) -> Option<&LockedServer> {
        self.servers
            .iter()
            .find(|server| server.transport.identity() == transport.identity())
    }
}

fn transport_key(transport: &McpTransport) -> String {
    serde_json::to_string(transport).unwrap_or_default()
}

/// Whether a tool takes arguments its schema does not list (as `json`):
/// unless its schema says `additionalProperties: false`.
pub(crate) fn takes_unlisted(schema: &Value) -> bool {
    schema["additionalProperties"] != Value::Bool(false)
}

/// A tool's arguments as the parameters of a call: each property with its
/// type, optional unless required. The arguments it takes beside them are
/// the checker's to tell ([`takes_unlisted`]).
pub(crate) fn tool_params(schema: &Value) -> Vec<(String, Ty)> {
    // A set, not a list: a tool of thousands of properties looked each up
    // in its thousands of required names.
    let required: HashSet<&str> = schema["required"]
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    schema["properties"]
        .as_object()
        .map(|properties| {
            properties
                .iter()
                .map(|(name, property)| {
                    let ty = ty_of(property);
                    let ty = if required.contains(&name.as_str()) {
                        ty
                    } else {
                        ty.optional()
                    };
                    (name.clone(), ty)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The type a JSON Schema describes, as far as the language can say it;
/// `json` (which fits anything) for what it cannot, so that a schema the
/// checker does not understand never yields a false error.
fn ty_of(schema: &Value) -> Ty {
    if let Some(variants) = schema["enum"].as_array() {
        let strings: Option<Vec<String>> = variants
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect();
        return match strings {
            Some(strings) if !strings.is_empty() => Ty::enumeration(strings),
            _ => Ty::Json,
        };
    }
    match schema["type"].as_str() {
        Some("string") => Ty::String,
        Some("integer") => Ty::Int,
        Some("number") => Ty::Float,
        Some("boolean") => Ty::Bool,
        Some("array") => match schema.get("items") {
            Some(items) => Ty::List(ty_of(items).into()),
            None => Ty::List(Ty::Json.into()),
        },
        // Records would need the schema's every rule about extra and
        // missing fields; their fields are left to the tool.
        _ => Ty::Json,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_gives_typed_parameters_required_or_optional() {
        let schema = json!({
            "type": "object",
            "properties": {
                "url": { "type": "string" },
                "depth": { "type": "number" },
                "button": { "type": "string", "enum": ["left", "right"] },
                "keys": { "type": "array", "items": { "type": "string" } },
                "options": { "type": "object" }
            },
            "required": ["url"],
            "additionalProperties": false
        });
        let params = tool_params(&schema);
        let ty = |name: &str| {
            params
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| t.clone())
        };
        assert_eq!(ty("url"), Some(Ty::String));
        assert_eq!(ty("depth"), Some(Ty::Float.optional()));
        assert_eq!(
            ty("button"),
            Some(Ty::enumeration(vec!["left".into(), "right".into()]).optional())
        );
        assert_eq!(ty("keys"), Some(Ty::List(Ty::String.into()).optional()));
        assert_eq!(ty("options"), Some(Ty::Json.optional()));
        assert!(
            !takes_unlisted(&schema),
            "a closed schema takes no other argument"
        );
        let open = json!({ "type": "object", "properties": { "message": { "type": "string" } } });
        assert_eq!(
            tool_params(&open),
            vec![("message".to_string(), Ty::String.optional())]
        );
        assert!(
            takes_unlisted(&open),
            "an open schema takes other arguments"
        );
    }

    #[test]
    fn a_server_is_found_by_its_identity_whatever_the_order_of_its_env() {
        let stdio = |env: &[(&str, &str)]| McpTransport::Stdio {
            command: "npx".into(),
            args: vec!["@playwright/mcp".into()],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let lock = ToolLock {
            version: LOCK_VERSION,
            servers: vec![LockedServer {
                name: "browser".into(),
                transport: stdio(&[("A", "1"), ("B", "2")]),
                tools: Vec::new(),
            }],
        };
        assert!(lock.server(&stdio(&[("B", "2"), ("A", "1")])).is_some());
        assert!(lock.server(&stdio(&[("A", "1")])).is_none());
        let text = lock.to_json();
        assert_eq!(ToolLock::from_json(&text), Ok(lock));
        assert!(ToolLock::from_json(&text.replace("\"version\": 1", "\"version\": 9")).is_err());
    }
}
