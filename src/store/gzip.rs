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
//!   cairn's strict decoder all read. A document smaller than one block never starts a thread.

use std::io::{self, Write};
use std::sync::mpsc;
use std::sync::{Mutex, PoisonError};
use std::thread::{Scope, ScopedJoinHandle};

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
pub fn gzip(input: &[u8]) -> io::Result<Vec<u8>> {
    gzip_with(|w| w.write_all(input))
}

/// What `produce` writes, as one complete gzip member. Full blocks are compressed on other
/// cores while `produce` goes on writing. The writer is a concrete type, not `dyn Write`: a
/// serializer makes a call per token, and each one is then an inlined copy.
pub fn gzip_with(
    produce: impl FnOnce(&mut BlockWriter<'_, '_>) -> io::Result<()>,
) -> io::Result<Vec<u8>> {
    let (job_tx, job_rx) = mpsc::channel::<Block>();
    let job_rx = Mutex::new(job_rx);
    let (done_tx, done_rx) = mpsc::channel::<Compressed>();
    let helpers = spare_cores();
    std::thread::scope(|scope| {
        let mut writer = BlockWriter {
            scope,
            jobs: Some(job_tx),
            job_rx: &job_rx,
            done_tx: done_tx.clone(),
            helpers_left: helpers,
            helpers: Vec::new(),
            block: Vec::new(),
            blocks_sent: 0,
            total_len: 0,
        };
        let produced = produce(&mut writer);
        let BlockWriter {
            jobs,
            done_tx: helpers_done_tx,
            helpers,
            block: last,
            blocks_sent,
            total_len,
            ..
        } = writer;
        // No more blocks: helpers stop once the queue is empty. Only they hold senders of
        // results from now on, so collecting ends when they have all stopped.
        drop((jobs, helpers_done_tx));
        let assembled = produced
            .and_then(|()| assemble(&job_rx, done_tx, &done_rx, last, blocks_sent, total_len));
        // Joined here, so a helper that panicked makes an error rather than a panic of the
        // scope (its block is then missing from `assemble`'s result too).
        let mut panicked = false;
        for helper in helpers {
            panicked |= helper.join().is_err();
        }
        if panicked {
            return Err(io::Error::other("a compression thread panicked"));
        }
        assembled
    })
}

/// Compress what is still queued and the last block on this thread, collect every block's
/// result, and put the member together: header, blocks in order, CRC-32 and length.
fn assemble(
    job_rx: &Mutex<mpsc::Receiver<Block>>,
    done_tx: mpsc::Sender<Compressed>,
    done_rx: &mpsc::Receiver<Compressed>,
    last: Vec<u8>,
    blocks_sent: usize,
    total_len: usize,
) -> io::Result<Vec<u8>> {
    while let Some(block) = next_block(job_rx, false) {
        // The receiver is `done_rx`, alive until this function returns.
        let _ = done_tx.send(compress_block(block, FlushCompress::Sync));
    }
    drop(done_tx);
    let tail = compress_block(
        Block {
            index: blocks_sent,
            data: last,
        },
        FlushCompress::Finish,
    );
    let mut parts: Vec<Option<(Vec<u8>, crc32fast::Hasher)>> = Vec::new();
    parts.resize_with(blocks_sent + 1, || None);
    for done in std::iter::once(tail).chain(done_rx.iter()) {
        let index = done.index;
        parts[index] = Some(done.result?);
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

/// Cores beyond the calling thread's. Looked up once: the lookup reads cgroup files, which
/// costs more than compressing a small checkpoint.
fn spare_cores() -> usize {
    static SPARE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SPARE.get_or_init(|| {
        std::thread::available_parallelism().map_or(0, |n| n.get().saturating_sub(1))
    })
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

/// Collects the document into blocks and hands each full one to a helper thread.
pub struct BlockWriter<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    /// Where full blocks go; `None` once the document is complete.
    jobs: Option<mpsc::Sender<Block>>,
    job_rx: &'env Mutex<mpsc::Receiver<Block>>,
    done_tx: mpsc::Sender<Compressed>,
    /// Helper threads that may still be started (one per spare core, on demand).
    helpers_left: usize,
    /// The helpers started, to be joined.
    helpers: Vec<ScopedJoinHandle<'scope, ()>>,
    /// The block being filled (grows as needed, so a small document stays small).
    block: Vec<u8>,
    blocks_sent: usize,
    total_len: usize,
}

impl BlockWriter<'_, '_> {
    /// Queue the full block, starting a helper thread if one is still allowed.
    fn ship(&mut self) {
        // The document is at least a block long: the next one is allocated whole at once.
        let data = std::mem::replace(&mut self.block, Vec::with_capacity(BLOCK_BYTES));
        let block = Block {
            index: self.blocks_sent,
            data,
        };
        self.blocks_sent += 1;
        let Some(jobs) = &self.jobs else {
            return;
        };
        if jobs.send(block).is_err() {
            // Unreachable: the receiver lives until the scope ends.
            return;
        }
        if self.helpers_left > 0 {
            self.helpers_left -= 1;
            let job_rx = self.job_rx;
            let done_tx = self.done_tx.clone();
            let helper = self.scope.spawn(move || {
                while let Some(block) = next_block(job_rx, true) {
                    if done_tx
                        .send(compress_block(block, FlushCompress::Sync))
                        .is_err()
                    {
                        break;
                    }
                }
            });
            self.helpers.push(helper);
        }
    }
}

impl Write for BlockWriter<'_, '_> {
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

/// The next queued block; `wait` blocks until one comes or the queue is closed.
fn next_block(job_rx: &Mutex<mpsc::Receiver<Block>>, wait: bool) -> Option<Block> {
    let rx = job_rx.lock().unwrap_or_else(PoisonError::into_inner);
    if wait {
        rx.recv().ok()
    } else {
        rx.try_recv().ok()
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
    fn a_failing_producer_fails_the_encoding() {
        let err = gzip_with(|w| {
            w.write_all(&sample(3 * BLOCK_BYTES))?;
            Err(io::Error::other("serializer gave up"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "serializer gave up");
    }
}
