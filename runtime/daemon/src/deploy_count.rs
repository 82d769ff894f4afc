//! How many deploys the flowds on one SQLite file have made: the length of
//! a file beside it (`flow.db-deploys`), one byte appended per deploy.
//!
//! Each start needs the deployment it runs. Read from the store every time,
//! it cost B9 a quarter of its rate (a read transaction per start beside
//! the writer's commits: 32 against 43 µs of flowd per step); cached, two
//! flowds sharing the file (which the docs allow) never saw each other's
//! deploys. A cache entry now holds the count it was read at, and is used
//! only while the count is the same: one `fstat` per start. A deploy
//! appends its byte after its commit and before its answer, so a start
//! anywhere after that answer reads the store again. (A flowd killed
//! between the two leaves the others with their entries until the next
//! deploy anywhere; a client that got no answer deploys again, which
//! counts.) On PostgreSQL flowds need not share a machine: every start
//! reads its deployment.

use std::fs::File;
use std::io::Write;
use std::path::Path;

pub(crate) struct DeployCount {
    file: File,
}

impl DeployCount {
    /// The count beside the SQLite file at `db`, created if it is not there.
    pub(crate) fn beside(db: &Path) -> std::io::Result<DeployCount> {
        let mut path = db.as_os_str().to_owned();
        path.push("-deploys");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)?;
        Ok(DeployCount { file })
    }

    /// The count now; `None` when it cannot be read, and then nothing
    /// cached is to be trusted.
    pub(crate) fn now(&self) -> Option<u64> {
        self.file.metadata().ok().map(|meta| meta.len())
    }

    /// Counts a deploy (or a retirement), once it is committed and before
    /// it is answered.
    pub(crate) fn count(&self) {
        // One byte in one append: concurrent deploys each add theirs.
        if let Err(error) = (&self.file).write_all(b".") {
            tracing::warn!(
                "the count of deploys beside the store could not grow ({error}): other flowds on this SQLite file may start runs of the deployments before it"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_deploy_counts_in_every_process_that_reads_the_count() {
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
        assert_eq!(other.now(), Some(before + 2));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
