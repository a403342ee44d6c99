//! Human-in-the-loop defaults (seed 002): auto-allow most tools, ask
//! before `fs.delete`, before shell commands tagged destructive or
//! privileged, and before a call to an MCP server's tool (`sys.mcp.call`:
//! what a remote tool does is not known here).

use serde_json::Value;

/// What to do with one tool call before it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Auto,
    /// Ask a human; the reasons are shown in `proc.run.hil.requested`.
    Ask(Vec<&'static str>),
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
    fn deletes_ask_and_reads_do_not() {
        let a = serde_json::json!({"path": "x"});
        assert_eq!(
            decide("fs.delete", &a, "/w", "/h"),
            Decision::Ask(vec!["delete"])
        );
        assert_eq!(decide("fs.read", &a, "/w", "/h"), Decision::Auto);
    }
}
