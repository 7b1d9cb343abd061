//! Fast gzip encoding of checkpoint files.
//!
//! Compression is the biggest cost of a large checkpoint, so three things keep it small:
//! - the zlib-rs backend at level 1 (zlib-ng's "quick" strategy), several times faster than
//!   the default level for a slightly larger file;
//! - compressors are pooled and reset rather than allocated per file (a fresh one costs a few
//!   hundred KiB of zeroed memory, page faults included, which dominates a 1 KiB checkpoint);
//! - a large document is cut into blocks that are compressed on other cores while the rest is
//!   still being serialized, pigz-style: each block but the last ends with a sync flush, so
//!   the raw deflate streams concatenate into one valid stream, and the blocks' CRC-32s are
//!   combined. The result is one ordinary gzip member that `zcat`, Python's `gzip` and
//!   cairn's strict decoder all read.
//!
//! The other cores' work is done by helper threads, one per spare core, started on first use
//! and kept for the life of the process: starting a thread per save cost about a third of a
//! 64 KiB save. A save never waits for a helper to become free: every full block is queued
//! with the save, a helper is told about it, and once the document is complete the saving
//! thread compresses whatever no helper has taken yet. A document smaller than one block never
//! involves a helper.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use flate2::{Compress, Compression, FlushCompress, Status};

/// The compression level: fast, since a checkpoint is written far more often than read.
const LEVEL: u32 = 1;

/// The size of the blocks compressed independently (and in parallel).
const BLOCK_BYTES: usize = 32 * 1024;

/// How many idle compressors are kept for reuse.
const POOL_LIMIT: usize = 16;

/// The gzip member header: magic, deflate, no flags, no mtime, no extra flags, OS unknown.
const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// Idle compressors, reset and ready.
static POOL: Mutex<Vec<Compress>> = Mutex::new(Vec::new());

/// `input` as one complete gzip member (header, deflate stream, CRC-32 and length trailer).
#[cfg(test)]
pub(super) fn gzip(input: &[u8]) -> io::Result<Vec<u8>> {
    gzip_with(|w| w.write_all(input))
}

/// What `produce` writes, as one complete gzip member. Full blocks are compressed on other
/// cores while `produce` goes on writing. The writer is a concrete type, not `dyn Write`: a
/// serializer makes a call per token, and each one is then an inlined copy.
pub(super) fn gzip_with(
    produce: impl FnOnce(&mut BlockWriter) -> io::Result<()>,
) -> io::Result<Vec<u8>> {
    let (done_tx, done_rx) = mpsc::channel::<Compressed>();
    let mut writer = BlockWriter {
        queued: Arc::new(Mutex::new(VecDeque::new())),
        done_tx,
        block: Vec::new(),
        blocks_sent: 0,
        total_len: 0,
    };
    produce(&mut writer)?;
    let BlockWriter {
        queued,
        done_tx,
        block: last,
        blocks_sent,
        total_len,
        ..
    } = writer;
    // Blocks no helper has taken are compressed here; helpers finish the ones they took.
    while let Some(block) = pop_block(&queued) {
        // The receiver is `done_rx`, alive until this function returns.
        let _ = done_tx.send(compress_block(block, FlushCompress::Sync));
    }
    let tail = compress_block(
        Block {
            index: blocks_sent,
            data: last,
        },
        FlushCompress::Finish,
    );
    // `done_tx` lives until this returns, so `recv` in `assemble` cannot fail.
    assemble(&done_rx, blocks_sent, tail, total_len)
}

