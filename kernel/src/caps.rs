//! Capability patterns (reference §2.2): `*`, an exact call `a.b.c`, or a
//! prefix `a.b.*`; segments match `[a-z][a-z0-9]*`. One matcher checks a
//! caller's capabilities against a call (and, later, a device's
//! `implements` against a routed call).

/// Capabilities of gid 0 (root).
pub const ROOT_CAPABILITIES: &[&str] = &["*"];

/// Capabilities of gid 100 (`users`). `account.create` is deliberately not
/// here: creating humans is root's (or an explicit grant's) business.
pub const USER_CAPABILITIES: &[&str] = &[
    "fs.*",
    "shell.*",
    "net.fetch",
    "proc.*",
    // Process-internal: the handlers refuse every caller but a process.
    "ai.*",
    "sched.*",
    "codemode.*",
    "sys.mcp.*",
    "sys.oauth.*",
    "notification.*",
    "repo.*",
    "signal.*",
    "sys.config.get",
    "sys.config.set",
    "sys.device.*",
    "sys.token.*",
    "sys.workspace.*",
    "workspace.*",
    "account.list",
];

/// Capabilities of gid 101 (`drivers`); unused at connect, as in the
/// reference (a driver answers calls, it never makes them).
pub const DRIVER_CAPABILITIES: &[&str] = &["fs.*", "shell.*"];

/// Capabilities of gid 102 (`services`).
pub const SERVICE_CAPABILITIES: &[&str] = &["adapter.*"];

/// Whether `pattern` is well formed.
pub fn is_valid_pattern(pattern: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    let body = pattern.strip_suffix(".*").unwrap_or(pattern);
    !body.is_empty()
        && body.split('.').all(|seg| {
            let mut cs = seg.chars();
            matches!(cs.next(), Some('a'..='z'))
                && cs.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
}

/// Whether one pattern covers `call`.
pub fn matches(pattern: &str, call: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_suffix('*') {
        Some(prefix) if prefix.ends_with('.') => call.starts_with(prefix),
        _ => pattern == call,
    }
}

/// Whether any of `caps` covers `call`.
pub fn has_capability(caps: &[String], call: &str) -> bool {
    caps.iter().any(|c| matches(c, call))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_prefix_and_exact_patterns_match_as_documented() {
        assert!(matches("*", "sys.token.create"));
        assert!(matches("fs.*", "fs.read"));
        assert!(!matches("fs.*", "fsx.read"));
        assert!(matches("sys.token.*", "sys.token.list"));
        assert!(!matches("sys.token.*", "sys.config.get"));
        assert!(matches("account.list", "account.list"));
        assert!(!matches("account.list", "account.create"));
    }

    #[test]
    fn malformed_patterns_are_rejected() {
        for p in ["", ".*", "Fs.read", "fs..read", "fs.*.x", "1a", "fs.re-ad"] {
            assert!(!is_valid_pattern(p), "{p}");
        }
        for p in ["*", "fs.*", "fs.read", "a1.b2"] {
            assert!(is_valid_pattern(p), "{p}");
        }
    }
}
