//! Human-in-the-loop approval. Without a policy, seed 002's defaults:
//! auto-allow most tools, ask before `fs.delete`, before shell commands
//! tagged destructive or privileged, and before a call to an MCP server's
//! tool (`sys.mcp.call`: what a remote tool does is not known here). An account's policy
//! (`users/{uid}/ai/tools/approval`, else the profile's
//! `config/ai/profile/<p>/tools/approval`) is `{default?, rules: [{match,
//! target?, action}]}`: the most specific matching rule wins (a target
//! scope first, then an exact syscall over a domain wildcard over `*`,
//! then the earlier rule), and the tagger's facts still turn its `auto`
//! into `ask`.

use gsv_protocol::ai::ConfigResult;
use serde::Deserialize;
use serde_json::Value;

/// The approval policy a run applies: the account's
/// (`users/{uid}/ai/tools/approval`), else its profile's; none means the
/// built-in rules.
pub fn approval_policy(ai: &ConfigResult, run_as_uid: i64) -> Result<Option<Policy>, String> {
    let Some(text) = ai
        .approval_policy
        .as_ref()
        .or(ai.profile_approval_policy.as_ref())
    else {
        return Ok(None);
    };
    Policy::parse(text).map(Some).map_err(|e| {
        format!(
            "the approval policy (users/{}/ai/tools/approval or the profile's) is invalid: {e}",
            run_as_uid
        )
    })
}

/// What to do with one tool call before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Auto,
    /// Ask a human; the reasons are shown in `proc.run.hil.requested`.
    Ask(Vec<&'static str>),
    /// Refused by the policy: the model gets a tool error.
    Deny,
}

/// A policy rule's or the default's action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Auto,
    Ask,
    Deny,
}

/// One rule of an approval policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// An exact syscall (`fs.delete`), a domain wildcard (`fs.*`) or `*`.
    #[serde(rename = "match")]
    pub pattern: String,
    /// `gsv` (native), `device` (any device) or one device id.
    pub target: Option<String>,
    pub action: Action,
}

/// An account's or profile's approval policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// For calls no rule matches; the seed's defaults when absent.
    pub default: Option<Action>,
    #[serde(default)]
    pub rules: Vec<Rule>,
}

impl Policy {
    /// Parses a stored policy (JSON text), naming what is wrong.
    pub fn parse(text: &str) -> Result<Policy, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// The action of the most specific rule matching `call` on `target`.
    fn action(&self, call: &str, target: &str) -> Option<Action> {
        let rank = |r: &Rule| -> Option<(u8, u8)> {
            let pattern = match r.pattern.as_str() {
                "*" => 0,
                p if p == call => 2,
                p if p.strip_suffix(".*").is_some_and(|d| {
                    call.strip_prefix(d)
                        .is_some_and(|rest| rest.starts_with('.'))
                }) =>
                {
                    1
                }
                _ => return None,
            };
            let scoped = match r.target.as_deref() {
                None => 0,
                Some(t) if t == target => 1,
                Some("device") if target != "gsv" => 1,
                Some(_) => return None,
            };
            Some((scoped, pattern))
        };
        let mut best: Option<((u8, u8), Action)> = None;
        for r in &self.rules {
            if let Some(k) = rank(r)
                && best.is_none_or(|(b, _)| k > b)
            {
                best = Some((k, r.action));
            }
        }
        best.map(|(_, a)| a)
    }
}

/// The decision for `call` with `args` under `policy` (the seed's defaults
/// when `None`), for a process in `cwd` whose account's home is `home`.
pub fn decide_with(
    policy: Option<&Policy>,
    call: &str,
    args: &Value,
    cwd: &str,
    home: &str,
) -> Decision {
    let Some(policy) = policy else {
        return decide(call, args, cwd, home);
    };
    let target = args
        .get("target")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .unwrap_or("gsv");
    match policy.action(call, target).or(policy.default) {
        None => decide(call, args, cwd, home),
        Some(Action::Deny) => Decision::Deny,
        Some(Action::Ask) => {
            let mut tags = facts(call, args, cwd, home);
            if tags.is_empty() {
                tags.push("policy");
            }
            Decision::Ask(tags)
        }
        Some(Action::Auto) => {
            let tags = facts(call, args, cwd, home);
            if tags.is_empty() {
                Decision::Auto
            } else {
                Decision::Ask(tags)
            }
        }
    }
}

