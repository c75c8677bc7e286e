//! Registered files checked against the catalog when read: the one place where a stage's
//! view of a file (its bytes) is compared with what the catalog recorded when the file was
//! registered (its size and xxh3-64 checksum).
//!
//! Stages never open a registered file by path: they get a [`Registered`] from the catalog
//! (through [`super::workspace::Workspace`]) and read it through [`Registered::read`] (the
//! whole file, hashed as it is read: chunks, checkpoints, predictions, metrics) or
//! `NpyMap::open_registered` (a memory map hashed once when opened: small `.npy` files). A
//! memory-mapped matrix too large to hash on every open (K_XX̃) is hashed on its first use
//! after registration and the catalog records that (`Workspace::map_large`); `pipeline
//! verify` hashes every file, always. Whatever does not match stops the stage with one
//! message, naming the file, its owner and the repair:
//!
//! ```text
//! chunk (dataset 'toy', ingest run 1, datasets/toy.run1/train/part-00000.parquet): checksum
//! mismatch (stored 1c0f…, found 93ab…); run 'pipeline verify --repair'
//! ```

use std::fmt;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A file the catalog registered, with what it recorded about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// What the file holds: an artifact kind (`chunk`, `kxx`, ...) or `checkpoint`.
    pub kind: &'static str,
    /// Who registered it: `dataset 'toy', ingest run 1`, `svd run 2`, ...
    pub owner: String,
    /// Workspace-relative path, as the catalog records it.
    pub rel: String,
    /// Absolute path.
    pub path: PathBuf,
    /// Size in bytes when registered.
    pub bytes: u64,
    /// xxh3-64 of the bytes when registered, 16 hex digits.
    pub checksum: String,
    /// The artifact row's id (None for a checkpoint), to record a full verification.
    pub artifact_id: Option<i64>,
    /// When the file was last hashed in full after registration (large files only).
    pub verified_at: Option<String>,
}

/// How a file differs from its registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    /// The file is gone.
    Missing,
    /// The file has another size (truncated or extended).
    Size { stored: u64, found: u64 },
    /// Same size, other bytes.
    Checksum { stored: String, found: String },
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::Missing => write!(f, "missing"),
            Damage::Size { stored, found } => write!(
                f,
                "size mismatch (stored {stored} bytes, found {found} bytes)"
            ),
            Damage::Checksum { stored, found } => {
                write!(f, "checksum mismatch (stored {stored}, found {found})")
            }
        }
    }
}

/// xxh3-64 of `bytes` as the catalog writes it (16 hex digits).
pub fn checksum_of(bytes: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(bytes))
}

/// What hashing a registered file in full found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// None: the file is as registered.
    pub damage: Option<Damage>,
    /// Bytes read and hashed.
    pub hashed: u64,
}

impl Registered {
    /// `kind (owner, path)`: how messages name the file.
    pub fn name(&self) -> String {
        format!("{} ({}, {})", self.kind, self.owner, self.rel)
    }

    /// The error a stage stops with when the file is not as registered.
    pub fn damaged(&self, damage: &Damage) -> anyhow::Error {
        anyhow::anyhow!("{}: {damage}; run 'pipeline verify --repair'", self.name())
    }

    /// Compares a size and checksum found on disk with the registered ones.
    pub fn compare(&self, bytes: u64, checksum: impl FnOnce() -> String) -> Option<Damage> {
        if bytes != self.bytes {
            return Some(Damage::Size {
                stored: self.bytes,
                found: bytes,
            });
        }
        let found = checksum();
        (found != self.checksum).then(|| Damage::Checksum {
            stored: self.checksum.clone(),
            found,
        })
    }

    /// Ok when `bytes` (the whole file, read or mapped) are the registered ones; else the
    /// error naming the file.
    pub fn check_bytes(&self, bytes: &[u8]) -> Result<()> {
        match self.compare(bytes.len() as u64, || checksum_of(bytes)) {
            None => Ok(()),
            Some(damage) => Err(self.damaged(&damage)),
        }
    }

    /// An error opening the file: a missing file is damage, anything else an I/O error.
    fn open_error(&self, e: std::io::Error) -> anyhow::Error {
        if e.kind() == ErrorKind::NotFound {
            self.damaged(&Damage::Missing)
        } else {
            anyhow::Error::new(e).context(format!("opening {}", self.name()))
        }
    }

