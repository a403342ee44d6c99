//! The kernel's domains, and the one place they are wired: every syscall
//! registered with the capability it needs ([`register`]), every
//! domain's migrations in id order ([`MIGRATIONS`]), and what each does
//! at start ([`prepare`] before the kernel exists, [`start`] after).
//!
//! A domain is a module owning its state (its rows, its tables' migration,
//! what it keeps in memory) and its calls (`calls`, handlers taking the
//! session and typed arguments). The state half sits below `kernel.rs`;
//! the calls take the `Kernel` and sit above it (ARCHITECTURE.md, kernel).
//! Adding a domain means a module here, a line in [`MIGRATIONS`] if it has
//! tables, and its lines in [`register`].

pub mod accounts;
pub mod adapter;
pub mod ai;
pub mod codemode;
pub mod device;
pub mod fs;
pub mod mcp;
pub mod notification;
pub mod oauth;
pub mod proc;
pub mod pty;
pub mod repo;
pub mod sched;
pub mod shell;
pub mod snapshot;
pub mod sys;
pub mod timers;
pub mod watch;
pub mod workspace;

use std::sync::{Arc, Mutex};

use wsd_dofs::Dofs;

use crate::db::{Db, Migration};
use crate::dispatch::Dispatch;
use crate::error::KernelError;
use crate::kernel::Kernel;

/// Every domain's migrations, in id order.
pub const MIGRATIONS: &[&[Migration]] = &[
    accounts::MIGRATIONS,
    workspace::MIGRATIONS,
    device::MIGRATIONS,
    proc::MIGRATIONS,
    timers::MIGRATIONS,
    notification::MIGRATIONS,
    sched::MIGRATIONS,
    watch::MIGRATIONS,
    snapshot::MIGRATIONS,
    proc::CONVERSATION_MIGRATIONS,
    mcp::MIGRATIONS,
    adapter::MIGRATIONS,
    proc::IPC_MIGRATIONS,
    oauth::MIGRATIONS,
    pty::MIGRATIONS,
];

/// [`MIGRATIONS`] as one list, what `Db::open` applies.
pub fn migrations() -> Vec<Migration> {
    MIGRATIONS.iter().flat_map(|m| m.iter().copied()).collect()
}

/// Start-up on the migrated database and the system store, before the
/// kernel serves: root's accounts, the routes a stopped kernel left (all
/// dead), root's home.
pub async fn prepare(db: &Db, system: &Arc<Mutex<Dofs>>) -> Result<(), KernelError> {
    db.call(accounts::bootstrap).await?;
    db.call(device::reset_at_start).await?;
    db.call(adapter::store::reset_receipts_at_start).await?;
    fs::calls::ensure_dir(system, "root").await
}

/// Start-up that needs the whole kernel: runs a stopped kernel left
/// `running` end, and queued work starts.
pub async fn start(k: &Arc<Kernel>) -> Result<(), KernelError> {
    proc::calls::run::recover(k).await?;
    proc::calls::ipc::recover(k).await?;
    sched::calls::recover(k).await?;
    pty::calls::recover(k).await?;
    timers::calls::start(k);
    tokio::spawn(watch::calls::prune_periodically(Arc::downgrade(k)));
    Ok(())
}

/// The listeners of process signals: IPC replies, signal watches, chat
/// surfaces (see [`proc::SignalListeners`]).
pub fn signal_listeners() -> proc::SignalListeners<Kernel> {
    proc::SignalListeners {
        run_finished: proc::calls::ipc::on_run_finished,
        watches: proc::calls::signal_watch::fire,
        surface: adapter::calls::on_run_signal,
    }
}

/// The whole table.
pub fn table() -> Dispatch<Kernel> {
    let mut d = Dispatch::default();
    register(&mut d);
    d
}

