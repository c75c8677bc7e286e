//! Reading input text files (or standard input): compression detection, checksums of the
//! raw bytes, and cutting the text into blocks of whole lines with known line numbers.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Context, Result};
use xxhash_rust::xxh3::Xxh3;

use crate::error::InputError;

/// The longest line ingest reads, in bytes without its '\n': 64 MiB. Rows are held whole
/// while they are parsed, so without a cap one "line" of a file that is not rows of text
/// (a disk image, a file of zeros) would be read into memory until allocation fails.
/// The longest real rows are far shorter: an XC-repository row with a few hundred
/// thousand `id:value` tokens is a few MB, a dense LIBSVM row of 1 million features about
/// 20 MB (`docs/formats.md`, "Limits").
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// How standard input is named in messages (`<stdin>:3: found ...`).
pub const STDIN_NAME: &str = "<stdin>";

/// The most bytes gzip (deflate: a 258-byte match in 2 bits) can decompress one input
/// byte to.
const GZIP_MAX_RATIO: u64 = 1032;
/// The same for zstd: an RLE block of 128 KiB is 4 bytes (3 of header, 1 repeated).
const ZSTD_MAX_RATIO: u64 = 32768;

/// How an input file is compressed, detected from its first bytes (not its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        }
    }

    /// The most bytes `raw_bytes` of this compression can decompress to: a bound on the
    /// lines (hence rows) a file can hold, known before it is read.
    pub fn max_decompressed(self, raw_bytes: u64) -> u64 {
        let ratio = match self {
            Compression::None => 1,
            Compression::Gzip => GZIP_MAX_RATIO,
            Compression::Zstd => ZSTD_MAX_RATIO,
        };
        raw_bytes.saturating_mul(ratio)
    }

    fn detect(magic: &[u8]) -> Self {
        if magic.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// Facts about an input file once it has been read through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    pub path: PathBuf,
    /// Size of the file on disk (compressed size for compressed input).
    pub bytes: u64,
    /// xxh3-64 of the file's raw bytes, 16 hex digits.
    pub checksum: String,
    pub compression: Compression,
}

#[derive(Default)]
struct HashState {
    hasher: Xxh3,
    bytes: u64,
}

/// Hashes the raw (possibly compressed) bytes as they are read.
struct HashingReader {
    inner: Box<dyn Read + Send>,
    state: Arc<Mutex<HashState>>,
}

impl Read for HashingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut state = self.state.lock().expect("hash state poisoned");
        state.hasher.update(&buf[..n]);
        state.bytes += n as u64;
        Ok(n)
    }
}

/// A block of whole lines.
#[derive(Debug, Clone, Default)]
pub struct TextBlock {
    /// 1-based line number of the first line in `bytes`.
    pub first_line: u64,
    pub n_lines: u64,
    pub bytes: Vec<u8>,
    /// False when the file's last line has no '\n' (a truncated file, or a careless writer).
    pub terminated: bool,
}

/// Line-oriented reader over a plain, gzip or zstd file, or a stream read once.
pub struct LineSource {
    path: PathBuf,
    compression: Compression,
    reader: Box<dyn BufRead + Send>,
    hash: Arc<Mutex<HashState>>,
    /// Lines handed out so far.
    lines: u64,
    carry: Vec<u8>,
    eof: bool,
    /// Size of the file on disk when it was opened (`u64::MAX` for a stream, whose size is
    /// not known: no bound).
    raw_len: u64,
}

/// How [`special_kind`] names a FIFO.
const FIFO: &str = "a FIFO (named pipe)";

/// What `path` is when it exists but is not a regular file (symlinks followed); None for a
/// regular file, or when there is nothing to look at (opening it reports that).
fn special_kind(path: &Path) -> Option<&'static str> {
    let kind = std::fs::metadata(path).ok()?.file_type();
    Some(if kind.is_file() {
        return None;
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        FIFO
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a file that is not a regular file"
    })
}

