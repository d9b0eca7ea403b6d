//! A job's output, addressed by absolute byte offset: the last bytes in a bounded ring in
//! memory, and the whole stream spilled to `$DROVER_HOME/jobs/<owner>/<job>.log` in two
//! segments (the older one `<job>.log.1`) of at most [`SEGMENT_BYTES`] each, so a job that
//! writes forever takes bounded memory and bounded disk.
//!
//! One writer (the thread that reads the job's pipe) appends; any number of readers read from
//! an offset and get the bytes from there and the next offset, so a reader that follows a job
//! never misses or repeats a byte. A reader that asks for bytes no longer kept (older than the
//! older segment, or lost to a failed spill) gets the first byte still kept, and is told how
//! many it skipped.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

/// How many of the latest bytes are kept in memory.
pub const RING_BYTES: usize = 1 << 20;
/// The size at which the log's current segment becomes the older one (which it replaces):
/// at most twice this is kept on disk per job.
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// The most one read returns.
pub const MAX_READ: usize = 1 << 20;

/// Bytes of a job's output from an offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The offset of `bytes[0]`: the offset asked for, unless `skipped`.
    pub offset: u64,
    pub bytes: Vec<u8>,
    /// Where the next read starts: `offset + bytes.len()`.
    pub next: u64,
    /// How many bytes the job has written so far.
    pub end: u64,
    /// Bytes between the offset asked for and `offset` that are no longer kept.
    pub skipped: u64,
}

/// Where the spilled bytes are: `[older_start, current_start)` in `<job>.log.1`,
/// `[current_start, spilled)` in `<job>.log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Segments {
    pub older_start: Option<u64>,
    pub current_start: u64,
    /// Bytes written to the log; below the job's end only when a write failed.
    pub spilled: u64,
}

#[derive(Debug)]
struct State {
    ring: VecDeque<u8>,
    /// The offset of `ring[0]`.
    ring_start: u64,
    end: u64,
    segments: Segments,
    /// The spill stopped (a full disk, a vanished folder): why.
    spill_error: Option<String>,
}

/// One job's output (see the module's documentation).
#[derive(Debug)]
pub struct Output {
    log: PathBuf,
    ring_limit: usize,
    state: Mutex<State>,
    /// Readers hold it while they read the log, the writer while it renames a segment, so a
    /// read never opens a segment that is being replaced.
    files: Mutex<()>,
    /// The end offset, for followers.
    end_tx: watch::Sender<u64>,
}

impl Output {
    /// A new, empty output spilled to `log`.
    pub fn new(log: PathBuf, ring_limit: usize) -> Output {
        Output::with(log, ring_limit, 0, Segments::default())
    }

    /// The output of a job that no longer runs, read from its log: nothing in memory.
    pub fn from_disk(log: PathBuf, end: u64, segments: Segments) -> Output {
        Output::with(log, 0, end, segments)
    }

    fn with(log: PathBuf, ring_limit: usize, end: u64, segments: Segments) -> Output {
        let (end_tx, _) = watch::channel(end);
        Output {
            log,
            ring_limit,
            state: Mutex::new(State {
                ring: VecDeque::new(),
                ring_start: end,
                end,
                segments,
                spill_error: None,
            }),
            files: Mutex::new(()),
            end_tx,
        }
    }

    /// The log file of the current segment.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    fn older_path(&self) -> PathBuf {
        older_path(&self.log)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Poisoning: every change to the state is a few assignments that cannot panic halfway.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The end offset now, and a receiver that changes when it grows.
    pub fn follow(&self) -> watch::Receiver<u64> {
        self.end_tx.subscribe()
    }

    pub fn end(&self) -> u64 {
        self.state().end
    }

    pub fn segments(&self) -> Segments {
        self.state().segments
    }

    pub fn spill_error(&self) -> Option<String> {
        self.state().spill_error.clone()
    }

    /// The first offset still kept (in the log or the ring).
    pub fn first_kept(&self) -> u64 {
        let state = self.state();
        first_kept(&state)
    }

    /// The ring is let go (the job ended and its log holds everything): reads go to the log.
    /// A job whose spill failed keeps its ring, its only copy of the end.
    pub fn release_ring(&self) {
        let mut state = self.state();
        if state.spill_error.is_none() && state.segments.spilled == state.end {
            state.ring = VecDeque::new();
            state.ring_start = state.end;
        }
    }

