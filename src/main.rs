//! The `cairn` binary: everything lives in the library; this only runs its CLI.

fn main() -> std::process::ExitCode {
    // Before anything else: a command being started through this binary (see exec_trampoline).
    if let Some(code) = cairn::runner::exec_trampoline::run_if_requested() {
        return code;
    }
    // CAIRN_SPAWN_VIA_FORK keeps the fork path (to compare, or to inject faults into forks).
    let by_default = std::env::var_os("CAIRN_SPAWN_VIA_FORK").is_none();
    cairn::runner::exec_trampoline::enable(by_default);
    cairn::cli::main()
}
