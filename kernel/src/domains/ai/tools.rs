//! The tools a model is offered: each a syscall under a name the model
//! sees, its parameters the schema of that syscall's argument type. The
//! loop runs them (`proc::calls::run`); `ai.tools` lists them.

use gsv_protocol::codemode as codemode_args;
use gsv_protocol::shell::ShellToolArgs;
use gsv_protocol::{Targeted, fs, tool_parameters};
use schemars::JsonSchema;
use serde_json::{Value, json};

use crate::domains::codemode;

/// The tool names the model sees and the syscall each one is.
pub const TOOLS: &[(&str, &str)] = &[
    ("Read", "fs.read"),
    ("Write", "fs.write"),
    ("Edit", "fs.edit"),
    ("Delete", "fs.delete"),
    ("Search", "fs.search"),
    ("Shell", "shell.exec"),
    ("CodeMode", "codemode.exec"),
];

/// The tool definitions in OpenAI `tools` form. Each tool's parameters
/// are the schema of its syscall's argument type (with `target`), so the
/// model sees exactly what the call accepts.
pub fn tool_defs() -> Vec<Value> {
    fn def<T: JsonSchema>(name: &str, description: &str) -> Value {
        json!({"type": "function", "function": {
            "name": name, "description": description,
            "parameters": tool_parameters::<Targeted<T>>()}})
    }
    vec![
        def::<fs::ReadArgs>("Read", "Read a file (numbered lines) or list a directory."),
        def::<fs::WriteArgs>("Write", "Create or replace a file."),
        def::<fs::EditArgs>("Edit", "Replace an exact string in a file."),
        def::<fs::DeleteArgs>(
            "Delete",
            "Delete a file or directory (asks the user first).",
        ),
        def::<fs::SearchArgs>("Search", "Search file contents for a literal string."),
        def::<ShellToolArgs>("Shell", "Run a shell command in the workspace."),
        json!({"type": "function", "function": {
            "name": "CodeMode", "description": codemode::TOOL_DESCRIPTION,
            "parameters": tool_parameters::<codemode_args::ExecArgs>()}}),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_parameters_are_the_syscall_argument_schemas_with_a_target() {
        let defs = tool_defs();
        let names: Vec<_> = defs.iter().map(|d| d["function"]["name"].clone()).collect();
        assert_eq!(names, TOOLS.iter().map(|t| json!(t.0)).collect::<Vec<_>>());
        let params = |name: &str| {
            defs.iter()
                .find(|d| d["function"]["name"] == name)
                .map(|d| d["function"]["parameters"].clone())
                .unwrap()
        };
        let read = params("Read");
        assert_eq!(read["type"], "object");
        assert_eq!(read["required"], json!(["path"]));
        for key in ["path", "offset", "limit", "target"] {
            assert!(read["properties"].get(key).is_some(), "{key}: {read}");
        }
        let edit = params("Edit");
        let mut req: Vec<_> = edit["required"].as_array().unwrap().clone();
        req.sort_by_key(|v| v.to_string());
        assert_eq!(
            req,
            vec![json!("newString"), json!("oldString"), json!("path")]
        );
        assert!(edit["properties"].get("replaceAll").is_some(), "{edit}");
        let shell = params("Shell");
        for key in ["command", "timeout", "sessionId", "target"] {
            assert!(shell["properties"].get(key).is_some(), "{key}: {shell}");
        }
        assert!(serde_json::to_string(&defs).unwrap().find("$ref").is_none());
    }
}
