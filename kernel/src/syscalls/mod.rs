//! Syscall handlers by domain, and the one place they are registered.

pub mod account;
pub mod device;
pub mod fs;
pub mod proc;
pub mod shell;
pub mod sys;
pub mod workspace;

use crate::dispatch::Dispatch;
use crate::kernel::Kernel;

/// The whole table.
pub fn table() -> Dispatch<Kernel> {
    let mut d = Dispatch::default();
    register(&mut d);
    d
}

/// Registers every syscall with the capability it needs.
pub fn register(d: &mut Dispatch<Kernel>) {
    d.add("sys.token.create", "sys.token.create", sys::token_create);
    d.add("sys.token.list", "sys.token.list", sys::token_list);
    d.add("sys.token.revoke", "sys.token.revoke", sys::token_revoke);
    d.add("sys.config.get", "sys.config.get", sys::config_get);
    d.add("sys.config.set", "sys.config.set", sys::config_set);
    d.add("sys.device.list", "sys.device.list", device::list);
    d.add("sys.device.get", "sys.device.get", device::get);
    d.add("sys.device.update", "sys.device.update", device::update);
    d.add("account.create", "account.create", account::create);
    d.add("account.list", "account.list", account::list);
    d.add(
        "sys.workspace.create",
        "sys.workspace.create",
        workspace::create,
    );
    d.add("sys.workspace.list", "sys.workspace.list", workspace::list);
    d.add("sys.workspace.get", "sys.workspace.get", workspace::get);
    d.add(
        "sys.workspace.archive",
        "sys.workspace.archive",
        workspace::archive,
    );
    d.add("fs.read", "fs.read", fs::read);
    d.add("fs.write", "fs.write", fs::write);
    d.add("fs.edit", "fs.edit", fs::edit);
    d.add("fs.delete", "fs.delete", fs::delete);
    d.add("fs.search", "fs.search", fs::search);
    d.add("proc.spawn", "proc.spawn", proc::spawn);
    d.add("proc.list", "proc.list", proc::list);
    d.add("proc.send", "proc.send", proc::send);
    d.add("proc.history", "proc.history", proc::history);
    d.add("proc.abort", "proc.abort", proc::abort);
    d.add("proc.hil", "proc.hil", proc::hil);
    d.add("proc.reset", "proc.reset", proc::reset);
    d.add("proc.kill", "proc.kill", proc::kill);
    d.add("shell.exec", "shell.exec", shell::exec);
}
