//! One test's run: the real interpreter over the memory journal, the
//! test's mocks as its provider, its decisions applied where the run
//! parks, in virtual time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flow_compiler::test_case::{Expectation, GateDecision, TestCase};
use flow_engine::approval::{PendingApproval, expire};
use flow_engine::journal::{Journal, Outcome, StepRecord, StepStatus, Way};
use flow_engine::memory::MemoryStore;
use flow_engine::offline::OfflineProvider;
use flow_engine::services::{BoxFuture, Services};
use flow_engine::time::rfc3339_utc;
use flow_plan::Plan;
use serde_json::Value;

use super::expect::Miss;
use super::mock::{Mocks, Unmocked};

/// The run id of every test run: what a provider's call ids start with.
const RUN_ID: &str = "test";

/// How many times a run may park and be resumed: a workflow parks once per
/// gate it reaches (gates side by side park once), so more is a loop of
/// gates no test means.
const MAX_PARKS: usize = 1_000;

/// What a test's run did.
pub(crate) struct Ran {
    /// How the last invocation ended.
    pub(crate) outcome: Outcome,
    pub(crate) records: Vec<StepRecord>,
    /// Why the run could not go where the test meant, if it could not: a
    /// gate left undecided, a decision refused (with its line).
    pub(crate) stuck: Option<Miss>,
    pub(crate) unmocked: Vec<Unmocked>,
    /// Virtual time the run took, parked time excluded.
    pub(crate) elapsed: Duration,
    /// Which way it went at each place it could go more than one.
    pub(crate) ways: Ways,
}

/// The ways a test's run went (`Way`), which its journal keeps for branch
/// coverage: an arm or an iteration that ran no step left no record.
#[derive(Debug, Default)]
pub(crate) struct Ways {
    /// The blocks entered, by the prefix of their steps' paths.
    pub(crate) entered: HashSet<String>,
    /// The arms taken: (the block's prefix, the condition's id, the arm).
    pub(crate) arms: HashSet<(String, String, usize)>,
    /// The items each loop went over: (the block's prefix, the loop's id).
    pub(crate) loops: HashMap<(String, String), usize>,
}

/// The memory journal, with the ways the run went kept beside it.
struct TestJournal {
    store: Arc<MemoryStore>,
    ways: Mutex<Ways>,
}

impl Journal for TestJournal {
    fn lookup(&self, path: &str) -> Option<StepRecord> {
        self.store.lookup(path)
    }

    fn resumed(&self) -> bool {
        self.store.resumed()
    }

    fn record<'a>(
        &'a self,
        record: StepRecord,
    ) -> BoxFuture<'a, Result<(), flow_engine::error::StepError>> {
        self.store.record(record)
    }

    fn went(&self, way: Way<'_>) {
        let mut ways = self.ways.lock().unwrap_or_else(|p| p.into_inner());
        match way {
            Way::Entered { at } => {
                if !ways.entered.contains(at) {
                    ways.entered.insert(at.to_string());
                }
            }
            Way::Arm { at, id, arm } => {
                ways.arms.insert((at.to_string(), id.to_string(), arm));
            }
            Way::Loop { at, id, items } => {
                ways.loops.insert((at.to_string(), id.to_string()), items);
            }
        }
    }
}

/// Runs `case` on `plan` on a runtime of its own whose clock is paused and
/// moves on whenever every task waits, so that backoff, timeouts and the
/// workflow's deadline take no wall time.
pub(crate) fn run(plan: &Plan, case: &TestCase, offline: Option<OfflineProvider>) -> Ran {
    // A real stall of the process is nothing to a virtual clock.
    flow_engine::stall::ignore();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(drive(plan, case, offline)),
        Err(error) => Ran {
            outcome: Outcome::Parked {
                pending: Vec::new(),
            },
            records: Vec::new(),
            stuck: Some(Miss::of_run(format!("no runtime for the test: {error}"))),
            unmocked: Vec::new(),
            elapsed: Duration::ZERO,
            ways: Ways::default(),
        },
    }
}

async fn drive(plan: &Plan, case: &TestCase, offline: Option<OfflineProvider>) -> Ran {
    let store = Arc::new(MemoryStore::default());
    let journal = Arc::new(TestJournal {
        store: store.clone(),
        ways: Mutex::default(),
    });
    let mocks = Arc::new(Mocks::new(&case.mocks, offline));
    let services = Services {
        provider: mocks.clone(),
        effects: store.clone(),
        mcp: Some(mocks.clone()),
        journal: journal.clone(),
        steps: None,
        in_flight: None,
    };
    // A test that expects the run to park takes an undecided gate as its end.
    let parks = case
        .expects
        .iter()
        .any(|expect| matches!(&expect.what, Expectation::Status { status } if status == "parked"));
    let mut spent = Duration::ZERO;
    // What the virtual clock moved on while the run was parked: to each
    // gate's expiry, as a test expires it.
    let mut parked_ms = 0;
    let mut stuck = None;
    let mut outcome = Outcome::Parked {
        pending: Vec::new(),
    };
    // One invocation more than the parks allowed: the last park's
    // decision must be run to its end.
    for invocation in 0..=MAX_PARKS {
        let started = tokio::time::Instant::now();
        outcome = flow_engine::interp::run_within(
            plan,
            &case.workflow,
            RUN_ID,
            case.input.clone(),
            services.clone(),
            spent,
            0,
        )
        .await;
        spent += started.elapsed();
        let Outcome::Parked { pending } = &outcome else {
            break;
        };
        if invocation == MAX_PARKS {
            stuck = Some(Miss::of_run(format!(
                "the run parked more than {MAX_PARKS} times, the most a test's run may (it parks at each gate it reaches, or at the gates side by side)"
            )));
            break;
        }
        let virtual_now = TEST_EPOCH_MS + spent.as_millis() as u64 + parked_ms;
        match decide_all(&store, case, pending, parks, virtual_now, &mut parked_ms).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(why) => {
                stuck = Some(why);
                break;
            }
        }
    }
    Ran {
        outcome,
        records: store.records(),
        stuck,
        unmocked: mocks.unmocked(),
        elapsed: spent,
        ways: std::mem::take(&mut *journal.ways.lock().unwrap_or_else(|p| p.into_inner())),
    }
}

