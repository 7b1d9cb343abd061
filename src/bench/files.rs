//! `cairn bench files`: what storing a checkpoint's file costs, against the disk's limit.
//!
//! Each round writes `--size-mb` of fresh random bytes into a scratch file (not timed), then
//! times three things on the same file system: the reference, writing the same bytes to a new
//! file and fsyncing it (the least any durable copy costs); `changed`, storing the file as a
//! checkpoint's file (read, hashed, copied into `blobs/`, synced, renamed, directory synced);
//! and `unchanged`, storing it again once its change time has settled (the stat check that
//! lets an unchanged file cost no read). One JSON line per measurement and round.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::RunDirParent;
use cairn::store::blobs::BlobStore;

#[derive(Debug, Args)]
pub(crate) struct FilesArgs {
    /// The file's size in MiB.
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    pub size_mb: usize,
    /// Rounds, each with fresh bytes.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Where the run directory is made (the file system the queue would be on).
    #[arg(long, value_name = "DIR", default_value_os_t = super::checkpoint::default_dir())]
    pub dir: PathBuf,
}

/// One measurement's line.
#[derive(Debug, Serialize)]
pub(crate) struct FilesResult {
    pub bench: &'static str,
    pub what: &'static str,
    pub round: usize,
    pub bytes: u64,
    pub seconds: f64,
    pub mib_s: f64,
}

/// Run the rounds; one result per measurement and round.
pub(crate) fn run(args: &FilesArgs) -> anyhow::Result<Vec<FilesResult>> {
    let parent = RunDirParent::create(&args.dir)?;
    let work = tempfile::Builder::new()
        .prefix("files-")
        .tempdir_in(&args.dir)
        .context("making the run directory")?;
    let results = rounds(args, work.path());
    drop(work);
    parent.remove_if_empty();
    results
}

fn rounds(args: &FilesArgs, work: &Path) -> anyhow::Result<Vec<FilesResult>> {
    let scratch = work.join("scratch");
    fs::create_dir_all(&scratch)?;
    let store = BlobStore::open(work)?;
    let names: BTreeMap<String, String> = [("model".to_owned(), "model.bin".to_owned())].into();
    let bytes = (args.size_mb as u64) << 20;
    let mut results = Vec::new();
    let line = |what, round, seconds: f64| FilesResult {
        bench: "files",
        what,
        round,
        bytes,
        seconds: (seconds * 1e6).round() / 1e6,
        mib_s: ((bytes as f64 / (1 << 20) as f64) / seconds * 10.0).round() / 10.0,
    };
    for round in 1..=args.rounds {
        let source = scratch.join("model.bin");
        let content = random_file(&source, bytes)?;
        // The reference: the same bytes to a new file, fsynced.
        let reference = work.join(format!("reference-{round}.bin"));
        let started = Instant::now();
        let mut out = fs::File::create(&reference)?;
        for chunk in content.chunks(1 << 20) {
            out.write_all(chunk)?;
        }
        out.sync_all()?;
        results.push(line("write_fsync", round, started.elapsed().as_secs_f64()));
        drop(out);
        fs::remove_file(&reference)?;
        drop(content);

        let started = Instant::now();
        store.store_files(&scratch, &names)?;
        results.push(line("changed", round, started.elapsed().as_secs_f64()));

        // Past the window in which a change would not move the file's times.
        std::thread::sleep(std::time::Duration::from_millis(2200));
        store.store_files(&scratch, &names)?; // remembered as settled
        let started = Instant::now();
        store.store_files(&scratch, &names)?;
        results.push(line("unchanged", round, started.elapsed().as_secs_f64()));
    }
    Ok(results)
}

/// Fill `path` with `bytes` fresh random bytes; returns them for the reference write.
fn random_file(path: &Path, bytes: u64) -> anyhow::Result<Vec<u8>> {
    let mut rng = fastrand::Rng::new();
    let mut content = vec![0u8; bytes as usize];
    for chunk in content.chunks_mut(8) {
        let word = rng.u64(..).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    fs::write(path, &content).with_context(|| format!("writing {}", path.display()))?;
    Ok(content)
}