/// Collect the `blocks` full blocks' results, then put the member together: header, blocks in
/// order, the tail, CRC-32 and length. Exactly `blocks` results come: helpers send one for
/// every block they take, even when compressing it panicked. A document smaller than a block
/// is its tail alone and never touches the channel.
fn assemble(
    done_rx: &mpsc::Receiver<Compressed>,
    blocks: usize,
    tail: Compressed,
    total_len: usize,
) -> io::Result<Vec<u8>> {
    let mut parts: Vec<Option<(Vec<u8>, crc32fast::Hasher)>> = Vec::new();
    parts.resize_with(blocks + 1, || None);
    parts[tail.index] = Some(tail.result?);
    for _ in 0..blocks {
        let done = done_rx
            .recv()
            .map_err(|_| io::Error::other("a compressed block went missing"))?;
        parts[done.index] = Some(done.result?);
    }
    let mut out = Vec::with_capacity(
        HEADER.len() + 8 + parts.iter().flatten().map(|(b, _)| b.len()).sum::<usize>(),
    );
    out.extend_from_slice(&HEADER);
    let mut crc = crc32fast::Hasher::new();
    for part in parts {
        let Some((bytes, part_crc)) = part else {
            return Err(io::Error::other("a compressed block went missing"));
        };
        out.extend_from_slice(&bytes);
        crc.combine(&part_crc);
    }
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    // ISIZE is the input length modulo 2^32, as the format defines it.
    out.extend_from_slice(&(total_len as u32).to_le_bytes());
    Ok(out)
}

/// A block of the document, numbered in order.
struct Block {
    index: usize,
    data: Vec<u8>,
}

/// A block's raw deflate bytes and the CRC-32 of its input.
struct Compressed {
    index: usize,
    result: io::Result<(Vec<u8>, crc32fast::Hasher)>,
}

/// One save's full blocks that no thread has taken yet.
type Queued = Arc<Mutex<VecDeque<Block>>>;

/// Tells a helper that a save queued a block: the helper takes the save's oldest queued block
/// (if the saving thread has not taken it already) and sends the result back.
struct Ticket {
    queued: Queued,
    done: mpsc::Sender<Compressed>,
}

fn pop_block(queued: &Queued) -> Option<Block> {
    queued
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop_front()
}

/// The helper threads' ticket queue, started on first use: one helper per core beyond the
/// calling thread's. `None` on a single core, or when no thread could be started.
fn helpers() -> Option<&'static mpsc::Sender<Ticket>> {
    static HELPERS: OnceLock<Option<mpsc::Sender<Ticket>>> = OnceLock::new();
    HELPERS
        .get_or_init(|| {
            // Looked up once: the lookup reads cgroup files, which costs more than compressing
            // a small checkpoint.
            let spare = std::thread::available_parallelism()
                .map_or(0, |n| n.get().saturating_sub(1));
            let (tickets, inbox) = mpsc::channel::<Ticket>();
            let inbox = Arc::new(Mutex::new(inbox));
            let mut started = 0;
            for n in 0..spare {
                let inbox = Arc::clone(&inbox);
                let spawned = std::thread::Builder::new()
                    .name(format!("cairn-gzip-{n}"))
                    .spawn(move || help(&inbox));
                match spawned {
                    Ok(_) => started += 1,
                    Err(err) => {
                        tracing::warn!(error = %err, "could not start a compression thread; compressing on fewer cores");
                        break;
                    }
                }
            }
            (started > 0).then_some(tickets)
        })
        .as_ref()
}

/// A helper's loop: one block per ticket, until the process ends.
fn help(inbox: &Mutex<mpsc::Receiver<Ticket>>) {
    loop {
        let ticket = {
            let inbox = inbox.lock().unwrap_or_else(PoisonError::into_inner);
            match inbox.recv() {
                Ok(ticket) => ticket,
                // The sender lives in a static: this happens only as the process exits.
                Err(_) => return,
            }
        };
        let Some(block) = pop_block(&ticket.queued) else {
            continue;
        };
        let index = block.index;
        // A result is sent for every block taken, so its save never waits for it in vain.
        let compressed = panic::catch_unwind(AssertUnwindSafe(|| {
            compress_block(block, FlushCompress::Sync)
        }))
        .unwrap_or_else(|_| Compressed {
            index,
            result: Err(io::Error::other("a compression thread panicked")),
        });
        // The save may have failed and gone; its result is then not needed.
        let _ = ticket.done.send(compressed);
    }
}