    /// Reads up to `max` bytes (at most [`MAX_READ`]) from `offset`. An offset past the end
    /// reads nothing and says where the end is.
    pub fn read(&self, offset: u64, max: usize) -> Chunk {
        // A rotation between reading the state and opening the log can leave a read empty:
        // the next attempt sees the new segments.
        let mut chunk = self.read_once(offset, max);
        for _ in 0..2 {
            if !chunk.bytes.is_empty() || chunk.offset >= chunk.end {
                break;
            }
            chunk = self.read_once(offset, max);
        }
        chunk
    }

    fn read_once(&self, offset: u64, max: usize) -> Chunk {
        let max = max.clamp(1, MAX_READ);
        let (start, end, from_ring, segments) = {
            let state = self.state();
            let kept = first_kept(&state);
            let start = offset.clamp(kept, state.end);
            if start >= state.ring_start {
                let skip = usize::try_from(start - state.ring_start).unwrap_or(usize::MAX);
                (
                    start,
                    state.end,
                    Some(ring_bytes(&state.ring, skip, max)),
                    state.segments,
                )
            } else {
                (start, state.end, None, state.segments)
            }
        };
        let bytes = from_ring.unwrap_or_else(|| {
            let until = end.min(segments.spilled);
            let want = usize::try_from(until.saturating_sub(start))
                .unwrap_or(usize::MAX)
                .min(max);
            self.read_log(start, want, segments).unwrap_or_else(|e| {
                tracing::warn!(log = %self.log.display(), error = %e, "cannot read a job's log");
                Vec::new()
            })
        });
        let next = start + bytes.len() as u64;
        Chunk {
            offset: start,
            bytes,
            next,
            end,
            skipped: start.saturating_sub(offset),
        }
    }

    /// The last `n` bytes (at most [`MAX_READ`]).
    pub fn tail(&self, n: usize) -> Chunk {
        let end = self.end();
        let n = n.min(MAX_READ) as u64;
        let chunk = self.read(end.saturating_sub(n), MAX_READ);
        Chunk {
            skipped: 0,
            ..chunk
        }
    }

    fn read_log(&self, start: u64, want: usize, segments: Segments) -> io::Result<Vec<u8>> {
        let _files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        // The segments may have moved on since the state was read: read them again.
        let segments = {
            let now = self.state().segments;
            if now == segments { segments } else { now }
        };
        let mut out = Vec::with_capacity(want);
        let mut at = start;
        if at < segments.current_start {
            let older_start = segments.older_start.unwrap_or(segments.current_start);
            if at >= older_start {
                let n = (segments.current_start - at).min(want as u64);
                read_at(&self.older_path(), at - older_start, n, &mut out)?;
                at += n;
            } else {
                // Gone with a rotation since the state was read: the caller asks again.
                return Ok(out);
            }
        }
        let rest = want.saturating_sub(out.len()) as u64;
        if rest > 0 && at >= segments.current_start {
            read_at(&self.log, at - segments.current_start, rest, &mut out)?;
        }
        Ok(out)
    }
}

/// `max` bytes of the ring from `skip`, copied slice by slice (under the state's lock: the
/// writer waits for this copy, so it is one `memcpy` or two).
fn ring_bytes(ring: &VecDeque<u8>, skip: usize, max: usize) -> Vec<u8> {
    let (a, b) = ring.as_slices();
    let n = ring.len().saturating_sub(skip).min(max);
    let mut bytes = Vec::with_capacity(n);
    if skip < a.len() {
        let from_a = (a.len() - skip).min(n);
        bytes.extend_from_slice(&a[skip..skip + from_a]);
        bytes.extend_from_slice(&b[..n - from_a]);
    } else {
        let at = skip - a.len();
        bytes.extend_from_slice(&b[at..at + n]);
    }
    bytes
}

fn first_kept(state: &State) -> u64 {
    let spilled_from = state
        .segments
        .older_start
        .unwrap_or(state.segments.current_start);
    if state.spill_error.is_some() && state.segments.spilled < state.ring_start {
        // A gap between what the log holds and the ring: only the ring is contiguous to the end.
        state.ring_start
    } else {
        spilled_from.min(state.ring_start)
    }
}

