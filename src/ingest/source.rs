//! Reading input text files: compression detection, checksums of the raw bytes, and
//! cutting the text into blocks of whole lines with known line numbers.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use xxhash_rust::xxh3::Xxh3;

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
    inner: File,
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

/// Line-oriented reader over a plain, gzip or zstd file.
pub struct LineSource {
    path: PathBuf,
    compression: Compression,
    reader: Box<dyn BufRead + Send>,
    hash: Arc<Mutex<HashState>>,
    /// Lines handed out so far.
    lines: u64,
    carry: Vec<u8>,
    eof: bool,
}

impl LineSource {
    pub fn open(path: &Path) -> Result<Self> {
        let mut file =
            File::open(path).with_context(|| format!("{}: cannot open", path.display()))?;
        let mut magic = [0u8; 4];
        let got = read_up_to(&mut file, &mut magic)
            .with_context(|| format!("{}: cannot read", path.display()))?;
        let compression = Compression::detect(&magic[..got]);
        drop(file);
        let state = Arc::new(Mutex::new(HashState::default()));
        let raw = HashingReader {
            inner: File::open(path).with_context(|| format!("{}: cannot open", path.display()))?,
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
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lines handed out so far (the 1-based number of the last one).
    pub fn lines_read(&self) -> u64 {
        self.lines
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
        let n = self
            .reader
            .read_until(b'\n', buf)
            .with_context(|| self.io_context())?;
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
            // A single line longer than `target`: keep reading until it ends.
            let want = buf.len() * 2;
            self.fill(&mut buf, want)?;
        }
        if buf.is_empty() {
            return Ok(None);
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
            let got = self
                .reader
                .read_until(b'\n', &mut block.bytes)
                .with_context(|| self.io_context())?;
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

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
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
