//! Folders and files only their owner can open: drover's home holds conversations, tokens and
//! the agents' records, so everything it makes there is 0700 (folders) or 0600 (files),
//! whatever the umask.

use std::fs::{DirBuilder, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every folder drover makes in its home.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file drover makes in its home.
pub const FILE_MODE: u32 = 0o600;

/// `create_dir_all`, each folder it makes 0700 (existing ones are left as they are).
pub fn create_dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
}

/// `create_dir`, the folder 0700.
pub fn create_dir(path: &Path) -> io::Result<()> {
    DirBuilder::new().mode(DIR_MODE).create(path)
}

/// Open options whose files, when created, are 0600.
pub fn open_options() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(FILE_MODE);
    options
}

/// Makes `home` drover's: created 0700 if missing; an existing one must belong to this user,
/// and is made 0700 if others could open it (homes made before drover kept them private).
/// Returns whether it had to narrow the mode.
pub fn claim_home(home: &Path) -> Result<bool, String> {
    create_dir_all(home).map_err(|e| format!("cannot create `{}`: {e}", home.display()))?;
    let meta =
        std::fs::metadata(home).map_err(|e| format!("cannot read `{}`: {e}", home.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(format!(
            "`{}` belongs to uid {}, not to this user (uid {me}): drover keeps its data only in a folder of its own user; use another --home",
            home.display(),
            meta.uid()
        ));
    }
    let open_to_others = meta.mode() & 0o077 != 0;
    if open_to_others {
        std::fs::set_permissions(home, std::fs::Permissions::from_mode(DIR_MODE))
            .map_err(|e| format!("cannot make `{}` private (chmod 700): {e}", home.display()))?;
    }
    Ok(open_to_others)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("metadata").mode() & 0o777
    }

    #[test]
    fn what_it_makes_is_private_whatever_the_umask_allows() {
        let root = tempfile::tempdir().expect("root");
        let deep = root.path().join("a/b/c");
        create_dir_all(&deep).expect("dirs");
        for dir in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode(&root.path().join(dir)), 0o700, "{dir}");
        }
        let file = deep.join("f");
        let mut f = open_options()
            .create(true)
            .append(true)
            .open(&file)
            .expect("file");
        f.write_all(b"x").expect("write");
        assert_eq!(mode(&file), 0o600);
    }

    #[test]
    fn an_open_home_is_narrowed_and_a_private_one_left_alone() {
        let root = tempfile::tempdir().expect("root");
        let home = root.path().join("home");
        assert!(
            !claim_home(&home).expect("new home"),
            "a new home is made 0700"
        );
        assert_eq!(mode(&home), 0o700);
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert!(claim_home(&home).expect("open home"));
        assert_eq!(mode(&home), 0o700);
    }
}
