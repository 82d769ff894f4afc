//! `flowc test`'s machinery: each test of a file runs on the real
//! interpreter (`flow-engine`) in memory, its recipes answered by its mocks
//! and its approvals decided as it says, in virtual time.

pub(crate) mod coverage;
pub(crate) mod expect;
mod mock;
pub(crate) mod report;
pub(crate) mod run;

use std::sync::Arc;

use flow_compiler::test_case::TestCase;
use flow_plan::Plan;

use expect::Miss;

/// A test to run: its file, the plan of its workflow's file, the case.
pub(crate) struct Job {
    pub(crate) file: String,
    pub(crate) plan: Arc<Plan>,
    pub(crate) case: TestCase,
    /// Answers the recipe calls the test does not mock (`--offline`).
    pub(crate) offline: Option<flow_engine::offline::OfflineProvider>,
}

/// How a test went.
pub(crate) struct Verdict {
    pub(crate) misses: Vec<Miss>,
    pub(crate) ran: run::Ran,
}

impl Verdict {
    pub(crate) fn passed(&self) -> bool {
        self.misses.is_empty()
    }
}

/// The coverage of one workflow by the tests that ran it.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Coverage {
    pub(crate) workflow: String,
    /// The file that declares it.
    pub(crate) source: String,
    pub(crate) arms: Vec<coverage::Arm>,
}

impl Coverage {
    /// The arms taken, of all.
    pub(crate) fn taken(&self) -> (usize, usize) {
        let taken = self.arms.iter().filter(|a| !a.taken_by.is_empty()).count();
        (taken, self.arms.len())
    }

    /// The share of arms taken, in percent (100 when there are none).
    pub(crate) fn percent(&self) -> f64 {
        match self.taken() {
            (_, 0) => 100.0,
            (taken, all) => taken as f64 * 100.0 / all as f64,
        }
    }
}

/// The coverage of every workflow the jobs ran, and of `others` that no
/// test runs, in order of file and name.
pub(crate) fn coverage(jobs: &[Job], verdicts: &[Verdict], others: &[Arc<Plan>]) -> Vec<Coverage> {
    let mut found: Vec<Coverage> = Vec::new();
    let mut seen: Vec<(String, String)> = Vec::new();
    for job in jobs {
        let key = (job.plan.source.clone(), job.case.workflow.clone());
        if seen.contains(&key) {
            continue;
        }
        let Some(workflow) = job.plan.workflow(&job.case.workflow) else {
            continue;
        };
        let runs = jobs.iter().zip(verdicts).filter(|(other, _)| {
            other.plan.source == job.plan.source && other.case.workflow == job.case.workflow
        });
        let arms = coverage::arms(
            workflow,
            runs.map(|(job, verdict)| (job.case.name.as_str(), &verdict.ran)),
        );
        found.push(Coverage {
            workflow: key.1.clone(),
            source: key.0.clone(),
            arms,
        });
        seen.push(key);
    }
    // The workflows no test runs: those of the files without tests, and
    // the others of the files the tests run (a file may hold its tests).
    for plan in others.iter().chain(jobs.iter().map(|job| &job.plan)) {
        for workflow in &plan.workflows {
            let key = (plan.source.clone(), workflow.name.clone());
            if !seen.contains(&key) {
                found.push(Coverage {
                    workflow: key.1.clone(),
                    source: key.0.clone(),
                    arms: coverage::untested(workflow),
                });
                seen.push(key);
            }
        }
    }
    found.sort_by(|a, b| (&a.source, &a.workflow).cmp(&(&b.source, &b.workflow)));
    found
}

/// Runs `job` and judges it.
pub(crate) fn test(job: &Job) -> Verdict {
    let ran = run::run(&job.plan, &job.case, job.offline);
    Verdict {
        misses: expect::judge(&job.case, &ran),
        ran,
    }
}
