//! `flowc test`'s machinery: each test of a file runs on the real
//! interpreter (`flow-engine`) in memory, its recipes answered by its mocks
//! and its approvals decided as it says, in virtual time.

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

/// Runs `job` and judges it.
pub(crate) fn test(job: &Job) -> Verdict {
    let ran = run::run(&job.plan, &job.case);
    Verdict {
        misses: expect::judge(&job.case, &ran),
        ran,
    }
}
