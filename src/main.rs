//! The `cairn` binary: everything lives in the library; this only runs its CLI.

fn main() -> std::process::ExitCode {
    cairn::cli::main()
}
