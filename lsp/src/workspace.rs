//! The workspace on disk: its folders, the `.flow` files under them, and
//! the paths and URIs that name them.

use flow_compiler::check::normalize;
use tower_lsp_server::ls_types::*;

/// Adds the `.flow` files under `dir` to `out`, skipping hidden folders,
/// build output and `node_modules`.
pub(crate) fn walk(dir: &std::path::Path, out: &mut Vec<String>, depth: usize) {
    // Deep trees are not a workspace's sources; stop before walking a disk.
    if depth > 12 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || name == "target" || name == "node_modules" {
            continue;
        }
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => walk(&path, out, depth + 1),
            Ok(_) if path.extension().is_some_and(|e| e == "flow") => {
                if let Some(text) = path.to_str() {
                    out.push(normalize(text));
                }
            }
            _ => {}
        }
    }
}

/// The workspace folders, or the root URI of a client that sends no
/// folders: the projects whose files the documents may import.
pub(crate) fn workspace_roots(params: &InitializeParams) -> Vec<std::path::PathBuf> {
    let folders: Vec<std::path::PathBuf> = params
        .workspace_folders
        .iter()
        .flatten()
        .filter_map(|folder| folder.uri.to_file_path().map(|p| p.into_owned()))
        .collect();
    if !folders.is_empty() {
        return folders;
    }
    // The protocol deprecates `rootUri` in favour of the folders, but
    // clients without folder support still send only it.
    #[allow(deprecated)]
    let root = params.root_uri.as_ref();
    root.and_then(|uri| uri.to_file_path().map(|p| p.into_owned()))
        .into_iter()
        .collect()
}

pub(crate) fn path_of(uri: &Uri) -> Option<String> {
    let path = uri.to_file_path()?;
    Some(normalize(path.to_str()?))
}

pub(crate) fn uri_of(path: &str) -> Option<Uri> {
    Uri::from_file_path(path)
}
