//! The `codemode` domain: one sandboxed async JavaScript block per call
//! ([`sandbox`]), whose `shell`, `fs.*`, `syscall` and MCP tool functions
//! are ordinary syscalls of the process it runs in. It owns no tables;
//! what a block may reach is the process's (capabilities, approvals,
//! devices) and the user's MCP servers'.
//!
//! `codemode.exec` is the model's `CodeMode` tool (internal: only a
//! process may call it); `codemode.run` is a user's block, run in one of
//! their processes or as themselves.

pub mod calls;
pub mod sandbox;

use std::collections::HashMap;
use std::fmt::Write as _;

use gsv_protocol::mcp::{McpConnectionState, McpServerSummary};
use serde_json::Value;

use sandbox::McpBinding;

/// The `CodeMode` tool's description before the MCP declarations.
pub const TOOL_DESCRIPTION: &str = "Run one sandboxed async JavaScript block for multi-step work. \
The code is the body of an async function: use `await`, and `return` the result. Globals: \
`shell(input, {cwd?, timeout?, sessionId?, target?})` (the Shell tool's result), \
`fs.read({path, offset?, limit?})`, `fs.write({path, content})`, \
`fs.edit({path, oldString, newString, replaceAll?})`, `fs.delete({path})`, \
`fs.search({query, path?, include?})`, `syscall(call, args)` for any other syscall, \
`console.log` (returned as logs), `mcpTools` (the connected MCP tools), and one async function \
per MCP tool. No network, no modules; 60 s and 64 MiB at most.";

/// The declarations appended to the description are cut here.
const MAX_DECLARATIONS: usize = 12_000;

/// A name usable as a JavaScript identifier: `get-sum` → `get_sum`.
pub fn js_ident(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '$' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// The block's functions for the tools of `servers` that are ready: a
/// unique tool name as is, every tool as `<Server>_<tool>`.
pub fn bindings(servers: &[McpServerSummary]) -> Vec<McpBinding> {
    let ready = || {
        servers
            .iter()
            .filter(|s| s.state == McpConnectionState::Ready)
    };
    let mut uses: HashMap<String, usize> = HashMap::new();
    for s in ready() {
        for t in &s.tools {
            *uses.entry(js_ident(&t.name)).or_default() += 1;
        }
    }
    let mut out = Vec::new();
    for s in ready() {
        for t in &s.tools {
            let name = js_ident(&t.name);
            out.push(McpBinding {
                name: (uses[&name] == 1).then(|| name.clone()),
                alias: format!("{}_{}", js_ident(&s.name), name),
                server_id: s.server_id.clone(),
                server_name: s.name.clone(),
                tool: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.input_schema.clone(),
                output_schema: t.output_schema.clone(),
            });
        }
    }
    out
}

/// TypeScript declarations of the tools, for the `CodeMode` description.
pub fn declarations(tools: &[McpBinding]) -> String {
    let mut out = String::new();
    for t in tools {
        let input = t.input_schema.as_ref().map_or("{}".into(), ts_type);
        let output = t.output_schema.as_ref().map_or("unknown".into(), ts_type);
        let doc = t
            .description
            .as_deref()
            .map(|d| format!("/** {} */\n", d.replace("*/", "* /").trim()))
            .unwrap_or_default();
        for name in t.name.iter().chain(std::iter::once(&t.alias)) {
            let line = format!("{doc}declare function {name}(args: {input}): Promise<{output}>;\n");
            if out.len() + line.len() > MAX_DECLARATIONS {
                out.push_str("// … more tools in mcpTools\n");
                return out;
            }
            out.push_str(&line);
        }
    }
    out
}

/// A JSON schema as a TypeScript type, as far as it says.
fn ts_type(schema: &Value) -> String {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return values
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join(" | ");
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => "string".into(),
        Some("number") | Some("integer") => "number".into(),
        Some("boolean") => "boolean".into(),
        Some("null") => "null".into(),
        Some("array") => {
            let item = schema.get("items").map_or("unknown".into(), ts_type);
            format!("Array<{item}>")
        }
        Some("object") | None if schema.get("properties").is_some() => {
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut s = String::from("{ ");
            if let Some(props) = schema["properties"].as_object() {
                for (k, v) in props {
                    let opt = if required.contains(&k.as_str()) {
                        ""
                    } else {
                        "?"
                    };
                    let key = if js_ident(k) == *k {
                        k.clone()
                    } else {
                        Value::String(k.clone()).to_string()
                    };
                    let _ = write!(s, "{key}{opt}: {}; ", ts_type(v));
                }
            }
            s.push('}');
            s
        }
        Some("object") => "Record<string, unknown>".into(),
        _ => "unknown".into(),
    }
}

/// The model's tools with the `CodeMode` description extended by the
/// TypeScript declarations of `bindings` (the user's ready MCP tools).
pub fn with_declarations(mut tools: Vec<Value>, bindings: &[McpBinding]) -> Vec<Value> {
    let decls = declarations(bindings);
    if decls.is_empty() {
        return tools;
    }
    for t in &mut tools {
        if t["function"]["name"] == "CodeMode" {
            t["function"]["description"] = Value::String(format!(
                "{TOOL_DESCRIPTION}\n\nConnected MCP tools:\n```ts\n{decls}```"
            ));
        }
    }
    tools
}

#[cfg(test)]
mod tests {
    use gsv_protocol::mcp::{McpToolSummary, McpTransportType};
    use serde_json::json;

    use super::*;

    fn server(id: &str, name: &str, tools: &[&str]) -> McpServerSummary {
        McpServerSummary {
            server_id: id.into(),
            uid: 1,
            name: name.into(),
            url: "http://127.0.0.1:1/mcp".into(),
            transport: McpTransportType::Auto,
            state: McpConnectionState::Ready,
            auth_url: None,
            error: None,
            instructions: None,
            capabilities: None,
            tools: tools
                .iter()
                .map(|t| McpToolSummary {
                    name: (*t).into(),
                    description: Some("Adds.".into()),
                    input_schema: Some(json!({"type": "object",
                        "properties": {"a": {"type": "number"}, "b": {"type": "integer"}},
                        "required": ["a"]})),
                    output_schema: None,
                })
                .collect(),
            resource_count: 0,
            prompt_count: 0,
            created_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn unique_tool_names_are_functions_and_every_tool_has_a_server_alias() {
        let b = bindings(&[
            server("m1", "Math", &["get-sum", "echo"]),
            server("m2", "my server", &["echo"]),
        ]);
        let names: Vec<_> = b
            .iter()
            .map(|b| (b.name.clone(), b.alias.clone()))
            .collect();
        assert_eq!(
            names,
            vec![
                (Some("get_sum".into()), "Math_get_sum".into()),
                (None, "Math_echo".into()),
                (None, "my_server_echo".into()),
            ]
        );
        let d = declarations(&b);
        assert!(
            d.contains(
                "declare function get_sum(args: { a: number; b?: number; }): Promise<unknown>;"
            ),
            "{d}"
        );
        assert!(d.contains("/** Adds. */"), "{d}");
    }

    #[test]
    fn identifiers_are_valid_javascript() {
        assert_eq!(js_ident("lookup-record"), "lookup_record");
        assert_eq!(js_ident("2fa"), "_2fa");
        assert_eq!(js_ident(""), "_");
    }
}
