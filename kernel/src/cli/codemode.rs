//! `gsv codemode run FILE|-` and `gsv mcp add|list|rm|call`: thin clients
//! of `codemode.run` and `sys.mcp.*`. Tables are tab-separated lines;
//! `--json` prints the call's data instead.

use std::io::Read as _;

use anyhow::{Context, Result, bail};
use clap::Subcommand;
use gsv_kernel::client::GsvClient;
use serde_json::{Map, Value, json};

#[derive(Debug, Subcommand)]
pub enum CodemodeAction {
    /// Run a script (FILE, or `-` for stdin) as the body of an async
    /// function: prints what it returns (a string as is, else JSON), its
    /// logs on stderr; a failed block exits 1.
    Run {
        /// The script, or `-` to read it from stdin.
        file: String,
        /// Run in this process (its account, cwd and approvals).
        #[arg(long)]
        pid: Option<String>,
        /// Default `target` of `shell` and `fs.*` inside the block.
        #[arg(long)]
        target: Option<String>,
        /// Default `cwd` of `shell` inside the block.
        #[arg(long)]
        cwd: Option<String>,
        /// `args.KEY = VALUE` inside the block (VALUE as JSON if it
        /// parses, else a string); repeatable.
        #[arg(long = "arg", value_name = "KEY=VALUE")]
        arg: Vec<String>,
        /// The block's whole `args` as a JSON object.
        #[arg(long, conflicts_with = "arg")]
        args_json: Option<String>,
        /// Print the whole `{status, result|error, logs}` envelope.
        #[arg(long)]
        json: bool,
        /// The block's `argv`.
        #[arg(last = true)]
        argv: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum McpAction {
    /// Connect an MCP server (streamable HTTP) and print its id.
    Add {
        name: String,
        /// `https://…`, or `http://` on localhost. (Its own id: the global
        /// `--url` is the kernel's, and clap would merge the two.)
        #[arg(id = "server_url", value_name = "URL")]
        url: String,
        /// `NAME: VALUE` sent with every request; repeatable.
        #[arg(long = "header", value_name = "NAME: VALUE")]
        header: Vec<String>,
        /// Print the whole server summary.
        #[arg(long)]
        json: bool,
    },
    /// Print your MCP servers: id, state, name, url, tools
    /// (tab-separated; tools comma-separated).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove an MCP server.
    Rm { server_id: String },
    /// Call a tool: prints its structured content (JSON), else its text;
    /// a tool error exits 1.
    Call {
        server_id: String,
        tool: String,
        /// The tool's arguments as a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
        /// Print the whole result.
        #[arg(long)]
        json: bool,
    },
}

fn print_json(v: &Value) -> Result<()> {
    super::out(&format!("{}\n", serde_json::to_string_pretty(v)?))
}

fn print_value(v: &Value) -> Result<()> {
    match v {
        Value::String(s) => super::out(&format!("{s}\n")),
        v => print_json(v),
    }
}

fn json_object(text: &str, flag: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str(text).with_context(|| format!("{flag}: not JSON"))? {
        Value::Object(m) => Ok(m),
        _ => bail!("{flag}: must be a JSON object"),
    }
}

pub async fn codemode(c: &mut GsvClient, action: CodemodeAction) -> Result<bool> {
    let CodemodeAction::Run {
        file,
        pid,
        target,
        cwd,
        arg,
        args_json,
        json,
        argv,
    } = action;
    let code = if file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the script from stdin")?;
        s
    } else {
        std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?
    };
    let args = match args_json {
        Some(text) => json_object(&text, "--args-json")?,
        None => {
            let mut m = Map::new();
            for a in arg {
                let (k, v) = a
                    .split_once('=')
                    .with_context(|| format!("--arg {a}: expected KEY=VALUE"))?;
                let v = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned()));
                m.insert(k.to_owned(), v);
            }
            m
        }
    };
    let r = c
        .call(
            "codemode.run",
            json!({"pid": pid, "code": code, "target": target, "cwd": cwd,
                   "argv": argv, "args": args}),
        )
        .await?;
    let failed = r["status"] == "failed";
    if json {
        print_json(&r)?;
        return Ok(!failed);
    }
    for line in r["logs"].as_array().into_iter().flatten() {
        eprintln!("{}", line.as_str().unwrap_or_default());
    }
    if failed {
        eprintln!("{}", r["error"].as_str().unwrap_or("the block failed"));
        return Ok(false);
    }
    print_value(&r["result"])?;
    Ok(true)
}

pub async fn mcp(c: &mut GsvClient, action: McpAction) -> Result<bool> {
    match action {
        McpAction::Add {
            name,
            url,
            header,
            json,
        } => {
            let mut headers = Map::new();
            for h in header {
                let (k, v) = h
                    .split_once(':')
                    .with_context(|| format!("--header {h}: expected NAME: VALUE"))?;
                headers.insert(k.trim().to_owned(), json!(v.trim()));
            }
            let d = c
                .call(
                    "sys.mcp.add",
                    json!({"name": name, "url": url, "transport": {"headers": headers}}),
                )
                .await?;
            if json {
                print_json(&d["server"])?;
            } else {
                super::out(&format!(
                    "{}\n",
                    d["server"]["serverId"].as_str().unwrap_or("")
                ))?;
                // A server behind OAuth waits for its owner's sign-in.
                if let Some(url) = d["server"]["authUrl"].as_str() {
                    eprintln!("gsv: sign in to this server in a browser: {url}");
                }
            }
            Ok(true)
        }
        McpAction::List { json } => {
            let d = c.call("sys.mcp.list", json!({})).await?;
            if json {
                return print_json(&d).map(|()| true);
            }
            let mut text = String::new();
            for s in d["servers"].as_array().into_iter().flatten() {
                let tools: Vec<&str> = s["tools"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t["name"].as_str())
                    .collect();
                text.push_str(&format!(
                    "{}\t{}\t{}\t{}\t{}\n",
                    s["serverId"].as_str().unwrap_or(""),
                    s["state"].as_str().unwrap_or(""),
                    s["name"].as_str().unwrap_or(""),
                    s["url"].as_str().unwrap_or(""),
                    tools.join(","),
                ));
            }
            super::out(&text)?;
            Ok(true)
        }
        McpAction::Rm { server_id } => {
            let d = c
                .call("sys.mcp.remove", json!({"serverId": server_id}))
                .await?;
            if d["removed"] != true {
                bail!("no MCP server {server_id}");
            }
            Ok(true)
        }
        McpAction::Call {
            server_id,
            tool,
            args,
            json,
        } => {
            let arguments = json_object(&args, "--args")?;
            let d = c
                .call(
                    "sys.mcp.call",
                    json!({"serverId": server_id, "name": tool, "arguments": arguments}),
                )
                .await?;
            let failed = d["isError"] == true;
            if json {
                print_json(&d)?;
                return Ok(!failed);
            }
            let text: Vec<&str> = d["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|b| b["type"] == "text")
                .filter_map(|b| b["text"].as_str())
                .collect();
            if failed {
                eprintln!("{}", text.join("\n"));
                return Ok(false);
            }
            match d.get("structuredContent").filter(|v| !v.is_null()) {
                Some(v) => print_json(v)?,
                None => super::out(&format!("{}\n", text.join("\n")))?,
            }
            Ok(true)
        }
    }
}
