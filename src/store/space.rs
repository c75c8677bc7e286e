//! Free space on the workspace's file system, checked before a stage writes a large output,
//! so a full disk is refused at the start with both figures instead of failing halfway with
//! a bare "No space left on device".

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Test hook: when set, its value (bytes) is taken as the free space of every file system
/// instead of asking the operating system. The free-space tests use it; nothing else should.
pub const FREE_SPACE_OVERRIDE: &str = "FSGP_FREE_SPACE_BYTES";

/// Refuses when the file system holding `path` (an existing file or directory) has fewer
/// than `bytes` bytes free for an unprivileged writer; `what` names the output
/// ("kxx.npy"), e.g. `kxx.npy needs 24.2 GiB, the workspace's file system has 3.1 GiB free`.
pub fn ensure_free(path: &Path, bytes: u64, what: &str) -> Result<()> {
    let free = free_bytes(path)?;
    if free < bytes {
        bail!(
            "{what} needs {}, the workspace's file system has {} free ({})",
            human_bytes(bytes),
            human_bytes(free),
            path.display()
        );
    }
    Ok(())
}

/// Bytes available to an unprivileged writer on the file system holding `path`.
pub fn free_bytes(path: &Path) -> Result<u64> {
    if let Ok(figure) = std::env::var(FREE_SPACE_OVERRIDE) {
        return figure
            .trim()
            .parse()
            .with_context(|| format!("{FREE_SPACE_OVERRIDE}={figure:?} is not a byte count"));
    }
    let c_path = CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("{} contains a NUL byte", path.display()))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a valid NUL-terminated string and `stat` points to writable
    // memory of the right type; statvfs fills it completely when it returns 0.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("asking the free space of {}", path.display()));
    }
    // SAFETY: statvfs returned 0, so the struct is initialised.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Ok(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// `1536` → `1.5 KiB`: binary units with one decimal, bytes below 1 KiB.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_uses_binary_units() {
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(
            human_bytes(24 * 1024 * 1024 * 1024 + 200 * 1024 * 1024),
            "24.2 GiB"
        );
    }

    #[test]
    fn the_current_directory_has_some_free_space() {
        if std::env::var(FREE_SPACE_OVERRIDE).is_err() {
            assert!(free_bytes(Path::new(".")).unwrap() > 0);
        }
    }
}