/// Where a test's virtual clock starts, for what a run is told of the time
/// (an approval's `decided_at`): 2000-01-01T00:00:00Z, the same on every
/// run of the test, so that an `expect` can name it.
const TEST_EPOCH_MS: u64 = 946_684_800_000;

/// The groups a test's decider is taken to be a member of: a test knows no
/// group's members, so a person (an address) the gate does not name decides
/// as a member of its groups (as `flow test-from` writes a decision a
/// member made through flowd).
fn member_of(gate: &PendingApproval, by: &str) -> Vec<String> {
    if !by.contains('@') {
        return Vec::new();
    }
    gate.approvers
        .iter()
        .filter(|approver| !approver.contains('@'))
        .cloned()
        .collect()
}

/// Applies the test's decision to each gate the run parked at: whether the
/// run goes on (`false`: the test expects it parked there), or why not.
/// `now_ms` is the virtual clock's time, which a decision is dated by; a
/// gate expired moves the clock on to its expiry (`parked_ms`), so that
/// what is decided after it is dated after it.
async fn decide_all(
    store: &MemoryStore,
    case: &TestCase,
    pending: &[PendingApproval],
    parks: bool,
    now_ms: u64,
    parked_ms: &mut u64,
) -> Result<bool, Miss> {
    // The gates parked side by side expire in one wait, the longest.
    let mut waited_ms = 0;
    // A gate the test leaves waiting (`wait`, or no decision in a test
    // that expects the run parked) does not hold back the others parked
    // beside it (parallel branches): they are decided, and the run goes on
    // if any was.
    let mut waiting: Option<&PendingApproval> = None;
    let mut decided_any = false;
    // How often each gate was decided (or expired) before: counted once,
    // and then as this loop decides. Counted from every record for each
    // gate parked, a loop of 5,000 gates took 70 s (an audit).
    let mut made: HashMap<String, usize> = HashMap::new();
    store.each_record(|record| {
        if record.status != StepStatus::Pending {
            *made.entry(record.step_id.clone()).or_default() += 1;
        }
    });
    for gate in pending {
        let Some(decision) = case.decisions.iter().find(|d| d.step == gate.step_id) else {
            if parks {
                waiting.get_or_insert(gate);
                continue;
            }
            return Err(Miss::of_run(format!(
                "the run parked at {}; decide it in the test (`decide step.{} approve by \"...\"`)",
                gate.path, gate.step_id
            )));
        };
        // The n-th time the run parks at this gate takes the n-th decision
        // (the last for every time after it).
        let times = made.get(&gate.step_id).copied().unwrap_or(0);
        let Some(decided) = decision.decided.get(times).or(decision.decided.last()) else {
            continue;
        };
        decided_any |= !matches!(decided, GateDecision::Wait);
        match decided {
            GateDecision::Wait => {
                waiting.get_or_insert(gate);
            }
            GateDecision::Decided(decided) => store
                .decide_as_member(
                    &gate.path,
                    &decided.by,
                    &member_of(gate, &decided.by),
                    decided.approved,
                    decided.comment.as_deref(),
                    &rfc3339_utc(now_ms),
                )
                .map_err(|refused| Miss {
                    expected: format!(
                        "decide step.{} {} by \"{}\"",
                        gate.step_id,
                        if decided.approved {
                            "approve"
                        } else {
                            "reject"
                        },
                        decided.by
                    ),
                    line: Some(decided.line),
                    found: format!("the run refused it at {}: {refused}", gate.path),
                })?,
            GateDecision::Expire => {
                let record = store.lookup(&gate.path).ok_or_else(|| {
                    Miss::of_run(format!("no record of the approval at {}", gate.path))
                })?;
                let due = gate
                    .expires_ms
                    .map(|after| record.started_ms.saturating_add(after));
                let mut expired = due
                    .and_then(|due| expire(&record, gate, due, record.round))
                    .ok_or_else(|| {
                        Miss::of_run(format!(
                            "the approval at {} never expires: it has no `expires`",
                            gate.path
                        ))
                    })?;
                // Dated on the virtual clock, when the gate is due.
                if let (Some(output), Some(after)) = (&expired.output, gate.expires_ms) {
                    let mut output = Value::clone(output);
                    output["decided_at"] = Value::from(rfc3339_utc(now_ms.saturating_add(after)));
                    expired.output = Some(Arc::new(output));
                    waited_ms = waited_ms.max(after);
                }
                store
                    .record(expired)
                    .await
                    .map_err(|error| Miss::of_run(error.message))?;
            }
        }
        // A gate that needs more than one approver is still pending.
        if store
            .lookup(&gate.path)
            .is_some_and(|record| record.status != StepStatus::Pending)
        {
            *made.entry(gate.step_id.clone()).or_default() += 1;
        }
    }
    *parked_ms = parked_ms.saturating_add(waited_ms);
    match waiting {
        Some(_) if decided_any => Ok(true),
        Some(_) if parks => Ok(false),
        Some(gate) => Err(Miss::of_run(format!(
            "the run parked at {}, where the test's decisions of `step.{}` end with `wait`; `expect status parked` if it is to stay there",
            gate.path, gate.step_id
        ))),
        None => Ok(true),
    }
}
