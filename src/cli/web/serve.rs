//! `cairn serve --listen ADDR [--db URL]`: the dashboard and the queue's metrics without running
//! tasks — for a host that only watches, a shared PostgreSQL queue (every node's tasks, each
//! with its node), or a queue whose daemon is stopped. It ends on SIGINT or SIGTERM.

use std::path::Path;

use clap::Args;
use futures::StreamExt;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_tokio::Signals;

use super::{ListenArgs, ReadSource, WebConfig};
use crate::cli::error::{CliError, CliResult};
use crate::cli::source::DbArg;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub listen: ListenArgs,

    #[command(flatten)]
    pub db: DbArg,
}

pub(crate) fn run(queue: &Path, args: ServeArgs) -> CliResult {
    let Some(listen) = args.listen.listen else {
        return Err(CliError::usage(
            "cairn serve needs --listen ADDR (e.g. 127.0.0.1:9464)",
        ));
    };
    let config = WebConfig {
        listen,
        observer: None,
        source: ReadSource {
            queue: queue.to_path_buf(),
            db: args.db.url().map(str::to_string),
        },
        token: args.listen.token()?,
    };
    if config.source.db.is_none() && !queue.is_dir() {
        return Err(CliError::failure(format_args!(
            "queue {} does not exist (use --queue DIR or CAIRN_QUEUE, or --db URL)",
            queue.display()
        )));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failure(format_args!("cannot start the runtime: {e}")))?;
    runtime.block_on(async move {
        let serve = super::start(config).await?;
        let mut signals = Signals::new([SIGINT, SIGTERM])
            .map_err(|e| CliError::failure(format_args!("cannot install signal handlers: {e}")))?;
        tokio::select! {
            _ = serve => {}
            _ = signals.next() => {}
        }
        Ok(())
    })
}