/// Refuses an input that exists but is not a regular file, before anything opens it
/// (opening a FIFO blocks until a writer comes; a device never ends). Ingest reads every
/// input more than once and records its size and checksum, which only a regular file
/// can give.
pub fn refuse_special_file(path: &Path) -> Result<(), InputError> {
    match special_kind(path) {
        None => Ok(()),
        Some(kind) => Err(InputError::new(
            path,
            0,
            format!(
                "found {kind}, expected a regular file: ingest reads each input more than \
                 once (label scan, parse, and the checksum that recognises a repeated \
                 ingest), which a pipe or device cannot replay; save the data to a file first"
            ),
        )),
    }
}

/// The message for a line longer than [`MAX_LINE_BYTES`].
fn line_too_long(path: &Path, line: u64) -> anyhow::Error {
    anyhow!(InputError::new(
        path,
        line,
        format!(
            "found a line longer than {MAX_LINE_BYTES} bytes, expected lines of at most \
             {} MiB (is this a text file of rows? docs/formats.md, \"Limits\")",
            MAX_LINE_BYTES >> 20
        )
    ))
}

impl LineSource {
    pub fn open(path: &Path) -> Result<Self> {
        refuse_special_file(path)?;
        let mut file =
            File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let mut magic = [0u8; 4];
        let got = read_up_to(&mut file, &mut magic)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        let compression = Compression::detect(&magic[..got]);
        let raw_len = file
            .metadata()
            .with_context(|| format!("{}: cannot read", path.display()))?
            .len();
        drop(file);
        let inner = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        Self::over(path, compression, Box::new(inner), raw_len)
    }

    /// Opens `path` to be read once, front to back (`predict --input`): a regular file as
    /// [`LineSource::open`] does, and also a FIFO (`<(zcat rows.gz)`, a named pipe), which
    /// a single pass can read. Other special files are refused as `open` refuses them.
    pub fn open_once(path: &Path) -> Result<Self> {
        match special_kind(path) {
            None => Self::open(path),
            Some(FIFO) => {
                let file =
                    File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
                Self::from_stream(path, Box::new(file))
            }
            Some(kind) => Err(InputError::new(
                path,
                0,
                format!("found {kind}, expected a regular file or a pipe"),
            )
            .into()),
        }
    }

    /// Standard input, named `<stdin>` in messages; compression by its first bytes.
    pub fn stdin() -> Result<Self> {
        Self::from_stream(Path::new(STDIN_NAME), Box::new(std::io::stdin()))
    }

    /// A stream read once (a pipe, standard input), named `name` in messages: its first
    /// bytes are read to detect the compression, then handed back in front of the rest.
    fn from_stream(name: &Path, mut inner: Box<dyn Read + Send>) -> Result<Self> {
        let mut magic = vec![0u8; 4];
        let got = read_up_to(&mut inner, &mut magic)
            .with_context(|| format!("{}: cannot read", name.display()))?;
        magic.truncate(got);
        let compression = Compression::detect(&magic);
        let whole = std::io::Cursor::new(magic).chain(inner);
        Self::over(name, compression, Box::new(whole), u64::MAX)
    }

