//! `ai.tools` and `ai.config` (seed 000): the inputs of an agent run,
//! resolved from config rows (`users/<uid>/ai/*` over `config/ai/*`) and
//! the tool table. Internal calls: only a process's own loop may make
//! them; a socket gets 403 `Permission denied: <call>`. No state of its
//! own.

pub mod calls;
pub mod tools;