    /// The whole file, checked against its registration: the reader of every registered
    /// file a stage decodes from memory (chunks, checkpoints, predictions, small JSON).
    pub fn read(&self) -> Result<Vec<u8>> {
        let bytes = std::fs::read(&self.path).map_err(|e| self.open_error(e))?;
        self.check_bytes(&bytes)?;
        Ok(bytes)
    }

    /// Ok when the file exists; a missing file is damage (e.g. before mapping it).
    pub fn ensure_present(&self) -> Result<()> {
        std::fs::metadata(&self.path)
            .map(|_| ())
            .map_err(|e| self.open_error(e))
    }

    /// Ok when `found` is the registered size (a large file verified since registration).
    pub fn check_size(&self, found: u64) -> Result<()> {
        if found == self.bytes {
            return Ok(());
        }
        Err(self.damaged(&Damage::Size {
            stored: self.bytes,
            found,
        }))
    }

    /// Hashes the file in full, streaming (bounded memory whatever its size), and says what,
    /// if anything, differs from its registration (`pipeline verify`).
    pub fn inspect(&self) -> Result<Inspection> {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Ok(Inspection {
                    damage: Some(Damage::Missing),
                    hashed: 0,
                })
            }
            Err(e) => return Err(self.open_error(e)),
        };
        let size = file
            .metadata()
            .with_context(|| format!("reading the size of {}", self.name()))?
            .len();
        if size != self.bytes {
            return Ok(Inspection {
                damage: self.compare(size, String::new),
                hashed: 0,
            });
        }
        let (hashed, checksum) = hash_stream(&mut file, &self.path)?;
        Ok(Inspection {
            damage: self.compare(hashed, || checksum),
            hashed,
        })
    }

    /// Hashes the file in full and fails with the damage message if it differs.
    pub fn verify(&self) -> Result<u64> {
        let found = self.inspect()?;
        match found.damage {
            None => Ok(found.hashed),
            Some(damage) => Err(self.damaged(&damage)),
        }
    }

    /// The absolute path (for messages and for formats that need a path).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// xxh3-64 of a stream read to its end in 1 MiB blocks: (bytes read, checksum).
fn hash_stream(reader: &mut impl Read, path: &Path) -> Result<(u64, String)> {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    Ok((bytes, format!("{:016x}", hasher.digest())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(path: &Path, bytes: &[u8]) -> Registered {
        Registered {
            kind: "chunk",
            owner: "dataset 'toy', ingest run 1".into(),
            rel: "datasets/toy.run1/train/part-00000.parquet".into(),
            path: path.to_path_buf(),
            bytes: bytes.len() as u64,
            checksum: checksum_of(bytes),
            artifact_id: Some(1),
            verified_at: None,
        }
    }

    #[test]
    fn damage_is_named_with_the_file_its_owner_and_the_repair() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let good = b"0123456789".to_vec();
        std::fs::write(&path, &good).unwrap();
        let file = registered(&path, &good);
        assert_eq!(file.read().unwrap(), good);
        assert_eq!(file.verify().unwrap(), 10);
        assert_eq!(file.inspect().unwrap().damage, None);

        std::fs::write(&path, b"0123456780").unwrap();
        let e = format!("{:#}", file.read().unwrap_err());
        assert!(
            e.starts_with(
                "chunk (dataset 'toy', ingest run 1, datasets/toy.run1/train/part-00000.parquet): \
                 checksum mismatch (stored "
            ),
            "{e}"
        );
        assert!(e.ends_with("; run 'pipeline verify --repair'"), "{e}");
        assert!(matches!(
            file.inspect().unwrap().damage,
            Some(Damage::Checksum { .. })
        ));

        std::fs::write(&path, b"01234").unwrap();
        let e = format!("{:#}", file.read().unwrap_err());
        assert!(
            e.contains("size mismatch (stored 10 bytes, found 5 bytes)"),
            "{e}"
        );
        assert_eq!(
            file.inspect().unwrap().damage,
            Some(Damage::Size {
                stored: 10,
                found: 5
            })
        );

        std::fs::remove_file(&path).unwrap();
        let e = format!("{:#}", file.read().unwrap_err());
        assert!(e.contains("part-00000.parquet): missing; run"), "{e}");
        assert!(format!("{:#}", file.ensure_present().unwrap_err()).contains("missing"));
        assert_eq!(file.inspect().unwrap().damage, Some(Damage::Missing));
    }
}