    /// A source over `raw`, the input's bytes from the first, decompressed as
    /// `compression` says and hashed as read.
    fn over(
        path: &Path,
        compression: Compression,
        raw: Box<dyn Read + Send>,
        raw_len: u64,
    ) -> Result<Self> {
        let state = Arc::new(Mutex::new(HashState::default()));
        let raw = HashingReader {
            inner: raw,
            state: Arc::clone(&state),
        };
        const BUF: usize = 1 << 20;
        let reader: Box<dyn BufRead + Send> = match compression {
            Compression::None => Box::new(BufReader::with_capacity(BUF, raw)),
            Compression::Gzip => Box::new(BufReader::with_capacity(
                BUF,
                flate2::read::MultiGzDecoder::new(BufReader::with_capacity(BUF, raw)),
            )),
            Compression::Zstd => Box::new(BufReader::with_capacity(
                BUF,
                zstd::stream::read::Decoder::new(raw)
                    .with_context(|| format!("{}: cannot start zstd decoder", path.display()))?,
            )),
        };
        Ok(LineSource {
            path: path.to_path_buf(),
            compression,
            reader,
            hash: state,
            lines: 0,
            carry: Vec::new(),
            eof: false,
            raw_len,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lines handed out so far (the 1-based number of the last one).
    pub fn lines_read(&self) -> u64 {
        self.lines
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Size of the file on disk (compressed size for compressed input; `u64::MAX` for a
    /// stream).
    pub fn raw_len(&self) -> u64 {
        self.raw_len
    }

    /// The most lines the file can hold: every line but an unterminated last one ends with
    /// '\n', and that one has at least a byte, so no more than its (decompressed) bytes.
    pub fn max_lines(&self) -> u64 {
        self.compression.max_decompressed(self.raw_len)
    }

    /// Raw bytes read from disk so far (for progress).
    pub fn raw_bytes_read(&self) -> u64 {
        self.hash.lock().expect("hash state poisoned").bytes
    }

    fn io_context(&self) -> String {
        format!(
            "{}: read error after line {}",
            self.path.display(),
            self.lines
        )
    }

    /// Reads one line into `buf` (without its '\n'). Returns false at end of file.
    /// `terminated` tells whether the line ended with '\n'.
    pub fn read_line(&mut self, buf: &mut Vec<u8>) -> Result<Option<bool>> {
        debug_assert!(self.carry.is_empty(), "read_line after read_block");
        buf.clear();
        let n = self.read_capped_line(buf)?;
        if n == 0 {
            self.eof = true;
            return Ok(None);
        }
        self.lines += 1;
        let terminated = buf.last() == Some(&b'\n');
        if terminated {
            buf.pop();
        }
        Ok(Some(terminated))
    }

    /// Appends the next line (with its '\n') to `buf`, reading at most [`MAX_LINE_BYTES`] + 1
    /// bytes of it: a longer line is an error naming it, not an allocation. Returns the
    /// bytes read (0 at end of file).
    fn read_capped_line(&mut self, buf: &mut Vec<u8>) -> Result<usize> {
        let start = buf.len();
        let read = (&mut self.reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', buf);
        let n = read.with_context(|| self.io_context())?;
        let text = n - usize::from(buf.last() == Some(&b'\n') && buf.len() > start);
        if text > MAX_LINE_BYTES {
            return Err(line_too_long(&self.path, self.lines + 1));
        }
        Ok(n)
    }

    /// Reads about `target` bytes of whole lines into `buf` (a block handed back by a
    /// consumer, so its allocation is reused and spares the page faults of fresh memory).
    /// Returns None at end of file.
    pub fn read_block_into(
        &mut self,
        target: usize,
        mut buf: Vec<u8>,
    ) -> Result<Option<TextBlock>> {
        buf.clear();
        buf.extend_from_slice(&self.carry);
        self.carry.clear();
        buf.reserve(target.saturating_sub(buf.len()) + (1 << 16));
        loop {
            while buf.len() < target && !self.eof {
                self.fill(&mut buf, target)?;
            }
            if self.eof || memchr::memrchr(b'\n', &buf).is_some() {
                break;
            }
            // A single line longer than `target`: keep reading until it ends, holding at
            // most MAX_LINE_BYTES + 1 bytes of it (plus one read of 64 KiB). The block then
            // starts with that line.
            if buf.len() > MAX_LINE_BYTES {
                return Err(line_too_long(&self.path, self.lines + 1));
            }
            let want = (buf.len() * 2).min(MAX_LINE_BYTES + 1);
            buf.reserve_exact((want - buf.len()).max(1 << 16));
            self.fill(&mut buf, want)?;
        }
        if buf.is_empty() {
            return Ok(None);
        }
        // The last read may have ended a line up to 64 KiB past the cap; only a block's
        // first line can be that long (every other one is within `target` + 64 KiB).
        if memchr::memchr(b'\n', &buf).unwrap_or(buf.len()) > MAX_LINE_BYTES {
            return Err(line_too_long(&self.path, self.lines + 1));
        }
        if !self.eof {
            let cut = memchr::memrchr(b'\n', &buf).expect("checked above") + 1;
            self.carry.extend_from_slice(&buf[cut..]);
            buf.truncate(cut);
        }
        let newlines = memchr::memchr_iter(b'\n', &buf).count() as u64;
        let terminated = buf.last() == Some(&b'\n');
        let n_lines = newlines + u64::from(!terminated);
        let block = TextBlock {
            first_line: self.lines + 1,
            n_lines,
            bytes: buf,
            terminated,
        };
        self.lines += n_lines;
        Ok(Some(block))
    }

    /// Reads exactly `n` lines (fewer only at end of file) as one block.
    pub fn read_lines(&mut self, n: u64) -> Result<TextBlock> {
        let mut block = TextBlock {
            first_line: self.lines + 1,
            n_lines: 0,
            bytes: Vec::new(),
            terminated: true,
        };
        while block.n_lines < n {
            let before = block.bytes.len();
            let got = self.read_capped_line(&mut block.bytes)?;
            if got == 0 {
                self.eof = true;
                break;
            }
            block.n_lines += 1;
            self.lines += 1;
            if block.bytes.last() != Some(&b'\n') {
                block.terminated = false;
                debug_assert!(block.bytes.len() > before);
                break;
            }
        }
        Ok(block)
    }

    /// Appends up to `want - buf.len()` (at least 64 KiB) bytes; sets `eof` when none came.
    fn fill(&mut self, buf: &mut Vec<u8>, want: usize) -> Result<()> {
        let old = buf.len();
        let grow = want.saturating_sub(old).max(1 << 16);
        buf.resize(old + grow, 0);
        let n = loop {
            match self.reader.read(&mut buf[old..]) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                buf.truncate(old);
                return Err(e).with_context(|| self.io_context());
            }
        };
        buf.truncate(old + n);
        if n == 0 {
            self.eof = true;
        }
        Ok(())
    }

    /// Reads whatever is left (so the checksum covers the whole file) and reports.
    pub fn finish(mut self) -> Result<SourceInfo> {
        let mut sink = [0u8; 1 << 14];
        while self
            .reader
            .read(&mut sink)
            .with_context(|| self.io_context())?
            > 0
        {}
        let state = self.hash.lock().expect("hash state poisoned");
        Ok(SourceInfo {
            path: self.path.clone(),
            bytes: state.bytes,
            checksum: format!("{:016x}", state.hasher.digest()),
            compression: self.compression,
        })
    }
}

fn read_up_to(file: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = file.read(&mut buf[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// Checksum of a file's raw bytes without parsing it (used to decide whether a repeated
/// ingest has the same inputs).
pub fn checksum_source(path: &Path) -> Result<SourceInfo> {
    refuse_special_file(path)?;
    let mut raw = File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    let mut magic = Vec::new();
    loop {
        let n = raw
            .read(&mut buf)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        if n == 0 {
            break;
        }
        if magic.len() < 4 {
            magic.extend_from_slice(&buf[..n.min(4 - magic.len())]);
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok(SourceInfo {
        path: path.to_path_buf(),
        bytes,
        checksum: format!("{:016x}", hasher.digest()),
        compression: Compression::detect(&magic),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of `head`, then a line of `long` bytes 'x' (and '\n' when `terminated`).
    fn file_with_long_line(head: &str, long: usize, terminated: bool) -> tempfile::NamedTempFile {
        let mut text = head.as_bytes().to_vec();
        text.resize(head.len() + long, b'x');
        if terminated {
            text.push(b'\n');
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        file
    }

    fn too_long_at(e: &anyhow::Error, path: &Path, line: u64) {
        let at = format!(
            "{}:{line}: found a line longer than {MAX_LINE_BYTES} bytes",
            path.display()
        );
        assert!(e.to_string().starts_with(&at), "{e:#}");
    }

    /// Reads a header line, then every block, as the layouts do (the header leaves the
    /// buffered reader part-full, so later reads come short); returns the lines of the blocks,
    /// or the first error.
    fn read_all(path: &Path) -> Result<u64> {
        let mut src = LineSource::open(path)?;
        src.read_line(&mut Vec::new())?;
        let mut lines = 0;
        while let Some(b) = src.read_block_into(4 << 20, Vec::new())? {
            lines += b.n_lines;
        }
        Ok(lines)
    }

    #[test]
    fn a_line_at_the_cap_is_read_one_byte_longer_is_refused() {
        for terminated in [true, false] {
            // The long line right after the header (where the reads double to exactly the
            // cap), and after two short rows (where they do not).
            for (head, rows) in [("h\n", 1), ("h\n1\n2\n", 3)] {
                let ok = file_with_long_line(head, MAX_LINE_BYTES, terminated);
                assert_eq!(read_all(ok.path()).unwrap(), rows);
                // Also lines that end within the last read's 64 KiB past the cap.
                for over in [1, 4, 60_000] {
                    let bad = file_with_long_line(head, MAX_LINE_BYTES + over, terminated);
                    too_long_at(&read_all(bad.path()).unwrap_err(), bad.path(), rows + 1);
                }
            }
        }
    }

    #[test]
    fn single_lines_are_capped_too() {
        let bad = file_with_long_line("", MAX_LINE_BYTES + 1, true);
        let mut src = LineSource::open(bad.path()).unwrap();
        too_long_at(&src.read_line(&mut Vec::new()).unwrap_err(), bad.path(), 1);
        let bad = file_with_long_line("a\nb\n", MAX_LINE_BYTES + 1, false);
        let mut src = LineSource::open(bad.path()).unwrap();
        too_long_at(&src.read_lines(5).unwrap_err(), bad.path(), 3);
    }

    #[test]
    fn special_files_are_refused_before_they_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let e = LineSource::open(dir.path()).err().unwrap();
        assert!(
            e.to_string()
                .contains("found a directory, expected a regular file"),
            "{e}"
        );
        let e = checksum_source(Path::new("/dev/zero")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("/dev/zero: found a character device"),
            "{e}"
        );
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Opening it would block until a writer came: the test would hang.
        let e = LineSource::open(&fifo).err().unwrap();
        assert!(e.to_string().contains("found a FIFO (named pipe)"), "{e}");
    }

    /// A stream (standard input, a pipe) is decompressed by its first bytes too, and its
    /// lines numbered as a file's; a stream shorter than the magic is plain text.
    #[test]
    fn streams_are_read_by_their_magic_bytes() {
        let text = b"1 1:1\n2 2:2\n";
        for bytes in [text.to_vec(), zstd::encode_all(&text[..], 3).unwrap()] {
            let stream = Box::new(std::io::Cursor::new(bytes));
            let mut src = LineSource::from_stream(Path::new(STDIN_NAME), stream).unwrap();
            let block = src.read_lines(5).unwrap();
            assert_eq!((block.first_line, block.n_lines), (1, 2));
            assert_eq!(block.bytes, text);
        }
        let mut src = LineSource::from_stream(
            Path::new("x"),
            Box::new(std::io::Cursor::new(b"7".to_vec())),
        )
        .unwrap();
        let mut line = Vec::new();
        assert_eq!(src.read_line(&mut line).unwrap(), Some(false));
        assert_eq!(line, b"7");
    }

    #[test]
    fn line_capacity_is_the_decompressed_bound() {
        assert_eq!(Compression::None.max_decompressed(10), 10);
        assert_eq!(Compression::Gzip.max_decompressed(10), 10_320);
        assert_eq!(Compression::Zstd.max_decompressed(u64::MAX), u64::MAX);
    }
}
