//! The `cairn` binary: everything lives in the library; this only runs its CLI.

fn main() -> std::process::ExitCode {
    // Started as the trampoline of a command run as its submitter: that, and nothing else.
    cairn::runner::trampoline::main_if_asked();
    cairn::cli::main()
}
