//! The per-user default secret: what an engine given no secret proves (unless it was told
//! `allowUnauthenticated`). It is a file that only this user can read, made on first use,
//! so processes of one user work together with no configuration, while a process of
//! another uid, which cannot read it, is refused as any holder of another secret is — on
//! tcp and on the shm socket that hands out memfds alike. Nothing carries it to another
//! host, so a cluster across hosts still needs `authSecret` (and an engine that listens
//! beyond loopback refuses to start without one).
//!
//! Where: the folder named by `FERRY_USER_SECRET_DIR`, else `$XDG_CONFIG_HOME/ferry`, else
//! `$HOME/.config/ferry`; the file in it is `secret`. The user's configuration folder, not
//! `$XDG_RUNTIME_DIR`: that one is set in login sessions and not in most services, and
//! emptied at logout, so two processes of one user would not always find the same file.
//!
//! The file holds 64 hex digits and a newline, and the secret is those 64 characters: the
//! same file given as `FERRY_AUTH_SECRET_FILE` on another host is the same secret.
//!
//! Made without a race: written under a fresh name (`O_EXCL`, mode 0600), then linked to
//! its name, which fails when another process got there first; every process then reads
//! the one that is there. It is used only if it is a regular file (not a link) owned by
//! this user with no permission for group or others, in a folder of this user that others
//! cannot write; anything else is refused with what is wrong and how to fix it.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::auth::Secret;
use crate::error::{Error, Result};

/// Environment variable naming the folder of the per-user secret (tests point it into
/// their build folder; a service can pin it so that every process of the user agrees).
pub const USER_SECRET_DIR_ENV: &str = "FERRY_USER_SECRET_DIR";

/// The file's name in its folder.
const FILE_NAME: &str = "secret";
/// Random bytes in a new secret (written as twice as many hex digits).
const NEW_SECRET_BYTES: usize = 32;
/// The most of the file that is read: a secret is far shorter.
const MAX_FILE_BYTES: u64 = 4096;

/// The per-user secret: read from its file, made first if there is none.
pub(crate) fn user_secret() -> Result<Secret> {
    load_or_create(&secret_dir(|name| std::env::var_os(name))?)
}

/// Where this process finds the per-user secret (whether it was made yet or not): a raw
/// client of this user proves what is in it, and the file can be given as
/// `FERRY_AUTH_SECRET_FILE` to engines elsewhere.
///
/// # Errors
/// `ERR_FERRY_INVALID_ARGUMENT` when the environment names no folder for it.
pub fn user_secret_file() -> Result<PathBuf> {
    Ok(secret_dir(|name| std::env::var_os(name))?.join(FILE_NAME))
}

