//! The append-only JSONL log under timelines and inboxes: one JSON record per line.
//!
//! One torn-tail rule for both. Replaying stops at the first line without its newline: only
//! the last line can be torn (a crash mid-write), so it is cut when the log is opened for
//! appending and ignored when it is only read. A complete line that does not decode (a damaged
//! line in the middle) is logged and skipped; the lines after it still count.
//!
//! A failed append (a full disk, an I/O error) never leaves part of its line behind: the log
//! knows the length of its good prefix and cuts the file back to it, so the next append starts
//! on a line of its own instead of being glued to a fragment. A line glued by an older drover
//! (`{"op":"queued","me{"op":"queued",…}`) is salvaged at replay from its last whole record.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::StoreError;

/// One log open for appending.
#[derive(Debug)]
pub(crate) struct Log {
    path: PathBuf,
    file: File,
    /// The length of the prefix made of whole, acknowledged lines: a failed append is cut
    /// back to it.
    len: u64,
    /// A failed append could not be cut back: the next append first retries the cut.
    torn: bool,
}

impl Log {
    /// Opens (creating it and its folder) the log at `path`, hands every well-formed record to
    /// `apply` in order, and cuts a torn last line. Returns the log and how many complete lines
    /// it holds.
    pub(crate) fn open<T: DeserializeOwned>(
        path: &Path,
        apply: impl FnMut(T),
    ) -> Result<(Log, u64), StoreError> {
        if let Some(dir) = path.parent() {
            crate::private::create_dir_all(dir).map_err(StoreError::io("create folder", dir))?;
        }
        let mut file = crate::private::open_options()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(StoreError::io("open", path))?;
        let replayed =
            replay(BufReader::new(&file), path, apply).map_err(StoreError::io("read", path))?;
        let len = file
            .seek(SeekFrom::End(0))
            .map_err(StoreError::io("read", path))?;
        if replayed.good_len < len {
            tracing::warn!(path = %path.display(), cut = len - replayed.good_len, "cut the torn end of a log");
            file.set_len(replayed.good_len)
                .map_err(StoreError::io("truncate", path))?;
        }
        let log = Log {
            path: path.to_path_buf(),
            file,
            len: replayed.good_len,
            torn: false,
        };
        Ok((log, replayed.lines))
    }

    /// Whether the log holds nothing.
    pub(crate) fn is_empty(&self) -> Result<bool, StoreError> {
        let meta = self
            .file
            .metadata()
            .map_err(StoreError::io("read", &self.path))?;
        Ok(meta.len() == 0)
    }

    /// Empties the log (everything in it is settled).
    pub(crate) fn clear(&mut self) -> Result<(), StoreError> {
        self.file
            .set_len(0)
            .map_err(StoreError::io("truncate", &self.path))?;
        self.len = 0;
        self.torn = false;
        Ok(())
    }

    /// Appends one record as one line, left in the page cache (a daemon crash keeps it; see
    /// [`Log::sync`] for a machine crash).
    pub(crate) fn append(&mut self, record: &impl Serialize) -> Result<(), StoreError> {
        self.append_line(record, false)
    }

    /// Appends one record and fsyncs it before returning.
    pub(crate) fn append_synced(&mut self, record: &impl Serialize) -> Result<(), StoreError> {
        self.append_line(record, true)
    }

    /// Writes the whole line (and syncs it) or leaves the file as it was: on any failure the
    /// file is cut back to its good prefix.
    fn append_line(&mut self, record: &impl Serialize, sync: bool) -> Result<(), StoreError> {
        let line = self.encode(record)?;
        if self.torn {
            self.cut_back()?;
        }
        // One write per line: with O_APPEND a line is never interleaved with another.
        let written = self
            .file
            .write_all(&line)
            .and_then(|()| if sync { self.file.sync_data() } else { Ok(()) });
        match written {
            Ok(()) => {
                self.len += line.len() as u64;
                Ok(())
            }
            Err(e) => {
                // Part of the line may be in the file (ENOSPC in the middle of it).
                self.torn = true;
                if let Err(cut) = self.cut_back() {
                    tracing::error!(path = %self.path.display(), error = %cut,
                        "cannot cut a failed append back; the next append retries");
                }
                Err(StoreError::io("append to", &self.path)(e))
            }
        }
    }

    /// Cuts the file back to its good prefix (shrinking frees space, so this works on a full
    /// disk).
    fn cut_back(&mut self) -> Result<(), StoreError> {
        self.file
            .set_len(self.len)
            .map_err(StoreError::io("truncate", &self.path))?;
        self.torn = false;
        Ok(())
    }

