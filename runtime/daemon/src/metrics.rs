//! `/metrics`: Prometheus text format (prometheus-client), names by the
//! Prometheus conventions (`_total` counters, `_seconds` units).
//!
//! Every series of a run's doings carries its `account`, so that one
//! tenant's load, failures and waits can be told from another's.
//!
//! Step metrics come from the runner's observer (each step record as it is
//! journaled), run metrics from how each invocation of a run ends; nothing
//! here reads the store.

use std::sync::Arc;

use flow_plan::StepKind;
use flow_runtime::journal::{StepRecord, StepStatus};
use flow_runtime::limit::LimitEvents;
use flow_runtime::store::{MailState, NotificationKind, PendingGates, RunStatus};

use crate::webhooks::Delivery;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkflowLabels {
    account: String,
    workflow: String,
    status: String,
}

/// A step's labels, made for every step a run journals: the account is
/// shared with its run's observer and the names are the plan's own, so
/// that looking the series up copies nothing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    account: Arc<String>,
    kind: &'static str,
    status: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    account: Arc<String>,
    kind: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Durations from 1 ms to about 9 minutes.
fn duration_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeliveryLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    account: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindResultLabels {
    account: String,
    kind: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AccountLabels {
    account: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PendingLabels {
    account: String,
    workflow: String,
}

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pending: Family<PendingLabels, Gauge>,
    llm_waits: Histograms<AccountLabels>,
    fail_opens: Family<AccountLabels, Counter>,
    emails: Family<KindResultLabels, Counter>,
    destinations: Family<KindResultLabels, Counter>,
    deliveries: Family<WebhookLabels, Counter>,
    exports: Family<DeliveryLabels, Counter>,
    executions: Family<WorkflowLabels, Counter>,
    durations: Histograms<WorkflowLabels>,
    steps: Histograms<StepLabels>,
    retries: Family<KindLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::default();
        let executions = Family::<WorkflowLabels, Counter>::default();
        registry.register(
            "flow_workflow_executions",
            "Invocations of workflow runs, by account, workflow and how they ended (completed, failed, pending_approval)",
            executions.clone(),
        );
        let durations: Histograms<WorkflowLabels> = Family::new_with_constructor(duration_buckets);
        registry.register_with_unit(
            "flow_workflow_duration",
            "Active time of an invocation of a run, by account, workflow and how it ended",
            Unit::Seconds,
            durations.clone(),
        );
        let steps: Histograms<StepLabels> = Family::new_with_constructor(duration_buckets);
        registry.register_with_unit(
            "flow_step_duration",
            "Duration of a step execution (all its attempts), by account, step kind and status",
            Unit::Seconds,
            steps.clone(),
        );
        let retries = Family::<KindLabels, Counter>::default();
        registry.register(
            "flow_step_retries",
            "Attempts after the first, by account and step kind",
            retries.clone(),
        );
        let deliveries = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "flow_webhook_deliveries",
            "Webhook deliveries by account and result (delivered, or failed after every retry)",
            deliveries.clone(),
        );
        let exports = Family::<DeliveryLabels, Counter>::default();
        registry.register(
            "flow_trace_exports",
            "OTLP trace exports by result (delivered, or failed after every retry)",
            exports.clone(),
        );
        let pending = Family::<PendingLabels, Gauge>::default();
        registry.register(
            "flow_approvals_pending",
            "Gates of parked runs waiting for a decision, by account and workflow (read from the store at each scrape)",
            pending.clone(),
        );
        let llm_waits: Histograms<AccountLabels> = Family::new_with_constructor(|| {
            // From 0.1 ms: a permit at hand costs about that in Redis.
            Histogram::new(exponential_buckets(0.000_1, 2.0, 22))
        });
        registry.register_with_unit(
            "flow_llm_semaphore_wait",
            "Time an LLM call waited for a permit of its account's concurrency limit",
            Unit::Seconds,
            llm_waits.clone(),
        );
        let fail_opens = Family::<AccountLabels, Counter>::default();
        registry.register(
            "flow_llm_semaphore_fail_open",
            "LLM calls let through without a permit because Redis failed or was slow",
            fail_opens.clone(),
        );
        let emails = Family::<KindResultLabels, Counter>::default();
        registry.register(
            "flow_emails",
            "Emails by account, notification kind (approval, handoff) and result (sent, failed after every retry, skipped)",
            emails.clone(),
        );
        let destinations = Family::<KindResultLabels, Counter>::default();
        registry.register(
            "flow_destination_deliveries",
            "Attempts at delivering a run's result to a destination, by account, destination kind (webhook, email, kb) and result (delivered, failed and tried again, given_up)",
            destinations.clone(),
        );
        Metrics {
            registry,
            pending,
            llm_waits,
            fail_opens,
            emails,
            destinations,
            deliveries,
            exports,
            executions,
            durations,
            steps,
            retries,
        }
    }
}