/// Collects the document into blocks and queues each full one for the helpers.
pub(super) struct BlockWriter {
    queued: Queued,
    done_tx: mpsc::Sender<Compressed>,
    /// The block being filled (grows as needed, so a small document stays small).
    block: Vec<u8>,
    blocks_sent: usize,
    total_len: usize,
}

impl BlockWriter {
    /// Queue the full block and tell a helper about it.
    fn ship(&mut self) {
        // The document is at least a block long: the next one is allocated whole at once.
        let data = std::mem::replace(&mut self.block, Vec::with_capacity(BLOCK_BYTES));
        self.queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(Block {
                index: self.blocks_sent,
                data,
            });
        self.blocks_sent += 1;
        // Looked up here, not per document: a small one never starts the helpers.
        if let Some(helpers) = helpers() {
            // Fails only if every helper is gone; the block is then compressed here.
            let _ = helpers.send(Ticket {
                queued: Arc::clone(&self.queued),
                done: self.done_tx.clone(),
            });
        }
    }
}

impl Write for BlockWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = BLOCK_BYTES - self.block.len();
        let taken = buf.len().min(room);
        self.block.extend_from_slice(&buf[..taken]);
        self.total_len += taken;
        if self.block.len() == BLOCK_BYTES {
            self.ship();
        }
        Ok(taken)
    }

    /// Most calls are a few bytes that fit the current block: one inlined copy.
    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if buf.len() < BLOCK_BYTES - self.block.len() {
            self.block.extend_from_slice(buf);
            self.total_len += buf.len();
            return Ok(());
        }
        let mut rest = buf;
        while !rest.is_empty() {
            let taken = self.write(rest)?;
            rest = &rest[taken..];
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Compress one block with a pooled compressor.
fn compress_block(block: Block, flush: FlushCompress) -> Compressed {
    let mut out = Vec::with_capacity(block.data.len() / 2 + 64);
    let result = deflate_chunk(&block.data, flush, &mut out).map(|crc| (out, crc));
    Compressed {
        index: block.index,
        result,
    }
}

/// Append `input` as raw deflate to `out`, ending with `flush` (Sync: byte-aligned, more may
/// follow; Finish: the final block). Returns the chunk's CRC-32.
fn deflate_chunk(
    input: &[u8],
    flush: FlushCompress,
    out: &mut Vec<u8>,
) -> io::Result<crc32fast::Hasher> {
    let mut crc = crc32fast::Hasher::new();
    crc.update(input);
    let mut compressor = take_compressor();
    let result = run_deflate(&mut compressor, input, flush, out);
    if result.is_ok() {
        give_back(compressor);
    }
    result.map(|()| crc)
}

/// Drive `compressor` over all of `input`, growing `out` as needed.
fn run_deflate(
    compressor: &mut Compress,
    input: &[u8],
    flush: FlushCompress,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let start = compressor.total_in();
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.capacity().max(4096) / 2);
        }
        let consumed = (compressor.total_in() - start) as usize;
        let status = compressor
            .compress_vec(&input[consumed..], out, flush)
            .map_err(|err| io::Error::other(format!("deflate failed: {err}")))?;
        let all_in = (compressor.total_in() - start) as usize == input.len();
        match flush {
            FlushCompress::Finish if status == Status::StreamEnd => return Ok(()),
            // A flush is complete once the output was not filled to the brim.
            FlushCompress::Finish => {}
            _ if all_in && out.len() < out.capacity() => return Ok(()),
            _ => {}
        }
    }
}

/// A reset compressor from the pool, or a new one.
fn take_compressor() -> Compress {
    let pooled = POOL.lock().unwrap_or_else(PoisonError::into_inner).pop();
    pooled.unwrap_or_else(|| Compress::new(Compression::new(LEVEL), false))
}

/// Return a compressor that finished its work cleanly.
fn give_back(mut compressor: Compress) {
    compressor.reset();
    let mut pool = POOL.lock().unwrap_or_else(PoisonError::into_inner);
    if pool.len() < POOL_LIMIT {
        pool.push(compressor);
    }
}

