//! `cairn clients-path`: where the worker helpers are, for shells and for trying a worker by
//! hand (`PYTHONPATH="$(cairn clients-path)/python" python3 worker.py`).

use std::path::Path;

use clap::Args;

use super::error::{print_line, CliError, CliResult};

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  . \"$(cairn clients-path)/sh/cairn.sh\"
  PYTHONPATH=\"$(cairn clients-path)/python\" python3 my_worker.py

Commands run by the daemon get CAIRN_CLIENTS (this directory) and PYTHONPATH already.")]
pub(super) struct ClientsPathArgs {}

/// Make sure the queue's `clients/` holds this binary's helpers, then print its absolute path.
/// A user who may not write the queue (a submitter of a service's queue) gets the path as long
/// as the daemon has written the helpers there.
pub(super) fn run(queue: &Path, _args: ClientsPathArgs) -> CliResult {
    let root = std::path::absolute(queue)
        .map_err(|e| CliError::failure(format_args!("queue {}: {e}", queue.display())))?;
    // Not created here: a queue named by mistake (the wrong ./queue) should not appear.
    if !root.is_dir() {
        return Err(CliError::failure(format_args!(
            "no queue directory at {} (give --queue DIR or set CAIRN_QUEUE)",
            root.display()
        )));
    }
    let dir = match crate::clients::install(&root) {
        Ok(dir) => dir,
        Err(e) if installed(&root) => {
            eprintln!("warning: cannot update the helpers ({e}); the daemon's copy is used");
            crate::clients::clients_dir(&root)
        }
        Err(e) => return Err(e.into()),
    };
    print_line(dir.display())
}

/// Are all the helpers present (written by the daemon, possibly an older build)?
fn installed(root: &Path) -> bool {
    let dir = crate::clients::clients_dir(root);
    crate::clients::HELPERS
        .iter()
        .all(|(name, _)| dir.join(name).is_file())
}
