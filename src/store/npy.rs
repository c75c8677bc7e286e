//! Dense matrices as NumPy `.npy` files (format v1/v2, little-endian, C order), read and
//! written through memory maps so an N×R matrix larger than RAM never has to be loaded.
//!
//! Header handling and views over the mapped bytes are ndarray-npy's; this module adds
//! creation of a zero-filled file of the final size, row-block writes into its writable
//! map, fsync and checksums.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use memmap2::{Mmap, MmapMut};
use ndarray::{ArrayView1, ArrayView2, ArrayViewMut2};
use ndarray_npy::{ViewMutNpyExt, ViewNpyExt, WritableElement, WriteNpyExt};

use super::chunks::{checksum_file, synced_and_summed, WrittenFile};
use super::integrity::Registered;
use crate::failpoint;

/// An N×C f32 `.npy` file being filled row block by row block through a writable map.
pub struct NpyRowWriter {
    path: PathBuf,
    file: File,
    map: MmapMut,
    rows: usize,
    cols: usize,
}

impl NpyRowWriter {
    /// Creates `path` holding a zero rows×cols f32 matrix (a sparse file until written).
    pub fn create(path: &Path, rows: usize, cols: usize) -> Result<Self> {
        Self::create_shaped(path, (rows, cols), rows, cols)
    }

    /// Creates `path` holding a zero f32 vector of `len` entries, filled through
    /// [`NpyRowWriter::view_mut1`] (an N-vector written as it streams by, never held).
    pub fn create_vector(path: &Path, len: usize) -> Result<Self> {
        Self::create_shaped(path, len, len, 1)
    }

    fn create_shaped<Sh: ndarray::IntoDimension>(
        path: &Path,
        shape: Sh,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        ndarray_npy::write_zeroed_npy::<f32, _>(&file, shape)
            .with_context(|| format!("sizing {}", path.display()))?;
        reserve(&file, path)?;
        // SAFETY: the file was created by us (create_new) and no other process maps it.
        let map = unsafe { MmapMut::map_mut(&file) }
            .with_context(|| format!("mapping {}", path.display()))?;
        Ok(NpyRowWriter {
            path: path.to_path_buf(),
            file,
            map,
            rows,
            cols,
        })
    }

    pub fn view_mut(&mut self) -> Result<ArrayViewMut2<'_, f32>> {
        ArrayViewMut2::<f32>::view_mut_npy(&mut self.map)
            .with_context(|| format!("viewing {}", self.path.display()))
    }

    /// The vector of a writer made by [`NpyRowWriter::create_vector`].
    pub fn view_mut1(&mut self) -> Result<ndarray::ArrayViewMut1<'_, f32>> {
        ndarray::ArrayViewMut1::<f32>::view_mut_npy(&mut self.map)
            .with_context(|| format!("viewing {}", self.path.display()))
    }

    /// Copies `block` into rows `first_row..first_row + block.nrows()`.
    pub fn write_rows(&mut self, first_row: usize, block: ArrayView2<'_, f32>) -> Result<()> {
        let (rows, cols) = (self.rows, self.cols);
        if block.ncols() != cols || first_row + block.nrows() > rows {
            bail!(
                "row block {}x{} at row {first_row} does not fit the {rows}x{cols} matrix {}",
                block.nrows(),
                block.ncols(),
                self.path.display()
            );
        }
        let mut view = self.view_mut()?;
        view.slice_mut(ndarray::s![first_row..first_row + block.nrows(), ..])
            .assign(&block);
        Ok(())
    }

    /// Flushes the map, fsyncs the file and returns its size and checksum.
    pub fn finish(self) -> Result<WrittenFile> {
        self.map
            .flush()
            .with_context(|| format!("flushing {}", self.path.display()))?;
        self.file
            .sync_all()
            .with_context(|| format!("syncing {}", self.path.display()))?;
        drop(self.map);
        checksum_file(&self.path)
    }
}

/// Allocates the disk blocks of a file sized (sparsely) by `write_zeroed_npy`, so that a
/// full disk is an error here, named, and not a SIGBUS later: a store into a mapped page
/// that the file system cannot back kills the process with SIGBUS, which no error handling
/// can catch. A test's full disk strikes here too (`npy-write-enospc:FILE`), with the
/// header in the file and the data region not yet backed.
fn reserve(file: &File, path: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let reserving = || format!("reserving the disk space of {}", path.display());
    failpoint::enospc_at("npy-write-enospc", file_name(path)).with_context(reserving)?;
    let len = file.metadata().with_context(reserving)?.len();
    let len = libc::off_t::try_from(len).with_context(reserving)?;
    // SAFETY: posix_fallocate on a file descriptor we own, over its own length; it touches
    // no memory of ours.
    let code = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if code != 0 {
        return Err(std::io::Error::from_raw_os_error(code)).with_context(reserving);
    }
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned())
}