/// The per-user secret's folder, from the environment that `var` reads.
fn secret_dir(var: impl Fn(&str) -> Option<OsString>) -> Result<PathBuf> {
    if let Some(dir) = var(USER_SECRET_DIR_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let absolute = |name: &str| var(name).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(config) = absolute("XDG_CONFIG_HOME") {
        return Ok(config.join("ferry"));
    }
    if let Some(home) = absolute("HOME") {
        return Ok(home.join(".config").join("ferry"));
    }
    Err(Error::InvalidArgument(format!(
        "no folder for the per-user secret (none of {USER_SECRET_DIR_ENV}, XDG_CONFIG_HOME \
         and HOME is set): set one, or give every engine authSecret or FERRY_AUTH_SECRET_FILE"
    )))
}

fn load_or_create(dir: &Path) -> Result<Secret> {
    let me = effective_uid();
    private_dir(dir, me)?;
    let path = dir.join(FILE_NAME);
    // A file removed between our making and reading it is made again, a few times.
    for _ in 0..3 {
        match read_private(&path, me)? {
            Some(secret) => return Ok(secret),
            None => create(dir, &path)?,
        }
    }
    Err(refused(&path, "keeps disappearing while it is made".into()))
}

fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn refused(path: &Path, why: String) -> Error {
    Error::InvalidArgument(format!("the per-user secret file {} {why}", path.display()))
}

/// Why a file or folder owned by `owner` with permission bits `mode` cannot hold this
/// user's secret, or `None` when it can: owned by `me`, and none of `forbidden` set.
fn not_private(owner: u32, mode: u32, me: u32, forbidden: u32) -> Option<String> {
    let mode = mode & 0o7777;
    (owner != me || mode & forbidden != 0)
        .then(|| format!("is owned by uid {owner} with mode {mode:o}"))
}

/// Makes the folder (mode 0700) if it is missing, and checks that it is this user's and
/// that no one else can write in it.
fn private_dir(dir: &Path, me: u32) -> Result<()> {
    let fail = |why: String| {
        Error::InvalidArgument(format!(
            "the per-user secret's folder {} {why} (set {USER_SECRET_DIR_ENV} to another, \
             or give authSecret)",
            dir.display()
        ))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| fail(format!("cannot be made: {e}")))?;
    // Followed if it is a link: what counts is who can change the folder it leads to.
    let m = std::fs::metadata(dir).map_err(|e| fail(format!("cannot be read: {e}")))?;
    if !m.is_dir() {
        return Err(fail("is not a folder".into()));
    }
    if let Some(why) = not_private(m.uid(), m.mode(), me, 0o022) {
        return Err(fail(format!(
            "{why}: it must be owned by uid {me} and writable by it alone"
        )));
    }
    Ok(())
}

/// The secret in `path`, `None` if there is no such file, or why it cannot be used.
fn read_private(path: &Path, me: u32) -> Result<Option<Secret>> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refused(
                path,
                "is a symbolic link: remove it (a new secret is made) or give its target as \
                 FERRY_AUTH_SECRET_FILE"
                    .into(),
            ))
        }
        Err(e) => return Err(refused(path, format!("cannot be read: {e}"))),
    };
    // Checked on the open file: what is read is what was checked.
    let m = file
        .metadata()
        .map_err(|e| refused(path, format!("cannot be read: {e}")))?;
    if !m.is_file() {
        return Err(refused(path, "is not a regular file".into()));
    }
    if let Some(why) = not_private(m.uid(), m.mode(), me, 0o077) {
        return Err(refused(
            path,
            format!(
                "{why}: it must be owned by uid {me} and readable by it alone (mode 600). \
                 Remove it (a new secret is made) or fix it (chown, chmod 600)"
            ),
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| refused(path, format!("cannot be read: {e}")))?;
    Secret::from_contents(bytes)
        .map(Some)
        .map_err(|e| refused(path, format!("holds no usable secret: {e}")))
}

/// Writes a new secret under a fresh name and links it to `path`; another process that
/// linked first wins, and its secret is the one read next.
fn create(dir: &Path, path: &Path) -> Result<()> {
    let mut raw = [0u8; NEW_SECRET_BYTES];
    getrandom::fill(&mut raw)
        .map_err(|e| refused(path, format!("cannot be made: no randomness: {e}")))?;
    let mut text: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    text.push('\n');
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix)
        .map_err(|e| refused(path, format!("cannot be made: no randomness: {e}")))?;
    let temp = dir.join(format!(
        ".{FILE_NAME}.{}.{:016x}",
        std::process::id(),
        u64::from_le_bytes(suffix)
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&temp)
        .and_then(|mut f| {
            f.write_all(text.as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| std::fs::hard_link(&temp, path));
    let _ = std::fs::remove_file(&temp);
    match written {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(refused(path, format!("cannot be made: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{on_hello, ClientHandshake, HelloOutcome, MAC_LEN};
    use crate::wire::HEADER_LEN;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A fresh private folder, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "ferry-user-secret-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&p)
                .expect("temp dir");
            Self(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Whether two secrets complete a handshake with each other.
    fn agree(a: &Secret, b: &Secret) -> bool {
        let c = ClientHandshake::new(Some(a.clone()), 1, 1, [1; 16]);
        let Ok(HelloOutcome::Challenge(s)) = on_hello(Some(b), c.hello(), 2, [2; 16]) else {
            return false;
        };
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(&s.challenge()[..HEADER_LEN]);
        let mac: [u8; MAC_LEN] = s.challenge()[HEADER_LEN..].try_into().expect("mac");
        c.answer(&head, &mac).is_ok_and(|p| s.verify(&p).is_ok())
    }

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).expect("stat").mode() & 0o7777
    }

    #[test]
    fn the_folder_is_the_override_else_the_config_folder_else_home() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let all = env(&[
            (USER_SECRET_DIR_ENV, "target/s"),
            ("XDG_CONFIG_HOME", "/c"),
            ("HOME", "/h"),
        ]);
        assert_eq!(secret_dir(all).expect("dir"), PathBuf::from("target/s"));
        let config = env(&[("XDG_CONFIG_HOME", "/c"), ("HOME", "/h")]);
        assert_eq!(secret_dir(config).expect("dir"), PathBuf::from("/c/ferry"));
        // A relative XDG_CONFIG_HOME is ignored, as the XDG spec says.
        let home = env(&[("XDG_CONFIG_HOME", "c"), ("HOME", "/h")]);
        assert_eq!(
            secret_dir(home).expect("dir"),
            PathBuf::from("/h/.config/ferry")
        );
        let err = secret_dir(env(&[])).expect_err("nowhere");
        assert_eq!(err.code(), "ERR_FERRY_INVALID_ARGUMENT");
        assert!(err.to_string().contains("authSecret"), "{err}");
    }

    #[test]
    fn first_use_makes_a_private_file_that_later_uses_read() {
        let root = TempDir::new();
        let dir = root.0.join("nested").join("ferry");
        let first = load_or_create(&dir).expect("made");
        assert_eq!(mode_of(&dir), 0o700);
        let file = dir.join(FILE_NAME);
        assert_eq!(mode_of(&file), 0o600);
        let text = std::fs::read_to_string(&file).expect("read");
        assert_eq!(text.len(), 2 * NEW_SECRET_BYTES + 1);
        assert!(text.trim_end().bytes().all(|b| b.is_ascii_hexdigit()));
        let again = load_or_create(&dir).expect("read again");
        assert!(agree(&first, &again));
        // The file's text is the secret, as FERRY_AUTH_SECRET_FILE reads it.
        let as_file = Secret::from_file(&file.display().to_string()).expect("as a file");
        assert!(agree(&first, &as_file));
        let names: Vec<_> = std::fs::read_dir(&dir).expect("list").collect();
        assert_eq!(names.len(), 1, "no temporary file left");
    }

    #[test]
    fn processes_racing_to_make_it_agree_on_one_secret() {
        let root = TempDir::new();
        let dir = root.0.join("ferry");
        let start = std::sync::Arc::new(std::sync::Barrier::new(8));
        let racers: Vec<_> = (0..8)
            .map(|_| {
                let (dir, start) = (dir.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    load_or_create(&dir).expect("secret")
                })
            })
            .collect();
        let secrets: Vec<Secret> = racers
            .into_iter()
            .map(|r| r.join().expect("racer"))
            .collect();
        assert!(secrets.iter().all(|s| agree(s, &secrets[0])));
        let names: Vec<_> = std::fs::read_dir(&dir).expect("list").collect();
        assert_eq!(names.len(), 1, "one file, no temporary one left");
    }

    #[test]
    fn a_file_or_folder_others_may_touch_or_a_link_is_refused_saying_how_to_fix_it() {
        let root = TempDir::new();
        let file = root.0.join(FILE_NAME);
        std::fs::write(&file, "ab".repeat(32)).expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        let err = load_or_create(&root.0).expect_err("group may read it");
        assert_eq!(err.code(), "ERR_FERRY_INVALID_ARGUMENT");
        let text = err.to_string();
        assert!(text.contains(&file.display().to_string()), "{text}");
        assert!(
            text.contains("mode 640") && text.contains("chmod 600"),
            "{text}"
        );
        // A link, even to a private file, is refused.
        let real = root.0.join("real");
        std::fs::rename(&file, &real).expect("move");
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::symlink(&real, &file).expect("link");
        let err = load_or_create(&root.0).expect_err("a link");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        std::fs::remove_file(&file).expect("unlink");
        // Too short to be a secret.
        std::fs::write(&file, "short\n").expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let err = load_or_create(&root.0).expect_err("short");
        assert!(err.to_string().contains("at least 32 bytes"), "{err}");
        std::fs::remove_file(&file).expect("remove");
        // A folder others may write in.
        std::fs::set_permissions(&root.0, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = load_or_create(&root.0).expect_err("open folder");
        assert!(err.to_string().contains("writable by it alone"), "{err}");
        assert!(!file.exists(), "nothing made there");
    }

    #[test]
    fn a_file_of_another_owner_is_refused() {
        if effective_uid() != 0 {
            return; // giving a file away takes root
        }
        let root = TempDir::new();
        let file = root.0.join(FILE_NAME);
        std::fs::write(&file, "ab".repeat(32)).expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).expect("chown");
        let err = load_or_create(&root.0).expect_err("not ours");
        assert!(err.to_string().contains("owned by uid 65534"), "{err}");
        assert_eq!(not_private(0, 0o100600, 0, 0o077), None);
    }
}