/// Registers every syscall with the capability it needs.
pub fn register(d: &mut Dispatch<Kernel>) {
    d.add("sys.token.create", sys::calls::token_create);
    d.add("sys.token.list", sys::calls::token_list);
    d.add("sys.token.revoke", sys::calls::token_revoke);
    d.add("sys.config.get", sys::calls::config_get);
    d.add("sys.config.set", sys::calls::config_set);
    d.add("sys.device.list", device::calls::list);
    d.add("sys.device.get", device::calls::get);
    d.add("sys.device.update", device::calls::update);
    d.add("account.create", accounts::calls::create);
    d.add("account.list", accounts::calls::list);
    d.add("sys.workspace.create", workspace::calls::create);
    d.add("sys.workspace.list", workspace::calls::list);
    d.add("sys.workspace.get", workspace::calls::get);
    d.add("sys.workspace.archive", workspace::calls::archive);
    d.add("fs.read", fs::calls::read);
    d.add("fs.write", fs::calls::write);
    d.add("fs.edit", fs::calls::edit);
    d.add("fs.delete", fs::calls::delete);
    d.add("fs.search", fs::calls::search);
    d.add("ai.tools", ai::calls::tools);
    d.add("ai.config", ai::calls::config);
    d.add("fs.watch", watch::calls::watch);
    d.add("fs.changes", watch::calls::changes);
    d.add("fs.unwatch", watch::calls::unwatch);
    d.add("proc.spawn", proc::calls::spawn);
    d.add("proc.list", proc::calls::list);
    d.add("proc.send", proc::calls::send);
    d.add("proc.history", proc::calls::history);
    d.add("proc.abort", proc::calls::abort);
    d.add("proc.hil", proc::calls::hil);
    d.add("proc.reset", proc::calls::reset);
    d.add("proc.kill", proc::calls::kill);
    d.add("proc.ipc.send", proc::calls::ipc::send);
    d.add("proc.ipc.call", proc::calls::ipc::call);
    d.add_internal("proc.ipc.deliver", proc::calls::ipc::deliver);
    d.add("signal.watch", proc::calls::signal_watch::watch);
    d.add("signal.unwatch", proc::calls::signal_watch::unwatch);
    d.add("proc.profile.list", proc::calls::profile_list);
    d.add("proc.conversation.open", proc::calls::conversation::open);
    d.add("proc.conversation.list", proc::calls::conversation::list);
    d.add("proc.conversation.get", proc::calls::conversation::get);
    d.add("proc.conversation.close", proc::calls::conversation::close);
    d.add("proc.conversation.reset", proc::calls::conversation::reset);
    d.add(
        "proc.conversation.policy.get",
        proc::calls::conversation::policy_get,
    );
    d.add(
        "proc.conversation.policy.set",
        proc::calls::conversation::policy_set,
    );
    d.add(
        "proc.conversation.compact",
        proc::calls::conversation::compact,
    );
    d.add("proc.conversation.fork", proc::calls::conversation::fork);
    d.add(
        "proc.conversation.segments",
        proc::calls::conversation::segments,
    );
    d.add(
        "proc.conversation.segment.read",
        proc::calls::conversation::segment_read,
    );
    d.add("shell.exec", shell::calls::exec);
    d.add("shell.pty.open", pty::calls::open);
    d.add("shell.pty.input", pty::calls::input);
    d.add("shell.pty.resize", pty::calls::resize);
    d.add("shell.pty.attach", pty::calls::attach);
    d.add("shell.pty.list", pty::calls::list);
    d.add("shell.pty.close", pty::calls::close);
    d.add_internal("codemode.exec", codemode::calls::exec);
    d.add("codemode.run", codemode::calls::run);
    d.add("sys.mcp.add", mcp::calls::add);
    d.add("sys.mcp.list", mcp::calls::list);
    d.add("sys.mcp.remove", mcp::calls::remove);
    d.add("sys.mcp.refresh", mcp::calls::refresh);
    d.add("sys.mcp.call", mcp::calls::call);
    d.add("sys.oauth.start", oauth::calls::start);
    d.add("sys.oauth.list", oauth::calls::list);
    d.add("sys.oauth.forget", oauth::calls::forget);
    d.add("sched.list", sched::calls::list);
    d.add("sched.add", sched::calls::add);
    d.add("sched.update", sched::calls::update);
    d.add("sched.remove", sched::calls::remove);
    d.add("sched.run", sched::calls::run);
    d.add("notification.create", notification::calls::create);
    d.add("notification.list", notification::calls::list);
    d.add("notification.mark_read", notification::calls::mark_read);
    d.add("notification.dismiss", notification::calls::dismiss);
    d.add("workspace.snapshot.create", snapshot::calls::create);
    d.add("workspace.snapshot.list", snapshot::calls::list);
    d.add("workspace.snapshot.get", snapshot::calls::get);
    d.add("workspace.snapshot.diff", snapshot::calls::diff);
    d.add("workspace.snapshot.restore", snapshot::calls::restore);
    d.add("workspace.snapshot.delete", snapshot::calls::delete);
    d.add("workspace.recover", snapshot::calls::recover);
    // Root only: it walks every workspace store.
    d.add("sys.gc", snapshot::calls::gc);
    d.add("repo.list", repo::calls::list);
    d.add("repo.create", repo::calls::create);
    d.add("repo.refs", repo::calls::refs);
    d.add("repo.read", repo::calls::read);
    d.add("repo.search", repo::calls::search);
    d.add("repo.log", repo::calls::log);
    d.add("repo.diff", repo::calls::diff);
    d.add("repo.compare", repo::calls::compare);
    d.add("repo.apply", repo::calls::apply);
    d.add("repo.import", repo::calls::import);
    d.add("adapter.connect", adapter::calls::connect);
    d.add("adapter.disconnect", adapter::calls::disconnect);
    d.add("adapter.send", adapter::calls::send);
    d.add("adapter.status", adapter::calls::status);
    // Service role only (the handlers refuse anyone else).
    d.add("adapter.inbound", adapter::calls::inbound);
    d.add("adapter.state.update", adapter::calls::state_update);
    // User role only (the handlers refuse services and processes).
    d.add("sys.link", adapter::calls::link);
    d.add("sys.unlink", adapter::calls::unlink);
    d.add("sys.link.list", adapter::calls::link_list);
    d.add("sys.link.consume", adapter::calls::link_consume);
    d.add("sys.link.route.set", adapter::calls::route_set);
    d.add("sys.link.route.list", adapter::calls::route_list);
    d.add("sys.link.route.delete", adapter::calls::route_delete);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksums the kernel wrote before migrations moved into their
    /// domains: a database created by an older build must still open.
    #[test]
    fn migrations_keep_their_released_ids_names_and_checksums() {
        let released = [
            (
                1,
                "accounts",
                "277cbf46579f6abdb7b3737b9058d88d8add6243b9d6f399bdefb35557bf3bc9",
            ),
            (
                2,
                "workspaces",
                "aa3f38346d8fb74f3c82d9fd2d9b2c3eb5d0b16e01253dae14ab8d2b7b0e1048",
            ),
            (
                3,
                "devices",
                "4cd4fe917a06207a40f783a8499d120ff2418b656b0cf53469b6ff0b392f55b2",
            ),
            (
                4,
                "processes",
                "ac40e11585ad6e8753880debbfec70ea4e786f85c9b48f2ed1a889755e7829ea",
            ),
        ];
        let now: Vec<_> = migrations()
            .iter()
            .map(|m| (m.version, m.name, wsd_sqlite::checksum(m)))
            .collect();
        for (i, (id, name, sum)) in released.iter().enumerate() {
            assert_eq!((now[i].0, now[i].1, now[i].2.as_str()), (*id, *name, *sum));
        }
    }

    #[test]
    fn migration_ids_are_unique_and_ascending() {
        let ids: Vec<i64> = migrations().iter().map(|m| m.version).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    }

    #[test]
    fn every_domain_call_is_registered_once() {
        // `Dispatch::add` panics on a second registration of one name.
        assert!(table().calls().len() >= 28);
    }
}