#[cfg(test)]
mod tests {
    use std::io::{self, Read, Write};

    use super::{gzip, gzip_with, BLOCK_BYTES};

    fn gunzip(bytes: &[u8]) -> Vec<u8> {
        let mut decoder = flate2::bufread::GzDecoder::new(bytes);
        let mut out = Vec::new();
        decoder.read_to_end(&mut out).unwrap();
        assert!(decoder.into_inner().is_empty(), "one member, nothing after");
        out
    }

    /// Text-like bytes that compress, with some variety.
    fn sample(len: usize) -> Vec<u8> {
        let words = ["alpha ", "beta ", "gamma ", "delta ", "{\"k\":17}, "];
        let mut rng = fastrand::Rng::with_seed(7);
        let mut out = Vec::with_capacity(len + 16);
        while out.len() < len {
            out.extend_from_slice(words[rng.usize(..words.len())].as_bytes());
            if rng.u8(..) == 0 {
                out.extend(std::iter::repeat_with(|| rng.u8(..)).take(40));
            }
        }
        out.truncate(len);
        out
    }

    #[test]
    fn round_trips_small_empty_and_parallel_inputs() {
        for len in [
            0,
            1,
            1000,
            70_000,
            BLOCK_BYTES - 1,
            BLOCK_BYTES,
            BLOCK_BYTES + 1,
            3 << 20,
        ] {
            let input = sample(len);
            let encoded = gzip(&input).unwrap();
            assert_eq!(gunzip(&encoded), input, "length {len}");
            if len > 1000 {
                assert!(encoded.len() < input.len() / 2, "length {len} compresses");
            }
        }
    }

    #[test]
    fn pooled_compressors_start_clean() {
        // The same input twice gives the same bytes: a reused compressor carries nothing over.
        let input = sample(50_000);
        let first = gzip(&input).unwrap();
        let _other = gzip(&sample(9_000)).unwrap();
        assert_eq!(gzip(&input).unwrap(), first);
    }

    #[test]
    fn many_small_writes_across_block_boundaries() {
        let input = sample(5 * BLOCK_BYTES + 17);
        let encoded = gzip_with(|w| {
            for piece in input.chunks(1000) {
                w.write_all(piece)?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(gunzip(&encoded), input);
    }

    #[test]
    fn saves_on_many_threads_at_once_share_the_helpers() {
        // More saving threads than helpers: each save gets its own blocks back, in order,
        // whichever thread compressed them.
        let inputs: Vec<Vec<u8>> = (0..8).map(|n| sample(3 * BLOCK_BYTES + n * 977)).collect();
        std::thread::scope(|scope| {
            for input in &inputs {
                scope.spawn(move || {
                    for _ in 0..5 {
                        assert_eq!(gunzip(&gzip(input).unwrap()), *input);
                    }
                });
            }
        });
    }

    /// The ids of this process's compression helpers.
    fn helper_threads() -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .map(|task| task.unwrap().path())
            .filter(|task| {
                std::fs::read_to_string(task.join("comm"))
                    .is_ok_and(|name| name.starts_with("cairn-gzip"))
            })
            .map(|task| task.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        ids.sort();
        ids
    }

    #[test]
    fn helpers_are_started_once_not_per_save() {
        let input = sample(4 * BLOCK_BYTES);
        gzip(&input).unwrap();
        let started = helper_threads();
        let spare = std::thread::available_parallelism().map_or(0, |n| n.get() - 1);
        assert_eq!(
            started.len(),
            spare,
            "one helper per spare core: {started:?}"
        );
        for _ in 0..20 {
            assert_eq!(gunzip(&gzip(&input).unwrap()), input);
        }
        assert_eq!(
            helper_threads(),
            started,
            "the same helpers serve every save"
        );
    }

    #[test]
    fn a_failing_producer_fails_the_encoding() {
        let err = gzip_with(|w| {
            w.write_all(&sample(3 * BLOCK_BYTES))?;
            Err(io::Error::other("serializer gave up"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "serializer gave up");
    }
}