impl Metrics {
    /// The runner observer that records each journaled step of a run of
    /// `account`.
    pub fn observer(&self, account: &str) -> impl Fn(&StepRecord) + Send + Sync + 'static {
        let (steps, retries) = (self.steps.clone(), self.retries.clone());
        let account = Arc::new(account.to_string());
        // The run's series, each looked up in the family once: a lookup
        // hashes the labels under the family's lock, and a run's steps
        // are mostly of one kind and status. A histogram is a handle on
        // the family's own (families never drop a step series).
        let series: std::sync::Mutex<Vec<(StepKind, StepStatus, Histogram)>> = Default::default();
        move |record: &StepRecord| {
            // A pending approval is recorded when the run parks, a retrying
            // step between its attempts; each is counted once it ends.
            if record.status.is_replaceable() {
                return;
            }
            let kind = record.kind.name();
            let seconds = record.ended_ms.saturating_sub(record.started_ms) as f64 / 1000.0;
            let mut series = series.lock().unwrap_or_else(|p| p.into_inner());
            let found = series
                .iter()
                .position(|(k, s, _)| *k == record.kind && *s == record.status);
            let at = found.unwrap_or_else(|| {
                let histogram = steps
                    .get_or_create(&StepLabels {
                        account: Arc::clone(&account),
                        kind,
                        status: record.status.as_str(),
                    })
                    .clone();
                series.push((record.kind, record.status, histogram));
                series.len() - 1
            });
            series[at].2.observe(seconds);
            drop(series);
            let again = record.attempts.len().saturating_sub(1) as u64;
            if again > 0 {
                retries
                    .get_or_create(&KindLabels {
                        account: Arc::clone(&account),
                        kind,
                    })
                    .inc_by(again);
            }
        }
    }

    /// Counts a webhook delivery attempt of `account`'s as it ends.
    pub fn webhook_delivery(&self, account: &str, delivery: Delivery) {
        self.deliveries
            .get_or_create(&WebhookLabels {
                account: account.to_string(),
                result: delivery.as_str().to_string(),
            })
            .inc();
    }

    /// Counts an attempt at one of `account`'s destinations of `kind`.
    pub fn destination_delivery(&self, account: &str, kind: &str, result: &str) {
        self.destinations
            .get_or_create(&KindResultLabels {
                account: account.to_string(),
                kind: kind.to_string(),
                result: result.to_string(),
            })
            .inc();
    }

    /// Counts each trace export as it ends.
    pub fn export_counter(&self) -> impl Fn(Delivery) + Clone + Send + Sync + 'static {
        counting(self.exports.clone())
    }

    /// Counts an email of a notification of `kind`, once it went as it went.
    pub fn email(&self, account: &str, kind: NotificationKind, result: MailState) {
        self.emails
            .get_or_create(&KindResultLabels {
                account: account.to_string(),
                kind: kind.as_str().to_string(),
                result: result.as_str().to_string(),
            })
            .inc();
    }

    /// Records how an invocation of a run of `account`'s `workflow` ended.
    pub fn run_ended(
        &self,
        account: &str,
        workflow: &str,
        status: RunStatus,
        active: std::time::Duration,
    ) {
        let labels = WorkflowLabels {
            account: account.to_string(),
            workflow: workflow.to_string(),
            status: status.as_str().to_string(),
        };
        self.executions.get_or_create(&labels).inc();
        self.durations
            .get_or_create(&labels)
            .observe(active.as_secs_f64());
    }

    /// Forgets the series of `account`'s `workflow`, retired: each kept
    /// its labels for good, so that an account deploying, running and
    /// retiring workflows by the hundred grew every scrape and flowd's
    /// memory without bound (an audit: 4.7 MB of metrics for 5 workflows
    /// deployed).
    pub fn forget_workflow(&self, account: &str, workflow: &str) {
        for status in RunStatus::ALL {
            let labels = WorkflowLabels {
                account: account.to_string(),
                workflow: workflow.to_string(),
                status: status.as_str().to_string(),
            };
            self.executions.remove(&labels);
            self.durations.remove(&labels);
        }
    }

    /// The limiter's events, as these metrics.
    pub fn limit_events(&self) -> LimitMetrics {
        LimitMetrics {
            waits: self.llm_waits.clone(),
            fail_opens: self.fail_opens.clone(),
        }
    }

    /// Sets the pending approvals gauge to the store's count, by account
    /// and workflow.
    pub fn set_pending_approvals(&self, counts: &[PendingGates]) {
        // A workflow with none left must not keep showing its last count.
        self.pending.clear();
        for count in counts {
            self.pending
                .get_or_create(&PendingLabels {
                    account: count.account.clone(),
                    workflow: count.workflow.clone(),
                })
                .set(count.gates as i64);
        }
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// The concurrency limiter's waits and fail-opens, by account.
pub struct LimitMetrics {
    waits: Histograms<AccountLabels>,
    fail_opens: Family<AccountLabels, Counter>,
}

impl LimitEvents for LimitMetrics {
    fn waited(&self, account: &str, wait: std::time::Duration) {
        self.waits
            .get_or_create(&AccountLabels {
                account: account.to_string(),
            })
            .observe(wait.as_secs_f64());
    }

    fn failed_open(&self, account: &str) {
        self.fail_opens
            .get_or_create(&AccountLabels {
                account: account.to_string(),
            })
            .inc();
    }
}

/// A counter of deliveries by result, as a callback.
fn counting(
    family: Family<DeliveryLabels, Counter>,
) -> impl Fn(Delivery) + Clone + Send + Sync + 'static {
    move |delivery| {
        family
            .get_or_create(&DeliveryLabels {
                result: delivery.as_str().to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: StepKind, status: StepStatus) -> StepRecord {
        StepRecord {
            path: "s".into(),
            step_id: "s".into(),
            kind,
            status,
            input: serde_json::Value::Null,
            output: None,
            error: None,
            attempts: Vec::new(),
            started_ms: 0,
            ended_ms: 5,
            round: 0,
        }
    }

    /// Guards the observer's series kept per run: each kind and status of
    /// a run's steps counts in its own series, in the family that
    /// `/metrics` shows, and a step between attempts in none.
    #[test]
    fn a_runs_steps_count_in_the_series_of_their_kind_and_status() {
        let metrics = Metrics::default();
        let observe = metrics.observer("acme");
        let other_run = metrics.observer("acme");
        for (kind, status) in [
            (StepKind::Recipe, StepStatus::Completed),
            (StepKind::Recipe, StepStatus::Failed),
            (StepKind::Recipe, StepStatus::Completed),
            (StepKind::KbWrite, StepStatus::Completed),
            (StepKind::Recipe, StepStatus::Retrying),
        ] {
            observe(&record(kind, status));
        }
        other_run(&record(StepKind::Recipe, StepStatus::Completed));
        let text = metrics.encode();
        for line in [
            "flow_step_duration_seconds_count{account=\"acme\",kind=\"recipe\",status=\"completed\"} 3",
            "flow_step_duration_seconds_count{account=\"acme\",kind=\"recipe\",status=\"failed\"} 1",
            "flow_step_duration_seconds_count{account=\"acme\",kind=\"kb_write\",status=\"completed\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        assert!(!text.contains("status=\"retrying\""), "{text}");
    }
}