    /// Makes everything appended so far durable against a machine crash.
    pub(crate) fn sync(&mut self) -> Result<(), StoreError> {
        self.file
            .sync_data()
            .map_err(StoreError::io("sync", &self.path))
    }

    fn encode(&self, record: &impl Serialize) -> Result<Vec<u8>, StoreError> {
        let mut line = serde_json::to_vec(record).map_err(|source| StoreError::Encode {
            path: self.path.clone(),
            source,
        })?;
        line.push(b'\n');
        Ok(line)
    }
}

/// Replays the log at `path` without opening it for appending (a missing log is empty).
/// Returns how many complete lines it holds.
pub(crate) fn read<T: DeserializeOwned>(
    path: &Path,
    apply: impl FnMut(T),
) -> Result<u64, StoreError> {
    match File::open(path) {
        Ok(file) => replay(BufReader::new(file), path, apply)
            .map(|replayed| replayed.lines)
            .map_err(StoreError::io("read", path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(StoreError::io("read", path)(e)),
    }
}

struct Replayed {
    /// The length of the prefix made of complete lines.
    good_len: u64,
    /// Complete lines, damaged ones included.
    lines: u64,
}

fn replay<T: DeserializeOwned>(
    mut reader: impl BufRead,
    path: &Path,
    mut apply: impl FnMut(T),
) -> io::Result<Replayed> {
    let mut replayed = Replayed {
        good_len: 0,
        lines: 0,
    };
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            break; // the end, or a torn last line: its write never finished
        }
        match serde_json::from_slice::<T>(&line) {
            Ok(record) => apply(record),
            Err(e) => match salvage::<T>(&line) {
                Some(record) => {
                    tracing::warn!(path = %path.display(), "a log line was glued to a fragment; kept its whole record");
                    apply(record);
                }
                None => {
                    tracing::warn!(path = %path.display(), error = %e, "skipped a damaged log line");
                }
            },
        }
        replayed.good_len += n as u64;
        replayed.lines += 1;
    }
    Ok(replayed)
}

/// The whole record at the end of a line an older drover glued to the fragment of a failed
/// append: both logs' records start with `{"op":`, so the last such start that decodes is it.
fn salvage<T: DeserializeOwned>(line: &[u8]) -> Option<T> {
    const START: &[u8] = b"{\"op\":";
    (1..line.len())
        .rev()
        .filter(|&i| line[i..].starts_with(START))
        .find_map(|i| serde_json::from_slice::<T>(&line[i..]).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    #[test]
    fn a_torn_last_line_is_cut_and_a_damaged_middle_line_skipped() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("logs").join("x.jsonl");
        let (mut log, lines) = Log::open::<u32>(&path, |_| {}).expect("open");
        assert_eq!(lines, 0);
        log.append(&1u32).expect("append");
        log.append_synced(&2u32).expect("append");
        drop(log);
        let mut raw = OpenOptions::new().append(true).open(&path).expect("raw");
        raw.write_all(b"garbage\n3\n4").expect("write");
        drop(raw);

        let mut seen = Vec::new();
        assert_eq!(read::<u32>(&path, |n| seen.push(n)).expect("read"), 4);
        assert_eq!(seen, [1, 2, 3]);
        assert_eq!(std::fs::read(&path).expect("bytes"), b"1\n2\ngarbage\n3\n4");

        let mut seen = Vec::new();
        let (log, lines) = Log::open::<u32>(&path, |n| seen.push(n)).expect("reopen");
        assert_eq!((lines, seen), (4, vec![1, 2, 3]));
        assert!(!log.is_empty().expect("len"));
        assert_eq!(std::fs::read(&path).expect("bytes"), b"1\n2\ngarbage\n3\n");
    }

    #[test]
    fn a_glued_line_keeps_its_whole_record() {
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct R {
            op: String,
            n: u32,
        }
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("x.jsonl");
        std::fs::write(
            &path,
            br#"{"op":"a","n":1}
{"op":"a","n{"op":"b","n":3}
"#,
        )
        .expect("write");
        let mut seen = Vec::new();
        assert_eq!(read::<R>(&path, |r| seen.push(r.n)).expect("read"), 2);
        assert_eq!(seen, [1, 3]);
    }

    #[test]
    fn a_missing_log_reads_empty() {
        let dir = tempfile::tempdir().expect("dir");
        let n = read::<u32>(&dir.path().join("none.jsonl"), |_| {}).expect("read");
        assert_eq!(n, 0);
    }
}