fn read_at(path: &Path, from: u64, n: u64, out: &mut Vec<u8>) -> io::Result<()> {
    let mut file = File::open(path)?;
    file.seek(SeekFrom::Start(from))?;
    file.take(n).read_to_end(out)?;
    Ok(())
}

/// The older segment of the log `log`.
pub fn older_path(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// The writing side: owned by the one thread that reads the job's pipe.
#[derive(Debug)]
pub struct Writer {
    file: Option<File>,
    /// Bytes in the current segment.
    in_segment: u64,
    segment_limit: u64,
}

impl Writer {
    /// Creates the log (private to the user) for `output`.
    pub fn create(output: &Output) -> io::Result<Writer> {
        Writer::with_segment_limit(output, SEGMENT_BYTES)
    }

    pub fn with_segment_limit(output: &Output, segment_limit: u64) -> io::Result<Writer> {
        let file = drover_core::private::open_options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&output.log)?;
        Ok(Writer {
            file: Some(file),
            in_segment: 0,
            segment_limit: segment_limit.max(1),
        })
    }

    /// Appends `bytes` to the log and the ring, then tells followers. Returns whether the
    /// current segment was replaced (the job's record keeps where the segments start).
    pub fn push(&mut self, output: &Output, bytes: &[u8]) -> bool {
        let mut rotated = false;
        if self.file.is_some() && self.in_segment >= self.segment_limit {
            rotated = self.rotate(output);
        }
        // The log first, outside the state's lock: readers of the ring never wait for the disk.
        let spill = self.file.as_mut().map(|file| file.write_all(bytes));
        let mut state = output.state();
        match spill {
            Some(Ok(())) => {
                self.in_segment += bytes.len() as u64;
                state.segments.spilled += bytes.len() as u64;
            }
            Some(Err(e)) => {
                tracing::warn!(log = %output.log.display(), error = %e, "a job's log stopped: the rest of its output is kept in memory only");
                state.spill_error = Some(format!("cannot write `{}`: {e}", output.log.display()));
                self.file = None;
            }
            None => {}
        }
        // Room is made before the bytes go in, so the ring never holds (nor allocates) more
        // than its limit; of a push larger than the ring only its end is kept.
        let limit = output.ring_limit;
        let keep = &bytes[bytes.len().saturating_sub(limit)..];
        let excess = (state.ring.len() + keep.len()).saturating_sub(limit);
        if excess > 0 {
            state.ring.drain(..excess);
        }
        if state.ring.capacity() < limit {
            let more = limit - state.ring.len();
            state.ring.reserve_exact(more);
        }
        state.ring.extend(keep);
        state.end += bytes.len() as u64;
        state.ring_start = state.end - state.ring.len() as u64;
        let end = state.end;
        drop(state);
        output.end_tx.send_replace(end);
        rotated
    }

    /// The current segment becomes the older one (replacing it), and a new one starts.
    fn rotate(&mut self, output: &Output) -> bool {
        let _files = output.files.lock().unwrap_or_else(PoisonError::into_inner);
        let older = output.older_path();
        let renamed = std::fs::rename(&output.log, &older).and_then(|()| {
            drover_core::private::open_options()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&output.log)
        });
        match renamed {
            Ok(file) => {
                self.file = Some(file);
                self.in_segment = 0;
                let mut state = output.state();
                let current = state.segments.current_start;
                state.segments.older_start = Some(current);
                state.segments.current_start = state.segments.spilled;
                true
            }
            Err(e) => {
                tracing::warn!(log = %output.log.display(), error = %e, "cannot start a new segment of a job's log");
                output.state().spill_error =
                    Some(format!("cannot rotate `{}`: {e}", output.log.display()));
                self.file = None;
                false
            }
        }
    }
}

