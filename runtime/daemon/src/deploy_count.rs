//! How many deploys the flowds on one SQLite file have made: the length of
//! a file beside it (`flow.db-deploys`), one byte appended per deploy.
//!
//! Each start needs the deployment it runs. Read from the store every time,
//! it cost B9 a quarter of its rate (a read transaction per start beside
//! the writer's commits: 32 against 43 µs of flowd per step); cached, two
//! flowds sharing the file (which the docs allow) never saw each other's
//! deploys. A cache entry now holds the count it was read at, and is used
//! only while the count is the same: one `stat` per start. A deploy
//! appends its byte after its commit and before its answer, so a start
//! anywhere after that answer reads the store again. (A flowd killed
//! between the two leaves the others with their entries until the next
//! deploy anywhere; a client that got no answer deploys again, which
//! counts.) On PostgreSQL flowds need not share a machine: every start
//! reads its deployment.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The count of deploys at one moment (`DeployCount::now`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    inode: u64,
    changed: (i64, i64),
    len: u64,
}

pub(crate) struct DeployCount {
    path: PathBuf,
    /// A count this process could not make: its own deploys are then not
    /// seen by its cache either, which it stops trusting for good.
    failed: AtomicBool,
}

impl DeployCount {
    /// The count beside the SQLite file at `db`, created if it is not
    /// there: a flowd that cannot keep it does not start, since its
    /// deploys would go unseen by the other flowds on the file.
    pub(crate) fn beside(db: &Path) -> std::io::Result<DeployCount> {
        let mut path = db.as_os_str().to_owned();
        path.push("-deploys");
        let count = DeployCount {
            path: PathBuf::from(path),
            failed: AtomicBool::new(false),
        };
        count.append(b"")?;
        Ok(count)
    }

    /// The count now: the file's length, with the file itself (by its
    /// path: a file replaced, or deleted and made anew, is another count,
    /// even on a reused inode, by its time of change). `None` when it
    /// cannot be read or this process failed to count, and then nothing
    /// cached is to be trusted.
    pub(crate) fn now(&self) -> Option<Stamp> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        let meta = std::fs::metadata(&self.path).ok()?;
        Some(Stamp {
            inode: meta.ino(),
            changed: (meta.ctime(), meta.ctime_nsec()),
            len: meta.len(),
        })
    }

    /// Counts a deploy (or a retirement), once it is committed and before
    /// it is answered.
    pub(crate) fn count(&self) {
        // One byte in one append: concurrent deploys each add theirs.
        if let Err(error) = self.append(b".") {
            self.failed.store(true, Ordering::Relaxed);
            tracing::warn!(
                "the count of deploys beside the store ({}) could not grow ({error}): other flowds on this SQLite file may start runs of the deployments before it; this one now reads its deployment at every start",
                self.path.display()
            );
        }
    }

    fn append(&self, bytes: &[u8]) -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?
            .write_all(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two counts on one file, as two flowds on one SQLite file hold.
    #[test]
    fn each_deploy_moves_every_holders_count() {
        let dir = std::env::temp_dir().join(format!("flow-deploy-count-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("flow.db");
        let (one, other) = (
            DeployCount::beside(&db).unwrap(),
            DeployCount::beside(&db).unwrap(),
        );
        let before = other.now().unwrap();
        one.count();
        one.count();
        let after = other.now().unwrap();
        assert_eq!(after.len, before.len + 2);
        assert_eq!(one.now(), Some(after));
        // Deleted and made anew at the same length: another count.
        std::fs::remove_file(dir.join("flow.db-deploys")).unwrap();
        let again = DeployCount::beside(&db).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        for _ in 0..after.len {
            again.count();
        }
        assert_ne!(other.now(), Some(after));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