/// The tagger's facts about one call: for a shell command its
/// [`shell_tags`] and `network`; for a file call a `hidden` path or one
/// `outside_home` (outside both the home and the cwd).
pub fn facts(call: &str, args: &Value, cwd: &str, home: &str) -> Vec<&'static str> {
    if call == "shell.exec" {
        let cmd = args
            .get("input")
            .or_else(|| args.get("command"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut tags = shell_tags(cmd, cwd, home);
        let network = cmd.split(['|', ';', '&', '\n']).any(|part| {
            part.split_whitespace().next().is_some_and(|w| {
                matches!(
                    w.rsplit('/').next().unwrap_or(w),
                    "curl" | "wget" | "ssh" | "scp" | "rsync" | "nc" | "ncat" | "telnet" | "ftp"
                )
            })
        });
        if network {
            tags.push("network");
        }
        return tags;
    }
    let mut tags = Vec::new();
    if call.starts_with("fs.")
        && let Some(path) = args.get("path").and_then(Value::as_str)
    {
        if path
            .split('/')
            .any(|seg| seg.starts_with('.') && seg != "." && seg != "..")
        {
            tags.push("hidden");
        }
        let on_device = args
            .get("target")
            .and_then(Value::as_str)
            .is_some_and(|t| !t.is_empty() && t != "gsv");
        if !on_device && path.starts_with('/') && !under(path, cwd) && !under(path, home) {
            tags.push("outside_home");
        }
    }
    tags
}

/// The default policy for `call` with `args`, for a process in `cwd`
/// whose account's home is `home`.
pub fn decide(call: &str, args: &Value, cwd: &str, home: &str) -> Decision {
    match call {
        "fs.delete" => Decision::Ask(vec!["delete"]),
        "sys.mcp.call" => Decision::Ask(vec!["mcp"]),
        "shell.exec" => {
            // `input` is the syscall's name for the command line.
            let cmd = args
                .get("input")
                .or_else(|| args.get("command"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let tags = shell_tags(cmd, cwd, home);
            if tags.is_empty() {
                Decision::Auto
            } else {
                Decision::Ask(tags)
            }
        }
        _ => Decision::Auto,
    }
}

/// Tags of a shell command line: `destructive`, `privileged`,
/// `outside_cwd`. Heuristic by design: it looks at words, not a parse, so
/// it errs towards asking.
pub fn shell_tags(cmd: &str, cwd: &str, home: &str) -> Vec<&'static str> {
    let mut tags = Vec::new();
    // Each simple command of a pipeline or list is judged on its own.
    for part in cmd.split(['|', ';', '&', '\n']) {
        let mut words: Vec<&str> = part.split_whitespace().collect();
        // Wrappers run the next word as the command: `sudo rm -rf x` is
        // both privileged and destructive.
        while let Some(&first) = words.first() {
            let prog = first.rsplit('/').next().unwrap_or(first);
            if matches!(prog, "sudo" | "su" | "doas" | "pkexec") && !tags.contains(&"privileged") {
                tags.push("privileged");
            }
            if !matches!(
                prog,
                "sudo" | "doas" | "pkexec" | "env" | "nice" | "nohup" | "time" | "xargs" | "exec"
            ) {
                break;
            }
            words.remove(0);
            while words
                .first()
                .is_some_and(|w| w.starts_with('-') || w.contains('='))
            {
                words.remove(0);
            }
        }
        let Some(&first) = words.first() else {
            continue;
        };
        let prog = first.rsplit('/').next().unwrap_or(first);
        let has = |flag: &str| words.iter().skip(1).any(|w| short_flag(w, flag));
        let destructive = match prog {
            "rm" => has("r") || has("R") || has("f") || words.contains(&"--recursive"),
            "dd" | "mkfs" | "shred" | "wipefs" | "fdisk" | "parted" => true,
            p if p.starts_with("mkfs.") => true,
            "chmod" | "chown" | "chgrp" => has("R") || words.contains(&"--recursive"),
            "git" => {
                words.get(1) == Some(&"clean")
                    || (words.get(1) == Some(&"reset") && words.contains(&"--hard"))
                    || (words.get(1) == Some(&"push") && (has("f") || words.contains(&"--force")))
            }
            "find" => words.contains(&"-delete"),
            _ => false,
        };
        if destructive && !tags.contains(&"destructive") {
            tags.push("destructive");
        }
    }
    // A redirection to an absolute path outside cwd and home writes where
    // the process was not put.
    let mut rest = cmd;
    while let Some(i) = rest.find('>') {
        rest = &rest[i + 1..];
        let target = rest
            .trim_start_matches('>')
            .split_whitespace()
            .next()
            .unwrap_or("");
        if target.starts_with('/')
            && target != "/dev/null"
            && !under(target, cwd)
            && !under(target, home)
            && !tags.contains(&"outside_cwd")
        {
            tags.push("outside_cwd");
        }
    }
    tags
}

fn under(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    !dir.is_empty() && (path == dir || path.starts_with(&format!("{dir}/")))
}

/// `-rf` carries `r`; `--force` does not count as a short flag.
fn short_flag(word: &str, flag: &str) -> bool {
    word.starts_with('-') && !word.starts_with("--") && word[1..].contains(flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destructive_and_privileged_commands_are_tagged() {
        for c in [
            "rm -rf build",
            "ls && rm -r x",
            "dd if=/dev/zero of=disk",
            "mkfs.ext4 /dev/sda1",
            "chmod -R 777 .",
            "git reset --hard HEAD~3",
            "find . -name '*.o' -delete",
        ] {
            assert!(
                shell_tags(c, "/w", "/home/a").contains(&"destructive"),
                "{c}"
            );
        }
        assert_eq!(shell_tags("sudo ls", "/w", "/home/a"), vec!["privileged"]);
        assert_eq!(
            shell_tags("sudo rm -rf /", "/w", "/home/a"),
            vec!["privileged", "destructive"]
        );
        assert_eq!(
            shell_tags("echo hi > /etc/passwd", "/w", "/home/a"),
            vec!["outside_cwd"]
        );
    }

    #[test]
    fn ordinary_commands_are_not_tagged() {
        for c in [
            "ls -la",
            "cargo test",
            "rm notes.txt",
            "echo hi > /w/out.txt",
            "echo x > /dev/null",
            "chmod 644 a",
            "git status",
        ] {
            assert!(shell_tags(c, "/w", "/home/a").is_empty(), "{c}");
        }
    }

    #[test]
    fn the_most_specific_rule_wins_and_facts_still_ask() {
        let p = Policy::parse(
            r#"{"default": "ask", "rules": [
                {"match": "*", "action": "auto"},
                {"match": "fs.*", "action": "deny"},
                {"match": "fs.read", "action": "auto"},
                {"match": "fs.read", "target": "device", "action": "ask"},
                {"match": "fs.read", "action": "deny"}
            ]}"#,
        )
        .unwrap();
        let d = |call: &str, args: serde_json::Value| {
            decide_with(Some(&p), call, &args, "/w", "/home/a")
        };
        use serde_json::json;
        assert_eq!(d("fs.read", json!({"path": "/w/a"})), Decision::Auto);
        assert_eq!(d("fs.write", json!({"path": "/w/a"})), Decision::Deny);
        assert_eq!(
            d("fs.read", json!({"path": "a", "target": "laptop"})),
            Decision::Ask(vec!["policy"])
        );
        assert_eq!(d("shell.exec", json!({"input": "ls"})), Decision::Auto);
        assert_eq!(
            d("shell.exec", json!({"input": "curl example.com"})),
            Decision::Ask(vec!["network"])
        );
        assert_eq!(
            d("fs.read", json!({"path": "/home/a/.ssh/id"})),
            Decision::Ask(vec!["hidden"])
        );
        assert_eq!(
            d("fs.read", json!({"path": "/etc/passwd"})),
            Decision::Ask(vec!["outside_home"])
        );
        let only_default = Policy::parse(r#"{"rules": []}"#).unwrap();
        assert_eq!(
            decide_with(Some(&only_default), "fs.delete", &json!({}), "/w", "/h"),
            Decision::Ask(vec!["delete"]),
            "no rule and no default: the seed's defaults"
        );
        assert!(Policy::parse(r#"{"rules": [{"match": "x", "action": "maybe"}]}"#).is_err());
    }

    #[test]
    fn deletes_ask_and_reads_do_not() {
        let a = serde_json::json!({"path": "x"});
        assert_eq!(
            decide("fs.delete", &a, "/w", "/h"),
            Decision::Ask(vec!["delete"])
        );
        assert_eq!(decide("fs.read", &a, "/w", "/h"), Decision::Auto);
    }
}
