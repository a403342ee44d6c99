//! The six system profiles of seed 000 (`proc.profile.list`). A profile
//! decides whether a user may start it, whether its processes may ask a
//! human, and which context files (`config/ai/profile/<p>/context.d/*`)
//! and approval policy (`config/ai/profile/<p>/tools/approval`) its runs
//! use.

use gsv_protocol::proc::ProfileInfo;

/// One system profile.
#[derive(Debug, Clone, Copy)]
pub struct Profile {
    pub id: &'static str,
    pub display_name: &'static str,
    pub description: &'static str,
    pub interactive: bool,
    /// A user may `proc.spawn` it; the others are started by the kernel
    /// (`cron` by schedules).
    pub startable: bool,
    pub background: bool,
    /// One process per user (`init`) or a new one per spawn.
    pub singleton: bool,
}

pub const INIT: &str = "init";
pub const TASK: &str = "task";
pub const CRON: &str = "cron";

pub const SYSTEM: &[Profile] = &[
    Profile {
        id: INIT,
        display_name: "Home",
        description: "The persistent home conversation for the user.",
        interactive: true,
        startable: true,
        background: false,
        singleton: true,
    },
    Profile {
        id: TASK,
        display_name: "Task",
        description: "A focused conversation for new work.",
        interactive: true,
        startable: true,
        background: false,
        singleton: false,
    },
    Profile {
        id: "review",
        display_name: "Review",
        description: "A skeptical review conversation for packages and changes.",
        interactive: true,
        startable: true,
        background: false,
        singleton: false,
    },
    Profile {
        id: "mcp",
        display_name: "Master Control",
        description: "Operational control-plane and diagnostics conversation.",
        interactive: true,
        startable: true,
        background: false,
        singleton: false,
    },
    Profile {
        id: "app",
        display_name: "App",
        description: "A process started by an app.",
        interactive: true,
        startable: false,
        background: false,
        singleton: false,
    },
    Profile {
        id: CRON,
        display_name: "Scheduled",
        description: "A background process started by a schedule.",
        interactive: false,
        startable: false,
        background: true,
        singleton: false,
    },
];

pub fn get(id: &str) -> Option<&'static Profile> {
    SYSTEM.iter().find(|p| p.id == id)
}

impl Profile {
    pub fn info(&self) -> ProfileInfo {
        ProfileInfo {
            id: self.id.to_owned(),
            kind: "system".to_owned(),
            display_name: self.display_name.to_owned(),
            description: Some(self.description.to_owned()),
            interactive: self.interactive,
            startable: self.startable,
            background: self.background,
            spawn_mode: if self.singleton { "singleton" } else { "new" }.to_owned(),
        }
    }
}