/// The longest prefix of `bytes` that ends on a whole UTF-8 character (an incomplete sequence
/// at the end waits for the next read), as text: invalid bytes become U+FFFD. Returns the
/// text and how many bytes it consumed. A chunk that is only an incomplete sequence is
/// consumed whole when `at_end` (nothing will complete it).
pub fn utf8_prefix(bytes: &[u8], at_end: bool) -> (String, usize) {
    let mut cut = bytes.len();
    if !at_end {
        // An incomplete sequence is at most 3 bytes long: look back that far for its lead byte.
        for back in 1..=3.min(bytes.len()) {
            let byte = bytes[bytes.len() - back];
            if byte & 0xC0 == 0x80 {
                continue; // a continuation byte
            }
            let len = match byte {
                b if b & 0x80 == 0 => 1,
                b if b & 0xE0 == 0xC0 => 2,
                b if b & 0xF0 == 0xE0 => 3,
                b if b & 0xF8 == 0xF0 => 4,
                _ => 1,
            };
            if len > back {
                cut = bytes.len() - back;
            }
            break;
        }
    }
    (String::from_utf8_lossy(&bytes[..cut]).into_owned(), cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(from: u64, n: usize) -> Vec<u8> {
        (from..from + n as u64).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn reads_by_offset_across_the_ring_and_both_segments() {
        let dir = tempfile::tempdir().expect("dir");
        let output = Output::new(dir.path().join("job-1.log"), 100);
        let mut writer = Writer::with_segment_limit(&output, 250).expect("writer");
        let mut written = 0u64;
        let mut rotations = 0;
        for size in [7usize, 93, 120, 1, 300, 64, 64, 77, 100, 5, 9] {
            if writer.push(&output, &pattern(written, size)) {
                rotations += 1;
            }
            written += size as u64;
        }
        assert_eq!(output.end(), written);
        assert_eq!(rotations, 2, "the log rotates each time a segment is full");
        // A follower reading in small steps from the first byte kept sees every byte once.
        let first = output.first_kept();
        assert!(first > 0, "a rotation drops the oldest segment");
        let mut at = first;
        let mut seen = Vec::new();
        while at < written {
            let chunk = output.read(at, 33);
            assert_eq!(chunk.offset, at);
            assert!(!chunk.bytes.is_empty(), "no progress at {at}");
            seen.extend_from_slice(&chunk.bytes);
            at = chunk.next;
        }
        assert_eq!(
            seen,
            pattern(first, usize::try_from(written - first).expect("small"))
        );
        // Before what is kept: the first byte kept, and how many were skipped.
        let chunk = output.read(0, 10);
        assert_eq!((chunk.offset, chunk.skipped), (first, first));
        assert_eq!(chunk.bytes, pattern(first, 10));
        // The tail comes from the ring.
        assert_eq!(output.tail(5).bytes, pattern(written - 5, 5));
        // Past the end: nothing, and the end.
        let chunk = output.read(written + 10, 10);
        assert!(chunk.bytes.is_empty());
        assert_eq!(chunk.next, written);
        // Released, the ring is gone and the log answers the same.
        output.release_ring();
        assert_eq!(
            output.read(written - 40, 40).bytes,
            pattern(written - 40, 40)
        );
    }

    #[test]
    fn the_ring_never_allocates_past_its_limit() {
        let dir = tempfile::tempdir().expect("dir");
        let output = Output::new(dir.path().join("job-1.log"), 1000);
        let mut writer = Writer::create(&output).expect("writer");
        let mut written = 0u64;
        // Pushes smaller than the ring, one as large, one larger: the ring wraps and is
        // refilled whole, its capacity staying at its limit.
        for size in [300usize, 700, 1, 999, 1000, 2500, 64, 900] {
            writer.push(&output, &pattern(written, size));
            written += size as u64;
            let state = output.state();
            assert!(state.ring.len() <= 1000);
            assert!(
                state.ring.capacity() < 2000,
                "capacity {} for a ring of 1000",
                state.ring.capacity()
            );
            assert_eq!(state.ring_start + state.ring.len() as u64, written);
        }
        // Reads that start in either half of the wrapped ring.
        for from in [written - 1000, written - 950, written - 100, written - 1] {
            let chunk = output.read(from, 2000);
            assert_eq!(
                chunk.bytes,
                pattern(from, usize::try_from(written - from).expect("small"))
            );
        }
    }

    #[test]
    fn text_stops_before_an_incomplete_character() {
        let bytes = "aé€".as_bytes(); // 1 + 2 + 3 bytes
        assert_eq!(utf8_prefix(bytes, false), ("aé€".to_string(), 6));
        assert_eq!(utf8_prefix(&bytes[..5], false), ("aé".to_string(), 3));
        assert_eq!(utf8_prefix(&bytes[..2], false), ("a".to_string(), 1));
        assert_eq!(utf8_prefix(&bytes[..5], true).1, 5);
        assert_eq!(utf8_prefix(b"\xff\xfe", false).1, 2);
    }
}