/// Writes a whole (small) array as `.npy`, fsyncs it and returns size and checksum.
pub fn write_array<T: WriteNpyExt + ?Sized>(path: &Path, array: &T) -> Result<WrittenFile> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = std::io::BufWriter::new(&file);
    array
        .write_npy(&mut writer)
        .with_context(|| format!("writing {}", path.display()))?;
    // A test's full disk strikes here (`npy-write-enospc:FILE`), the file partly flushed.
    failpoint::enospc_at("npy-write-enospc", file_name(path))
        .with_context(|| format!("writing {}", path.display()))?;
    // Flushed here, not on drop, where a failed write (a full disk) would go unseen.
    writer
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", path.display()))?;
    synced_and_summed(file, path)
}

/// A read-only memory map of an `.npy` file.
pub struct NpyMap {
    path: PathBuf,
    map: Mmap,
}

impl NpyMap {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: published artifacts are never modified in place (stages write new files
        // and rename), so the mapped bytes do not change under us.
        let map =
            unsafe { Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        Ok(NpyMap {
            path: path.to_path_buf(),
            map,
        })
    }

    /// An f32 matrix held in memory (an anonymous map) as a `.npy` file's bytes would be:
    /// what a model file's basis becomes, so it is read by the same code as `basis.npy`.
    /// `name` stands for the file in messages.
    pub fn in_memory(name: &Path, array: ArrayView2<'_, f32>) -> Result<Self> {
        let mut bytes = Vec::new();
        array
            .write_npy(&mut bytes)
            .with_context(|| format!("{}: encoding the basis", name.display()))?;
        let mut map = MmapMut::map_anon(bytes.len())
            .with_context(|| format!("{}: mapping {} bytes", name.display(), bytes.len()))?;
        map.copy_from_slice(&bytes);
        let map = map
            .make_read_only()
            .with_context(|| format!("{}: sealing the map", name.display()))?;
        Ok(NpyMap {
            path: name.to_path_buf(),
            map,
        })
    }

    /// A registered `.npy` file, mapped and hashed once in full against the catalog.
    pub fn open_registered(file: &Registered) -> Result<Self> {
        file.ensure_present()?;
        let map = Self::open(file.path())?;
        file.check_bytes(map.bytes())?;
        Ok(map)
    }

    /// A registered `.npy` file checked for its size only: a matrix too large to hash on
    /// every open, hashed once since registration (`Workspace::map_large`).
    pub fn open_registered_size_checked(file: &Registered) -> Result<Self> {
        file.ensure_present()?;
        let map = Self::open(file.path())?;
        file.check_size(map.bytes().len() as u64)?;
        Ok(map)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file as mapped (header and data), e.g. to hash it.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn view2<T: WritableElement + ndarray_npy::ViewElement>(
        &self,
    ) -> Result<ArrayView2<'_, T>> {
        ArrayView2::<T>::view_npy(&self.map).with_context(|| {
            format!(
                "{}: not a 2-D array of the expected type",
                self.path.display()
            )
        })
    }

    /// Asks the kernel to start reading the last `len` bytes-from-`offset` range of the
    /// array's data (offsets counted from the start of the data, after the header), so a
    /// consumer that will gather rows from that range finds them in the page cache. The
    /// data sits at the end of the file, which gives its start without parsing the header.
    pub fn will_need(&self, data_bytes: usize, offset: usize, len: usize) -> Result<()> {
        let start = self.map.len().checked_sub(data_bytes).with_context(|| {
            format!(
                "{}: shorter than its data ({data_bytes} bytes)",
                self.path.display()
            )
        })?;
        let len = len.min(data_bytes.saturating_sub(offset));
        if len > 0 {
            self.map
                .advise_range(memmap2::Advice::WillNeed, start + offset, len)
                .with_context(|| format!("madvise on {}", self.path.display()))?;
        }
        Ok(())
    }

    pub fn view1<T: WritableElement + ndarray_npy::ViewElement>(
        &self,
    ) -> Result<ArrayView1<'_, T>> {
        ArrayView1::<T>::view_npy(&self.map).with_context(|| {
            format!(
                "{}: not a 1-D array of the expected type",
                self.path.display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array1, Array2};

    #[test]
    fn row_blocks_round_trip_through_the_map() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.npy");
        let full = Array2::from_shape_fn((7, 3), |(i, j)| (i * 10 + j) as f32 + 0.25);
        let mut w = NpyRowWriter::create(&path, 7, 3).unwrap();
        w.write_rows(4, full.slice(ndarray::s![4.., ..])).unwrap();
        w.write_rows(0, full.slice(ndarray::s![..4, ..])).unwrap();
        assert!(w.write_rows(6, full.slice(ndarray::s![..2, ..])).is_err());
        let written = w.finish().unwrap();
        assert_eq!(written.bytes, std::fs::metadata(&path).unwrap().len());
        let map = NpyMap::open(&path).unwrap();
        assert_eq!(map.view2::<f32>().unwrap(), full.view());
        assert!(map.view2::<f64>().is_err());
        let read: Array2<f32> = ndarray_npy::read_npy(&path).unwrap();
        assert_eq!(read, full);
    }

    #[test]
    fn small_arrays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.npy");
        let s = Array1::from(vec![3.0f64, 2.0, 1.0e-300]);
        write_array(&path, &s).unwrap();
        let map = NpyMap::open(&path).unwrap();
        assert_eq!(map.view1::<f64>().unwrap(), s.view());
    }
}
