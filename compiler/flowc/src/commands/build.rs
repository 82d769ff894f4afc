//! `flowc build`: check a file and write its plan as JSON.

use std::path::{Path, PathBuf};

use flow_plan::Plan;

use crate::commands::check::{Stream, print};
use crate::loader::{io_reason, print_load_error, single_file, write_atomically};
use crate::report::Reports;
use crate::{Exit, Format};

pub(crate) fn run(
    file: &Path,
    root: Option<&Path>,
    output: Option<&Path>,
    workflow: Option<&str>,
    format: Format,
) -> Exit {
    // The plan may be going to stdout; diagnostics must not mix into it.
    let writes_stdout = output.is_some_and(|o| o == Path::new("-"));
    let diagnostics = if writes_stdout {
        Stream::Stderr
    } else {
        Stream::Stdout
    };
    let mut plan = match compile(file, root, format, diagnostics) {
        Ok(plan) => plan,
        Err(exit) => return exit,
    };
    let path = plan.source.clone();
    // A plan runs workflows: one without any ran nothing, and `flow run`
    // refused it only then.
    if plan.workflows.is_empty() {
        let tests = if path.ends_with(".test.flow") {
            format!(" (it holds tests: `flowc test {path}` runs them)")
        } else {
            " (its types and recipes are built with the files that import them)".to_string()
        };
        eprintln!("error: {path} declares no workflow, so it has no plan to build{tests}");
        return Exit::Usage;
    }
    if let Some(name) = workflow {
        if plan.workflow(name).is_none() {
            let names: Vec<&str> = plan.workflows.iter().map(|w| w.name.as_str()).collect();
            eprintln!(
                "error: no workflow named `{name}` in {path}; its workflows are: {}",
                if names.is_empty() {
                    "(none)".to_string()
                } else {
                    names.join(", ")
                }
            );
            return Exit::Usage;
        }
        plan.workflows.retain(|w| w.name == name);
        // The hash covers the workflows, so it must be taken again.
        plan = plan.seal();
    }
    let json = plan.to_json() + "\n";
    let destination = output.map_or_else(|| default_output(file), Path::to_path_buf);
    if destination == Path::new("-") {
        out!("{json}");
        eprintln!("wrote plan to stdout ({})", plan.hash);
        return Exit::Ok;
    }
    match write_atomically(&destination, json.as_bytes()) {
        Ok(()) => {
            eprintln!("wrote {} ({})", destination.display(), plan.hash);
            Exit::Ok
        }
        Err(error) => {
            eprintln!(
                "error: cannot write {}: {}",
                destination.display(),
                io_reason(&error)
            );
            Exit::Usage
        }
    }
}

/// Checks `file` (its imports confined to `root`, else its folder) and
/// lowers it to a plan: the one compile path of the commands that need a
/// plan (`build`, `diff`). Diagnostics, warnings included, are printed in
/// `format`, the machine formats to `diagnostics`; on errors it answers the
/// exit code: `Usage` when the file cannot be read, `Problems` when it does
/// not check.
pub(crate) fn compile(
    file: &Path,
    root: Option<&Path>,
    format: Format,
    diagnostics: Stream,
) -> Result<Plan, Exit> {
    let (compiled, reports) = compile_quietly(file, root)?;
    // Warnings are shown on a successful build too; errors stop it.
    if let Some(reports) = reports {
        print(&reports, format, diagnostics);
    }
    compiled
}

/// `compile`, its diagnostics (if any) given back rather than printed; a
/// file that cannot be read is said, and is the outer error.
pub(crate) fn compile_quietly(
    file: &Path,
    root: Option<&Path>,
) -> Result<(Result<Plan, Exit>, Option<Reports>), Exit> {
    let Some(source) = single_file(file, root) else {
        return Err(Exit::Usage);
    };
    let path = source.path.clone();
    let (checked, plan) = match flow_compiler::check_and_lower(&path, &source.loader()) {
        Ok(compiled) => compiled,
        Err(error) => {
            print_load_error(&error);
            return Err(Exit::Usage);
        }
    };
    let reports = (!checked.diagnostics.is_empty()).then(|| {
        let mut reports = Reports::default();
        reports.add(&checked);
        reports.sort();
        reports
    });
    if checked.has_errors() {
        return Ok((Err(Exit::Problems), reports));
    }
    let plan = plan.ok_or_else(|| {
        // Only programs with errors have no plan, and they returned above.
        eprintln!("error: internal: {path} checked clean but could not be lowered");
        Exit::Problems
    });
    Ok((plan, reports))
}

/// `dir/name.flow` builds to `dir/name.plan.json`.
fn default_output(file: &Path) -> PathBuf {
    file.with_extension("plan.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_path_replaces_the_extension() {
        assert_eq!(
            default_output(Path::new("examples/a.flow")),
            PathBuf::from("examples/a.plan.json")
        );
        assert_eq!(default_output(Path::new("a")), PathBuf::from("a.plan.json"));
    }
}
