//! The `cairn` binary: the library's command line, with the benchmarks (`cairn bench`) added,
//! which only the binary compiles.

mod bench;

fn main() -> std::process::ExitCode {
    // Started as the trampoline of a command run as its submitter: that, and nothing else.
    cairn::runner::trampoline::main_if_asked();
    cairn::cli::main_with::<bench::command::BenchCommand>()
}
