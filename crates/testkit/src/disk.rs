//! A full disk for tests: a small tmpfs mounted for one test (as root) and a filler that
//! takes every free page of it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

/// A small tmpfs mounted for one test, unmounted on drop (a panicking test included).
#[derive(Debug)]
pub struct Tmpfs {
    // Declared before `_dir` so the mount point is unmounted before the folder is removed.
    pub path: PathBuf,
    _dir: TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`256k`, `2m`) on a fresh folder; panics, saying why, when it
    /// cannot (the test needs root).
    pub fn mount(size: &str) -> Tmpfs {
        let dir = TempDir::new().expect("mount point");
        let path = dir.path().to_path_buf();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},huge=never,mode=0700"))
            .arg("tmpfs")
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("the disk-full test needs `mount` (as root): {e}"));
        assert!(
            out.status.success(),
            "the disk-full test needs to mount a tmpfs (as root, with CAP_SYS_ADMIN): \
             `mount -t tmpfs -o size={size} tmpfs {}` failed ({}): {}",
            path.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Tmpfs { path, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.path)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Something still holds it open: detach it so it goes once released.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

/// The page size the fillers write in.
pub const PAGE: usize = 4096;

/// Fills the file system holding `path` until a write fails with ENOSPC.
pub fn fill(path: &Path) {
    let mut file = fs::File::create(path).expect("create filler");
    let chunk = vec![0xa5_u8; PAGE];
    loop {
        if let Err(e) = file.write_all(&chunk) {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::StorageFull,
                "filling the disk failed otherwise: {e}"
            );
            break;
        }
    }
    // What did fit stays allocated.
    let _ = file.sync_all();
}
