//! Sources deployed as a set of files (path → text): the compiler's loader
//! for flowd's deploy, so that a workflow whose file imports others, or has
//! a `flow.lock` beside it, deploys as `flowc check` checks it.
//!
//! The set is all there is: an import of a path not in it is unresolved
//! (E113), and a path that climbs out of the set's root with `..` or is
//! absolute is refused before anything is checked, as the disk loader
//! refuses one outside its project.

use std::collections::BTreeMap;

use flow_compiler::LoadFailure;
use flow_compiler::check::normalize;
use flow_compiler::lock::LOCK_FILE;

/// The most files one deploy may hold.
pub(crate) const MAX_FILES: usize = 256;

/// A deploy's files, by normalized path. Serde reads it without the
/// checks of [`DeployedFiles::new`]: only a compile worker does, from the
/// flowd that checked them (`compile_worker`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub(crate) struct DeployedFiles {
    files: BTreeMap<String, String>,
}

impl DeployedFiles {
    /// The set, or why it is refused: too many files, or a path that is
    /// empty, absolute, leaves the set with `..`, or is neither a `.flow`
    /// source nor a `flow.lock`.
    pub(crate) fn new(files: BTreeMap<String, String>) -> Result<DeployedFiles, String> {
        if files.len() > MAX_FILES {
            return Err(format!(
                "{} files; a deploy holds at most {MAX_FILES}",
                files.len()
            ));
        }
        let mut normal = BTreeMap::new();
        for (path, text) in files {
            control_free(&path)?;
            let cleaned = normalize(&path);
            let is_lock = cleaned == LOCK_FILE || cleaned.ends_with(&format!("/{LOCK_FILE}"));
            if cleaned.is_empty()
                || cleaned.starts_with('/')
                || cleaned == ".."
                || cleaned.starts_with("../")
            {
                return Err(format!(
                    "`{}`: paths are relative and stay within the set",
                    flow_plan::cut(&path, 200)
                ));
            }
            if !cleaned.ends_with(".flow") && !is_lock {
                return Err(format!(
                    "`{}`: a deploy holds `.flow` sources and `{LOCK_FILE}` files only",
                    flow_plan::cut(&path, 200)
                ));
            }
            if normal.insert(cleaned, text).is_some() {
                return Err(format!("`{}` is given twice", flow_plan::cut(&path, 200)));
            }
        }
        Ok(DeployedFiles { files: normal })
    }

    /// Refuses a path holding a control character (a NUL, a line break):
    /// a name no editor or file system writes, which the run's files and
    /// messages would carry (regression: a NUL in a file's name deployed,
    /// and the run's test could not be written).
    pub(crate) fn check_path(path: &str) -> Result<(), String> {
        control_free(path)
    }

    /// One source under the name a client gave it, for its diagnostics
    /// only: `{"source", "path"}` deploys took any name before file sets
    /// came, so the rules for a set's paths do not apply to it (but for
    /// [`Self::check_path`]). Nothing is read by a name, and imports from
    /// it find nothing.
    pub(crate) fn single(path: &str, text: String) -> DeployedFiles {
        DeployedFiles {
            files: [(normalize(path), text)].into(),
        }
    }

    /// The one `.flow` file of a set that has exactly one.
    pub(crate) fn only_source(&self) -> Option<&str> {
        let mut sources = self.files.keys().filter(|path| path.ends_with(".flow"));
        match (sources.next(), sources.next()) {
            (Some(only), None) => Some(only),
            _ => None,
        }
    }

    pub(crate) fn contains(&self, path: &str) -> bool {
        self.files.contains_key(&normalize(path))
    }
}

impl flow_compiler::SourceLoader for DeployedFiles {
    fn load(&self, path: &str) -> Result<Vec<u8>, LoadFailure> {
        let normal = normalize(path);
        if let Some(text) = self.files.get(&normal) {
            return Ok(text.as_bytes().to_vec());
        }
        let hint = "send every file the workflow imports in `files`".to_string();
        if normal.starts_with('/') || normal == ".." || normal.starts_with("../") {
            return Err(LoadFailure::OutsideProject {
                reason: "the path leads outside the deployed files".to_string(),
                hint,
            });
        }
        Err(LoadFailure::Unreadable {
            reason: "not among the deployed files".to_string(),
            hint: Some(hint),
        })
    }

    fn lock(&self, path: &str) -> Result<Option<Vec<u8>>, LoadFailure> {
        Ok(self
            .files
            .get(&normalize(path))
            .map(|text| text.as_bytes().to_vec()))
    }
}

/// `path`, refused when it holds a control character.
fn control_free(path: &str) -> Result<(), String> {
    if path.chars().any(char::is_control) {
        return Err(format!(
            "`{}`: a path holds no control characters",
            flow_plan::inert(&flow_plan::cut(path, 200))
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(paths: &[&str]) -> Result<DeployedFiles, String> {
        DeployedFiles::new(
            paths
                .iter()
                .map(|path| (path.to_string(), String::new()))
                .collect(),
        )
    }

    #[test]
    fn paths_stay_within_the_set_and_are_sources_or_locks() {
        assert!(set(&["main.flow", "recipes/support.flow", "flow.lock"]).is_ok());
        assert!(set(&["./main.flow", "a/../b.flow"]).is_ok());
        for bad in [
            "/etc/x.flow",
            "../x.flow",
            "a/../../x.flow",
            "",
            "notes.txt",
            "a\0b.flow",
            "a\nb.flow",
        ] {
            assert!(set(&[bad]).is_err(), "{bad:?}");
        }
        assert!(set(&["a.flow", "./a.flow"]).is_err(), "the same file twice");
    }
}
